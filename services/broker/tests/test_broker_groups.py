"""Message groups without a network: `Groups` alone (assignment, parking, release), then a queue
with competing consumers: a group sticks to the consumer that took its first message, ungrouped
messages spread, a consumer without credit holds its group back while others flow, and a group
moves, in order, when its consumer leaves."""

from __future__ import annotations

from enmasse.amqp import codec
from enmasse.broker.entry import GONE, Entry
from enmasse.broker.groups import Groups
from enmasse.broker.plan import Plan
from enmasse.broker.queue import Queue, Settlement

from tests.fixtures.broker import Recorder


def message(n: int, group: str | None) -> bytes:
    properties = {"group_id": group} if group else {}
    return codec.encode_message(str(n), properties=properties)


def grouped_queue(groups: list[str | None]) -> Queue:
    """A queue holding messages 1..n, message i in groups[i - 1] (None: no group)."""
    queue = Queue(name="q", plan=Plan())
    for i, group in enumerate(groups, start=1):
        entry = Entry(i, message(i, group))
        if group is None:
            queue.enqueue(entry)
        else:
            queue.enqueue_in_group(entry, group=group, priority=4)
    return queue


def group_of_ids(recorder: Recorder, groups: list[str | None]) -> set[str | None]:
    return {groups[i - 1] for i in recorder.ids}


# ------------------------------------------------------------------ Groups alone


def test_assignment_parking_and_release() -> None:
    groups: Groups[str] = Groups()
    groups.assign("g1", "a")
    groups.assign("g2", "a")
    groups.assign("g3", "b")
    assert groups.owner_of("g1") == "a"
    assert groups.owner_of("g3") == "b"
    later, earlier, gone = Entry(7, b""), Entry(3, b""), Entry(5, b"")
    groups.park("a", 7, later)
    groups.park("a", 3, earlier)
    groups.park("a", 5, gone)
    gone.state = GONE
    assert groups.next_parked("a") is earlier  # oldest first
    assert groups.next_parked("b") is None
    back = groups.release("a")
    assert [entry for _, entry in back] == [later]  # what is still ready comes back
    assert groups.owner_of("g1") is None
    assert groups.owner_of("g2") is None
    assert groups.owner_of("g3") == "b"
    assert groups.assigned == 1


# ------------------------------------------------------------------ a grouped queue


def test_a_group_sticks_to_one_consumer_and_ungrouped_messages_spread() -> None:
    layout: list[str | None] = ["A", "B", None, None, "A", "B", None, "A", None, "B"] * 3
    queue = grouped_queue(layout)
    a, b = Recorder(), Recorder()
    queue.add_consumer(a)
    queue.add_consumer(b)
    queue.dispatch(0)
    assert sorted(a.ids + b.ids) == list(range(1, len(layout) + 1))
    for consumer in (a, b):
        assert consumer.ids == sorted(consumer.ids)  # each in enqueue order
    assert group_of_ids(a, layout) == {"A", None}  # one group each, ungrouped ones on both
    assert group_of_ids(b, layout) == {"B", None}


def test_a_consumer_without_credit_holds_its_group_back_while_others_flow() -> None:
    layout: list[str | None] = ["A", "A", "B", "A", None, "B", "A"]
    queue = grouped_queue(layout)
    a, b = Recorder(credit=1), Recorder(credit=100)
    queue.add_consumer(a)
    queue.add_consumer(b)
    queue.dispatch(0)
    assert a.ids == [1]  # took group A, then ran out of credit
    assert b.ids == [3, 5, 6]  # group B and the ungrouped one; A's others wait for a
    assert queue.depth == 3
    a.grant(10)
    queue.dispatch(0)
    assert a.ids == [1, 2, 4, 7]


def test_a_group_moves_in_order_when_its_consumer_leaves() -> None:
    layout: list[str | None] = ["A"] * 6
    queue = grouped_queue(layout)
    a, b = Recorder(credit=3), Recorder(credit=100)
    queue.add_consumer(a)
    queue.add_consumer(b)
    queue.dispatch(0)
    assert a.ids == [1, 2, 3]
    assert b.ids == []
    queue.settle(a, a.got[0], Settlement.ACCEPTED)
    queue.remove_consumer(a)  # 2 and 3 unsettled; 4-6 parked for a
    queue.dispatch(0)
    assert b.ids == [2, 3, 4, 5, 6]


def test_a_released_message_goes_back_to_its_owner_before_the_newer_ones() -> None:
    queue = grouped_queue(["A", "A", "A"])
    a, b = Recorder(credit=1), Recorder(credit=100)
    queue.add_consumer(a)
    queue.add_consumer(b)
    queue.dispatch(0)
    assert a.ids == [1]
    assert b.ids == []
    queue.settle(a, a.got[0], Settlement.RELEASED)
    a.grant(3)
    queue.dispatch(0)
    assert a.ids == [1, 1, 2, 3]
    assert b.ids == []


def test_a_queue_without_groups_never_takes_the_grouped_path() -> None:
    queue = grouped_queue([None, None])
    assert queue._groups is None
    a = Recorder()
    queue.add_consumer(a)
    queue.dispatch(0)
    assert a.ids == [1, 2]


def test_a_parked_message_still_expires() -> None:
    queue = Queue(name="q", plan=Plan())
    for i in (1, 2):
        entry = Entry(i, message(i, "A"), expires_at=100 if i == 2 else 0)
        queue.enqueue_in_group(entry, group="A", priority=4)
    a, b = Recorder(credit=1), Recorder(credit=10)
    queue.add_consumer(a)
    queue.add_consumer(b)
    queue.dispatch(0)  # 1 to a; 2 parked for a (b met it)
    assert (a.ids, b.ids, queue.depth) == ([1], [], 1)
    a.grant(1)
    queue.dispatch(100)
    assert a.ids == [1]
    assert (queue.depth, queue.expired) == (0, 1)
