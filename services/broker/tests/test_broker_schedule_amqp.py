"""Scheduled delivery over real AMQP: Qpid Proton's blocking client against a real
`enmasse-broker` process.

A message with `x-opt-delivery-delay` (ms from arrival) or `x-opt-delivery-time` (ms since the
epoch) is accepted at once but reaches a consumer that is already attached, with credit, only
from its due time on: a receive with a timeout shorter than the delay gets nothing, a longer one
gets it. A durable scheduled message survives a SIGKILL and restart and still comes at its
time, not before (the delay was stored as an absolute time).
"""

from __future__ import annotations

import time

import pytest
from proton import Message, Timeout, symbol

from tests.fixtures.broker import BrokerProcess

TIMEOUT = 15


def scheduled(body: str, *, durable: bool = False, **annotations: int) -> Message:
    return Message(
        body=body,
        durable=durable,
        annotations={symbol(f"x-opt-delivery-{k}"): v for k, v in annotations.items()},
    )


def test_a_delayed_message_comes_after_its_delay_not_before(broker: BrokerProcess) -> None:
    broker.ensure_queue("later")
    with broker.proton(timeout=TIMEOUT) as conn:
        receiver = conn.create_receiver("later", credit=10)
        sender = conn.create_sender("later")
        sent_at = time.monotonic()
        sender.send(scheduled("in two seconds", delay=2000))  # settled: the broker owns it
        sender.send(Message(body="now"))
        assert receiver.receive(timeout=TIMEOUT).body == "now"
        receiver.accept()
        with pytest.raises(Timeout):
            receiver.receive(timeout=1.0)  # well before its time: nothing
        message = receiver.receive(timeout=TIMEOUT)
        received_after = time.monotonic() - sent_at
        receiver.accept()
    assert message.body == "in two seconds"
    assert received_after >= 1.99  # not before its time (the broker rounds to the ms)
    assert message.annotations is not None
    assert message.annotations[symbol("x-opt-delivery-time")] > 0  # stored as a time


def test_an_absolute_delivery_time(broker: BrokerProcess) -> None:
    broker.ensure_queue("at")
    due = int(time.time() * 1000) + 2000
    with broker.proton(timeout=TIMEOUT) as conn:
        receiver = conn.create_receiver("at", credit=10)
        conn.create_sender("at").send(scheduled("at its time", time=due))
        with pytest.raises(Timeout):
            receiver.receive(timeout=1.0)
        message = receiver.receive(timeout=TIMEOUT)
        received_at = time.time() * 1000
        receiver.accept()
    assert message.body == "at its time"
    assert received_at >= due - 1


def test_a_durable_scheduled_message_survives_a_sigkill(broker: BrokerProcess) -> None:
    broker.ensure_queue("durable-later")
    delay_ms = 12_000  # longer than a restart on a loaded machine takes
    with broker.proton(timeout=TIMEOUT) as conn:
        conn.create_sender("durable-later").send(
            scheduled("after the crash", durable=True, delay=delay_ms)
        )
    due = time.time() + delay_ms / 1000
    broker.kill()
    broker.restart()
    with broker.proton(timeout=TIMEOUT) as conn:
        receiver = conn.create_receiver("durable-later", credit=10)
        early = due - time.time() - 1.0
        assert early > 0, "the restart took longer than the delay: nothing left to check"
        with pytest.raises(Timeout):
            receiver.receive(timeout=early)  # recovered, still not visible
        message = receiver.receive(timeout=TIMEOUT)
        received_at = time.time()
        receiver.accept()
    assert message.body == "after the crash"
    assert received_at >= due - 0.5  # its original due time, not a new delay from restart


def test_a_topic_subscriber_gets_it_at_its_time(broker: BrokerProcess) -> None:
    broker.ensure_topic("news")
    with broker.proton(timeout=TIMEOUT) as conn:
        receiver = conn.create_receiver("news", credit=10)
        conn.create_sender("news").send(scheduled("scheduled news", delay=1500))
        with pytest.raises(Timeout):
            receiver.receive(timeout=0.5)
        message = receiver.receive(timeout=TIMEOUT)
        receiver.accept()
    assert message.body == "scheduled news"
