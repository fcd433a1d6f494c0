"""`enmasse-router`: start-up and wiring of one router process, nothing else.

The engine (one epoll loop) runs on the main thread with its listeners: the client port, the
client TLS port (amqps, with --tls-cert/--tls-key) and the inter-router port; RouterAdmin
(grpc.aio) runs on its own thread and posts into the engine; with --metrics-port, Prometheus
metrics (`metrics.RouterMetrics`, read from the engine on each scrape) are served from a thread of
their own. Chosen ports (port 0 picks free ones)
are written as JSON to --ports-file once everything listens, which is how tests and `enmasse up`
find them. An optional --config file (a RouterConfig in protobuf JSON) is applied before the first
client can connect; otherwise the router-agent pushes one. SIGTERM makes the router leave its
space (`departure.py`: its clients redirected to a peer between deliveries, then the engine
stops); SIGINT stops the engine at once.
The parts meet here: the `Router` gets its handler factory (`handlers.RouterHandlers`), whose
handlers the listeners use too, and RouterAdmin its `AdminView` over the router.

Who gets in (`access.py`): with --tls-dir (the router's certificate: tls.crt, tls.key, ca.crt;
`enmasse up` and cert-manager give every router one) the inter-router port speaks mutual TLS: it
takes only peers whose client certificate that CA signed, and this router presents its own to
its peers and to the brokers it dials, and verifies theirs. With --mesh-secret-file too (every
rendered router), a peer must also log in with SASL PLAIN and the space's secret, inside the TLS:
the certificate says "a router of this installation", the secret "of this space". Without
--tls-dir the mesh runs over plain TCP, and without a secret the mesh port is open to anyone who
reaches it (warnings say so; tests and benches run so). Refused peers are logged with who and why
(`inter_router.py`).
--client-auth says whether the client port checks logins against the configured users
(`enmasse.amqp.logins.UserLogins`, as a brokered space's broker does):
`anonymous` (no check at all, the default: tests and benches), `optional` (SCRAM and PLAIN checked
when given, ANONYMOUS and PLAIN without TLS allowed) or `required` (what every rendered router
runs: SCRAM, PLAIN over TLS, and ANONYMOUS or PLAIN without TLS only when the space plan allows
them, as the pushed RouterConfig says), on the amqps port too (the engine then does TLS itself,
under its SASL). Failed logins are throttled per peer and per user by the engine
(`enmasse.amqp.throttle`).
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import signal
import threading
from pathlib import Path

import click
import structlog
from enmasse.amqp import sasl
from enmasse.amqp.engine import Engine, Tls, settle_gc_for_message_loop
from enmasse.amqp.logins import UserLogins
from enmasse.amqp.throttle import LoginThrottle
from enmasse.amqp.tls import mutual_tls
from enmasse.common.certificates import (
    CONTROL_PLANE,
    OPERATOR,
    TLS_DIR_ENV,
    TlsFiles,
    tls_dir_files,
)
from enmasse.common.logging import configure_logging
from enmasse.common.metrics import METRICS_PORT, serve_metrics
from enmasse.common.serving import start_server
from enmasse.common.tracing import configure_service_tracing
from enmasse.router.access import MeshSecret, MeshSecretError, world_readable
from enmasse.router.admin import OPERATOR_CALLS, SERVICE_NAME, AdminView, RouterAdminServicer
from enmasse.router.departure import Departure
from enmasse.router.forwarding import Router
from enmasse.router.handlers import RouterHandlers
from enmasse.router.metrics import RouterMetrics
from enmasse.v1 import router_pb2, router_pb2_grpc
from google.protobuf import json_format
from prometheus_client import REGISTRY

log = structlog.get_logger("enmasse.router")


def _serve_admin(
    *,
    engine: Engine,
    view: AdminView,
    host: str,
    port: int,
    bound: list[int],
    ready: threading.Event,
    tls: TlsFiles | None,
) -> None:
    async def serve() -> None:
        servicer = RouterAdminServicer(engine=engine, view=view)
        running = await start_server(
            registrations=[
                (router_pb2_grpc.add_RouterAdminServicer_to_server, servicer, SERVICE_NAME)
            ],
            host=host,
            port=port,
            tls=tls,
            caller_roles=(CONTROL_PLANE,),  # the router-agent; routers and clients never
            # `enmasse status` reads; the console closes a client's connection (never configures)
            method_roles=dict.fromkeys(OPERATOR_CALLS, (CONTROL_PLANE, OPERATOR)),
        )
        bound.append(running.port)
        ready.set()
        await running.server.wait_for_termination()

    asyncio.run(serve())


def _write_ports(path: Path, ports: dict[str, int]) -> None:
    # Written whole then renamed: a reader polling for the file never sees half of it.
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(ports))
    os.replace(partial, path)


CLIENT_AUTH = ("anonymous", "optional", "required")


def _client_tls(*, cert: str | None, key: str | None) -> Tls | None:
    if (cert is None) != (key is None):
        raise click.UsageError("--tls-cert and --tls-key go together")
    if cert is None:
        return None
    return Tls(cert_file=cert, key_file=key)


def _mesh_secret(path: Path | None) -> MeshSecret | None:
    if path is None:
        return None
    try:
        return MeshSecret.read(path)
    except MeshSecretError as error:
        raise click.BadParameter(str(error), param_hint="--mesh-secret-file") from None


def _own_certificate(tls_dir: str | None) -> TlsFiles | None:
    try:
        return tls_dir_files(tls_dir)
    except FileNotFoundError as error:  # half a certificate must not fall back to plain TCP
        raise click.BadParameter(str(error), param_hint="--tls-dir") from None


def _warn_of_weak_mesh(*, internal_tls: Tls | None, secret_file: Path | None) -> None:
    """Says so when the mesh is less than mutual TLS plus the space's secret."""
    if internal_tls is None:
        log.warning(
            "inter-router port and broker links without TLS: peers are not authenticated "
            "by certificate and the mesh travels in clear",
            hint="pass --tls-dir",
        )
    if secret_file is None and internal_tls is None:
        log.warning(
            "inter-router port open: any peer that reaches it joins the mesh",
            hint="pass --mesh-secret-file",
        )
    elif secret_file is not None and world_readable(secret_file):
        log.warning("mesh secret file is readable by every user", path=str(secret_file))


