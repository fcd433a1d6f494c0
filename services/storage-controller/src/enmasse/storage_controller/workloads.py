"""Broker workloads rendered as Kubernetes manifests into the GitOps output.

In: a space's `Placement` brokers and each broker's local ports. Out: the text of one YAML file
per broker, `<gitops-dir>/workloads/<space>/<broker-id>.yaml`, holding a Service and a StatefulSet
(one replica, a PVC template for its journal), which `GitOpsOutput.write_space` writes. In a
cluster Argo CD applies each `workloads/<space>` directory (k8s/argocd/apps/workloads.yaml) and
prunes a removed file's objects; locally the runtime reads the very same files.

Rendering is pure and deterministic (fixed key order, no timestamps): re-rendering an unchanged
placement changes no byte, so git sees no commit and Argo CD no sync.

The labels and annotations are the contract with everyone who reads the output (the local
runtime, `read_broker`): they are named, and read back, in `enmasse.resources.rendered_brokers`;
what is the storage-controller's own here is the shape of the pod (image, ports, journal volume).
Every broker mounts the Secret `enmasse-broker-tls` (role `broker`, issued by cert-manager) and
reads it through `$ENMASSE_TLS_DIR`: BrokerAdmin speaks mutual TLS, so readiness is the exec
probe of `workload_files.health_probe` (kubelet's grpc probe has no client certificate). A
standard space's broker also runs `--routers-only`: its AMQP port speaks mutual TLS with that
certificate and takes only the space's routers (their `enmasse-router-tls`, of the same CA); a
brokered space's broker serves its clients on that port instead (`enmasse.io/serves`), with
`--client-auth=required`: they log in as the space's users, which this controller pushes; and
on amqps (5671) with a certificate of its own, the Certificate `<broker-id>-amqps-tls` rendered
in the same file (role `endpoint`, the broker's Service names, issuer `enmasse-ca`), mounted at
/etc/enmasse/tls. Its clients reach it through its Service from anywhere, as a standard space's
reach its routers: the NetworkPolicy `<broker-id>-clients` rendered last in the file admits
AMQP (5672) and AMQPS (5671) to that one pod from any source (k8s/base/network-policies.yaml
denies everything else; its admin port stays the control plane's, through `from-this-namespace`).
"""

from __future__ import annotations

from typing import Any

import yaml
from enmasse.common.metrics import METRICS_PORT
from enmasse.resources.rendered_brokers import (
    ANNOTATION_KIND,
    ANNOTATION_OWNER,
    ANNOTATION_SERVES,
    ANNOTATION_STATE,
    CLIENT_AUTH,
    LABEL_BROKER,
    MANAGER,
    SERVES_CLIENTS,
    SERVES_ROUTERS,
    Broker,
    LocalPorts,
)
from enmasse.resources.workload_files import (
    AMQPS_PORT,
    ANNOTATION_ADMIN_PORT,
    ANNOTATION_AMQP_PORT,
    ANNOTATION_AMQPS_PORT,
    BROKER_TLS_SECRET,
    LABEL_MANAGED_BY,
    LABEL_SPACE,
    amqps_container_arguments,
    amqps_mount,
    amqps_volume,
    endpoint_certificate,
    health_probe,
    tls_env,
    tls_mounts,
    tls_volumes,
)

IMAGE = "enmasse-py/broker"
AMQP_PORT = 5672
ADMIN_PORT = 5685
DATA_DIR = "/var/lib/enmasse/broker"
JOURNAL_SIZE = "1Gi"


