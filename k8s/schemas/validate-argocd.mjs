// Validates Argo CD objects (Application, ApplicationSet, AppProject) against the schemas of
// Argo CD's CRDs, as compiled by the npm package @kubernetes-models/argo-cd (pinned in
// package.json; `npm ci` here installs it). kubernetes-validate covers core Kubernetes objects
// only, so tests/test_k8s_manifests.py hands every argoproj.io object to this script.
//
// In: a JSON array of objects on stdin. Out: a JSON array on stdout, one entry per object, in
// order: {"kind", "name", "errors": [...]} (empty errors: valid). Exit 0 when every object was
// judged, 2 when the input itself is unusable.
import { readFileSync } from "node:fs";
import { Application } from "@kubernetes-models/argo-cd/argoproj.io/v1alpha1/Application";
import { ApplicationSet } from "@kubernetes-models/argo-cd/argoproj.io/v1alpha1/ApplicationSet";
import { AppProject } from "@kubernetes-models/argo-cd/argoproj.io/v1alpha1/AppProject";

const MODELS = { Application, ApplicationSet, AppProject };

function judge(object) {
  const name = object?.metadata?.name ?? "";
  const Model = object?.apiVersion === "argoproj.io/v1alpha1" ? MODELS[object.kind] : undefined;
  if (Model === undefined) {
    return { kind: object?.kind, name, errors: [`no Argo CD schema for ${object?.apiVersion} ${object?.kind}`] };
  }
  try {
    new Model(object).validate();
    return { kind: object.kind, name, errors: [] };
  } catch (error) {
    return { kind: object.kind, name, errors: [String(error.message ?? error)] };
  }
}

let objects;
try {
  objects = JSON.parse(readFileSync(0, "utf8"));
} catch (error) {
  process.stderr.write(`input is not JSON: ${error.message}\n`);
  process.exit(2);
}
if (!Array.isArray(objects)) {
  process.stderr.write("input must be a JSON array of objects\n");
  process.exit(2);
}
process.stdout.write(JSON.stringify(objects.map(judge)) + "\n");
