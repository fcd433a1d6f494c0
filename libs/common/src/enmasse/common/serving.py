"""How every EnMasse-py service serves gRPC.

`start_server` takes the servicers to register (through their generated `add_*_to_server`
functions), adds the standard health service (grpcio-health-checking) and server reflection, binds
a loopback or wildcard address (port 0 picks a free port: tests and `enmasse up` read it back) and
starts. Health starts as SERVING for the overall server and each named service; callers flip it to
NOT_SERVING while they drain or lose their backing store.

`write_port_file` publishes the bound port for whoever started the process (tests, `enmasse up`),
and `until_terminated` is how a service's main waits for SIGTERM/SIGINT before it drains.

Why one function: every service must look the same from outside (health probes in Kubernetes,
reflection for grpcurl-style debugging), and nobody should have to remember the wiring.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import grpc
from enmasse.common import tracing
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

Registration = tuple[Callable[[object, grpc.aio.Server], None], object, str]
"""(add_XServicer_to_server, servicer instance, full service name) for each service served."""


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
) -> RunningServer:
    # OpenTelemetry's interceptor first (when tracing is configured), so the span covers the rest.
    traced = [*tracing.server_interceptors(), *interceptors]
    server = grpc.aio.server(interceptors=traced, options=list(options))
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    names = []
    for add_to_server, servicer, name in registrations:
        add_to_server(servicer, server)
        names.append(name)
    served = [*names, reflection.SERVICE_NAME, health.SERVICE_NAME]
    reflection.enable_server_reflection(served, server)
    bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise OSError(f"could not bind gRPC port {host}:{port}")
    await server.start()
    running = RunningServer(server=server, port=bound, health=health_servicer)
    for name in ["", *names]:
        await running.set_serving(True, service=name)
    return running


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
