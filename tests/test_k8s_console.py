"""The web console's Kubernetes objects (k8s/base/console.yaml), checked offline.

Schema validity comes with every other object (tests/test_k8s_manifests.py builds and validates
each kustomization); here, what the console itself needs: its image in each overlay, flags its
own parser takes, the config service it calls verified against the CA of a Certificate that
cert-manager issues for it, HTTPS probes on the login page (the one page that answers without a
token), a Service on the same port, and a NetworkPolicy that names who may come in.
"""

from __future__ import annotations

from pathlib import PurePosixPath

import pytest
from enmasse.console.main import parse_args

from tests.test_k8s_manifests import OVERLAYS, build, named


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_console_is_deployed_behind_https_calling_config_with_the_ca(overlay: str) -> None:
    objects = build(overlay)
    pod = named(objects, "Deployment")["console"]["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["image"].startswith("enmasse-py/console:"), container["image"]

    args = parse_args(container["args"])
    assert (args.listen, args.config) == ("0.0.0.0:8443", "config:5680")
    secrets = {v["name"]: v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
    mounts = {m["mountPath"]: secrets[m["name"]] for m in container["volumeMounts"]}
    assert mounts == {str(args.tls_dir): "enmasse-console-tls"}
    assert PurePosixPath(str(args.ca_file)) == PurePosixPath(str(args.tls_dir)) / "ca.crt"
    issued = {c["spec"]["secretName"]: c for c in named(objects, "Certificate").values()}
    assert "server auth" in issued["enmasse-console-tls"]["spec"]["usages"]
    assert issued["enmasse-console-tls"]["spec"]["issuerRef"]["name"] == "enmasse-ca"

    for probe in ("readinessProbe", "livenessProbe"):
        get = container[probe]["httpGet"]
        assert (get["path"], get["scheme"], get["port"]) == ("/login", "HTTPS", "https")
    assert container["ports"] == [{"name": "https", "containerPort": 8443}]
    service = named(objects, "Service")["console"]["spec"]
    assert service["ports"][0]["port"] == 8443
    assert service["selector"] == {"app.kubernetes.io/name": "console"}

    policy = named(objects, "NetworkPolicy")["console-from-ingress"]["spec"]
    assert policy["podSelector"] == {"matchLabels": {"app.kubernetes.io/component": "console"}}
    assert all(rule.get("from") for rule in policy["ingress"])  # never open to all
