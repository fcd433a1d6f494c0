"""The router leaves a message's delivery-count alone, real processes: an anycast message reaches
its consumer byte for byte (header included) and the consumer's released / modified outcome goes
back to the producer as it was given; a queue's message, through the router to its broker and
back, comes again unchanged after a release and one higher after modified{delivery-failed}: the
broker counts, the router carries."""

from __future__ import annotations

from enmasse.amqp import codec
from enmasse.amqp.client import Client
from enmasse.amqp.engine import Outcome

from tests.fixtures.broker import BrokerProcess
from tests.fixtures.router import RouterFleet
from tests.fixtures.waiting import wait_for


def _connect(port: int, opened: list[Client]) -> Client:
    opened.append(Client("127.0.0.1", port))
    return opened[-1]


def test_anycast_bytes_and_outcomes_pass_through_unchanged(
    routers: RouterFleet, clients: list[Client]
) -> None:
    router = routers.start("r1")
    router.apply(routers.mesh_config(generation=1, addresses={"work": "anycast"}))
    receiver = _connect(router.amqp_port, clients).receiver("work", credit=10)
    sender = _connect(router.amqp_port, clients).sender("work")
    header = codec.Header(durable=True, first_acquirer=True, delivery_count=3)
    payload = codec.with_header(codec.encode_message("counted elsewhere"), header)

    released = sender.send_async(payload)
    delivery = receiver.receive(10)
    assert delivery.payload == payload
    receiver.settle(delivery, Outcome.RELEASED)
    assert released.result(10).outcome is Outcome.RELEASED

    modified = sender.send_async(payload)
    delivery = receiver.receive(10)
    assert codec.read_header(delivery.payload) == header
    receiver.settle(delivery, Outcome.MODIFIED, delivery_failed=True, undeliverable_here=True)
    outcome = modified.result(10)
    assert (outcome.outcome, outcome.delivery_failed, outcome.undeliverable_here) == (
        Outcome.MODIFIED,
        True,
        True,
    )


def test_a_queue_through_the_router_counts_failed_deliveries_only(
    routers: RouterFleet, broker: BrokerProcess, clients: list[Client]
) -> None:
    broker.ensure_queue("orders")
    router = routers.start_before_queue("orders", broker_port=broker.amqp_port)
    sender = _connect(router.amqp_port, clients).sender("orders")
    assert sender.send(codec.encode_message("order")).outcome is Outcome.ACCEPTED
    receiver = _connect(router.amqp_port, clients).receiver("orders", credit=1)
    counts = []
    for outcome in (Outcome.RELEASED, Outcome.RELEASED, Outcome.MODIFIED, Outcome.RELEASED):
        delivery = receiver.receive(10)
        assert codec.read_body(delivery.payload) == "order"
        counts.append(codec.read_header(delivery.payload).delivery_count)
        receiver.settle(delivery, outcome, delivery_failed=outcome is Outcome.MODIFIED)
    delivery = receiver.receive(10)
    counts.append(codec.read_header(delivery.payload).delivery_count)
    receiver.accept(delivery)
    assert counts == [0, 0, 0, 1, 1]
    wait_for(lambda: broker.addresses()["orders"].dequeued == 1, what="the broker's ack")
    assert broker.addresses()["orders"].depth == 0
