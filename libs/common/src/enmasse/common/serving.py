"""How every EnMasse-py service serves gRPC.

`start_server` takes the servicers to register (through their generated `add_*_to_server`
functions), adds the standard health service (grpcio-health-checking) and server reflection, binds
a loopback or wildcard address (port 0 picks a free port: tests and `enmasse up` read it back) and
starts. Health starts as SERVING for the overall server and each named service; callers flip it to
NOT_SERVING while they drain or lose their backing store.

`write_port_file` publishes the bound port for whoever started the process (tests, `enmasse up`),
and `until_terminated` is how a service's main waits for SIGTERM/SIGINT before it drains.

Transport security: given a `TlsFiles` (the service's `--tls-dir`: `tls.crt`, `tls.key`,
`ca.crt`, as `enmasse up` and cert-manager lay them out) the port speaks TLS only and requires a
client certificate from that CA (mutual TLS): a plaintext client or one whose certificate another
CA signed never gets a call through. `caller_roles` narrows who may call further: only a client
certificate whose subject names one of those roles (its OU; RouterAdmin and BrokerAdmin accept
`control-plane` only) reaches a servicer, anyone else gets PERMISSION_DENIED; health stays open to
any certificate of the CA, so probes need no special identity, and `method_roles` names the
methods that admit other roles (one broker asks another to prepare a drain; the operator's
certificate may read). Without TLS the port is plaintext as before (tests, benches) and
`start_server` logs a warning that says so.

`require_client_certificate=False` (the config service, whose every call carries a bearer token:
its callers are told apart by token, and a tenant holds nothing else) keeps the port TLS-only but
lets a client in without a certificate. grpcio offers only "require and verify" or "do not ask":
its Python API has no "verify when one is presented" (gRPC core's
REQUEST_CLIENT_CERTIFICATE_AND_VERIFY), so such a port does not ask, and a certificate a client
holds is neither checked nor a credential there: the token alone says who calls.

Why one function: every service must look the same from outside (health probes in Kubernetes,
reflection for grpcurl-style debugging), and nobody should have to remember the wiring.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import signal
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

import grpc
import structlog
from enmasse.common import tracing
from enmasse.common.certificates import TlsFiles, roles_of
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

Registration = tuple[Callable[[object, grpc.aio.Server], None], object, str]
"""(add_XServicer_to_server, servicer instance, full service name) for each service served."""

log = structlog.get_logger("enmasse.serving")

OPEN_TO_ANY_PEER = frozenset({health.SERVICE_NAME})
"""Services any certificate of the CA may call whatever `caller_roles` says (probes)."""


@dataclass
class RunningServer:
    server: grpc.aio.Server
    port: int
    health: health.aio.HealthServicer

    async def set_serving(self, serving: bool, *, service: str = "") -> None:
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if serving
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        await self.health.set(service, status)

    async def stop(self, *, grace: float = 2.0) -> None:
        await self.health.enter_graceful_shutdown()
        await self.server.stop(grace)


async def start_server(
    *,
    registrations: Sequence[Registration],
    host: str = "127.0.0.1",
    port: int = 0,
    interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
    options: Sequence[tuple[str, object]] = (),
    tls: TlsFiles | None = None,
    caller_roles: Collection[str] = (),
    method_roles: Mapping[str, Collection[str]] | None = None,
    require_client_certificate: bool = True,
) -> RunningServer:
    gate = (
        [CallerRoleGate(frozenset(caller_roles), methods=method_roles or {})]
        if tls is not None and caller_roles
        else []
    )
    # OpenTelemetry's interceptor first (when tracing is configured), so the span covers the rest.
    traced = [*tracing.server_interceptors(), *gate, *interceptors]
    server = grpc.aio.server(interceptors=traced, options=list(options))
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    names = []
    for add_to_server, servicer, name in registrations:
        add_to_server(servicer, server)
        names.append(name)
    served = [*names, reflection.SERVICE_NAME, health.SERVICE_NAME]
    reflection.enable_server_reflection(served, server)
    bound = _bind(
        server,
        address=f"{host}:{port}",
        tls=tls,
        names=names,
        require_client_certificate=require_client_certificate,
    )
    if bound == 0:
        raise OSError(f"could not bind gRPC port {host}:{port}")
    await server.start()
    running = RunningServer(server=server, port=bound, health=health_servicer)
    for name in ["", *names]:
        await running.set_serving(True, service=name)
    return running


def server_credentials(
    tls: TlsFiles, *, require_client_certificate: bool = True
) -> grpc.ServerCredentials:
    """TLS with a required client certificate signed by `tls`'s CA (mutual TLS); without
    `require_client_certificate`, TLS that asks the client for no certificate."""
    chain, key, authority = tls.read()
    if not require_client_certificate:
        return grpc.ssl_server_credentials([(key, chain)])
    return grpc.ssl_server_credentials(
        [(key, chain)], root_certificates=authority, require_client_auth=True
    )


def _bind(
    server: grpc.aio.Server,
    *,
    address: str,
    tls: TlsFiles | None,
    names: list[str],
    require_client_certificate: bool,
) -> int:
    if tls is not None:
        credentials = server_credentials(tls, require_client_certificate=require_client_certificate)
        return server.add_secure_port(address, credentials)
    log.warning("grpc_plaintext", address=address, services=names, hint="give --tls-dir for mTLS")
    return server.add_insecure_port(address)


def _caller_roles(context: grpc.aio.ServicerContext) -> tuple[str, ...]:
    certificates = context.auth_context().get("x509_pem_cert", [])
    return roles_of(certificates[0]) if certificates else ()


class CallerRoleGate(grpc.aio.ServerInterceptor):
    """Lets a call reach its servicer only when the peer's certificate names an allowed role."""

    def __init__(self, roles: frozenset[str], *, methods: Mapping[str, Collection[str]]) -> None:
        self._roles = roles
        self._methods = {method: frozenset(allowed) for method, allowed in methods.items()}

    async def intercept_service(self, continuation, handler_call_details):  # type: ignore[no-untyped-def]
        handler = await continuation(handler_call_details)
        service = handler_call_details.method.lstrip("/").split("/", 1)[0]
        if handler is None or service in OPEN_TO_ANY_PEER:
            return handler
        method = handler_call_details.method
        return _gated(handler, self._methods.get(method, self._roles))


