"""Durable subscriptions that end when their subscriber does not come back (broker.py leases).

A durable subscriber (source durable, expiry policy `never`) whose source also names a terminus
`timeout` (seconds) asks for its subscription to last that long after it leaves. Real broker
process, real clients. What a user sees: back in time, it gets everything published while it
was away; too late, the subscription (and what it held) is gone, and BrokerAdmin no longer
lists it, across a broker SIGKILL and restart too; without a timeout, nothing ends. Every wait is
bounded.
"""

from __future__ import annotations

import time

from enmasse.amqp import codec
from enmasse.amqp.client import Client
from enmasse.amqp.engine import Terminus

from tests.fixtures.broker import BrokerProcess


def _durable(timeout: int) -> Terminus:
    return Terminus(address="prices", durable=2, expiry_policy="never", timeout=timeout)


def _subscribe_and_leave(broker: BrokerProcess, *, timeout: int) -> None:
    with Client("127.0.0.1", broker.amqp_port, container_id="trader", timeout=10) as client:
        client.receiver("prices", name="ticks", source=_durable(timeout), credit=10).detach()


def _publish(broker: BrokerProcess, *bodies: str) -> None:
    with Client("127.0.0.1", broker.amqp_port, timeout=10) as client:
        sender = client.sender("prices")
        for body in bodies:
            sender.send(codec.encode_message(body, durable=True))


def _come_back(broker: BrokerProcess, *, timeout: int, wait: float = 2.0) -> list[str]:
    got: list[str] = []
    with Client("127.0.0.1", broker.amqp_port, container_id="trader", timeout=10) as client:
        receiver = client.receiver("prices", name="ticks", source=_durable(timeout), credit=10)
        while True:
            try:
                delivery = receiver.receive(wait)
            except TimeoutError:
                break
            got.append(str(codec.read_body(delivery.payload)))
            receiver.accept(delivery)
        receiver.detach()
    return got


def _subscriptions(broker: BrokerProcess) -> list[str]:
    return sorted(name for name in broker.addresses() if name.startswith("prices::"))


def _until_gone(broker: BrokerProcess, *, limit: float = 15.0) -> None:
    deadline = time.monotonic() + limit
    while _subscriptions(broker):
        assert time.monotonic() < deadline, f"still there: {_subscriptions(broker)}"
        time.sleep(0.1)


def test_back_within_its_timeout_the_subscriber_gets_everything(broker: BrokerProcess) -> None:
    broker.ensure_topic("prices")
    _subscribe_and_leave(broker, timeout=30)
    _publish(broker, "1", "2", "3")
    assert _come_back(broker, timeout=30) == ["1", "2", "3"]
    assert len(_subscriptions(broker)) == 1


def test_too_late_the_subscription_and_what_it_held_are_gone(broker: BrokerProcess) -> None:
    broker.ensure_topic("prices")
    _subscribe_and_leave(broker, timeout=1)
    _publish(broker, "1", "2")
    _until_gone(broker)
    assert "subscription expired" in broker.log()
    assert _come_back(broker, timeout=1, wait=1.0) == [], "a new, empty subscription"


def test_the_end_survives_a_broker_crash(broker: BrokerProcess) -> None:
    broker.ensure_topic("prices")
    _subscribe_and_leave(broker, timeout=2)
    _publish(broker, "1")
    broker.restart()  # SIGKILL, then the same data directory
    _until_gone(broker)
    assert _come_back(broker, timeout=2, wait=1.0) == []


def test_without_a_timeout_nothing_ends(broker: BrokerProcess) -> None:
    broker.ensure_topic("prices")
    _subscribe_and_leave(broker, timeout=0)
    _publish(broker, "kept")
    time.sleep(2.0)  # longer than the other tests' timeouts: there is nothing to wait for here
    broker.restart()
    assert _come_back(broker, timeout=0) == ["kept"]
