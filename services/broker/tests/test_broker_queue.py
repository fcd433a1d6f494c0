"""Queue rules without a network: fairness, FIFO, redelivery counting, dead letters, browse, TTL,
memory limits. Consumers here are plain recorders of what a link would have been handed."""

from __future__ import annotations

from enmasse.broker.broker import Broker
from enmasse.broker.entry import Entry, Removal
from enmasse.broker.plan import Plan
from enmasse.broker.queue import MemoryBudget, Queue, Settlement

from tests.fixtures.broker import Recorder


def filled(n: int, plan: Plan | None = None, **kw: object) -> tuple[Queue, list]:
    removed: list = []
    q = Queue(name="q", plan=plan or Plan(), on_removed=lambda q, e, r: removed.append((e.id, r)))
    for i in range(1, n + 1):
        q.enqueue(Entry(id=i, payload=b"x" * 10, **kw))  # type: ignore[arg-type]
    return q, removed


def test_competing_consumers_are_served_round_robin() -> None:
    q, _ = filled(9)
    a, b, c = Recorder(10), Recorder(10), Recorder(10)
    for consumer in (a, b, c):
        q.add_consumer(consumer)
    assert q.dispatch(0) == 9
    assert (a.ids, b.ids, c.ids) == ([1, 4, 7], [2, 5, 8], [3, 6, 9])


def test_consumer_without_credit_is_skipped_and_nothing_is_lost() -> None:
    q, _ = filled(5)
    a, b = Recorder(1), Recorder(0)
    q.add_consumer(a)
    q.add_consumer(b)
    q.dispatch(0)
    assert (a.ids, b.ids, q.depth) == ([1], [], 4)
    b.grant(10)
    q.dispatch(0)
    assert b.ids == [2, 3, 4, 5]


def test_single_consumer_gets_fifo_order() -> None:
    q, _ = filled(100)
    a = Recorder(1000)
    q.add_consumer(a)
    q.dispatch(0)
    assert a.ids == list(range(1, 101))


def test_released_goes_to_another_consumer_unchanged() -> None:
    q, removed = filled(1)
    a, b = Recorder(1), Recorder(1)
    q.add_consumer(a)
    q.add_consumer(b)
    q.dispatch(0)
    entry = a.got[0]
    q.settle(a, entry, Settlement.RELEASED)
    q.dispatch(0)
    assert b.ids == [1]
    assert b.got[0].delivery_count == 0  # AMQP 1.0 3.4.4: the message is unchanged
    assert entry.failed_attempts == 0
    q.settle(b, entry, Settlement.ACCEPTED)
    assert removed == [(1, Removal.ACKED)]
    assert (q.depth, q.bytes, q.dequeued) == (0, 0, 1)


def test_redelivered_message_keeps_its_fifo_place() -> None:
    q, _ = filled(3)
    a = Recorder(2)
    q.add_consumer(a)
    q.dispatch(0)
    q.settle(a, a.got[1], Settlement.RELEASED)
    q.settle(a, a.got[0], Settlement.RELEASED)
    a.got.clear()
    a.grant(10)
    q.dispatch(0)
    assert a.ids == [1, 2, 3]


def test_failed_attempts_dead_letter_after_max_attempts() -> None:
    q, removed = filled(1, Plan(max_delivery_attempts=3))
    a = Recorder(100)
    q.add_consumer(a)
    for _ in range(3):
        q.dispatch(0)
        q.settle(a, a.got[-1], Settlement.FAILED)
    assert len(a.got) == 3
    assert removed == [(1, Removal.DEAD_LETTERED)]
    assert q.dead_lettered == 1
    assert q.dispatch(0) == 0


def test_release_does_not_count_as_failed_attempt() -> None:
    q, removed = filled(1, Plan(max_delivery_attempts=1))
    a = Recorder(100)
    q.add_consumer(a)
    for _ in range(5):
        q.dispatch(0)
        q.settle(a, a.got[-1], Settlement.RELEASED)
    assert removed == []
    assert (a.got[-1].delivery_count, a.got[-1].failed_attempts) == (0, 0)


def test_only_delivery_failed_counts_and_only_failures_dead_letter() -> None:
    counted: list[int] = []
    q, removed = filled(1, Plan(max_delivery_attempts=2), journaled=True)
    q.on_counted = lambda _q, e: counted.append(e.delivery_count)
    a = Recorder(100)
    q.add_consumer(a)
    seen = []
    for settlement in (
        Settlement.RELEASED,
        Settlement.MODIFIED,
        Settlement.FAILED,
        Settlement.RELEASED,
        Settlement.MODIFIED,
        Settlement.FAILED,
    ):
        q.dispatch(0)
        seen.append(a.got[-1].delivery_count)
        q.settle(a, a.got[-1], settlement)
    assert seen == [0, 0, 0, 1, 1, 1]
    assert removed == [(1, Removal.DEAD_LETTERED)]  # at the second failure, not the sixth outcome
    assert (a.got[-1].delivery_count, a.got[-1].failed_attempts) == (2, 2)
    assert counted == [1], "only a changed count is journaled (the dead letter moves with 2)"


