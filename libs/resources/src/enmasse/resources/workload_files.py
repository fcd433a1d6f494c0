"""Rendered workload files: the GitOps output, `<root>/workloads/<space>/<id>.yaml`.

Two writers share each space's folder: the storage-controller renders its brokers there and the
router-agent its routers. Each owns the files its own reader recognizes (`read` returns the
workload, or None for a file that is somebody else's) and never touches the others. In: the texts
a writer wants for a space (id -> YAML). Out: the ids whose files were written or deleted.

Writes are atomic (temp file + rename: the local runtime and Argo CD never read half a file) and
skipped when the text is unchanged, so re-rendering an unchanged placement changes no byte and
makes no git commit.

The labels and annotations both kinds of workload carry are named here; what a router file and
a broker file say besides is in `rendered_routers` and `rendered_brokers`. So is what both pods
need for mutual TLS on their admin port (`tls_volumes`, `tls_mounts`, `tls_env`,
`health_probe`): the per-role Secret cert-manager issues (k8s/base/certificates.yaml), read
through `$ENMASSE_TLS_DIR`, and an exec health probe (kubelet's grpc probe has no client
certificate; the script is the ConfigMap `enmasse-grpc-probe` of k8s/base/grpc-probe.yaml).
And what a client endpoint (every router, a brokered space's broker) needs for amqps: a
cert-manager Certificate of its own, rendered beside it (`endpoint_certificate`: role
`endpoint`, its Service's names, server auth only), mounted at /etc/enmasse/tls and passed as
`--tls-cert`, `--tls-key`, `--amqps-port` (`amqps_arguments`, the same flags locally).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import os
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml
from enmasse.common.certificates import CERT_FILE, ENDPOINT, KEY_FILE, TLS_DIR_ENV, TlsFiles

Workload = TypeVar("Workload")

WORKLOADS = "workloads"  # <root>/workloads/<space>/<id>.yaml
LABEL_SPACE = "enmasse.io/space"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"  # whose file it is: only its writer touches it
ANNOTATION_AMQP_PORT = "enmasse.io/local-amqp-port"  # the loopback ports of the local runtime
ANNOTATION_ADMIN_PORT = "enmasse.io/local-admin-port"
ANNOTATION_AMQPS_PORT = "enmasse.io/local-amqps-port"  # a client endpoint's amqps port, locally

ROUTER_TLS_SECRET = "enmasse-router-tls"  # role data-plane, one for every router
BROKER_TLS_SECRET = "enmasse-broker-tls"  # role broker, one for every broker
# tls.crt, tls.key, ca.crt (cert-manager's Secret layout) of the gRPC mutual TLS; not
# /etc/enmasse/tls, which k8s/README.md gives a router's client-facing (amqps) certificate.
TLS_MOUNT = "/etc/enmasse/grpc-tls"
PROBE_CONFIGMAP = "enmasse-grpc-probe"
AMQPS_PORT = 5671
AMQPS_TLS_MOUNT = "/etc/enmasse/tls"  # a client endpoint's own amqps certificate
NAMESPACE = "enmasse"
PROBE_MOUNT = "/etc/enmasse/probe"
PROBE_SCRIPT = f"{PROBE_MOUNT}/health_probe.py"


def tls_volumes(secret: str) -> list[dict[str, Any]]:
    """The pod's certificate Secret (group-readable: pods run with fsGroup 10001) and the probe."""
    return [
        {"name": "grpc-tls", "secret": {"secretName": secret, "defaultMode": 0o440}},
        {"name": "grpc-probe", "configMap": {"name": PROBE_CONFIGMAP}},
    ]


def tls_mounts() -> list[dict[str, Any]]:
    return [
        {"name": "grpc-tls", "mountPath": TLS_MOUNT, "readOnly": True},
        {"name": "grpc-probe", "mountPath": PROBE_MOUNT, "readOnly": True},
    ]


def tls_env() -> list[dict[str, Any]]:
    return [{"name": TLS_DIR_ENV, "value": TLS_MOUNT}]


def health_probe(port: int) -> dict[str, Any]:
    """Readiness through the mutual-TLS port: the probe presents the pod's own certificate."""
    return {
        "exec": {"command": ["python", PROBE_SCRIPT, str(port)]},
        "periodSeconds": 5,
        "timeoutSeconds": 5,
    }


def amqps_arguments(*, cert: str, key: str, port: int) -> list[str]:
    """The flags a router or a broker opens its amqps port with (the same names for both)."""
    return [f"--tls-cert={cert}", f"--tls-key={key}", f"--amqps-port={port}"]


def local_amqps_arguments(tls: TlsFiles | None, *, port: int | None) -> list[str]:
    """A locally run endpoint's amqps flags: its certificate's files and pinned port; none
    without either (a var dir without certificates: tests of the pure parts)."""
    if tls is None or port is None:
        return []
    return amqps_arguments(cert=str(tls.cert), key=str(tls.key), port=port)


def optional_port(value: str | None) -> int | None:
    """An annotation's port, None when the annotation is not there."""
    return int(value) if value is not None else None


