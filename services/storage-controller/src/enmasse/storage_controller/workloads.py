"""Broker workloads as Kubernetes manifests in the GitOps output, and read back for `enmasse up`.

In: a space's `Placement` brokers and each broker's local ports. Out: one YAML file per broker,
`<gitops-dir>/workloads/<space>/<broker-id>.yaml`, holding a Service and a StatefulSet (one
replica, a PVC template for its journal). In a cluster Argo CD applies each `workloads/<space>`
directory (k8s/argocd/apps/workloads.yaml) and prunes a removed file's objects; locally the
runtime reads the very same files.

Rendering is pure and deterministic (fixed key order, no timestamps): re-rendering an unchanged
placement changes no byte, so git sees no commit and Argo CD no sync. `GitOpsOutput.write_space`
writes only files whose text changed (atomically: temp file, then rename) and deletes the files of
brokers that are gone, touching only files it rendered itself (the managed-by label), so router
workloads or people's files in the same directory are left alone.

The contract with the local runtime and anyone else reading the output (StatefulSet metadata):
- labels `app.kubernetes.io/component: broker`, `app.kubernetes.io/managed-by:
  enmasse-storage-controller`, `enmasse.io/space: <space>`, `enmasse.io/broker: <broker-id>`;
- annotation `enmasse.io/broker-kind`: `pooled` or `dedicated`; `enmasse.io/owner`: the address
  a dedicated broker serves; `enmasse.io/state`: `Active` or `Draining` (a Draining broker still
  runs: it is handing its messages over; its file disappears once that is done);
- annotations `enmasse.io/local-amqp-port` and `enmasse.io/local-admin-port`: the loopback ports
  the local runtime must start it on. `local_broker_command` gives the exact command line
  (`enmasse-broker --host=127.0.0.1 --port=.. --admin-port=.. --data-dir=.. --ports-file=..`).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from enmasse.resources.workload_files import owned_files, sync_files
from enmasse.storage_controller.placement import ACTIVE, Broker

IMAGE = "enmasse-py/broker"
MANAGER = "enmasse-storage-controller"
AMQP_PORT = 5672
ADMIN_PORT = 5685
DATA_DIR = "/var/lib/enmasse/broker"
JOURNAL_SIZE = "1Gi"
WORKLOADS = "workloads"

LABEL_SPACE = "enmasse.io/space"
LABEL_BROKER = "enmasse.io/broker"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
ANNOTATION_KIND = "enmasse.io/broker-kind"
ANNOTATION_OWNER = "enmasse.io/owner"
ANNOTATION_STATE = "enmasse.io/state"
ANNOTATION_AMQP_PORT = "enmasse.io/local-amqp-port"
ANNOTATION_ADMIN_PORT = "enmasse.io/local-admin-port"


@dataclass(frozen=True)
class LocalPorts:
    amqp: int
    admin: int


@dataclass(frozen=True)
class BrokerWorkload:
    """What a rendered file says about one broker."""

    space: str
    broker: Broker
    ports: LocalPorts


class WorkloadError(ValueError):
    """A file in the output that claims to be ours but cannot be read as a broker workload."""


# ------------------------------------------------------------------ rendering (pure)


def render_broker(*, space: str, broker: Broker, ports: LocalPorts, image: str = IMAGE) -> str:
    """The Service and StatefulSet of one broker, as YAML text."""
    labels = _labels(space, broker.id)
    selector = {LABEL_SPACE: space, LABEL_BROKER: broker.id}
    annotations = {
        ANNOTATION_KIND: "pooled" if broker.pooled else "dedicated",
        ANNOTATION_OWNER: broker.owner,
        ANNOTATION_STATE: broker.state,
        ANNOTATION_AMQP_PORT: str(ports.amqp),
        ANNOTATION_ADMIN_PORT: str(ports.admin),
    }
    if broker.pooled:
        del annotations[ANNOTATION_OWNER]
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": broker.id, "labels": labels},
        "spec": {
            "selector": selector,
            "ports": [
                {"name": "amqp", "port": AMQP_PORT, "targetPort": "amqp"},
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
                "spec": _pod_spec(image),
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
    header = f"# Broker {broker.id} of address space {space}: rendered by {MANAGER}; do not edit.\n"
    return header + yaml.safe_dump_all(
        [service, stateful_set], sort_keys=False, default_flow_style=False, explicit_start=True
    )


def _labels(space: str, broker_id: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "broker",
        "app.kubernetes.io/component": "broker",
        "app.kubernetes.io/part-of": "enmasse",
        LABEL_MANAGED_BY: MANAGER,
        LABEL_SPACE: space,
        LABEL_BROKER: broker_id,
    }


def _pod_spec(image: str) -> dict[str, Any]:
    return {
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": 10001,
            "runAsGroup": 10001,
            "fsGroup": 10001,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [
            {
                "name": "broker",
                "image": image,
                "args": [
                    "--host=0.0.0.0",
                    f"--port={AMQP_PORT}",
                    f"--admin-port={ADMIN_PORT}",
                    f"--data-dir={DATA_DIR}",
                ],
                "ports": [
                    {"name": "amqp", "containerPort": AMQP_PORT},
                    {"name": "admin", "containerPort": ADMIN_PORT},
                ],
                "readinessProbe": {"grpc": {"port": ADMIN_PORT}, "periodSeconds": 5},
                "securityContext": {
                    "allowPrivilegeEscalation": False,
                    "readOnlyRootFilesystem": True,
                    "capabilities": {"drop": ["ALL"]},
                },
                "volumeMounts": [{"name": "data", "mountPath": DATA_DIR}],
            }
        ],
    }


# ------------------------------------------------------------------ reading back (pure)


def read_broker(text: str) -> BrokerWorkload | None:
    """The broker a file describes; None for a file that is not one of ours."""
    try:
        docs = [d for d in yaml.safe_load_all(text) if d]
    except yaml.YAMLError as error:
        raise WorkloadError(f"not YAML: {error}") from error
    for doc in docs:
        if not isinstance(doc, dict) or doc.get("kind") != "StatefulSet":
            continue
        metadata = doc.get("metadata") or {}
        labels = metadata.get("labels") or {}
        if labels.get(LABEL_MANAGED_BY) != MANAGER:
            return None
        return _workload(metadata, labels)
    return None


def _workload(metadata: dict[str, Any], labels: dict[str, str]) -> BrokerWorkload:
    annotations = metadata.get("annotations") or {}
    try:
        broker = Broker(
            id=labels[LABEL_BROKER],
            pooled=annotations[ANNOTATION_KIND] == "pooled",
            owner=annotations.get(ANNOTATION_OWNER, ""),
            state=annotations.get(ANNOTATION_STATE, ACTIVE),
        )
        ports = LocalPorts(
            amqp=int(annotations[ANNOTATION_AMQP_PORT]),
            admin=int(annotations[ANNOTATION_ADMIN_PORT]),
        )
        return BrokerWorkload(space=labels[LABEL_SPACE], broker=broker, ports=ports)
    except (KeyError, ValueError) as error:
        raise WorkloadError(f"broker workload lacks a readable {error}") from error


def local_broker_command(
    workload: BrokerWorkload, *, var_dir: Path, executable: str | None = None
) -> list[str]:
    """How the local runtime starts a rendered broker: its ports, its own data directory under
    <var>/brokers/<space>/<id>, and a ports file the BrokerDirectory reads back."""
    base = var_dir / "brokers" / workload.space / workload.broker.id
    program = executable or str(Path(sys.executable).parent / "enmasse-broker")
    return [
        program,
        "--host=127.0.0.1",
        f"--port={workload.ports.amqp}",
        f"--admin-port={workload.ports.admin}",
        f"--data-dir={base / 'data'}",
        f"--ports-file={base / 'ports.json'}",
    ]


# ------------------------------------------------------------------ the output directory


class GitOpsOutput:
    """The GitOps output directory: `<root>/workloads/<space>/<broker-id>.yaml`."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.workloads = self.root / WORKLOADS

    def space_dir(self, space: str) -> Path:
        return self.workloads / space

    def spaces(self) -> list[str]:
        if not self.workloads.is_dir():
            return []
        return sorted(p.name for p in self.workloads.iterdir() if p.is_dir())

    def read_space(self, space: str) -> dict[str, BrokerWorkload]:
        """The brokers rendered for a space, by id (files that are not ours are skipped)."""
        return {w.broker.id: w for _, w in self._ours(space)}

    def read_all(self) -> dict[str, dict[str, BrokerWorkload]]:
        return {space: self.read_space(space) for space in self.spaces()}

    def write_space(self, space: str, texts: Mapping[str, str]) -> list[str]:
        """Makes the space's broker files exactly `texts` (broker id -> YAML); returns the
        ids whose files were written or deleted."""
        owned = [(w.broker.id, path) for path, w in self._ours(space)]
        return sync_files(self.space_dir(space), texts=texts, owned=owned)

    def _ours(self, space: str) -> list[tuple[Path, BrokerWorkload]]:
        return owned_files(self.space_dir(space), read=read_broker)
