"""Rendered routers: what a router file in the GitOps output says, and how one runs locally.

In: the files the router-agent renders, `<gitops-dir>/workloads/<space>/<router-id>.yaml` (a
Service and a StatefulSet of one replica, beside the storage-controller's broker files). Out: a
`RouterWorkload` per file (`read_router`; None for a file that is somebody else's), the spaces
that have routers (`RenderedRouters`), and for the local runtime the command line, the working
directory and the mesh secret of each router. The router-agent renders these files (its
`workloads` module builds on `RenderedRouters`); `enmasse up` reads them: the contract sits here,
between the two, so that neither imports the other.

The contract (StatefulSet metadata, as for brokers):
- labels `app.kubernetes.io/component: router`, `app.kubernetes.io/managed-by:
  enmasse-router-agent`, `enmasse.io/space: <space>`, `enmasse.io/router: <router-id>`;
- annotations `enmasse.io/local-amqp-port`, `enmasse.io/local-amqps-port`,
  `enmasse.io/local-inter-router-port` and `enmasse.io/local-admin-port`: the loopback ports the
  local runtime starts it on, chosen free when the router is first rendered and kept from then on
  (clients and peers keep them across restarts). The router writes them back to
  `<var>/routers/<space>/<id>/ports.json`, which is where the agent's directory finds it.

How many routers a standard space runs is its plan's (`plan_routers`): `min_routers`, and at
least one; validation keeps it within `max_routers`.

Every router is a client endpoint on two ports: amqp (plain TCP) and amqps (TLS with a
certificate naming that router: in a cluster the Certificate rendered beside it, locally one the
runtime issues, `local_router_command`'s `endpoint_tls`).

Who gets in: every router runs `--client-auth=required` (SCRAM and PLAIN logins are checked
against the space's MessagingUsers; ANONYMOUS, and PLAIN without TLS, only where the space plan
allows them, as the router-agent's RouterConfig says) and `--mesh-secret-file`, the secret all
routers of the space log in to each other with, inside the mesh's mutual TLS (the router's
certificate comes through $ENMASSE_TLS_DIR: the runtime's environment, the pod's mount). Locally
that secret is `<var>/routers/<space>/mesh-secret`, written once (mode 0600) by
`ensure_local_mesh_secret` before the runtime starts the space's routers; it is never rendered
into the output (that is git).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from enmasse.common.certificates import TlsFiles
from enmasse.resources.workload_files import (
    ANNOTATION_ADMIN_PORT,
    ANNOTATION_AMQP_PORT,
    ANNOTATION_AMQPS_PORT,
    LABEL_SPACE,
    WORKLOADS,
    WorkloadError,
    local_amqps_arguments,
    managed_statefulset,
    optional_port,
    owned_files,
    sync_files,
)
from enmasse.v1 import resources_pb2

MANAGER = "enmasse-router-agent"
LABEL_ROUTER = "enmasse.io/router"
ANNOTATION_INTER_ROUTER_PORT = "enmasse.io/local-inter-router-port"
CLIENT_AUTH = "required"
LOCAL_MESH_SECRET = "mesh-secret"


@dataclass(frozen=True)
class LocalRouterPorts:
    amqp: int
    inter_router: int
    admin: int
    amqps: int | None = None  # None: rendered before routers had one (the agent adds it)


@dataclass(frozen=True)
class RouterWorkload:
    space: str
    router_id: str
    ports: LocalRouterPorts


def read_router(text: str) -> RouterWorkload | None:
    """The router a file describes; None for a file that is not one of ours."""
    metadata = managed_statefulset(text, manager=MANAGER)
    if metadata is None:
        return None
    labels = metadata.get("labels") or {}
    annotations = metadata.get("annotations") or {}
    try:
        return RouterWorkload(
            space=labels[LABEL_SPACE],
            router_id=labels[LABEL_ROUTER],
            ports=LocalRouterPorts(
                amqp=int(annotations[ANNOTATION_AMQP_PORT]),
                inter_router=int(annotations[ANNOTATION_INTER_ROUTER_PORT]),
                admin=int(annotations[ANNOTATION_ADMIN_PORT]),
                amqps=optional_port(annotations.get(ANNOTATION_AMQPS_PORT)),
            ),
        )
    except (KeyError, ValueError) as error:
        raise WorkloadError(f"router workload lacks a readable {error}") from error


def plan_routers(quotas: resources_pb2.Quotas) -> int:
    """The routers each standard space of a plan with these quotas runs: its min_routers, and at
    least one (a space without a router has no endpoint)."""
    return max(quotas.min_routers, 1)


class RenderedRouters:
    """`<root>/workloads/<space>/<router-id>.yaml` for every router the agent rendered: read by
    anyone, written (`write_space`) by the router-agent only."""

    def __init__(self, root: Path) -> None:
        self.workloads = Path(root) / WORKLOADS

    def spaces(self) -> list[str]:
        if not self.workloads.is_dir():
            return []
        return sorted(p.name for p in self.workloads.iterdir() if p.is_dir() and self._ours(p.name))

    def read_space(self, space: str) -> dict[str, RouterWorkload]:
        return {w.router_id: w for _, w in self._ours(space)}

    def write_space(self, space: str, texts: Mapping[str, str]) -> list[str]:
        """Makes the space's router files exactly `texts` (router id -> YAML); returns the ids
        whose files were written or deleted."""
        owned = [(w.router_id, path) for path, w in self._ours(space)]
        return sync_files(self.workloads / space, texts=texts, owned=owned)

    def _ours(self, space: str) -> list[tuple[Path, RouterWorkload]]:
        return owned_files(self.workloads / space, read=read_router)


# ------------------------------------------------------------------ running one locally


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
    workload: RouterWorkload,
    *,
    var_dir: Path,
    executable: str | None = None,
    endpoint_tls: TlsFiles | None = None,
) -> list[str]:
    """How the local runtime starts a rendered router: its pinned ports, the ports file in
    `local_router_dir`, which the agent's directory reads, and the space's mesh secret (made by
    `ensure_local_mesh_secret` first); with `endpoint_tls` (the router's own amqps certificate)
    and a pinned amqps port, its amqps listener too."""
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
        *local_amqps_arguments(endpoint_tls, port=workload.ports.amqps),
    ]
