"""RouterAdmin over gRPC: configuration pushes, stats, listings, closing a connection.

The router's state belongs to the engine thread (one epoll loop, no locks on the hot path); the
gRPC server runs its own asyncio loop in another thread. Every RPC therefore hands a plain function
to the engine with `call_soon_threadsafe` and awaits its result: reads are consistent snapshots,
writes (a new configuration, a close) happen between two engine events, never in the middle of one.

Errors map to gRPC status codes with the router's own text: a configuration that does not hold
together is INVALID_ARGUMENT (nothing changes, the running generation stays), an older generation is
FAILED_PRECONDITION, closing an unknown connection is NOT_FOUND.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable
from typing import Protocol, TypeVar

import grpc
from enmasse.router.config import ConfigError, StaleGeneration
from enmasse.v1 import router_pb2, router_pb2_grpc

T = TypeVar("T")

SERVICE_NAME = "enmasse.v1.RouterAdmin"


class EngineLoop(Protocol):
    def call_soon_threadsafe(self, fn: Callable[[], object]) -> object: ...


class AdminView(Protocol):
    """What the router core offers the admin API; every method runs on the engine thread."""

    def apply_config(self, pushed: router_pb2.RouterConfig) -> router_pb2.ApplyConfigResponse: ...
    def config_proto(self) -> router_pb2.RouterConfig: ...
    def stats(self, *, address: str) -> router_pb2.RouterStats: ...
    def connection_infos(self) -> list[router_pb2.ConnectionInfo]: ...
    def link_infos(self, *, connection_id: int) -> list[router_pb2.LinkInfo]: ...
    def close_connection(self, *, connection_id: int, reason: str) -> bool: ...


async def on_engine(engine: EngineLoop, fn: Callable[[], T]) -> T:
    """Runs `fn` on the engine thread and returns (or raises) what it did."""
    future: concurrent.futures.Future[T] = concurrent.futures.Future()

    def run() -> None:
        try:
            future.set_result(fn())
        except BaseException as error:  # handed back to the caller's thread, not swallowed
            future.set_exception(error)

    engine.call_soon_threadsafe(run)
    return await asyncio.wrap_future(future)


class RouterAdminServicer(router_pb2_grpc.RouterAdminServicer):
    def __init__(self, *, engine: EngineLoop, router: AdminView) -> None:
        self._engine = engine
        self._router = router

    async def ApplyConfig(
        self, request: router_pb2.RouterConfig, context: grpc.aio.ServicerContext
    ) -> router_pb2.ApplyConfigResponse:
        try:
            return await on_engine(self._engine, lambda: self._router.apply_config(request))
        except ConfigError as error:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))
        except StaleGeneration as error:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(error))
        raise AssertionError("unreachable: abort raises")

    async def GetConfig(
        self, request: router_pb2.GetConfigRequest, context: grpc.aio.ServicerContext
    ) -> router_pb2.RouterConfig:
        return await on_engine(self._engine, self._router.config_proto)

    async def GetStats(
        self, request: router_pb2.StatsRequest, context: grpc.aio.ServicerContext
    ) -> router_pb2.RouterStats:
        return await on_engine(self._engine, lambda: self._router.stats(address=request.address))

    async def ListConnections(
        self, request: router_pb2.ListConnectionsRequest, context: grpc.aio.ServicerContext
    ) -> router_pb2.ConnectionList:
        infos = await on_engine(self._engine, self._router.connection_infos)
        return router_pb2.ConnectionList(connections=infos)

    async def ListLinks(
        self, request: router_pb2.ListLinksRequest, context: grpc.aio.ServicerContext
    ) -> router_pb2.LinkList:
        infos = await on_engine(
            self._engine, lambda: self._router.link_infos(connection_id=request.connection_id)
        )
        return router_pb2.LinkList(links=infos)

    async def CloseConnection(
        self, request: router_pb2.CloseConnectionRequest, context: grpc.aio.ServicerContext
    ) -> router_pb2.CloseConnectionResponse:
        closed = await on_engine(
            self._engine,
            lambda: self._router.close_connection(
                connection_id=request.id, reason=request.reason or "closed by administrator"
            ),
        )
        if not closed:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no connection {request.id}")
        return router_pb2.CloseConnectionResponse()
