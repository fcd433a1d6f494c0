"""Transactions as the domain sees them (transactions.py, and the journal's TXN record), with no
network: published messages appear only at commit, acquired ones leave only at commit and come
back unchanged at rollback, and a crash recovers a commit all or nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
from enmasse.broker.broker import Broker
from enmasse.broker.entry import Entry
from enmasse.broker.journal import Journal
from enmasse.broker.plan import Plan
from enmasse.broker.queue import ACCEPTED, RELEASED, Queue, Settlement
from enmasse.broker.transactions import ROLLBACK, UNKNOWN_ID, TransactionError, Transactions

from tests.fixtures.broker import Recorder

OWNER = object()


def durable_broker(data_dir: Path) -> Broker:
    broker = Broker(data_dir=data_dir)
    broker.start()
    broker.ensure_queue("q", Plan(persistent=True))
    return broker


def publish(txns: Transactions, txn_id: bytes, body: bytes, *, durable: bool = True) -> None:
    txns.publish(txn_id, owner=OWNER, address="q", payload=body, durable=durable)


def acquire(
    txns: Transactions,
    txn_id: bytes,
    queue: Queue,
    consumer: Recorder,
    entry: Entry,
    told: list[Settlement],
) -> None:
    txns.acquire(
        txn_id,
        owner=OWNER,
        queue=queue,
        consumer=consumer,
        entry=entry,
        settlement=ACCEPTED,
        settle_delivery=told.append,
    )


def payloads(queue: Queue) -> list[bytes]:
    return [entry.payload for entry in queue.snapshot()]


def test_published_messages_appear_only_at_commit() -> None:
    broker = Broker()
    queue = broker.ensure_queue("q", Plan())
    txns = Transactions(broker)
    txn = txns.declare(owner=OWNER)
    publish(txns, txn.id, b"a")
    publish(txns, txn.id, b"b")
    assert queue.depth == 0
    assert broker.budget.used == 2  # held bytes count against the memory budget
    answered: list[str] = []
    done = txns.discharge(txn.id, owner=OWNER, fail=False, on_done=lambda: answered.append("x"))
    assert done is True  # no journal: answered at once
    assert payloads(queue) == [b"a", b"b"]
    assert broker.budget.used == 2  # now as the queue's bytes
    assert txn.id not in txns.open


def test_rolled_back_publish_leaves_nothing() -> None:
    broker = Broker()
    queue = broker.ensure_queue("q", Plan())
    txns = Transactions(broker)
    txn = txns.declare(owner=OWNER)
    publish(txns, txn.id, b"a")
    assert txns.discharge(txn.id, owner=OWNER, fail=True, on_done=lambda: None) is True
    assert queue.depth == 0
    assert queue.enqueued == 0
    assert broker.budget.used == 0


def test_acquired_message_stays_acquired_until_commit_then_is_gone() -> None:
    broker = Broker()
    queue = broker.ensure_queue("q", Plan())
    first, second = Recorder(credit=1), Recorder()
    queue.add_consumer(first)
    broker.publish("q", payload=b"m")
    txns = Transactions(broker)
    txn = txns.declare(owner=OWNER)
    told: list[Settlement] = []
    acquire(txns, txn.id, queue, first, first.got[0], told)
    queue.add_consumer(second)
    queue.dispatch(0)
    assert second.got == []  # acquired: nobody else gets it
    assert queue.in_flight == 1
    txns.discharge(txn.id, owner=OWNER, fail=False, on_done=lambda: None)
    assert told == [ACCEPTED]
    assert queue.in_flight == 0
    assert queue.depth == 0
    assert queue.dequeued == 1


def test_rollback_releases_acquired_message_with_delivery_count_unchanged() -> None:
    broker = Broker()
    queue = broker.ensure_queue("q", Plan())
    first = Recorder(credit=1)
    queue.add_consumer(first)
    broker.publish("q", payload=b"m")
    txns = Transactions(broker)
    txn = txns.declare(owner=OWNER)
    told: list[Settlement] = []
    acquire(txns, txn.id, queue, first, first.got[0], told)
    second = Recorder()
    queue.add_consumer(second)
    txns.discharge(txn.id, owner=OWNER, fail=True, on_done=lambda: None)
    assert told == [RELEASED]
    assert [e.payload for e in second.got] == [b"m"]
    assert second.got[0].delivery_count == 0


def test_unknown_foreign_and_discharged_ids_are_refused() -> None:
    broker = Broker()
    broker.ensure_queue("q", Plan())
    txns = Transactions(broker)
    txn = txns.declare(owner=OWNER)
    with pytest.raises(TransactionError) as never:
        publish(txns, b"nope", b"a")
    assert never.value.condition == UNKNOWN_ID
    assert "'nope'" in str(never.value)
    with pytest.raises(TransactionError) as foreign:
        txns.discharge(txn.id, owner=object(), fail=False, on_done=lambda: None)
    assert foreign.value.condition == UNKNOWN_ID
    txns.discharge(txn.id, owner=OWNER, fail=False, on_done=lambda: None)
    with pytest.raises(TransactionError) as twice:
        txns.discharge(txn.id, owner=OWNER, fail=False, on_done=lambda: None)
    assert twice.value.condition == UNKNOWN_ID


def test_commit_after_the_acquiring_consumer_left_rolls_back_everything() -> None:
    broker = Broker()
    queue = broker.ensure_queue("q", Plan())
    consumer = Recorder(credit=1)
    queue.add_consumer(consumer)
    broker.publish("q", payload=b"old")
    txns = Transactions(broker)
    txn = txns.declare(owner=OWNER)
    acquire(txns, txn.id, queue, consumer, consumer.got[0], [])
    publish(txns, txn.id, b"new")
    queue.remove_consumer(consumer)  # its link detached: the queue took "old" back
    txns.consumer_gone(consumer)
    with pytest.raises(TransactionError) as failed:
        txns.discharge(txn.id, owner=OWNER, fail=False, on_done=lambda: None)
    assert failed.value.condition == ROLLBACK
    assert "detached" in str(failed.value)
    assert payloads(queue) == [b"old"]  # "new" never published


def test_commit_to_a_deleted_address_rolls_back() -> None:
    broker = Broker()
    broker.ensure_queue("q", Plan())
    txns = Transactions(broker)
    txn = txns.declare(owner=OWNER)
    publish(txns, txn.id, b"a")
    broker.delete_queue("q")
    with pytest.raises(TransactionError) as failed:
        txns.discharge(txn.id, owner=OWNER, fail=False, on_done=lambda: None)
    assert failed.value.condition == ROLLBACK
    assert "'q'" in str(failed.value)


def test_end_owner_rolls_back_only_that_owners_transactions() -> None:
    broker = Broker()
    queue = broker.ensure_queue("q", Plan())
    txns = Transactions(broker)
    mine, theirs = txns.declare(owner=OWNER), txns.declare(owner="other")
    publish(txns, mine.id, b"a")
    assert txns.end_owner(OWNER) == 1
    assert list(txns.open) == [theirs.id]
    assert queue.depth == 0
    assert broker.budget.used == 0


def test_commit_is_one_journal_record_answered_after_fsync_and_recovered(tmp_path: Path) -> None:
    broker = durable_broker(tmp_path)
    queue = broker.queues["q"]
    consumer = Recorder(credit=1)
    queue.add_consumer(consumer)
    broker.publish("q", payload=b"old", durable=True)
    broker.commit()
    assert broker.journal is not None
    records_before = broker.journal.records
    txns = Transactions(broker)
    txn = txns.declare(owner=OWNER)
    acquire(txns, txn.id, queue, consumer, consumer.got[0], [])
    publish(txns, txn.id, b"new-1")
    publish(txns, txn.id, b"new-2")
    assert broker.journal.records == records_before  # nothing written before the discharge
    answered: list[str] = []
    done = txns.discharge(txn.id, owner=OWNER, fail=False, on_done=lambda: answered.append("x"))
    assert done is False
    assert answered == []  # not before the fsync
    broker.commit()
    assert answered == ["x"]
    broker.close()
    again = durable_broker(tmp_path)
    assert payloads(again.queues["q"]) == [b"new-1", b"new-2"]


def test_torn_commit_record_recovers_nothing_of_the_transaction(tmp_path: Path) -> None:
    broker = durable_broker(tmp_path)
    queue = broker.queues["q"]
    consumer = Recorder(credit=1)
    queue.add_consumer(consumer)
    broker.publish("q", payload=b"old", durable=True)
    broker.commit()
    journal = broker.journal
    assert journal is not None
    segment = tmp_path / "journal" / f"{journal.segment_numbers[-1]:08d}.jnl"
    size_before = segment.stat().st_size
    txns = Transactions(broker)
    txn = txns.declare(owner=OWNER)
    acquire(txns, txn.id, queue, consumer, consumer.got[0], [])
    publish(txns, txn.id, b"new-1")
    publish(txns, txn.id, b"new-2")
    txns.discharge(txn.id, owner=OWNER, fail=False, on_done=lambda: None)
    broker.commit()
    broker.close()
    written = segment.stat().st_size - size_before
    assert written > 0
    # A crash during the write: the record's last bytes never reached the disk.
    with open(segment, "r+b") as torn:
        torn.truncate(size_before + written - 3)
    again = durable_broker(tmp_path)
    assert payloads(again.queues["q"]) == [b"old"]  # no new message, the old one not acked


def test_journal_atomic_group_recovers_its_records_as_if_alone(tmp_path: Path) -> None:
    journal = Journal(tmp_path)
    journal.recover()
    journal.enqueue(msg_id=1, queues=["q"], payload=b"before", expires_at=0)
    with journal.atomic():
        journal.enqueue(msg_id=2, queues=["q"], payload=b"in-txn", expires_at=0)
        journal.ack(msg_id=1, queue="q")
    journal.commit()
    journal.close()
    found = Journal(tmp_path).recover()
    assert [m[1] for m in found.messages["q"]] == [b"in-txn"]
