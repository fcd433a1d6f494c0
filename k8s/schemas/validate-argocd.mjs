// Validates custom resources against the schemas of their CRDs: Argo CD's (Application,
// ApplicationSet, AppProject; npm package @kubernetes-models/argo-cd), cert-manager's
// (Certificate, Issuer; @kubernetes-models/cert-manager) and the Prometheus Operator's
// (PodMonitor; @kubernetes-models/prometheus-operator), all pinned in package.json (`npm ci`
// here installs them). kubernetes-validate covers core Kubernetes objects only, so
// tests/test_k8s_manifests.py hands every argoproj.io, cert-manager.io and monitoring.coreos.com
// object to this script.
//
// In: a JSON array of objects on stdin. Out: a JSON array on stdout, one entry per object, in
// order: {"kind", "name", "errors": [...]} (empty errors: valid). Exit 0 when every object was
// judged, 2 when the input itself is unusable.
import { readFileSync } from "node:fs";
import { Application } from "@kubernetes-models/argo-cd/argoproj.io/v1alpha1/Application";
import { ApplicationSet } from "@kubernetes-models/argo-cd/argoproj.io/v1alpha1/ApplicationSet";
import { AppProject } from "@kubernetes-models/argo-cd/argoproj.io/v1alpha1/AppProject";
import { Certificate } from "@kubernetes-models/cert-manager/cert-manager.io/v1/Certificate";
import { Issuer } from "@kubernetes-models/cert-manager/cert-manager.io/v1/Issuer";
import { PodMonitor } from "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/PodMonitor";

// apiVersion -> kind -> model
const MODELS = {
  "argoproj.io/v1alpha1": { Application, ApplicationSet, AppProject },
  "cert-manager.io/v1": { Certificate, Issuer },
  "monitoring.coreos.com/v1": { PodMonitor },
};

function judge(object) {
  const name = object?.metadata?.name ?? "";
  const Model = MODELS[object?.apiVersion]?.[object?.kind];
  if (Model === undefined) {
    return { kind: object?.kind, name, errors: [`no CRD schema for ${object?.apiVersion} ${object?.kind}`] };
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
