"""No dead letter is ever dropped: a broker with no queue of a dead letter's dead-letter address
holds it in its queue (never delivered again, counted, listed), keeps it held across a restart,
and moves it as soon as that queue is ensured.

The domain tests drive a `Broker` without a network; the last ones start a real `enmasse-broker`
and poison a queue with a real AMQP client (rejected, and modified with delivery-failed until
the plan's attempts run out).
"""

from __future__ import annotations

from pathlib import Path

from enmasse.amqp import codec
from enmasse.amqp.client import Client
from enmasse.amqp.engine import Outcome
from enmasse.broker.broker import Broker
from enmasse.broker.plan import Plan
from enmasse.broker.queue import Settlement

from tests.fixtures.broker import BrokerProcess, Recorder

POISONED = Plan(max_delivery_attempts=2, dead_letter_address="DLQ")


def _poison(broker: Broker, queue_name: str, *, attempts: int) -> Recorder:
    """One consumer fails the queue's first message `attempts` times; returns the consumer."""
    queue = broker.queues[queue_name]
    consumer = Recorder(credit=0)
    queue.add_consumer(consumer)
    for _ in range(attempts):
        consumer.grant(1)
        queue.dispatch(0)
        queue.settle(consumer, consumer.got[-1], Settlement.FAILED)
    return consumer


def test_a_dead_letter_with_no_dead_letter_queue_is_held_not_dropped_nor_redelivered() -> None:
    broker = Broker()
    broker.ensure_queue("jobs", POISONED)
    broker.publish("jobs", payload=b"poison")
    broker.publish("jobs", payload=b"fine")
    consumer = _poison(broker, "jobs", attempts=2)
    jobs = broker.queues["jobs"]
    assert (jobs.dead_lettered, jobs.dead_letters_held) == (1, 1)
    assert jobs.bytes == len(b"poison") + len(b"fine")  # still held: still in memory
    consumer.grant(10)
    jobs.dispatch(0)
    assert [e.payload for e in consumer.got] == [b"poison", b"poison", b"fine"]
    assert [e.payload for e in jobs.snapshot()] == []  # browsers do not see it either


def test_held_dead_letters_move_once_the_dead_letter_queue_is_ensured() -> None:
    broker = Broker()
    broker.ensure_queue("jobs", POISONED)
    broker.publish("jobs", payload=b"poison")
    _poison(broker, "jobs", attempts=2)
    broker.ensure_queue("DLQ", Plan())
    jobs, dlq = broker.queues["jobs"], broker.queues["DLQ"]
    assert (jobs.dead_letters_held, jobs.bytes) == (0, 0)
    assert [(e.payload, e.delivery_count) for e in dlq.snapshot()] == [(b"poison", 2)]


def test_a_dead_letter_queue_that_is_its_own_dead_letter_address_holds_its_dead_letters() -> None:
    broker = Broker()
    broker.ensure_queue("DLQ", Plan(dead_letter_address="DLQ"))
    broker.publish("DLQ", payload=b"twice dead")
    dlq = broker.queues["DLQ"]
    reader = Recorder()
    dlq.add_consumer(reader)
    dlq.dispatch(0)
    dlq.settle(reader, reader.got[0], Settlement.REJECTED)
    assert (dlq.depth, dlq.dead_lettered, dlq.dead_letters_held) == (0, 1, 1)


def test_a_held_dead_letter_stays_held_across_a_restart_and_moves_when_the_queue_comes(
    tmp_path: Path,
) -> None:
    first = Broker(data_dir=tmp_path)
    first.start()
    first.ensure_queue("jobs", POISONED)
    first.publish("jobs", payload=b"poison", durable=True)
    _poison(first, "jobs", attempts=2)
    first.commit()
    first.close()

    second = Broker(data_dir=tmp_path)
    second.start()
    jobs = second.queues["jobs"]
    assert (jobs.depth, jobs.dead_letters_held) == (0, 1)  # held, not ready again
    second.ensure_queue("DLQ", Plan())
    assert [(e.payload, e.delivery_count) for e in second.queues["DLQ"].snapshot()] == [
        (b"poison", 2)
    ]
    second.commit()
    second.close()

    third = Broker(data_dir=tmp_path)  # moved for good: in the DLQ, gone from its queue
    third.start()
    assert (third.queues["jobs"].depth, third.queues["jobs"].dead_letters_held) == (0, 0)
    assert [e.payload for e in third.queues["DLQ"].snapshot()] == [b"poison"]


