"""Router workloads as Kubernetes manifests in the GitOps output, and read back for `enmasse up`.

In: the standard address spaces (and how many routers each gets). Out: one YAML file per router,
`<gitops-dir>/workloads/<space>/<router-id>.yaml`, holding a Service and a StatefulSet (one
replica), beside the broker files the storage-controller renders into the same directory. In a
cluster Argo CD applies the directory; locally the runtime reads the very same files and starts
each router with `local_router_command`.

Rendering is pure and deterministic (fixed key order, no timestamps): re-rendering an unchanged
space changes no byte. `RouterWorkloads.write_space` writes only files whose text changed
(atomically: temp file, then rename) and deletes only files it rendered itself (the managed-by
label), so broker workloads and people's files in the same directory are left alone.

The contract with the local runtime (StatefulSet metadata, as for brokers):
- labels `app.kubernetes.io/component: router`, `app.kubernetes.io/managed-by:
  enmasse-router-agent`, `enmasse.io/space: <space>`, `enmasse.io/router: <router-id>`;
- annotations `enmasse.io/local-amqp-port`, `enmasse.io/local-inter-router-port` and
  `enmasse.io/local-admin-port`: the loopback ports the local runtime starts it on, chosen free
  when the router is first rendered and kept from then on (clients and peers keep them across
  restarts). The router writes them back to `<var>/routers/<space>/<id>/ports.json`, which is
  where the agent's directory finds it.

Who gets in: every router runs `--client-auth=optional` (SASL PLAIN logins are checked against
the space's MessagingUsers, which the agent pushes; ANONYMOUS still allowed) and
`--mesh-secret-file`, the secret all routers of the space log in to each other with. The secret
is never rendered into the GitOps output (it is git): in a cluster it is the Kubernetes Secret
`<space>-router-mesh` (key `secret`), created beside the output, mounted read-only; locally it is
`<var>/routers/<space>/mesh-secret`, written once (mode 0600) by `ensure_local_mesh_secret`
before the runtime starts the space's routers.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from enmasse.resources.workload_files import owned_files, sync_files

IMAGE = "enmasse-py/router"
MANAGER = "enmasse-router-agent"
AMQP_PORT = 5672
INTER_ROUTER_PORT = 55672
ADMIN_PORT = 5691
WORKLOADS = "workloads"

LABEL_SPACE = "enmasse.io/space"
LABEL_ROUTER = "enmasse.io/router"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
ANNOTATION_AMQP_PORT = "enmasse.io/local-amqp-port"
ANNOTATION_INTER_ROUTER_PORT = "enmasse.io/local-inter-router-port"
ANNOTATION_ADMIN_PORT = "enmasse.io/local-admin-port"
CLIENT_AUTH = "optional"
MESH_SECRET_DIR = "/etc/enmasse/mesh"
MESH_SECRET_KEY = "secret"
LOCAL_MESH_SECRET = "mesh-secret"


@dataclass(frozen=True)
class LocalRouterPorts:
    amqp: int
    inter_router: int
    admin: int


@dataclass(frozen=True)
class RouterWorkload:
    space: str
    router_id: str
    ports: LocalRouterPorts


class WorkloadError(ValueError):
    """A router workload file that does not say what the contract above says."""


def router_ids(count: int) -> list[str]:
    return [f"router-{i}" for i in range(count)]


def render_router(workload: RouterWorkload, *, image: str = IMAGE) -> str:
    """The Service and StatefulSet of one router, as YAML text."""
    space, router_id, ports = workload.space, workload.router_id, workload.ports
    labels = {
        "app.kubernetes.io/name": "router",
        "app.kubernetes.io/component": "router",
        "app.kubernetes.io/part-of": "enmasse",
        LABEL_MANAGED_BY: MANAGER,
        LABEL_SPACE: space,
        LABEL_ROUTER: router_id,
    }
    selector = {LABEL_SPACE: space, LABEL_ROUTER: router_id}
    annotations = {
        ANNOTATION_AMQP_PORT: str(ports.amqp),
        ANNOTATION_INTER_ROUTER_PORT: str(ports.inter_router),
        ANNOTATION_ADMIN_PORT: str(ports.admin),
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": f"{space}-{router_id}", "labels": labels},
        "spec": {
            "selector": selector,
            "ports": [
                {"name": "amqp", "port": AMQP_PORT, "targetPort": "amqp"},
                {"name": "inter-router", "port": INTER_ROUTER_PORT, "targetPort": "inter-router"},
                {"name": "admin", "port": ADMIN_PORT, "targetPort": "admin"},
            ],
        },
    }
    stateful_set = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": f"{space}-{router_id}", "labels": labels, "annotations": annotations},
        "spec": {
            "serviceName": f"{space}-{router_id}",
            "replicas": 1,
            "selector": {"matchLabels": selector},
            "template": {
                "metadata": {"labels": labels},
                "spec": _pod_spec(space=space, router_id=router_id, image=image),
            },
        },
    }
    header = f"# Router {router_id} of address space {space}: rendered by {MANAGER}; do not edit.\n"
    return header + yaml.safe_dump_all(
        [service, stateful_set], sort_keys=False, default_flow_style=False, explicit_start=True
    )


def mesh_secret_name(space: str) -> str:
    """The Kubernetes Secret holding the space's inter-router secret (key `secret`)."""
    return f"{space}-router-mesh"