@click.command()
@click.option("--router-id", required=True, help="This router's id in the mesh (no '/').")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=5672, show_default=True, help="Client AMQP port (0: free port).")
@click.option("--inter-router-port", default=55672, show_default=True)
@click.option("--admin-port", default=0, show_default=True, help="RouterAdmin gRPC port.")
@click.option(
    "--metrics-port",
    type=int,
    default=None,
    help=f"Prometheus metrics port (0: free port; {METRICS_PORT} in a cluster); none: no metrics.",
)
@click.option("--config", "config_path", type=click.Path(exists=True, dir_okay=False))
@click.option("--ports-file", type=click.Path(dir_okay=False))
@click.option("--idle-timeout", default=16.0, show_default=True, help="Seconds; 0 turns it off.")
@click.option("--max-message-size", default=0, show_default=True, help="Bytes; 0: no limit.")
@click.option("--max-frame-size", default=65536, show_default=True)
@click.option(
    "--leave-timeout",
    default=5.0,
    show_default=True,
    help="On SIGTERM: seconds to wait for each client connection to have nothing in flight "
    "before it is redirected to another router of the space (departure.py); below the grace "
    "period of supervisord (10 s) and Kubernetes (30 s).",
)
@click.option(
    "--mesh-secret-file",
    type=click.Path(dir_okay=False, path_type=Path),
    envvar="ENMASSE_MESH_SECRET_FILE",
    help="The space's inter-router secret; without it the inter-router port is open.",
)
@click.option(
    "--client-auth",
    type=click.Choice(CLIENT_AUTH),
    default="anonymous",
    show_default=True,
    envvar="ENMASSE_CLIENT_AUTH",
    help="Check logins on the client port against the configured users (required: and the plan).",
)
@click.option("--tls-cert", type=click.Path(exists=True, dir_okay=False), help="amqps cert (PEM).")
@click.option("--tls-key", type=click.Path(exists=True, dir_okay=False), help="amqps key (PEM).")
@click.option("--amqps-port", default=5671, show_default=True, help="TLS client port (0: free).")
@click.option(
    "--tls-dir",
    type=click.Path(file_okay=False),
    envvar=TLS_DIR_ENV,
    help="This router's certificate (tls.crt, tls.key, ca.crt): mutual TLS on RouterAdmin "
    "(control-plane callers; an operator certificate reads and closes connections), the "
    "inter-router mesh and the "
    "links to brokers; none: plain.",
)
def main(
    router_id: str,
    host: str,
    port: int,
    inter_router_port: int,
    admin_port: int,
    metrics_port: int | None,
    config_path: str | None,
    ports_file: str | None,
    idle_timeout: float,
    max_message_size: int,
    max_frame_size: int,
    leave_timeout: float,
    mesh_secret_file: Path | None,
    client_auth: str,
    tls_cert: str | None,
    tls_key: str | None,
    amqps_port: int,
    tls_dir: str | None,
) -> None:
    """Runs one router of an address space."""
    if "/" in router_id or not router_id:
        raise click.BadParameter("must be non-empty and contain no '/'", param_hint="--router-id")
    tls = _client_tls(cert=tls_cert, key=tls_key)
    secret = _mesh_secret(mesh_secret_file)
    own_certificate = _own_certificate(tls_dir)
    internal_tls = mutual_tls(own_certificate) if own_certificate is not None else None
    configure_logging(service="router")
    configure_service_tracing(service="router")
    engine = Engine(container_id=router_id)
    router = Router(
        router_id=router_id,
        engine=engine,
        handlers=RouterHandlers,
        idle_timeout=idle_timeout or None,
    )
    router.mesh_links.secret = secret
    router.mesh_links.tls = internal_tls
    router.broker_links.tls = internal_tls
    view = AdminView(router)
    if config_path:
        pushed = json_format.Parse(Path(config_path).read_text(), router_pb2.RouterConfig())
        view.apply_config(pushed)
    listen_for_clients = functools.partial(
        engine.listen,
        host=host,
        handler_factory=router.handlers.client,
        idle_timeout=idle_timeout or None,
        max_message_size=max_message_size,
        max_frame_size=max_frame_size,
        authenticator=(
            UserLogins(lambda: router.config, lax=client_auth == "optional")
            if client_auth != "anonymous"
            else None
        ),
        throttle=LoginThrottle(),  # one count of failures for the plain and the amqps port
        offered_capabilities=("ANONYMOUS-RELAY",),  # a sender with no target: by each `to`
    )
    ports = {"amqp": listen_for_clients(port=port)}
    if tls is not None:
        ports["amqps"] = listen_for_clients(port=amqps_port, tls=tls)
    _warn_of_weak_mesh(internal_tls=internal_tls, secret_file=mesh_secret_file)
    ports["inter_router"] = engine.listen(
        host=host,
        port=inter_router_port,
        handler_factory=router.handlers.mesh,
        idle_timeout=idle_timeout or None,
        # Mutual TLS with the router's certificate (when it has one); inside it the mesh logs
        # in with PLAIN and the space's secret, a second factor. ANONYMOUS is never offered
        # there, nor PLAIN in clear once there is TLS.
        tls=internal_tls,
        authenticator=(
            sasl.Passwords(secret.admits, allow_plain_without_tls=internal_tls is None)
            if secret is not None
            else None
        ),
    )
    bound: list[int] = []
    ready = threading.Event()
    threading.Thread(
        target=_serve_admin,
        kwargs={
            "engine": engine,
            "view": view,
            "host": host,
            "port": admin_port,
            "bound": bound,
            "ready": ready,
            "tls": own_certificate,
        },
        name="router-admin",
        daemon=True,
    ).start()
    if not ready.wait(30):
        raise click.ClickException("RouterAdmin did not start within 30 s")
    ports["admin"] = bound[0]
    if metrics_port is not None:
        REGISTRY.register(RouterMetrics(engine=engine, router=router))
        ports["metrics"] = serve_metrics(host=host, port=metrics_port)
    if ports_file:
        _write_ports(Path(ports_file), ports)
    log.info("router listening", router=router_id, **ports)
    router.start_housekeeping()
    departure = Departure(
        router=router,
        engine=engine,
        client_ports=[ports[name] for name in ("amqp", "amqps") if name in ports],
        timeout=leave_timeout,
    )
    # SIGTERM: leave the space (clients redirected between deliveries); SIGINT: stop now.
    signal.signal(signal.SIGTERM, lambda *_: engine.call_soon_threadsafe(departure.begin))
    signal.signal(signal.SIGINT, lambda *_: engine.stop())
    settle_gc_for_message_loop()
    engine.run()
    log.info("router stopped", router=router_id)


if __name__ == "__main__":
    main()