def test_deleting_a_queue_deletes_its_held_dead_letters_and_their_journal_records(
    tmp_path: Path,
) -> None:
    broker = Broker(data_dir=tmp_path)
    broker.start()
    broker.ensure_queue("jobs", POISONED)
    broker.publish("jobs", payload=b"poison", durable=True)
    _poison(broker, "jobs", attempts=2)
    assert broker.delete_queue("jobs") == 1
    assert broker.budget.used == 0
    broker.commit()
    assert broker.journal is not None
    assert broker.journal.live_messages == 0


def test_a_drain_takes_held_dead_letters_with_the_ready_messages() -> None:
    broker = Broker()
    broker.ensure_queue("jobs", POISONED)
    broker.publish("jobs", payload=b"poison")
    broker.publish("jobs", payload=b"waiting")
    consumer = _poison(broker, "jobs", attempts=2)
    jobs = broker.queues["jobs"]
    jobs.remove_consumer(consumer)
    taken = jobs.take_ready(10)
    assert [e.payload for e in taken] == [b"waiting", b"poison"]
    for entry in taken:
        jobs.finish_hand_off(entry)
    assert (jobs.depth, jobs.dead_letters_held, jobs.bytes) == (0, 0, 0)


# ------------------------------------------------------------------ a real broker


def test_a_poison_message_with_no_dead_letter_queue_is_held_and_listed_then_moved_to_it(
    broker: BrokerProcess,
) -> None:
    broker.ensure_queue("jobs", max_delivery_attempts=2, dead_letter_address="DLQ")
    with Client("127.0.0.1", broker.amqp_port) as c:
        c.sender("jobs").send(codec.encode_message("poison", durable=True))
        worker = c.receiver("jobs", credit=1)
        for _ in range(2):
            worker.settle(worker.receive(), Outcome.MODIFIED, delivery_failed=True)
        c.sender("jobs").send(codec.encode_message("fine"))
        after = worker.receive()
        assert codec.read_body(after.payload) == "fine"  # the poison is not delivered again
        worker.accept(after)
    listed = broker.addresses()["jobs"]
    assert (listed.depth, listed.dead_lettered, listed.dead_letters_held) == (0, 1, 1)
    assert listed.bytes > 0

    broker.restart()  # SIGKILL: the held dead letter was journaled as held
    assert broker.addresses()["jobs"].dead_letters_held == 1
    broker.ensure_queue("DLQ")
    with Client("127.0.0.1", broker.amqp_port) as c:
        dead = c.receiver("DLQ", credit=1).receive()
        assert codec.read_body(dead.payload) == "poison"
        assert codec.read_header(dead.payload).delivery_count == 2
    listed = broker.addresses()["jobs"]
    assert (listed.dead_letters_held, listed.bytes) == (0, 0)


def test_a_topic_lists_the_dead_letters_its_subscriptions_hold(broker: BrokerProcess) -> None:
    broker.ensure_topic("news", dead_letter_address="DLQ")
    with Client("127.0.0.1", broker.amqp_port) as c:
        reader = c.receiver("news", credit=1)
        c.sender("news").send(codec.encode_message("unreadable"))
        reader.settle(reader.receive(), Outcome.REJECTED)
        listed = broker.addresses()
        assert listed["news"].dead_letters_held == 1
        held = [a for a in listed.values() if a.kind == "subscription"]
        assert [(a.dead_lettered, a.dead_letters_held) for a in held] == [(1, 1)]
