"""A waypoint configured before its broker holds the address: the router keeps asking.

The router-agent may push a queue's route as soon as the broker's endpoint is known, before the
storage-controller has created the queue there. The broker refuses the router's links
(amqp:not-found); the router must attach them again by itself, with no further configuration
push, while producers wait without credit (not refused) and consumers stay attached.
"""

from __future__ import annotations

import time

from enmasse.amqp import codec
from enmasse.amqp.client import Client
from enmasse.amqp.engine import Outcome

from tests.fixtures.broker import BrokerProcess
from tests.fixtures.router import RouterFleet, RouterProcess

REFUSED = "broker refused a link; attaching again with back-off"
ATTACHED = "broker link attached again"


def _log_lines(router: RouterProcess, text: str) -> list[str]:
    log = router.log_path.read_text(errors="replace") if router.log_path.exists() else ""
    return [line for line in log.splitlines() if text in line]


def _wait_log(router: RouterProcess, text: str, *, count: int) -> None:
    deadline = time.monotonic() + 15
    while len(_log_lines(router, text)) < count:
        assert time.monotonic() < deadline, (
            f"{count} x {text!r} not logged:\n{_log_lines(router, '')}"
        )
        time.sleep(0.05)


def _wait_broker_connected(router: RouterProcess) -> None:
    deadline = time.monotonic() + 15
    while not any(c.role == "broker" for c in router.stats().connections):
        assert time.monotonic() < deadline, router.stats().connections
        time.sleep(0.05)


def test_a_queue_created_after_its_route_gets_producers_and_consumers_going_without_a_push(
    routers: RouterFleet, broker: BrokerProcess, clients: list[Client]
) -> None:
    router = routers.start_before_queue("orders", broker_port=broker.amqp_port)
    producer = Client("127.0.0.1", router.amqp_port)
    clients.append(producer)
    sender = producer.sender("orders")  # attached: the address is configured
    consumer = Client("127.0.0.1", router.amqp_port)
    clients.append(consumer)
    receiver = consumer.receiver("orders", credit=5)
    _wait_broker_connected(router)
    time.sleep(1.0)  # the broker says no to the sender and the feed, a few back-off rounds
    assert producer.call(lambda: sender.link.credit) == 0  # type: ignore[union-attr]
    pending = sender.send_async(codec.encode_message(b"first", durable=True))
    time.sleep(0.3)
    assert not pending.done()  # waiting for credit, not refused

    broker.ensure_queue("orders")  # the storage-controller's part, late

    assert pending.result(15).outcome is Outcome.ACCEPTED
    delivery = receiver.receive(15)
    assert codec.read_body(delivery.payload) == b"first"
    receiver.accept(delivery)
    assert sender.send(codec.encode_message(b"second")).outcome is Outcome.ACCEPTED
    delivery = receiver.receive(15)
    assert codec.read_body(delivery.payload) == b"second"
    receiver.accept(delivery)
    assert router.stats().generation == 1  # nobody pushed anything
    _wait_log(router, ATTACHED, count=2)
    # One line per change of state, not one per attempt.
    assert len(_log_lines(router, REFUSED)) == 2
    assert len(_log_lines(router, ATTACHED)) == 2
