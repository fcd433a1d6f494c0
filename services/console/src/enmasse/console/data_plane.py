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
"""

from __future__ import annotations

import asyncio
import time

import grpc
from enmasse.common.certificates import TlsFiles
from enmasse.common.credentials import peer_channel
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
