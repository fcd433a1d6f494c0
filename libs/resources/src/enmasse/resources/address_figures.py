"""Per-address figures of a space, from what its routers and brokers say: plain values.

In: each router's `RouterStats` (GetStats) and each broker's `ListAddressesResponse`
(ListAddresses), as a reader with the operator's certificate gets them. Out: by address string,
the `Counts` of that moment: messages in and out, stored, consumers, producers.

Whose numbers: in a standard space traffic and links are the routers' (deliveries in and out,
consumer and producer links, summed over the space's routers: a client is attached to one of
them; OUT includes what a router passes on to its brokers and to other routers), and stored
messages the brokers' (ready plus delivered-but-unsettled, summed over the brokers holding the
address: the same `stored` the brokers' Prometheus metrics give). A brokered space has no router:
its broker's enqueued, dequeued, consumers and stored are the figures, and nobody counts
producers (None). A subscription is held as the broker queue `<topic>::<subscription>`; its
figures are keyed by the subscription's own address string, and its topic's depth already sums
its subscriptions'.

Why here: `enmasse stats` (the CLI) and the console show the same figures, and neither may import
the other; both read the data plane the same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from enmasse.resources.contracts import SUBSCRIPTION, SUBSCRIPTION_SEPARATOR
from enmasse.v1 import broker_pb2, router_pb2


@dataclass(frozen=True)
class Counts:
    deliveries_in: int = 0
    deliveries_out: int = 0
    stored: int = 0
    consumers: int = 0
    producers: int | None = 0
    """None: nobody counts them (a brokered space's broker does not)."""


def standard_counts(
    *,
    routers: Sequence[router_pb2.RouterStats],
    brokers: Sequence[broker_pb2.ListAddressesResponse],
) -> dict[str, Counts]:
    """A standard space: traffic and links from the routers, stored messages from the brokers."""
    summed: dict[str, dict[str, int]] = {}
    for router in routers:
        for stats in router.addresses:
            into = summed.setdefault(stats.address, dict.fromkeys(_ROUTER_KEYS, 0))
            into["deliveries_in"] += stats.deliveries_in
            into["deliveries_out"] += stats.deliveries_out
            into["consumers"] += stats.consumers
            into["producers"] += stats.producers
    stored: dict[str, int] = {}
    for listing in brokers:
        for held in listing.addresses:
            key = address_of(held)
            stored[key] = stored.get(key, 0) + held.depth + held.in_flight
    return {
        address: Counts(stored=stored.get(address, 0), **values)
        for address, values in summed.items()
    } | {address: Counts(stored=held) for address, held in stored.items() if address not in summed}


_ROUTER_KEYS = ("deliveries_in", "deliveries_out", "consumers", "producers")


def brokered_counts(*, brokers: Sequence[broker_pb2.ListAddressesResponse]) -> dict[str, Counts]:
    """A brokered space: everything from its broker; producers are not counted there."""
    return {
        address_of(held): Counts(
            deliveries_in=held.enqueued,
            deliveries_out=held.dequeued,
            stored=held.depth + held.in_flight,
            consumers=held.consumers,
            producers=None,
        )
        for listing in brokers
        for held in listing.addresses
    }


def address_of(held: broker_pb2.BrokerAddress) -> str:
    """The address string a broker's queue, topic or subscription queue stands for."""
    if held.kind == SUBSCRIPTION:
        return held.name.partition(SUBSCRIPTION_SEPARATOR)[2]
    return held.name
