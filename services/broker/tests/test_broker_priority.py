"""Priority in the broker's domain, without a network: higher levels first, FIFO within a level,
redeliveries back in their place, above 9 counted as 9, and the other queue features (selectors,
browsers, TTL, drains' hand-off, dead letters, a restart) on a prioritized queue."""

from __future__ import annotations

from pathlib import Path

from enmasse.amqp import codec
from enmasse.amqp.selector import compile_selector
from enmasse.broker.broker import Broker
from enmasse.broker.entry import Entry, Removal, priority_of
from enmasse.broker.plan import Plan
from enmasse.broker.queue import Queue, Settlement

from tests.fixtures.broker import Recorder


def queue_with(priorities: list[int], **entry: object) -> tuple[Queue, list[tuple[int, Removal]]]:
    """A queue holding messages 1..n, message i with priorities[i - 1]."""
    removed: list[tuple[int, Removal]] = []
    q = Queue(name="q", plan=Plan(), on_removed=lambda q, e, r: removed.append((e.id, r)))
    for i, priority in enumerate(priorities, start=1):
        body = codec.encode_message(b"x", application_properties={"n": i})
        q.enqueue_with_priority(Entry(i, body, **entry), priority)  # type: ignore[arg-type]
    return q, removed


def test_higher_priority_first_and_fifo_within_a_level() -> None:
    q, _ = queue_with([1, 9, 4, 9, 0, 4, 1, 7])
    a = Recorder()
    q.add_consumer(a)
    q.dispatch(0)
    assert a.ids == [2, 4, 8, 3, 6, 1, 7, 5]


def test_a_priority_above_nine_counts_as_nine() -> None:
    q, _ = queue_with([9, 200, 10, 9])
    a = Recorder()
    q.add_consumer(a)
    q.dispatch(0)
    assert a.ids == [1, 2, 3, 4]
    assert {priority_of(e) for e in a.got} == {9}


def test_every_message_at_the_default_priority_is_plain_fifo() -> None:
    q, _ = queue_with([4] * 5)
    a = Recorder()
    q.add_consumer(a)
    q.dispatch(0)
    assert a.ids == [1, 2, 3, 4, 5]
    assert q._levels is None  # no priority met: the single-deque queue, as before


def test_a_released_message_goes_back_to_its_place_in_its_level() -> None:
    q, _ = queue_with([1, 9, 9, 4, 1])
    a = Recorder(2)
    q.add_consumer(a)
    q.dispatch(0)
    assert a.ids == [2, 3]
    high = a.got[0]
    q.settle(a, high, Settlement.RELEASED)
    q.settle(a, a.got[1], Settlement.ACCEPTED)
    a.grant(10)
    q.dispatch(0)
    assert a.ids[2:] == [2, 4, 1, 5]


def test_a_released_low_priority_message_does_not_jump_higher_ones() -> None:
    q, _ = queue_with([1, 4])
    a = Recorder(1)
    q.add_consumer(a)
    q.dispatch(0)
    assert a.ids == [2]  # priority 4 before 1
    q.enqueue_with_priority(Entry(3, b"\x00Sw\xa1\x01x"), 9)
    q.enqueue_with_priority(Entry(4, b"\x00Sw\xa1\x01x"), 1)
    a.grant(1)
    q.dispatch(0)
    assert a.ids == [2, 3]
    q.settle(a, a.got[0], Settlement.RELEASED)
    q.settle(a, a.got[1], Settlement.FAILED)  # back at 9, counted
    a.grant(10)
    q.dispatch(0)
    assert a.ids[2:] == [3, 2, 1, 4]
    assert a.got[2].delivery_count == 1


def test_a_consumer_gone_gives_back_in_priority_order() -> None:
    q, _ = queue_with([1, 9, 4])
    a, b = Recorder(3), Recorder(0)
    q.add_consumer(a)
    q.add_consumer(b)
    q.dispatch(0)
    assert a.ids == [2, 3, 1]
    q.remove_consumer(a)
    b.grant(10)
    q.dispatch(0)
    assert b.ids == [2, 3, 1]


def test_competing_consumers_share_round_robin_in_priority_order() -> None:
    q, _ = queue_with([1, 9, 4, 9, 1, 4])
    a, b = Recorder(), Recorder()
    q.add_consumer(a)
    q.add_consumer(b)
    q.dispatch(0)
    assert (a.ids, b.ids) == ([2, 3, 1], [4, 6, 5])


