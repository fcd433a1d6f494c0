"""The journal on a real temp directory: group commit, recovery in order, torn and corrupt tails,
segment reclaim."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from enmasse.broker.journal import Journal


def fill(journal: Journal, n: int, *, queue: str = "q", first: int = 1) -> None:
    for i in range(first, first + n):
        journal.enqueue(msg_id=i, queues=[queue], payload=f"m{i}".encode(), expires_at=0)


def recovered_ids(directory: Path, queue: str = "q") -> list[int]:
    found = Journal(directory).recover()
    return [msg_id for msg_id, _, _ in found.messages.get(queue, [])]


def test_group_commit_runs_callbacks_only_after_the_single_write(tmp_path: Path) -> None:
    journal = Journal(tmp_path)
    journal.recover()
    settled: list[int] = []
    fill(journal, 100)
    for i in range(100):
        journal.after_commit(lambda i=i: settled.append(i))
    assert settled == []
    journal.commit()
    assert settled == list(range(100))
    assert journal.commits == 1
    assert recovered_ids(tmp_path) == list(range(1, 101))


def test_uncommitted_records_are_not_recovered(tmp_path: Path) -> None:
    journal = Journal(tmp_path)
    journal.recover()
    fill(journal, 5)
    journal.commit()
    fill(journal, 5, first=6)  # never committed: the process died first
    assert recovered_ids(tmp_path) == [1, 2, 3, 4, 5]


def test_acked_messages_are_not_recovered_and_fan_out_needs_every_ack(tmp_path: Path) -> None:
    journal = Journal(tmp_path)
    journal.recover()
    fill(journal, 4)
    journal.enqueue(msg_id=5, queues=["t::a", "t::b"], payload=b"fan", expires_at=7)
    journal.ack(msg_id=2, queue="q")
    journal.ack(msg_id=5, queue="t::a")
    journal.commit()
    found = Journal(tmp_path).recover()
    assert [m[0] for m in found.messages["q"]] == [1, 3, 4]
    assert found.messages["t::b"] == [(5, b"fan", 7)]
    assert "t::a" not in found.messages
    assert found.next_id == 6


@pytest.mark.parametrize("damage", ["torn", "flipped"])
def test_torn_or_corrupt_tail_is_skipped_with_everything_before_it_kept(
    tmp_path: Path, damage: str
) -> None:
    journal = Journal(tmp_path)
    journal.recover()
    fill(journal, 10)
    journal.commit()
    segment = sorted(tmp_path.glob("*.jnl"))[-1]
    data = bytearray(segment.read_bytes())
    if damage == "torn":
        data = data[:-3]
    else:
        data[-2] ^= 0xFF
    segment.write_bytes(bytes(data))
    found = Journal(tmp_path).recover()
    assert [m[0] for m in found.messages["q"]] == list(range(1, 10))
    assert found.corrupt_segments == [segment.name]


def test_garbage_segment_does_not_stop_recovery_of_later_segments(tmp_path: Path) -> None:
    journal = Journal(tmp_path, segment_bytes=1)  # every commit rolls a new segment
    journal.recover()
    fill(journal, 1)
    journal.commit()
    fill(journal, 1, first=2)
    journal.commit()
    first = sorted(tmp_path.glob("*.jnl"))[0]
    first.write_bytes(os.urandom(64))
    assert recovered_ids(tmp_path) == [2]


def test_fully_acknowledged_segments_are_reclaimed_oldest_first(tmp_path: Path) -> None:
    journal = Journal(tmp_path, segment_bytes=1)
    journal.recover()
    for i in range(1, 4):
        fill(journal, 1, first=i)
        journal.commit()  # message i in a segment of its own
    assert len(list(tmp_path.glob("*.jnl"))) == 3
    journal.ack(msg_id=2, queue="q")
    journal.commit()  # the ack goes to a fourth segment
    assert len(list(tmp_path.glob("*.jnl"))) == 4  # 2's segment waits behind 1's
    journal.ack(msg_id=1, queue="q")
    journal.commit()
    assert len(list(tmp_path.glob("*.jnl"))) == 3  # 1 and 2 reclaimed; 3, 4 and the open one
    assert recovered_ids(tmp_path) == [3]


def test_group_committer_settles_after_its_fsync_and_batches_what_came_meanwhile(
    tmp_path: Path,
) -> None:
    import queue

    from enmasse.broker.journal import GroupCommitter

    journal = Journal(tmp_path)
    journal.recover()
    posted: queue.SimpleQueue = queue.SimpleQueue()
    committer = GroupCommitter(journal, post=posted.put, on_failure=lambda exc: None)
    settled: list[int] = []
    fill(journal, 1)
    journal.after_commit(lambda: settled.append(1))
    committer.kick()
    for i in range(2, 101):  # arrive while the first batch is being written
        fill(journal, 1, first=i)
        journal.after_commit(lambda i=i: settled.append(i))
        committer.kick()  # busy: nothing handed over yet
    while len(settled) < 100:
        posted.get(timeout=10)()  # what the engine thread would run
    assert settled == list(range(1, 101))
    assert journal.commits == 2  # the 99 that came meanwhile share ONE fsync
    committer.stop()
    assert recovered_ids(tmp_path) == list(range(1, 101))
