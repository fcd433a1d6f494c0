"""The broker's Prometheus metrics: per queue, topic and subscription, and its memory.

What flows in: a scrape (prometheus-client's HTTP thread calls `collect`). What flows out: metric
families named in `enmasse.common.metrics`, from one listing of the broker's addresses, the same
one BrokerAdmin's ListAddresses returns (`admin.list_addresses`).

Why a collector: the queues count what they take and hand out already, on the engine thread. A
scrape asks the engine for a snapshot between two events (`engine.submit`), so metrics cost the
message path nothing and agree with `enmasse status`. A topic's figures are its subscriptions'
summed (as ListAddresses has them); each subscription is listed too, as type `subscription`.
"""

from __future__ import annotations

from collections.abc import Iterator

from enmasse.amqp.engine import Engine
from enmasse.broker.admin import list_addresses
from enmasse.broker.broker import Broker
from enmasse.common import metrics as names
from enmasse.v1 import broker_pb2
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

SNAPSHOT_TIMEOUT = 5.0

Snapshot = tuple[list[broker_pb2.BrokerAddress], int, int]


class BrokerMetrics(Collector):
    def __init__(self, *, engine: Engine, broker: Broker) -> None:
        self._engine = engine
        self._broker = broker

    def describe(self) -> Iterator[Metric]:
        """Nothing: registering must not take a snapshot (the engine is not running yet)."""
        return iter(())

    def collect(self) -> Iterator[Metric]:
        addresses, used, limit = self._engine.submit(self._snapshot).result(
            timeout=SNAPSHOT_TIMEOUT
        )
        yield from address_families(addresses)
        memory_used = GaugeMetricFamily(names.BROKER_MEMORY_USED, "Bytes of messages held.")
        memory_used.add_metric([], used)
        memory_limit = GaugeMetricFamily(
            names.BROKER_MEMORY_LIMIT, "Bytes of messages the broker may hold."
        )
        memory_limit.add_metric([], limit)
        yield from (memory_used, memory_limit)

    def _snapshot(self) -> Snapshot:
        broker = self._broker
        return list_addresses(broker), broker.budget.used, broker.budget.limit


def address_families(addresses: list[broker_pb2.BrokerAddress]) -> Iterator[Metric]:
    """Per address: messages in, out, stored (count and bytes), expired, dead-lettered,
    consumers."""
    labels = list(names.ADDRESS_LABELS)
    families: dict[str, CounterMetricFamily | GaugeMetricFamily] = {
        "enqueued": CounterMetricFamily(
            names.ADDRESS_MESSAGES_IN, "Messages the broker took for the address.", labels=labels
        ),
        "dequeued": CounterMetricFamily(
            names.ADDRESS_MESSAGES_OUT,
            "Messages consumers acknowledged (or a drain moved).",
            labels=labels,
        ),
        "stored": GaugeMetricFamily(
            names.ADDRESS_STORED,
            "Messages held: ready, and sent to consumers but not settled yet.",
            labels=labels,
        ),
        "bytes": GaugeMetricFamily(
            names.ADDRESS_STORED_BYTES, "Payload bytes held, ready and unsettled.", labels=labels
        ),
        "expired": CounterMetricFamily(
            names.ADDRESS_EXPIRED, "Messages that expired.", labels=labels
        ),
        "dead_lettered": CounterMetricFamily(
            names.ADDRESS_DEAD_LETTERED, "Messages that became dead letters.", labels=labels
        ),
        "consumers": GaugeMetricFamily(
            names.ADDRESS_CONSUMERS, "Consumer links attached.", labels=labels
        ),
    }
    for address in addresses:
        key = [address.name, address.kind]
        for field, family in families.items():
            value = (
                address.depth + address.in_flight if field == "stored" else getattr(address, field)
            )
            family.add_metric(key, value)
    yield from families.values()