def test_a_selective_consumer_takes_the_highest_priority_it_selects() -> None:
    q, _ = queue_with([9, 1, 7, 4, 9])
    odd = Recorder()
    q.add_consumer(odd, selector=compile_selector("n IN (1, 3, 5)"))
    rest = Recorder(0)
    q.add_consumer(rest)
    q.dispatch(0)
    assert odd.ids == [1, 5, 3]
    rest.grant(10)
    q.dispatch(0)
    assert rest.ids == [4, 2]


def test_a_selective_consumer_of_a_queue_that_becomes_prioritized() -> None:
    q, _ = queue_with([4, 4])
    odd = Recorder(1)
    q.add_consumer(odd, selector=compile_selector("n IN (1, 3, 5)"))
    q.dispatch(0)
    assert odd.ids == [1]
    body = codec.encode_message(b"x", application_properties={"n": 3})
    q.enqueue_with_priority(Entry(3, body), 8)
    q.settle(odd, odd.got[0], Settlement.RELEASED)
    odd.grant(10)
    q.dispatch(0)
    assert odd.ids == [1, 3, 1]
    assert q.depth == 1  # message 2, which it does not select


def test_a_browser_sees_each_entry_once_in_id_order() -> None:
    q, _ = queue_with([1, 9, 4])
    browser = Recorder()
    q.add_consumer(browser, browse=True)
    q.dispatch(0)
    q.enqueue_with_priority(Entry(4, b"\x00Sw\xa1\x01x"), 0)
    q.dispatch(0)
    assert browser.ids == [1, 2, 3, 4]
    assert [e.id for e in q.snapshot()] == [2, 3, 1, 4]


def test_an_expired_high_priority_message_is_never_delivered() -> None:
    q, removed = queue_with([9, 1])
    q.enqueue_with_priority(Entry(3, b"\x00Sw\xa1\x01x", False, 100), 9)
    a = Recorder()
    q.add_consumer(a)
    q.dispatch(200)
    assert a.ids == [1, 2]
    assert removed == [(3, Removal.EXPIRED)]


def test_a_hand_off_takes_in_priority_order() -> None:
    q, _ = queue_with([1, 9, 4])
    taken = q.take_ready(10)
    assert [e.id for e in taken] == [2, 3, 1]
    for entry in taken:
        q.undo_hand_off(entry)
    assert [e.id for e in q.take_ready(10)] == [2, 3, 1]


def test_purge_empties_every_level() -> None:
    q, removed = queue_with([1, 9, 4])
    assert q.purge() == 3
    assert sorted(removed) == [(1, Removal.DELETED), (2, Removal.DELETED), (3, Removal.DELETED)]
    assert q.take_ready(10) == []


def test_a_dead_letter_keeps_its_priority() -> None:
    broker = Broker()
    broker.ensure_queue("q", Plan(dead_letter_address="DLQ"))
    broker.ensure_queue("DLQ", Plan())
    for i, priority in enumerate([1, 9], start=1):
        message = codec.encode_message(str(i).encode(), priority=priority)
        broker.publish("q", payload=message, durable=False, priority=priority)
    a = Recorder(1)
    broker.queues["q"].add_consumer(a)
    broker.queues["q"].dispatch(0)
    broker.queues["q"].settle(a, a.got[0], Settlement.REJECTED)
    dlq = broker.queues["DLQ"]
    assert [priority_of(e) for e in dlq.snapshot()] == [9]


def test_priority_order_survives_a_restart(tmp_path: Path) -> None:
    broker = Broker(data_dir=tmp_path)
    broker.start()
    broker.ensure_queue("q", Plan())
    for priority in [1, 9, 4, 9]:
        message = codec.encode_message(str(priority).encode(), durable=True, priority=priority)
        broker.publish("q", payload=message, durable=True, priority=priority)
    broker.commit()
    broker.close()
    again = Broker(data_dir=tmp_path)
    again.start()
    a = Recorder()
    again.queues["q"].add_consumer(a)
    again.queues["q"].dispatch(0)
    assert [codec.read_header(e.payload).priority for e in a.got] == [9, 9, 4, 1]
    again.close()