def _pod_spec(*, space: str, router_id: str, image: str) -> dict[str, Any]:
    return {
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": 10001,
            "runAsGroup": 10001,
            "fsGroup": 10001,  # the mounted mesh secret is group-readable, not world-readable
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "volumes": [
            {
                "name": "mesh-secret",
                "secret": {"secretName": mesh_secret_name(space), "defaultMode": 0o440},
            }
        ],
        "containers": [
            {
                "name": "router",
                "image": image,
                "args": [
                    f"--router-id={router_id}",
                    "--host=0.0.0.0",
                    f"--port={AMQP_PORT}",
                    f"--inter-router-port={INTER_ROUTER_PORT}",
                    f"--admin-port={ADMIN_PORT}",
                    f"--client-auth={CLIENT_AUTH}",
                    f"--mesh-secret-file={MESH_SECRET_DIR}/{MESH_SECRET_KEY}",
                ],
                "volumeMounts": [
                    {"name": "mesh-secret", "mountPath": MESH_SECRET_DIR, "readOnly": True}
                ],
                "ports": [
                    {"name": "amqp", "containerPort": AMQP_PORT},
                    {"name": "inter-router", "containerPort": INTER_ROUTER_PORT},
                    {"name": "admin", "containerPort": ADMIN_PORT},
                ],
                "readinessProbe": {"grpc": {"port": ADMIN_PORT}, "periodSeconds": 5},
                "securityContext": {
                    "allowPrivilegeEscalation": False,
                    "readOnlyRootFilesystem": True,
                    "capabilities": {"drop": ["ALL"]},
                },
            }
        ],
    }


def read_router(text: str) -> RouterWorkload | None:
    """The router a file describes; None for a file that is not one of ours."""
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
        annotations = metadata.get("annotations") or {}
        try:
            return RouterWorkload(
                space=labels[LABEL_SPACE],
                router_id=labels[LABEL_ROUTER],
                ports=LocalRouterPorts(
                    amqp=int(annotations[ANNOTATION_AMQP_PORT]),
                    inter_router=int(annotations[ANNOTATION_INTER_ROUTER_PORT]),
                    admin=int(annotations[ANNOTATION_ADMIN_PORT]),
                ),
            )
        except (KeyError, ValueError) as error:
            raise WorkloadError(f"router workload lacks a readable {error}") from error
    return None


