"""The router's Prometheus metrics: its addresses, connections, links and deliveries.

What flows in: a scrape (prometheus-client's HTTP thread calls `collect`). What flows out: metric
families named in `enmasse.common.metrics`, built from one `RouterStats` snapshot, the same one
RouterAdmin's GetStats returns.

Why a collector and not counters bumped per delivery: the forwarding core already counts every
delivery in its address points (`points.Counters`), on the engine thread, without locks. A scrape
asks the engine for a snapshot between two events (`engine.submit`), as the admin API does, so
metrics cost the message path nothing and can never disagree with `enmasse status`.
"""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Iterator

from enmasse.amqp.engine import Engine
from enmasse.common import metrics as names
from enmasse.router.admin import AdminView
from enmasse.router.forwarding import Router
from enmasse.v1 import router_pb2
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

SNAPSHOT_TIMEOUT = 5.0
OUTCOMES = ("accepted", "rejected", "released", "modified", "dropped")


class RouterMetrics(Collector):
    def __init__(self, *, engine: Engine, router: Router) -> None:
        self._engine = engine
        self._view = AdminView(router)

    def describe(self) -> Iterator[Metric]:
        """Nothing: registering must not take a snapshot (the engine is not running yet)."""
        return iter(())

    def collect(self) -> Iterator[Metric]:
        stats = self._engine.submit(self._snapshot).result(timeout=SNAPSHOT_TIMEOUT)
        yield from address_families(stats)
        yield from router_families(stats)

    def _snapshot(self) -> router_pb2.RouterStats:
        return self._view.stats(address="")


def address_families(stats: router_pb2.RouterStats) -> Iterator[Metric]:
    """Per address: messages in and out, outcomes, local consumers and producers."""
    labels = list(names.ADDRESS_LABELS)
    messages_in = CounterMetricFamily(
        names.ADDRESS_MESSAGES_IN, "Deliveries that came to the address here.", labels=labels
    )
    messages_out = CounterMetricFamily(
        names.ADDRESS_MESSAGES_OUT, "Deliveries the address sent on from here.", labels=labels
    )
    outcomes = CounterMetricFamily(
        names.ADDRESS_OUTCOMES,
        "Deliveries that came to the address here (from producers, brokers, other routers), "
        "by the outcome that settled them (dropped: pre-settled copies with nowhere to go).",
        labels=[*labels, "outcome"],
    )
    consumers = GaugeMetricFamily(
        names.ADDRESS_CONSUMERS, "Consumer links attached here.", labels=labels
    )
    producers = GaugeMetricFamily(
        names.ADDRESS_PRODUCERS, "Producer links attached here.", labels=labels
    )
    for a in stats.addresses:
        key = [a.address, a.type]
        messages_in.add_metric(key, a.deliveries_in)
        messages_out.add_metric(key, a.deliveries_out)
        for outcome in OUTCOMES:
            outcomes.add_metric([*key, outcome], getattr(a, outcome))
        consumers.add_metric(key, a.consumers)
        producers.add_metric(key, a.producers)
    yield from (messages_in, messages_out, outcomes, consumers, producers)


def router_families(stats: router_pb2.RouterStats) -> Iterator[Metric]:
    """Per router: connections by role, links, deliveries by outcome, routers it reaches."""
    router = [stats.router_id]
    connections = GaugeMetricFamily(
        names.ROUTER_CONNECTIONS, "Open connections, by role.", labels=["router", "role"]
    )
    roles = Tally(c.role for c in stats.connections)
    for role in ("normal", "inter-router", "broker"):
        connections.add_metric([*router, role], roles.get(role, 0))
    links = GaugeMetricFamily(names.ROUTER_LINKS, "Attached links.", labels=["router"])
    links.add_metric(router, sum(c.links for c in stats.connections))
    deliveries = CounterMetricFamily(
        names.ROUTER_DELIVERIES,
        "Deliveries settled at this router, by outcome (its addresses' outcomes summed).",
        labels=["router", "outcome"],
    )
    for outcome in OUTCOMES:
        deliveries.add_metric([*router, outcome], sum(getattr(a, outcome) for a in stats.addresses))
    reachable = GaugeMetricFamily(
        names.ROUTER_REACHABLE_ROUTERS, "Other routers of the mesh reached.", labels=["router"]
    )
    reachable.add_metric(router, len(stats.reachable_routers))
    yield from (connections, links, deliveries, reachable)