def _gated(handler: grpc.RpcMethodHandler, roles: frozenset[str]) -> grpc.RpcMethodHandler:
    """`handler` with every behaviour first checking the caller's roles."""

    async def refuse(context: grpc.aio.ServicerContext) -> None:
        if not roles.intersection(_caller_roles(context)):
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, "caller role not allowed")

    def unary(behaviour):  # type: ignore[no-untyped-def]
        async def checked(request, context):  # type: ignore[no-untyped-def]
            await refuse(context)
            answer = behaviour(request, context)
            return await answer if inspect.isawaitable(answer) else answer

        return checked

    def streaming(behaviour):  # type: ignore[no-untyped-def]
        async def checked(request, context):  # type: ignore[no-untyped-def]
            await refuse(context)
            async for response in behaviour(request, context):
                yield response

        return checked

    wrap = {
        "unary_unary": (grpc.unary_unary_rpc_method_handler, unary),
        "unary_stream": (grpc.unary_stream_rpc_method_handler, streaming),
        "stream_unary": (grpc.stream_unary_rpc_method_handler, unary),
        "stream_stream": (grpc.stream_stream_rpc_method_handler, streaming),
    }
    for kind, (make, around) in wrap.items():
        behaviour = getattr(handler, kind)
        if behaviour is not None:
            return make(
                around(behaviour),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
    return handler


def write_port_file(path: str | os.PathLike[str], port: int) -> None:
    """Writes `port` to `path` atomically (a reader never sees a half-written number)."""
    partial = f"{os.fspath(path)}.partial"
    with open(partial, "w") as file:
        file.write(f"{port}\n")
    os.replace(partial, path)


async def until_terminated() -> None:
    """Returns when the process gets SIGTERM (supervisor, Kubernetes) or SIGINT (Ctrl-C)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
