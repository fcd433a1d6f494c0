"""Scheduled delivery through a standard space's router, real processes: the router forwards a
queue's message to its broker byte for byte, so the `x-opt-delivery-delay` annotation reaches
the broker, which holds the message until its time: a consumer attached through the router gets
nothing before the delay and the message after it."""

from __future__ import annotations

import time

import pytest
from enmasse.amqp import codec
from enmasse.amqp.client import Client
from enmasse.amqp.engine import Outcome

from tests.fixtures.broker import BrokerProcess
from tests.fixtures.router import RouterFleet


def test_a_delayed_message_through_the_router_comes_at_its_time(
    routers: RouterFleet, broker: BrokerProcess, clients: list[Client]
) -> None:
    broker.ensure_queue("reminders")
    router = routers.start_before_queue("reminders", broker_port=broker.amqp_port)
    clients.append(Client("127.0.0.1", router.amqp_port))
    receiver = clients[-1].receiver("reminders", credit=10)
    clients.append(Client("127.0.0.1", router.amqp_port))
    sender = clients[-1].sender("reminders")
    payload = codec.encode_message(
        "in two seconds", message_annotations={"x-opt-delivery-delay": 2000}
    )
    sent_at = time.monotonic()
    assert sender.send(payload).outcome is Outcome.ACCEPTED
    with pytest.raises(TimeoutError):
        receiver.receive(1.0)  # the broker holds it: nothing yet
    delivery = receiver.receive(15)
    received_after = time.monotonic() - sent_at
    receiver.accept(delivery)
    assert codec.read_body(delivery.payload) == "in two seconds"
    assert received_after >= 1.99
    assert codec.read_message_annotations(delivery.payload)["x-opt-delivery-time"] > 0
