"""delivery-count and failed attempts survive a restart: the journal's COUNT record.

- Journal alone: the last COUNT of (message, queue) is what recovery gives back; counts of acked
  messages vanish with them; a segment written by the old code (ENQUEUE and ACK only, bytes laid
  out by hand here) still recovers; a record type from the future ends that segment's replay
  without crashing.
- Broker domain on a temp dir: a durable message failed twice, the process "dies" (nothing
  closed), a new Broker recovers it with delivery-count 2 and dead-letters it at the third failure
  when the plan allows 3 attempts. A message consumed at the first attempt writes no COUNT.
- Real process: the same story over AMQP with a SIGKILL in the middle.
"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

from enmasse.amqp import codec
from enmasse.amqp.client import Client
from enmasse.amqp.engine import Outcome
from enmasse.broker.broker import Broker
from enmasse.broker.entry import Entry
from enmasse.broker.journal import Journal
from enmasse.broker.plan import Plan
from enmasse.broker.queue import Settlement

from tests.fixtures.broker import BrokerProcess


class Holder:
    """A consumer that takes one entry at a time and keeps it until told."""

    def __init__(self) -> None:
        self.got: list[Entry] = []

    def credit(self) -> int:
        return 1 - len(self.got)

    def deliver(self, entry: Entry) -> None:
        self.got.append(entry)

    def take(self) -> Entry:
        return self.got.pop()


def _record(body: bytes) -> bytes:
    return struct.pack("<II", len(body), zlib.crc32(body)) + body


def test_last_count_of_a_live_message_is_recovered_per_queue(tmp_path: Path) -> None:
    journal = Journal(tmp_path)
    journal.recover()
    journal.enqueue(msg_id=1, queues=["q"], payload=b"a", expires_at=0)
    journal.enqueue(msg_id=2, queues=["t::x", "t::y"], payload=b"b", expires_at=0)
    journal.enqueue(msg_id=3, queues=["q"], payload=b"c", expires_at=0)
    journal.count(msg_id=1, queue="q", delivery_count=1, failed=1)
    journal.count(msg_id=1, queue="q", delivery_count=2, failed=2)
    journal.count(msg_id=2, queue="t::y", delivery_count=1, failed=0)
    journal.count(msg_id=3, queue="q", delivery_count=4, failed=0)
    journal.ack(msg_id=3, queue="q")
    journal.commit()
    found = Journal(tmp_path).recover()
    assert found.counts == {("q", 1): (2, 2), ("t::y", 2): (1, 0)}
    assert [m[0] for m in found.messages["q"]] == [1]


def test_segment_written_by_the_old_code_still_recovers(tmp_path: Path) -> None:
    # The pre-COUNT layout: ENQUEUE <BQQH> + (u16 len, name)* + payload; ACK <BQ> + name.
    enqueue = struct.pack("<BQQH", 1, 7, 0, 1) + struct.pack("<H", 1) + b"q" + b"old"
    enqueue2 = struct.pack("<BQQH", 1, 8, 0, 1) + struct.pack("<H", 1) + b"q" + b"gone"
    ack = struct.pack("<BQ", 2, 8) + b"q"
    (tmp_path / "00000001.jnl").write_bytes(_record(enqueue) + _record(enqueue2) + _record(ack))
    found = Journal(tmp_path).recover()
    assert found.messages == {"q": [(7, b"old", 0)]}
    assert found.counts == {}
    assert found.corrupt_segments == []
    assert found.next_id == 9


def test_unknown_record_type_ends_the_segment_replay_without_crashing(tmp_path: Path) -> None:
    enqueue = struct.pack("<BQQH", 1, 1, 0, 1) + struct.pack("<H", 1) + b"q" + b"kept"
    future = bytes([99]) + b"from a newer broker"
    (tmp_path / "00000001.jnl").write_bytes(_record(enqueue) + _record(future))
    found = Journal(tmp_path).recover()
    assert found.messages == {"q": [(1, b"kept", 0)]}
    assert found.corrupt_segments == ["00000001.jnl"]


def _fail(broker: Broker, queue_name: str, times: int) -> list[int]:
    """Delivers the queue's head to a holder and settles it FAILED `times` times; returns the
    delivery counts the consumer saw."""
    queue = broker.find_queue(queue_name)
    assert queue is not None
    holder = Holder()
    queue.add_consumer(holder)
    seen = []
    for _ in range(times):
        queue.dispatch(0)
        entry = holder.take()
        seen.append(entry.delivery_count)
        queue.settle(holder, entry, Settlement.FAILED)
    queue.remove_consumer(holder)
    return seen


def test_failed_attempts_before_a_crash_count_towards_dead_lettering(tmp_path: Path) -> None:
    plan = Plan(max_delivery_attempts=3, dead_letter_address="DLQ")
    first = Broker(data_dir=tmp_path)
    first.start()
    first.ensure_queue("DLQ", Plan())
    first.ensure_queue("jobs", plan)
    first.publish("jobs", payload=b"poison", durable=True)
    assert _fail(first, "jobs", 2) == [0, 1]
    first.commit()  # the group commit that carried the COUNT records; then the process dies

    second = Broker(data_dir=tmp_path)
    second.start()
    jobs = second.queues["jobs"]
    holder = Holder()
    jobs.add_consumer(holder)
    jobs.dispatch(0)
    again = holder.take()
    assert (again.delivery_count, again.failed_attempts) == (2, 2)
    jobs.settle(holder, again, Settlement.FAILED)
    assert (jobs.depth, jobs.dead_lettered) == (0, 1)
    dead = Holder()
    second.queues["DLQ"].add_consumer(dead)
    second.queues["DLQ"].dispatch(0)
    assert [(e.payload, e.delivery_count) for e in dead.got] == [(b"poison", 3)]
    second.commit()

    third = Broker(data_dir=tmp_path)  # the dead letter keeps its count across a restart too
    third.start()
    assert third.recovered.counts.get(("DLQ", dead.got[0].id)) == (3, 0)
    assert third.queues["jobs"].depth == 0


def test_a_message_consumed_at_the_first_attempt_writes_no_count(tmp_path: Path) -> None:
    broker = Broker(data_dir=tmp_path)
    broker.start()
    broker.ensure_queue("q", Plan())
    assert broker.journal is not None
    broker.publish("q", payload=b"m", durable=True)
    before = broker.journal.records
    queue = broker.queues["q"]
    holder = Holder()
    queue.add_consumer(holder)
    queue.dispatch(0)
    queue.settle(holder, holder.take(), Settlement.ACCEPTED)
    assert broker.journal.records == before + 1  # the ACK, and nothing else


def test_released_count_survives_a_restart(tmp_path: Path) -> None:
    first = Broker(data_dir=tmp_path)
    first.start()
    first.ensure_queue("q", Plan())
    first.publish("q", payload=b"m", durable=True)
    queue = first.queues["q"]
    holder = Holder()
    queue.add_consumer(holder)
    queue.dispatch(0)
    queue.remove_consumer(holder)  # the consumer went away holding it: given back, count + 1
    first.commit()
    second = Broker(data_dir=tmp_path)
    second.start()
    entry = second.queues["q"].snapshot()[0]
    assert (entry.delivery_count, entry.failed_attempts) == (1, 0)


def test_sigkill_keeps_delivery_count_and_dead_letters_after_max_attempts(
    broker: BrokerProcess,
) -> None:
    broker.ensure_queue("DLQ")
    broker.ensure_queue("probe")
    broker.ensure_queue("jobs", max_delivery_attempts=3, dead_letter_address="DLQ")
    with Client("127.0.0.1", broker.amqp_port) as c:
        c.sender("jobs").send(codec.encode_message("poison", durable=True))
        worker = c.receiver("jobs", credit=0)  # one credit per attempt: it holds none at the end
        counts = []
        for _ in range(2):
            worker.flow(1)
            delivery = worker.receive()
            counts.append(codec.read_header(delivery.payload).delivery_count)
            worker.settle(delivery, Outcome.MODIFIED, delivery_failed=True)
        assert counts == [0, 1]
        # A durable send after the second failure, on the same connection: the broker reads the
        # disposition first, so its COUNT record sits in the same or an earlier group commit
        # than this message, and this message's acceptance means both are on disk.
        probe = c.sender("probe").send(codec.encode_message("after", durable=True))
        assert probe.outcome == Outcome.ACCEPTED
    broker.restart()  # SIGKILL, same data dir

    with Client("127.0.0.1", broker.amqp_port) as c:
        worker = c.receiver("jobs", credit=1)
        delivery = worker.receive()
        assert codec.read_body(delivery.payload) == "poison"
        assert codec.read_header(delivery.payload).delivery_count == 2
        worker.settle(delivery, Outcome.MODIFIED, delivery_failed=True)  # the 3rd attempt
        dead = c.receiver("DLQ", credit=1).receive()
        assert codec.read_body(dead.payload) == "poison"
        assert codec.read_header(dead.payload).delivery_count == 3
    listed = broker.addresses()
    assert (listed["jobs"].depth, listed["jobs"].dead_lettered) == (0, 1)
