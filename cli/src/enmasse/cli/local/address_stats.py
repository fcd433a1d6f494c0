"""`enmasse stats --space S`: per address, what flowed in and out, what is stored, who is there.

In: the space's addresses (as the config service holds them), and, asked just now over the
operator's channel (mutual TLS with <var>/tls/operator, which RouterAdmin and BrokerAdmin let
read): each router's GetStats (deliveries in and out, consumer and producer links, per address)
and each broker's ListAddresses (messages stored, consumers, enqueued and dequeued). The routers
and brokers are found where `enmasse up` runs them (`readiness.directory`).
Out: one row per address: ADDRESS TYPE IN OUT STORED CONSUMERS PRODUCERS, and the routers or
brokers that did not answer (their cells then count without them).

Whose numbers: `enmasse.resources.address_figures`' (the console shows the same): in a standard
space IN, OUT, CONSUMERS and PRODUCERS are the routers', summed over the space's routers, and
STORED the brokers' messages held; a brokered space's are its broker's, PRODUCERS unknown (`-`).
Numbers count since each process started.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import grpc
from enmasse.cli.client import open_operator_channel
from enmasse.cli.local.readiness import ASK_DEADLINE
from enmasse.common.certificates import TlsFiles
from enmasse.resources.address_figures import Counts, brokered_counts, standard_counts
from enmasse.resources.contracts import BROKERED
from enmasse.resources.discovery import LocalDirectory
from enmasse.v1 import broker_pb2, broker_pb2_grpc, resources_pb2, router_pb2, router_pb2_grpc

HEADERS = ("ADDRESS", "TYPE", "IN", "OUT", "STORED", "CONSUMERS", "PRODUCERS")


@dataclass
class SpaceStats:
    routers: list[router_pb2.RouterStats] = field(default_factory=list)
    brokers: list[broker_pb2.ListAddressesResponse] = field(default_factory=list)
    silent: list[str] = field(default_factory=list)  # "router-0: UNAVAILABLE"


def gather(
    found: LocalDirectory,
    *,
    space: resources_pb2.AddressSpace,
    tls: TlsFiles | None,
) -> SpaceStats:
    stats = SpaceStats()
    name = space.metadata.name
    if space.spec.type != BROKERED:
        for router in found.routers(name):
            _add_router(stats, router.router_id, router.admin, tls=tls)
    for broker in found.brokers(name).values():
        _add_broker(stats, broker.name, broker.admin, tls=tls)
    return stats


def _add_router(stats: SpaceStats, router_id: str, admin: str, *, tls: TlsFiles | None) -> None:
    with open_operator_channel(admin, tls=tls) as channel:
        try:
            reply = router_pb2_grpc.RouterAdminStub(channel).GetStats(
                router_pb2.StatsRequest(), timeout=ASK_DEADLINE
            )
        except grpc.RpcError as error:
            stats.silent.append(f"{router_id}: {error.code().name}")  # type: ignore[attr-defined]
            return
    stats.routers.append(reply)


def _add_broker(stats: SpaceStats, broker_id: str, admin: str, *, tls: TlsFiles | None) -> None:
    with open_operator_channel(admin, tls=tls) as channel:
        try:
            reply = broker_pb2_grpc.BrokerAdminStub(channel).ListAddresses(
                broker_pb2.ListAddressesRequest(), timeout=ASK_DEADLINE
            )
        except grpc.RpcError as error:
            stats.silent.append(f"{broker_id}: {error.code().name}")  # type: ignore[attr-defined]
            return
    stats.brokers.append(reply)


def rows(
    addresses: Sequence[resources_pb2.Address],
    stats: SpaceStats,
    *,
    space: resources_pb2.AddressSpace,
) -> list[tuple[str, ...]]:
    """One row per address of the space, by address string."""
    counts = (
        brokered_counts(brokers=stats.brokers)
        if space.spec.type == BROKERED
        else standard_counts(routers=stats.routers, brokers=stats.brokers)
    )
    out: list[tuple[str, ...]] = []
    for address in sorted(addresses, key=lambda a: a.spec.address):
        found = counts.get(address.spec.address, Counts())
        producers = "-" if found.producers is None else str(found.producers)
        out.append(
            (
                address.spec.address,
                address.spec.type,
                str(found.deliveries_in),
                str(found.deliveries_out),
                str(found.stored),
                str(found.consumers),
                producers,
            )
        )
    return out