def endpoint_secret(name: str) -> str:
    """The Secret holding the amqps certificate of the workload whose Service is `name`."""
    return f"{name}-amqps-tls"


def endpoint_certificate(name: str, *, labels: dict[str, str]) -> dict[str, Any]:
    """The cert-manager Certificate of one client endpoint: its Service `name` and that name's
    cluster forms in the SAN, role `endpoint`, server auth only (it opens no mutual-TLS port),
    issued by `enmasse-ca`, whose ca.crt clients trust (k8s/README.md)."""
    return {
        "apiVersion": "cert-manager.io/v1",
        "kind": "Certificate",
        "metadata": {"name": endpoint_secret(name), "labels": labels},
        "spec": {
            "secretName": endpoint_secret(name),
            "commonName": name,
            "subject": {"organizationalUnits": [ENDPOINT]},
            "dnsNames": [
                name,
                f"{name}.{NAMESPACE}",
                f"{name}.{NAMESPACE}.svc",
                f"{name}.{NAMESPACE}.svc.cluster.local",
            ],
            "usages": ["digital signature", "key encipherment", "server auth"],
            "duration": "2160h",
            "renewBefore": "360h",
            "privateKey": {"algorithm": "ECDSA", "size": 256, "rotationPolicy": "Always"},
            "issuerRef": {"kind": "Issuer", "name": "enmasse-ca"},
        },
    }


def amqps_volume(name: str) -> dict[str, Any]:
    secret = {"secretName": endpoint_secret(name), "defaultMode": 0o440}
    return {"name": "amqps-tls", "secret": secret}


def amqps_mount() -> dict[str, Any]:
    return {"name": "amqps-tls", "mountPath": AMQPS_TLS_MOUNT, "readOnly": True}


def amqps_container_arguments() -> list[str]:
    """A pod's amqps flags: its mounted certificate, port 5671."""
    return amqps_arguments(
        cert=f"{AMQPS_TLS_MOUNT}/{CERT_FILE}", key=f"{AMQPS_TLS_MOUNT}/{KEY_FILE}", port=AMQPS_PORT
    )


_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class WorkloadError(ValueError):
    """A file in the output that claims to be a writer's but does not say what its contract says."""


def managed_statefulset(text: str, *, manager: str) -> dict[str, Any] | None:
    """The metadata of the StatefulSet a rendered file holds, when `manager` wrote it; None for
    a file that is somebody else's (another writer's, or people's)."""
    metadata = _statefulset_metadata(text, manager)
    return copy.deepcopy(metadata) if metadata is not None else None


@functools.lru_cache(maxsize=1024)
def _statefulset_metadata(text: str, manager: str) -> dict[str, Any] | None:
    # The router-agent and the storage-controller read every rendered file on every pass (a
    # file is the truth, and people may edit it): parsing YAML was most of their idle CPU. A
    # file's text decides its answer, so each distinct text is parsed once (with libyaml).
    try:
        docs = [d for d in yaml.load_all(text, Loader=_SAFE_LOADER) if d]
    except yaml.YAMLError as error:
        raise WorkloadError(f"not YAML: {error}") from error
    for doc in docs:
        if not isinstance(doc, dict) or doc.get("kind") != "StatefulSet":
            continue
        metadata: dict[str, Any] = doc.get("metadata") or {}
        labels = metadata.get("labels") or {}
        return metadata if labels.get(LABEL_MANAGED_BY) == manager else None
    return None


def owned_files(
    directory: Path, *, read: Callable[[str], Workload | None]
) -> list[tuple[Path, Workload]]:
    """The files of `directory` that `read` recognizes, in name order; unreadable ones skipped."""
    if not directory.is_dir():
        return []
    found = []
    for path in sorted(directory.glob("*.yaml")):
        with contextlib.suppress(ValueError, OSError):
            workload = read(path.read_text())
            if workload is not None:
                found.append((path, workload))
    return found


def sync_files(
    directory: Path, *, texts: Mapping[str, str], owned: Sequence[tuple[str, Path]]
) -> list[str]:
    """Makes the writer's files in `directory` exactly `texts`: deletes the `owned` (id, path)
    files `texts` lacks, writes the changed ones; the folder goes when nothing is left in it."""
    changed: list[str] = []
    for workload_id, path in owned:
        if workload_id not in texts:
            path.unlink(missing_ok=True)
            changed.append(workload_id)
    for workload_id, text in sorted(texts.items()):
        path = directory / f"{workload_id}.yaml"
        if path.exists() and path.read_text() == text:
            continue
        write_atomically(path, text)
        changed.append(workload_id)
    with contextlib.suppress(OSError):  # the other writer's files, or people's: it stays
        if directory.is_dir() and not any(directory.iterdir()):
            directory.rmdir()
    return changed


def write_atomically(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, partial = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".partial")
    try:
        with os.fdopen(fd, "w") as file:
            file.write(text)
        os.replace(partial, path)
    except BaseException:
        Path(partial).unlink(missing_ok=True)
        raise
