"""Router workloads rendered as Kubernetes manifests into the GitOps output.

In: the standard address spaces and how many routers each gets (`router_count`: its plan's
`min_routers`, at least one, or `--routers-per-space` where given, for tests and local runs; with
the reason, which the GitOps write-back commits as the message). Out: one YAML file per router,
`<gitops-dir>/workloads/<space>/<router-id>.yaml`, holding a Service, the cert-manager Certificate
of the router's amqps port and a StatefulSet (one replica), beside the broker files the
storage-controller renders into the same directory. In a
cluster Argo CD applies the directory; locally the runtime reads the very same files and starts
each router as `enmasse.resources.rendered_routers.local_router_command` says.

Rendering is pure and deterministic (fixed key order, no timestamps): re-rendering an unchanged
space changes no byte. `RouterWorkloads.ensure_space` writes only files whose text changed
(atomically: temp file, then rename) and deletes only files it rendered itself (the managed-by
label), so broker workloads and people's files in the same directory are left alone.

The labels and annotations are the contract with everyone who reads the output: they are named,
and read back, in `enmasse.resources.rendered_routers`; what is the agent's own here is the shape
of the pod (image, ports, the mounted mesh secret) and the choice of fresh local ports.

The mesh secret is never rendered into the GitOps output (it is git): in a cluster it is the
Kubernetes Secret `<space>-router-mesh` (key `secret`), created beside the output, mounted
read-only; locally it is a file the runtime writes (`ensure_local_mesh_secret`). Neither is the
router's certificate: every router mounts the Secret `enmasse-router-tls` (role `data-plane`,
issued by cert-manager) and reads it through `$ENMASSE_TLS_DIR`; its RouterAdmin port then
speaks mutual TLS, so readiness is the exec probe of `workload_files.health_probe`, and so do
its inter-router port (the secret's login inside the TLS) and its links to the space's brokers.
Its clients' amqps port (5671, beside amqp 5672) presents a certificate of its own: the
Certificate `<space>-<router-id>-amqps-tls` rendered in the same file (role `endpoint`, the
router's Service names, issuer `enmasse-ca`), mounted at /etc/enmasse/tls.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import yaml
from enmasse.common.metrics import METRICS_PORT
from enmasse.common.ports import unclaimed_port
from enmasse.resources.rendered_routers import (
    ANNOTATION_INTER_ROUTER_PORT,
    CLIENT_AUTH,
    LABEL_ROUTER,
    MANAGER,
    LocalRouterPorts,
    RenderedRouters,
    RouterWorkload,
    plan_routers,
)
from enmasse.resources.workload_files import (
    AMQPS_PORT,
    ANNOTATION_ADMIN_PORT,
    ANNOTATION_AMQP_PORT,
    ANNOTATION_AMQPS_PORT,
    LABEL_MANAGED_BY,
    LABEL_SPACE,
    ROUTER_TLS_SECRET,
    amqps_container_arguments,
    amqps_mount,
    amqps_volume,
    endpoint_certificate,
    health_probe,
    tls_env,
    tls_mounts,
    tls_volumes,
)
from enmasse.v1 import resources_pb2

IMAGE = "enmasse-py/router"
AMQP_PORT = 5672
INTER_ROUTER_PORT = 55672
ADMIN_PORT = 5691
MESH_SECRET_DIR = "/etc/enmasse/mesh"
MESH_SECRET_KEY = "secret"


def router_ids(count: int) -> list[str]:
    return [f"router-{i}" for i in range(count)]


@dataclass(frozen=True)
class RouterCount:
    """How many routers a space runs, and why (the commit message when its files change)."""

    routers: int
    why: str


def router_count(
    *,
    space: str,
    plan_name: str,
    plan: resources_pb2.AddressSpacePlan | None,
    override: int | None = None,
    rendered: int = 0,
) -> RouterCount:
    """The plan's routers (`plan_routers`), or `override` (--routers-per-space) when given.
    A plan the agent cannot see (not yet synced, or gone) keeps the `rendered` routers: no
    router is removed for want of knowing."""
    if override is not None:
        return _count(space, override, f"--routers-per-space {override}")
    if plan is None:
        kept = rendered or 1
        return _count(space, kept, f"plan {plan_name} not found: {'kept' if rendered else 'one'}")
    wanted = plan.spec.quotas.min_routers
    minimum = f"min {wanted}" if wanted > 0 else "no min_routers: one"
    return _count(space, plan_routers(plan.spec.quotas), f"plan {plan_name}: {minimum}")


def elastic_count(*, space: str, plan_name: str, routers: int, why: str) -> RouterCount:
    """A count the space's load chose (`elasticity.Elasticity`), between its plan's bounds."""
    return _count(space, routers, f"plan {plan_name}, by load: {why or 'as running'}")


def _count(space: str, routers: int, source: str) -> RouterCount:
    noun = "router" if routers == 1 else "routers"
    return RouterCount(routers, f"space {space}: {routers} {noun} ({source})")


# Rendered again on every pass, for every space, to compare with the files: the text depends on
# the workload alone, so each one is rendered once (YAML dumping was the agent's idle CPU).
@functools.lru_cache(maxsize=1024)
def render_router(workload: RouterWorkload, *, image: str = IMAGE) -> str:
    """The Service, amqps Certificate and StatefulSet of one router, as YAML text."""
    space, router_id, ports = workload.space, workload.router_id, workload.ports
    name = f"{space}-{router_id}"
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
    if ports.amqps is not None:
        annotations[ANNOTATION_AMQPS_PORT] = str(ports.amqps)
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "selector": selector,
            "ports": [
                {"name": "amqp", "port": AMQP_PORT, "targetPort": "amqp"},
                {"name": "amqps", "port": AMQPS_PORT, "targetPort": "amqps"},
                {"name": "inter-router", "port": INTER_ROUTER_PORT, "targetPort": "inter-router"},
                {"name": "admin", "port": ADMIN_PORT, "targetPort": "admin"},
            ],
        },
    }
    stateful_set = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": name, "labels": labels, "annotations": annotations},
        "spec": {
            "serviceName": name,
            "replicas": 1,
            "selector": {"matchLabels": selector},
            "template": {
                "metadata": {"labels": labels},
                "spec": _pod_spec(space=space, router_id=router_id, image=image),
            },
        },
    }
    certificate = endpoint_certificate(name, labels=labels)
    header = f"# Router {router_id} of address space {space}: rendered by {MANAGER}; do not edit.\n"
    return header + yaml.safe_dump_all(
        [service, certificate, stateful_set],
        sort_keys=False,
        default_flow_style=False,
        explicit_start=True,
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
            },
            *tls_volumes(ROUTER_TLS_SECRET),
            amqps_volume(f"{space}-{router_id}"),
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
                    f"--metrics-port={METRICS_PORT}",
                    f"--client-auth={CLIENT_AUTH}",
                    f"--mesh-secret-file={MESH_SECRET_DIR}/{MESH_SECRET_KEY}",
                    *amqps_container_arguments(),
                ],
                "env": tls_env(),
                "volumeMounts": [
                    {"name": "mesh-secret", "mountPath": MESH_SECRET_DIR, "readOnly": True},
                    *tls_mounts(),
                    amqps_mount(),
                ],
                "ports": [
                    {"name": "amqp", "containerPort": AMQP_PORT},
                    {"name": "amqps", "containerPort": AMQPS_PORT},
                    {"name": "inter-router", "containerPort": INTER_ROUTER_PORT},
                    {"name": "admin", "containerPort": ADMIN_PORT},
                    {"name": "metrics", "containerPort": METRICS_PORT},
                ],
                "readinessProbe": health_probe(ADMIN_PORT),
                "securityContext": {
                    "allowPrivilegeEscalation": False,
                    "readOnlyRootFilesystem": True,
                    "capabilities": {"drop": ["ALL"]},
                },
            }
        ],
    }


def fresh_ports(port: Callable[[], int] = unclaimed_port) -> LocalRouterPorts:
    chosen: list[int] = []
    while len(chosen) < 4:  # the kernel may hand the same free port out twice
        candidate = port()
        if candidate not in chosen:
            chosen.append(candidate)
    return LocalRouterPorts(
        amqp=chosen[0], inter_router=chosen[1], admin=chosen[2], amqps=chosen[3]
    )


def kept_ports(
    have: LocalRouterPorts | None, port: Callable[[], int] = unclaimed_port
) -> LocalRouterPorts:
    """A router's ports as rendered before (fresh ones for a new router); one rendered before
    routers had an amqps port gets one, the others kept."""
    if have is None:
        return fresh_ports(port)
    if have.amqps is not None:
        return have
    taken = {have.amqp, have.inter_router, have.admin}
    amqps = next(p for p in iter(port, None) if p not in taken)
    return replace(have, amqps=amqps)


class RouterWorkloads(RenderedRouters):
    """The agent's side of `<root>/workloads/<space>/<router-id>.yaml`: renders and writes."""

    def ensure_space(self, space: str, *, routers: int) -> list[str]:
        """Renders the space's `routers` routers (`router-0` ...; the ones beyond go), keeping
        each one's ports; returns the ids written or removed."""
        have = self.read_space(space)
        texts = {
            router_id: render_router(
                RouterWorkload(
                    space=space,
                    router_id=router_id,
                    ports=kept_ports(have[router_id].ports if router_id in have else None),
                )
            )
            for router_id in router_ids(routers)
        }
        return self.write_space(space, texts)

    def remove_space(self, space: str) -> list[str]:
        return self.write_space(space, {})
