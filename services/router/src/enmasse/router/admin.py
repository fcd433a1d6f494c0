"""RouterAdmin over gRPC: configuration pushes, stats, listings, closing a connection or a link.

Two parts. `AdminView` is the router as RouterAdmin sees it: protobuf in and out, over the
forwarding core's own state (a pushed `router_pb2.RouterConfig` becomes a `RouterConfig` value the
core swaps in; the core's address points, connections and links become `RouterStats`,
`ConnectionInfo` and `LinkInfo`), so the core itself never touches a protobuf message.
`RouterAdminServicer` is the thin gRPC side.

The router's state belongs to the engine thread (one epoll loop, no locks on the hot path); the
gRPC server runs its own asyncio loop in another thread. Every RPC therefore hands a plain function
to the engine (`await engine.call(fn)`) and awaits its result: reads are consistent snapshots,
writes (a new configuration, a close) happen between two engine events, never in the middle of one.

Errors map to gRPC status codes with the router's own text: a configuration that does not hold
together is INVALID_ARGUMENT (nothing changes, the running generation stays), an older generation is
FAILED_PRECONDITION, closing an unknown connection (or link) is NOT_FOUND.
"""

from __future__ import annotations

import grpc
from enmasse.amqp.engine import Engine
from enmasse.router.config import (
    ConfigError,
    StaleGeneration,
    config_from_proto,
    config_to_proto,
    decide_apply,
)
from enmasse.router.forwarding import Router
from enmasse.router.points import ANYCAST, LinkState
from enmasse.v1 import router_pb2, router_pb2_grpc

SERVICE_NAME = "enmasse.v1.RouterAdmin"
READS = tuple(
    f"/{SERVICE_NAME}/{method}"
    for method in ("GetConfig", "GetStats", "ListConnections", "ListLinks")
)
"""The calls that change nothing: the operator's certificate may make these (`enmasse status`)."""
OPERATOR_CALLS = (*READS, f"/{SERVICE_NAME}/CloseConnection", f"/{SERVICE_NAME}/CloseLink")
"""What the operator's certificate may call: the reads, and closing a client's connection or link
(the console's Close, made for a user the admin API let write in the space); never a new
configuration."""


class AdminView:
    """The router as RouterAdmin sees it; every method runs on the engine thread."""

    def __init__(self, router: Router) -> None:
        self._router = router

    def apply_config(self, pushed: router_pb2.RouterConfig) -> router_pb2.ApplyConfigResponse:
        """The generation first (the same: nothing to do; older: StaleGeneration), then the
        whole configuration validated (ConfigError), and only then swapped in."""
        router = self._router
        running = router.config
        if not decide_apply(running=running, pushed_generation=pushed.generation):
            return router_pb2.ApplyConfigResponse(generation=running.generation, changed=False)
        config = config_from_proto(pushed, router_id=router.router_id)
        router.apply_config(config)
        return router_pb2.ApplyConfigResponse(generation=config.generation, changed=True)

    def config_proto(self) -> router_pb2.RouterConfig:
        return config_to_proto(self._router.config)

    def stats(self, *, address: str) -> router_pb2.RouterStats:
        """Every configured address (used here or not) and every other address in use."""
        router = self._router
        names = [
            *router.config.addresses,
            *(a for a in router.points if a not in router.config.addresses),
        ]
        addresses = [self._address_stats(name) for name in names if not address or name == address]
        return router_pb2.RouterStats(
            router_id=router.router_id,
            generation=router.config.generation,
            addresses=addresses,
            connections=self.connection_infos(),
            reachable_routers=router.mesh.reachable(),
        )

    def _address_stats(self, address: str) -> router_pb2.AddressStats:
        router = self._router
        point = router.points.get(address)
        route = router.config.route(address)
        routers = router.mesh.routers_with_consumers(address)
        remote = len(routers)
        remote_consumers = sum(router.mesh.consumers_at(r, address) for r in routers)
        if point is None:
            kind = route.distribution.value if route is not None else ANYCAST
            return router_pb2.AddressStats(
                address=address,
                type=kind,
                remote_routers=remote,
                remote_consumers=remote_consumers,
            )
        c = point.counters
        return router_pb2.AddressStats(
            address=address,
            type=point.kind,
            deliveries_in=c.deliveries_in,
            deliveries_out=c.deliveries_out,
            accepted=c.accepted,
            rejected=c.rejected,
            released=c.released,
            modified=c.modified,
            dropped=c.dropped,
            consumers=len(point.local),
            producers=len(point.producers),
            remote_routers=remote,
            remote_consumers=remote_consumers,
        )

    def connection_infos(self) -> list[router_pb2.ConnectionInfo]:
        return [
            router_pb2.ConnectionInfo(
                id=record.id,
                container_id=record.connection.container_id or "",
                remote=record.connection.peer,
                role=record.role.value,
                user=record.connection.user or "",
                links=len(record.connection.links),
                deliveries_in=record.deliveries_in,
                deliveries_out=record.deliveries_out,
                opened_at_ms=int(record.opened_at * 1000),
            )
            for record in self._router.connections.values()
        ]

    def link_infos(self, *, connection_id: int) -> list[router_pb2.LinkInfo]:
        infos = []
        for record in self._router.connections.values():
            if connection_id and record.id != connection_id:
                continue
            for link in record.connection.links:
                state = link.context
                infos.append(
                    router_pb2.LinkInfo(
                        connection_id=record.id,
                        name=link.name,
                        role="sender" if link.is_sender else "receiver",
                        address=link.address or "",
                        credit=link.credit,
                        unsettled=len(link.unsettled),
                        deliveries=state.deliveries if isinstance(state, LinkState) else 0,
                    )
                )
        return infos

    def close_connection(self, *, connection_id: int, reason: str) -> bool:
        return self._router.close_connection(connection_id=connection_id, reason=reason)

    def close_link(self, request: router_pb2.CloseLinkRequest) -> bool:
        return self._router.close_link(
            connection_id=request.connection_id,
            name=request.name,
            sender=request.role == "sender",
            reason=request.reason or "closed by administrator",
        )