def render_broker(
    *,
    space: str,
    broker: Broker,
    ports: LocalPorts,
    image: str = IMAGE,
    routers_only: bool = True,
) -> str:
    """The Service and StatefulSet of one broker, as YAML text; routers_only: a standard space's
    broker (False: a brokered space's, whose AMQP and amqps ports serve the space's clients, with
    the amqps Certificate rendered between the two and the NetworkPolicy admitting them last)."""
    labels = _labels(space, broker.id)
    selector = {LABEL_SPACE: space, LABEL_BROKER: broker.id}
    annotations = {
        ANNOTATION_KIND: "pooled" if broker.pooled else "dedicated",
        ANNOTATION_OWNER: broker.owner,
        ANNOTATION_STATE: broker.state,
        ANNOTATION_SERVES: SERVES_ROUTERS if routers_only else SERVES_CLIENTS,
        ANNOTATION_AMQP_PORT: str(ports.amqp),
        ANNOTATION_ADMIN_PORT: str(ports.admin),
    }
    if broker.pooled:
        del annotations[ANNOTATION_OWNER]
    if not routers_only and ports.amqps is not None:
        annotations[ANNOTATION_AMQPS_PORT] = str(ports.amqps)
    client_ports = (
        [] if routers_only else [{"name": "amqps", "port": AMQPS_PORT, "targetPort": "amqps"}]
    )
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": broker.id, "labels": labels},
        "spec": {
            "selector": selector,
            "ports": [
                {"name": "amqp", "port": AMQP_PORT, "targetPort": "amqp"},
                *client_ports,
                {"name": "admin", "port": ADMIN_PORT, "targetPort": "admin"},
            ],
        },
    }
    stateful_set = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": broker.id, "labels": labels, "annotations": annotations},
        "spec": {
            "serviceName": broker.id,
            "replicas": 1,
            "selector": {"matchLabels": selector},
            "template": {
                "metadata": {"labels": labels},
                "spec": _pod_spec(image, name=broker.id, routers_only=routers_only),
            },
            "volumeClaimTemplates": [
                {
                    "metadata": {"name": "data", "labels": labels},
                    "spec": {
                        "accessModes": ["ReadWriteOnce"],
                        "resources": {"requests": {"storage": JOURNAL_SIZE}},
                    },
                }
            ],
        },
    }
    certificates = [] if routers_only else [endpoint_certificate(broker.id, labels=labels)]
    policies = [] if routers_only else [_clients_policy(broker.id, selector, labels=labels)]
    header = f"# Broker {broker.id} of address space {space}: rendered by {MANAGER}; do not edit.\n"
    return header + yaml.safe_dump_all(
        [service, *certificates, stateful_set, *policies],
        sort_keys=False,
        default_flow_style=False,
        explicit_start=True,
    )


def _clients_policy(
    name: str, selector: dict[str, str], *, labels: dict[str, str]
) -> dict[str, Any]:
    """A brokered space's broker is its clients' endpoint: its client ports from anywhere (a rule
    without `from`), like `routers-from-anywhere` for a standard space's routers."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": f"{name}-clients", "labels": labels},
        "spec": {
            "podSelector": {"matchLabels": selector},
            "policyTypes": ["Ingress"],
            "ingress": [
                {
                    "ports": [
                        {"protocol": "TCP", "port": AMQP_PORT},
                        {"protocol": "TCP", "port": AMQPS_PORT},
                    ]
                }
            ],
        },
    }


def _labels(space: str, broker_id: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "broker",
        "app.kubernetes.io/component": "broker",
        "app.kubernetes.io/part-of": "enmasse",
        LABEL_MANAGED_BY: MANAGER,
        LABEL_SPACE: space,
        LABEL_BROKER: broker_id,
    }


def _pod_spec(image: str, *, name: str, routers_only: bool) -> dict[str, Any]:
    # A standard space's broker serves its routers alone; a brokered space's, its clients, on
    # amqps too (its own certificate).
    serves = (
        ["--routers-only"]
        if routers_only
        else [f"--client-auth={CLIENT_AUTH}", *amqps_container_arguments()]
    )
    client_port = [] if routers_only else [{"name": "amqps", "containerPort": AMQPS_PORT}]
    return {
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": 10001,
            "runAsGroup": 10001,
            "fsGroup": 10001,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "volumes": [
            *tls_volumes(BROKER_TLS_SECRET),
            *([] if routers_only else [amqps_volume(name)]),
        ],
        "containers": [
            {
                "name": "broker",
                "image": image,
                "args": [
                    "--host=0.0.0.0",
                    f"--port={AMQP_PORT}",
                    f"--admin-port={ADMIN_PORT}",
                    f"--metrics-port={METRICS_PORT}",
                    f"--data-dir={DATA_DIR}",
                    *serves,
                ],
                "ports": [
                    {"name": "amqp", "containerPort": AMQP_PORT},
                    *client_port,
                    {"name": "admin", "containerPort": ADMIN_PORT},
                    {"name": "metrics", "containerPort": METRICS_PORT},
                ],
                "readinessProbe": health_probe(ADMIN_PORT),
                "securityContext": {
                    "allowPrivilegeEscalation": False,
                    "readOnlyRootFilesystem": True,
                    "capabilities": {"drop": ["ALL"]},
                },
                "env": tls_env(),
                "volumeMounts": [
                    {"name": "data", "mountPath": DATA_DIR},
                    *tls_mounts(),
                    *([] if routers_only else [amqps_mount()]),
                ],
            }
        ],
    }
