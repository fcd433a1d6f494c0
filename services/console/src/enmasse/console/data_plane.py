"""The console's read-only look at a space's routers and brokers: where the live figures come from.

In: a `Directory` (where each router's RouterAdmin and each broker's BrokerAdmin listen: this
machine's ports files under the var dir, `enmasse.resources.discovery.LocalDirectory`) and the
certificate to ask them with (the machine operator's, role `operator`: RouterAdmin and
BrokerAdmin let it read, never change). Out: a `figures.Sample` of one space, now.

Who may see it: only what the caller's token may see. The ASGI layer asks the admin API for the
space with the user's token first (app.py) and samples a space only once the API answered; the
certificate is the console's way in to the data plane, never a way around the API's decisions.

Each router and broker is asked with a short deadline, all at once; one that does not answer is
named in `Sample.silent` and its figures are left out, the others are shown.

The connections page (connections.py) asks the same way: each router's ListConnections and
ListLinks, and, for a Close the admin API let the user make, CloseConnection (or CloseLink) of
one client connection of one of the space's routers (the operator's certificate may close, never
configure).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import grpc
from enmasse.common.certificates import TlsFiles
from enmasse.common.credentials import peer_channel
from enmasse.console.connections import CLIENT, RouterConnections, closable, router_connections
from enmasse.console.figures import Sample
from enmasse.resources.address_figures import brokered_counts, standard_counts
from enmasse.resources.contracts import BROKERED
from enmasse.resources.discovery import Directory
from enmasse.v1 import broker_pb2, broker_pb2_grpc, resources_pb2, router_pb2, router_pb2_grpc

ASK_DEADLINE = 2.0
SAMPLE_SECONDS = 2.0
"""How often an open space page gets its figures."""


class DataPlane:
    def __init__(self, *, directory: Directory, tls: TlsFiles | None) -> None:
        self.directory = directory
        self.tls = tls

    async def _router(self, admin: str) -> router_pb2.RouterStats | None:
        async with peer_channel(admin, tls=self.tls) as channel:
            try:
                stats: router_pb2.RouterStats = await router_pb2_grpc.RouterAdminStub(
                    channel
                ).GetStats(router_pb2.StatsRequest(), timeout=ASK_DEADLINE)
            except grpc.aio.AioRpcError:
                return None
        return stats

    async def _broker(self, admin: str) -> broker_pb2.ListAddressesResponse | None:
        async with peer_channel(admin, tls=self.tls) as channel:
            try:
                listing: broker_pb2.ListAddressesResponse = await broker_pb2_grpc.BrokerAdminStub(
                    channel
                ).ListAddresses(broker_pb2.ListAddressesRequest(), timeout=ASK_DEADLINE)
            except grpc.aio.AioRpcError:
                return None
        return listing

    async def sample(self, space: resources_pb2.AddressSpace) -> Sample:
        name = space.metadata.name
        self.directory.refresh()
        routers = self.directory.routers(name)
        brokers = list(self.directory.brokers(name).values())
        answers = await asyncio.gather(
            *(self._router(r.admin) for r in routers), *(self._broker(b.admin) for b in brokers)
        )
        router_stats = [a for a in answers[: len(routers)] if isinstance(a, router_pb2.RouterStats)]
        listings = [
            a for a in answers[len(routers) :] if isinstance(a, broker_pb2.ListAddressesResponse)
        ]
        silent = tuple(
            who
            for who, answer in zip(
                [r.router_id for r in routers] + [b.name for b in brokers], answers, strict=True
            )
            if answer is None
        )
        if space.spec.type == BROKERED:
            counts = brokered_counts(brokers=listings)
        else:
            counts = standard_counts(routers=router_stats, brokers=listings)
        return Sample(at=time.monotonic(), counts=counts, silent=silent)

    async def _connections(self, router_id: str, admin: str) -> RouterConnections:
        async with peer_channel(admin, tls=self.tls) as channel:
            stub = router_pb2_grpc.RouterAdminStub(channel)
            try:
                connections, links = await asyncio.gather(
                    stub.ListConnections(router_pb2.ListConnectionsRequest(), timeout=ASK_DEADLINE),
                    stub.ListLinks(router_pb2.ListLinksRequest(), timeout=ASK_DEADLINE),
                )
            except grpc.aio.AioRpcError:
                return router_connections(router=router_id, connections=None, links=None)
        return router_connections(router=router_id, connections=connections, links=links)

    async def connections(self, space: resources_pb2.AddressSpace) -> list[RouterConnections]:
        """Every router of the space with its connections and their links, now."""
        self.directory.refresh()
        routers = self.directory.routers(space.metadata.name)
        asked = (self._connections(r.router_id, r.admin) for r in routers)
        return list(await asyncio.gather(*asked))

    async def close_connection(
        self, space: resources_pb2.AddressSpace, *, router_id: str, connection_id: int, reason: str
    ) -> None:
        """Closes one client connection of one of the space's routers with `reason` as the
        amqp:connection:forced description, or raises `CloseRefused` saying why not (no such
        router in the space, no such connection on it, not a client's, the router silent)."""
        request = router_pb2.CloseConnectionRequest(id=connection_id, reason=reason)
        async with self._client_connection(
            space, router_id=router_id, connection_id=connection_id
        ) as stub:
            await stub.CloseConnection(request, timeout=ASK_DEADLINE)

    async def close_link(
        self,
        space: resources_pb2.AddressSpace,
        *,
        router_id: str,
        connection_id: int,
        name: str,
        role: str,
        reason: str,
    ) -> None:
        """Closes one link (`name`, `role` as ListLinks says them) of a client connection with
        amqp:link:detach-forced, or raises `CloseRefused` as close_connection does."""
        request = router_pb2.CloseLinkRequest(
            connection_id=connection_id, name=name, role=role, reason=reason
        )
        async with self._client_connection(
            space, router_id=router_id, connection_id=connection_id
        ) as stub:
            await stub.CloseLink(request, timeout=ASK_DEADLINE)

    @contextlib.asynccontextmanager
    async def _client_connection(
        self, space: resources_pb2.AddressSpace, *, router_id: str, connection_id: int
    ) -> AsyncIterator[router_pb2_grpc.RouterAdminStub]:
        """RouterAdmin of `router_id`, once it is one of the space's routers and
        `connection_id` one of its clients' connections; any refusal as `CloseRefused`."""
        name = space.metadata.name
        self.directory.refresh()
        router = next((r for r in self.directory.routers(name) if r.router_id == router_id), None)
        if router is None:
            raise CloseRefused(f"address space '{name}' has no router '{router_id}'")
        async with peer_channel(router.admin, tls=self.tls) as channel:
            stub = router_pb2_grpc.RouterAdminStub(channel)
            try:
                listing = await stub.ListConnections(
                    router_pb2.ListConnectionsRequest(), timeout=ASK_DEADLINE
                )
                found = next((c for c in listing.connections if c.id == connection_id), None)
                if found is None:
                    raise CloseRefused(f"router '{router_id}' has no connection {connection_id}")
                if not closable(role=found.role, user=found.user):
                    what = found.role if found.role != CLIENT else f"logged in as {found.user}"
                    raise CloseRefused(
                        f"connection {connection_id} of router '{router_id}' is {what}, "
                        "the space's own: the console closes only clients' connections"
                    )
                yield stub
            except grpc.aio.AioRpcError as error:
                raise CloseRefused(
                    f"router '{router_id}': {error.details() or error.code().name}"
                ) from None


class CloseRefused(Exception):
    """A Close the data plane did not make, and why, in words for the page."""
