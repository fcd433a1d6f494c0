"""Prometheus metrics scraped from a real router and broker, and parsed as Prometheus would.

A broker and a router in front of its queue `orders` run with `--metrics-port 0`; a producer
sends 37 messages through the router, a consumer takes 20 of them. Scraped over HTTP and parsed
with `prometheus_client.parser`, the figures must be the traffic's: the router counted 37 + 20
deliveries in and accepted (the producer's to the broker, the broker's to the consumer), one
producer and one consumer; the broker took 37, handed out 20, holds 17. A control-plane
loop's `LoopMetrics` counts its passes and its failed ones.
"""

from __future__ import annotations

import urllib.request

import pytest
from enmasse.amqp import codec
from enmasse.amqp.client import Client
from enmasse.amqp.engine import Outcome
from enmasse.common import metrics as names
from enmasse.common.metrics import LoopMetrics, serve_metrics
from enmasse.v1 import router_pb2
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tests.fixtures.broker import BrokerFactory
from tests.fixtures.router import RouterFleet
from tests.fixtures.waiting import wait_for

SENT = 37
TAKEN = 20
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(port: int) -> Samples:
    """name + sorted labels -> value, as parsed from the text format."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    return parse(text)


def parse(text: str) -> Samples:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def of_address(samples: Samples, name: str, address: str, **labels: str) -> float:
    wanted = {"address": address, **labels}
    found = [
        v for (n, ls), v in samples.items() if n == name and wanted.items() <= dict(ls).items()
    ]
    assert len(found) == 1, (name, address, found)
    return found[0]


def test_router_and_broker_metrics_are_the_traffic_they_carried(
    broker_factory: BrokerFactory, routers: RouterFleet, clients: list[Client]
) -> None:
    broker = broker_factory("--metrics-port=0")
    broker.ensure_queue("orders")
    router = routers.start("r1", extra_args=("--metrics-port", "0"))
    waypoint = router_pb2.BrokerWaypoint(name="b1", host="127.0.0.1", port=broker.amqp_port)
    router.apply(
        routers.mesh_config(
            generation=1, addresses={"orders": "queue"}, waypoints={"orders": [waypoint]}
        )
    )
    clients.append(Client("127.0.0.1", router.amqp_port))
    sender = clients[-1].sender("orders")
    for n in range(SENT):
        assert sender.send(codec.encode_message(f"order {n}")).outcome is Outcome.ACCEPTED
    clients.append(Client("127.0.0.1", router.amqp_port))
    receiver = clients[-1].receiver("orders", credit=TAKEN)
    bodies = []
    for _ in range(TAKEN):
        delivery = receiver.receive(timeout=15)
        bodies.append(codec.read_body(delivery.payload))
        receiver.accept(delivery)
    assert bodies == [f"order {n}" for n in range(TAKEN)]
    dequeued = names.ADDRESS_MESSAGES_OUT + "_total"
    wait_for(  # the consumer's last accept reaches the broker through the router
        lambda: of_address(scrape(broker.metrics_port), dequeued, "orders") == TAKEN,
        what="the broker counting 20 acknowledged",
    )

    at_router = scrape(router.metrics_port)
    total = names.ADDRESS_OUTCOMES + "_total"
    # Both ways through the router: 37 from the producer to the broker, 20 from the broker to the
    # consumer, each settled accepted.
    assert of_address(at_router, total, "orders", outcome="accepted") == SENT + TAKEN
    assert of_address(at_router, total, "orders", outcome="rejected") == 0
    assert of_address(at_router, names.ADDRESS_PRODUCERS, "orders", type="queue") == 1
    assert of_address(at_router, names.ADDRESS_CONSUMERS, "orders", type="queue") == 1
    deliveries = (names.ROUTER_DELIVERIES + "_total", (("outcome", "accepted"), ("router", "r1")))
    assert at_router[deliveries] == SENT + TAKEN
    connections = (names.ROUTER_CONNECTIONS, (("role", "broker"), ("router", "r1")))
    assert at_router[connections] == 1

    at_broker = scrape(broker.metrics_port)
    assert of_address(at_broker, names.ADDRESS_MESSAGES_IN + "_total", "orders") == SENT
    assert of_address(at_broker, names.ADDRESS_STORED, "orders", type="queue") == SENT - TAKEN
    assert at_broker[(names.BROKER_MEMORY_USED, ())] > 0


def test_a_loop_counts_its_passes_and_its_failures() -> None:
    registry = CollectorRegistry()
    loop = LoopMetrics("reconcile", registry=registry)
    for _ in range(3):
        with loop.timed_pass():
            pass
    with pytest.raises(RuntimeError), loop.timed_pass():
        raise RuntimeError("etcd is gone")
    loop.waiting(7)
    samples = parse(generate_latest(registry).decode())
    assert samples[(names.LOOP_PASS_SECONDS + "_count", (("loop", "reconcile"),))] == 4
    assert samples[(names.LOOP_ERRORS + "_total", (("loop", "reconcile"),))] == 1
    assert samples[(names.LOOP_QUEUE_DEPTH, (("loop", "reconcile"),))] == 7


def test_metrics_are_served_over_http_on_a_free_port() -> None:
    registry = CollectorRegistry()
    LoopMetrics("sync", registry=registry).waiting(2)
    port = serve_metrics(host="127.0.0.1", port=0, registry=registry)
    assert scrape(port)[(names.LOOP_QUEUE_DEPTH, (("loop", "sync"),))] == 2
