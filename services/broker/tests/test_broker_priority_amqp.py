"""Priority over real AMQP: Qpid Proton's blocking client against a real `enmasse-broker` process.

Messages sent with header priorities are received highest first, FIFO within a level, by a
consumer that attaches after they were sent; the order holds across a SIGKILL and restart for
durable messages.
"""

from __future__ import annotations

from proton import Message

from tests.fixtures.broker import BrokerProcess

TIMEOUT = 10


def send_all(broker: BrokerProcess, address: str, messages: list[Message]) -> None:
    with broker.proton(timeout=TIMEOUT) as conn:
        sender = conn.create_sender(address)
        for message in messages:
            sender.send(message)  # blocks until settled: the broker owns it


def receive_bodies(broker: BrokerProcess, address: str, n: int) -> list[str]:
    with broker.proton(timeout=TIMEOUT) as conn:
        receiver = conn.create_receiver(address, credit=n)
        bodies = []
        for _ in range(n):
            message = receiver.receive(timeout=TIMEOUT)
            bodies.append(message.body)
        receiver.accept()
        return bodies


def test_a_late_consumer_gets_higher_priority_first(broker: BrokerProcess) -> None:
    broker.ensure_queue("jobs")
    sent = [("a", 1), ("b", 9), ("c", 4), ("d", 9)]
    send_all(broker, "jobs", [Message(body=b, priority=p) for b, p in sent])
    assert receive_bodies(broker, "jobs", 4) == ["b", "d", "c", "a"]


def test_without_priorities_a_queue_stays_fifo(broker: BrokerProcess) -> None:
    broker.ensure_queue("plain")
    send_all(broker, "plain", [Message(body=str(i)) for i in range(5)])
    assert receive_bodies(broker, "plain", 5) == ["0", "1", "2", "3", "4"]


def test_priority_order_survives_a_sigkill(broker: BrokerProcess) -> None:
    broker.ensure_queue("durable-jobs", persistent=True)
    sent = [("a", 1), ("b", 9), ("c", 4), ("d", 9), ("e", 0), ("f", 200)]
    send_all(broker, "durable-jobs", [Message(body=b, priority=p, durable=True) for b, p in sent])
    broker.kill()
    broker.restart()
    assert receive_bodies(broker, "durable-jobs", 6) == ["b", "d", "f", "c", "a", "e"]