class RouterAdminServicer(router_pb2_grpc.RouterAdminServicer):
    def __init__(self, *, engine: Engine, view: AdminView) -> None:
        self._engine = engine
        self._view = view

    async def ApplyConfig(
        self, request: router_pb2.RouterConfig, context: grpc.aio.ServicerContext
    ) -> router_pb2.ApplyConfigResponse:
        try:
            return await self._engine.call(lambda: self._view.apply_config(request))
        except ConfigError as error:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))
        except StaleGeneration as error:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(error))
        raise AssertionError("unreachable: abort raises")

    async def GetConfig(
        self, request: router_pb2.GetConfigRequest, context: grpc.aio.ServicerContext
    ) -> router_pb2.RouterConfig:
        return await self._engine.call(self._view.config_proto)

    async def GetStats(
        self, request: router_pb2.StatsRequest, context: grpc.aio.ServicerContext
    ) -> router_pb2.RouterStats:
        return await self._engine.call(lambda: self._view.stats(address=request.address))

    async def ListConnections(
        self, request: router_pb2.ListConnectionsRequest, context: grpc.aio.ServicerContext
    ) -> router_pb2.ConnectionList:
        infos = await self._engine.call(self._view.connection_infos)
        return router_pb2.ConnectionList(connections=infos)

    async def ListLinks(
        self, request: router_pb2.ListLinksRequest, context: grpc.aio.ServicerContext
    ) -> router_pb2.LinkList:
        infos = await self._engine.call(
            lambda: self._view.link_infos(connection_id=request.connection_id)
        )
        return router_pb2.LinkList(links=infos)

    async def CloseConnection(
        self, request: router_pb2.CloseConnectionRequest, context: grpc.aio.ServicerContext
    ) -> router_pb2.CloseConnectionResponse:
        closed = await self._engine.call(
            lambda: self._view.close_connection(
                connection_id=request.id, reason=request.reason or "closed by administrator"
            )
        )
        if not closed:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no connection {request.id}")
        return router_pb2.CloseConnectionResponse()

    async def CloseLink(
        self, request: router_pb2.CloseLinkRequest, context: grpc.aio.ServicerContext
    ) -> router_pb2.CloseLinkResponse:
        closed = await self._engine.call(lambda: self._view.close_link(request))
        if not closed:
            what = f"{request.role or 'link'} '{request.name}'"
            await context.abort(
                grpc.StatusCode.NOT_FOUND,
                f"no {what} on client connection {request.connection_id}",
            )
        return router_pb2.CloseLinkResponse()