def test_a_rewritten_message_counts_its_new_size() -> None:
    q, _ = filled(2)
    a = Recorder(1)
    q.add_consumer(a)
    q.dispatch(0)
    q.settle(a, a.got[0], Settlement.RELEASED)
    q.rewrite(a.got[0], b"y" * 14)
    assert (q.bytes, q.budget.used) == (24, 24)
    a.grant(2)
    q.dispatch(0)
    assert [e.payload for e in a.got] == [b"y" * 14, b"y" * 14, b"x" * 10]
    for entry in a.got[1:]:
        q.settle(a, entry, Settlement.ACCEPTED)
    assert (q.bytes, q.budget.used, q.depth) == (0, 0, 0)


def test_rejected_goes_straight_to_dead_letter() -> None:
    q, removed = filled(2)
    a = Recorder(1)
    q.add_consumer(a)
    q.dispatch(0)
    q.settle(a, a.got[0], Settlement.REJECTED)
    assert removed == [(1, Removal.DEAD_LETTERED)]


def test_consumer_leaving_releases_its_unsettled_in_order() -> None:
    q, _ = filled(4)
    a, b = Recorder(3), Recorder(0)
    q.add_consumer(a)
    q.add_consumer(b)
    q.dispatch(0)
    q.remove_consumer(a)
    b.grant(10)
    q.dispatch(0)
    assert b.ids == [1, 2, 3, 4]
    assert [e.delivery_count for e in b.got] == [1, 1, 1, 0]


def test_browser_sees_everything_without_consuming() -> None:
    q, _ = filled(3)
    browser = Recorder(10)
    q.add_consumer(browser, browse=True)
    q.dispatch(0)
    assert browser.ids == [1, 2, 3]
    assert q.depth == 3
    q.enqueue(Entry(id=4, payload=b"y"))
    q.dispatch(0)
    assert browser.ids == [1, 2, 3, 4]
    taker = Recorder(10)
    q.add_consumer(taker)
    q.dispatch(0)
    assert taker.ids == [1, 2, 3, 4]


def test_expired_message_is_never_delivered() -> None:
    q, removed = filled(0)
    q.enqueue(Entry(id=1, payload=b"a", expires_at=1000))
    q.enqueue(Entry(id=2, payload=b"b"))
    a = Recorder(10)
    q.add_consumer(a)
    q.dispatch(1000)
    assert a.ids == [2]
    assert removed == [(1, Removal.EXPIRED)]
    assert q.expired == 1


def test_reaper_expires_without_any_consumer() -> None:
    q, removed = filled(0)
    for i, deadline in enumerate([500, 300, 0, 900], start=1):
        q.enqueue(Entry(id=i, payload=b"x", expires_at=deadline))
    assert q.reap(100) == 0
    assert q.reap(600) == 2
    assert sorted(removed) == [(1, Removal.EXPIRED), (2, Removal.EXPIRED)]
    assert q.depth == 2
    a = Recorder(10)
    q.add_consumer(a)
    q.dispatch(600)
    assert a.ids == [3, 4]


def test_memory_limit_withholds_room_until_consumed() -> None:
    budget = MemoryBudget()
    q = Queue(name="q", plan=Plan(memory_limit_bytes=25), budget=budget)
    assert q.has_room()
    for i in range(3):
        q.enqueue(Entry(id=i + 1, payload=b"x" * 10))
    assert not q.has_room()
    assert q.depth == 3  # nothing dropped
    a = Recorder(2)
    q.add_consumer(a)
    q.dispatch(0)
    assert not q.has_room()  # delivered but unsettled still counts
    q.settle(a, a.got[0], Settlement.ACCEPTED)
    assert q.has_room()
    assert budget.used == 20


def test_broker_wide_budget_is_shared() -> None:
    broker = Broker(memory_limit_bytes=100)
    broker.ensure_queue("a", Plan())
    broker.ensure_queue("b", Plan())
    broker.publish("a", payload=b"x" * 100)
    assert not broker.has_room("b")
    woken: list[str] = []
    broker.when_room(lambda: woken.append("b"))
    consumer = Recorder(1)
    queue = broker.queues["a"]
    queue.add_consumer(consumer)
    queue.dispatch(0)
    queue.settle(consumer, consumer.got[0], Settlement.ACCEPTED)
    assert woken == ["b"]
    assert broker.has_room("b")


def test_message_that_expired_while_out_is_reaped_once_it_comes_back() -> None:
    q, removed = filled(0)
    q.enqueue(Entry(id=1, payload=b"a", expires_at=1000))
    a = Recorder(1)
    q.add_consumer(a)
    q.dispatch(0)
    assert q.reap(2000) == 0  # out with a consumer: not the reaper's
    q.remove_consumer(a)
    assert q.reap(2000) == 1
    assert removed == [(1, Removal.EXPIRED)]