def local_router_dir(workload: RouterWorkload, *, var_dir: Path) -> Path:
    """<var>/routers/<space>/<id>/: the router's ports file goes there (the runtime creates
    the directory before it starts the router; the router does not)."""
    return var_dir / "routers" / workload.space / workload.router_id


def local_mesh_secret(*, space: str, var_dir: Path) -> Path:
    """<var>/routers/<space>/mesh-secret: the secret every local router of the space shares."""
    return var_dir / "routers" / space / LOCAL_MESH_SECRET


def ensure_local_mesh_secret(*, space: str, var_dir: Path) -> Path:
    """Writes the space's mesh secret once (0600, random); an existing one is kept, so routers
    restarted later still agree with the ones running."""
    path = local_mesh_secret(space=space, var_dir=var_dir)
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(secrets.token_urlsafe(32) + "\n")
    # link() fails if the secret appeared meanwhile: a racing writer's secret wins, whole.
    with contextlib.suppress(FileExistsError):
        os.link(partial, path)
    partial.unlink()
    return path


def local_router_command(
    workload: RouterWorkload, *, var_dir: Path, executable: str | None = None
) -> list[str]:
    """How the local runtime starts a rendered router: its pinned ports, the ports file in
    `local_router_dir`, which the agent's directory reads, and the space's mesh secret (made by
    `ensure_local_mesh_secret` first)."""
    ports_file = local_router_dir(workload, var_dir=var_dir) / "ports.json"
    program = executable or str(Path(sys.executable).parent / "enmasse-router")
    return [
        program,
        f"--router-id={workload.router_id}",
        "--host=127.0.0.1",
        f"--port={workload.ports.amqp}",
        f"--inter-router-port={workload.ports.inter_router}",
        f"--admin-port={workload.ports.admin}",
        f"--ports-file={ports_file}",
        f"--client-auth={CLIENT_AUTH}",
        f"--mesh-secret-file={local_mesh_secret(space=workload.space, var_dir=var_dir)}",
    ]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def fresh_ports(port: Callable[[], int] = free_port) -> LocalRouterPorts:
    chosen: list[int] = []
    while len(chosen) < 3:  # the kernel may hand the same free port out twice
        candidate = port()
        if candidate not in chosen:
            chosen.append(candidate)
    return LocalRouterPorts(amqp=chosen[0], inter_router=chosen[1], admin=chosen[2])


class RouterWorkloads:
    """`<root>/workloads/<space>/<router-id>.yaml` for every router the agent rendered."""

    def __init__(self, root: Path, *, routers_per_space: int = 1) -> None:
        self.workloads = Path(root) / WORKLOADS
        self.routers_per_space = routers_per_space

    def spaces(self) -> list[str]:
        if not self.workloads.is_dir():
            return []
        return sorted(p.name for p in self.workloads.iterdir() if p.is_dir() and self._ours(p.name))

    def read_space(self, space: str) -> dict[str, RouterWorkload]:
        return {w.router_id: w for _, w in self._ours(space)}

    def ensure_space(self, space: str) -> list[str]:
        """Renders the space's routers, keeping each one's ports; returns the ids written."""
        have = self.read_space(space)
        texts = {
            router_id: render_router(
                RouterWorkload(
                    space=space,
                    router_id=router_id,
                    ports=have[router_id].ports if router_id in have else fresh_ports(),
                )
            )
            for router_id in router_ids(self.routers_per_space)
        }
        return self._write_space(space, texts)

    def remove_space(self, space: str) -> list[str]:
        return self._write_space(space, {})

    def _write_space(self, space: str, texts: Mapping[str, str]) -> list[str]:
        owned = [(w.router_id, path) for path, w in self._ours(space)]
        return sync_files(self.workloads / space, texts=texts, owned=owned)

    def _ours(self, space: str) -> list[tuple[Path, RouterWorkload]]:
        return owned_files(self.workloads / space, read=read_router)
