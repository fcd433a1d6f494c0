"""Scheduled delivery without a network: reading `x-opt-delivery-time` / `x-opt-delivery-delay`
(a delay rewritten into a time in the stored bytes), the per-queue heap, the broker's one timer,
invisibility until the due time (consumers, browsers, depth), priority and TTL on the way, topic
subscriptions, a restart from the journal, and a drain's hand-off."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from enmasse.amqp import codec
from enmasse.amqp.selector import compile_selector
from enmasse.broker.asks import DELIVERY_DELAY, DELIVERY_TIME, asks_of
from enmasse.broker.broker import Broker, now_ms
from enmasse.broker.entry import SCHEDULED, Entry, Removal
from enmasse.broker.plan import Plan
from enmasse.broker.queue import Queue
from enmasse.broker.schedule import Scheduled, Scheduler

from tests.fixtures.broker import Recorder

NOW = 1_700_000_000_000


def scheduled_body(body: str, **annotations: int) -> bytes:
    names = {"time": DELIVERY_TIME, "delay": DELIVERY_DELAY}
    return codec.encode_message(
        body, message_annotations={names[k]: v for k, v in annotations.items()}
    )


def bodies(recorder: Recorder) -> list[str]:
    return [codec.read_body(e.payload) for e in recorder.got]


# ------------------------------------------------------------------ reading the annotations


def test_a_plain_message_asks_nothing() -> None:
    assert asks_of(codec.encode_message(b"x", durable=True, ttl=5000), now=NOW) is None
    assert asks_of(codec.encode_message("x", properties={"message_id": "m"}), now=NOW) is None
    other = codec.encode_message("x", message_annotations={"x-opt-jms-dest": 0})
    assert asks_of(other, now=NOW) is None


def test_a_delay_is_rewritten_into_an_absolute_time_keeping_the_rest() -> None:
    payload = codec.encode_message(
        "hello",
        durable=True,
        message_annotations={DELIVERY_DELAY: 2000, "x-opt-trace": "keep"},
        properties={"message_id": "m1"},
    )
    asks = asks_of(payload, now=NOW)
    assert asks is not None
    assert asks.deliver_at == NOW + 2000
    assert asks.group is None
    annotations = codec.read_message_annotations(asks.payload)
    assert annotations == {"x-opt-trace": "keep", DELIVERY_TIME: NOW + 2000}
    assert codec.read_body(asks.payload) == "hello"
    assert codec.read_header(asks.payload).durable
    assert codec.read_properties(asks.payload).message_id == "m1"
    # Read again (a restart reads the journaled bytes): the same time, not a new delay.
    again = asks_of(asks.payload, now=NOW + 500)
    assert again is not None
    assert again.deliver_at == NOW + 2000


def test_an_absolute_time_is_kept_and_a_past_one_means_at_once() -> None:
    asks = asks_of(scheduled_body("a", time=NOW + 10_000), now=NOW)
    assert asks is not None
    assert asks.deliver_at == NOW + 10_000
    assert asks_of(scheduled_body("b", time=NOW - 1), now=NOW) is None
    assert asks_of(scheduled_body("c", delay=0), now=NOW) is None


def test_the_absolute_time_wins_over_a_delay() -> None:
    asks = asks_of(scheduled_body("a", time=NOW + 5000, delay=60_000), now=NOW)
    assert asks is not None
    assert asks.deliver_at == NOW + 5000


def test_a_group_id_is_read_and_a_short_properties_list_is_not_decoded() -> None:
    grouped = codec.encode_message("g", properties={"group_id": "orders-7", "group_sequence": 3})
    asks = asks_of(grouped, now=NOW)
    assert asks is not None
    assert asks.group == "orders-7"
    assert asks.deliver_at == 0
    assert asks.payload is grouped  # nothing to rewrite


# ------------------------------------------------------------------ the heap and the timer


def test_the_heap_gives_entries_in_due_order_and_skips_those_gone() -> None:
    heap = Scheduled()
    entries = [Entry(i, b"") for i in range(1, 5)]
    for entry in entries:
        entry.state = SCHEDULED
    assert heap.push(entries[0], 300)
    assert heap.push(entries[1], 100)
    assert not heap.push(entries[2], 200)
    assert heap.push(entries[3], 50)
    entries[3].state = entries[3].state.GONE  # reaped while waiting
    assert heap.next_due() == 100
    assert heap.due(99) == []
    assert [e.id for e in heap.due(250)] == [2, 3]
    assert len(heap) == 1
    assert heap.next_due() == 300


class FakeLoop:
    def __init__(self) -> None:
        self.timers: list[tuple[float, Callable[[], object], FakeTimer]] = []

    def call_later(self, seconds: float, fn: Callable[[], object]) -> FakeTimer:
        timer = FakeTimer()
        self.timers.append((seconds, fn, timer))
        return timer

    def live(self) -> list[float]:
        return [s for s, _, t in self.timers if not t.cancelled]


class FakeTimer:
    cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


def test_one_timer_armed_for_the_earliest_due_time() -> None:
    clock = [NOW]
    scheduler: Scheduler[Queue] = Scheduler(clock=lambda: clock[0])
    loop = FakeLoop()
    q1, q2 = (Queue(name=n, plan=Plan()) for n in ("q1", "q2"))
    scheduler.wake(q1, NOW + 5000)  # before the loop: armed when it comes
    scheduler.use_loop(loop.call_later)
    assert loop.live() == [5.0]
    scheduler.wake(q2, NOW + 9000)  # later: the timer stays
    assert loop.live() == [5.0]
    scheduler.wake(q2, NOW + 1000)  # earlier: re-armed
    assert loop.live() == [1.0]
    assert scheduler.due(NOW + 5000) == [q2, q1]


# ------------------------------------------------------------------ a queue in a broker


def test_a_scheduled_message_is_invisible_until_its_time() -> None:
    broker = Broker()
    queue = broker.ensure_queue("jobs", Plan())
    browser = Recorder()
    queue.add_consumer(browser, browse=True)
    broker.publish("jobs", payload=scheduled_body("later", delay=2000), now=NOW)
    broker.publish("jobs", payload=codec.encode_message("now"), now=NOW)
    assert bodies(browser) == ["now"]  # browsers do not see it either
    assert (queue.depth, queue.scheduled) == (1, 1)
    assert queue.bytes == len(scheduled_body("later", time=NOW + 2000)) + len(
        codec.encode_message("now")
    )
    consumer = Recorder()
    queue.add_consumer(consumer)
    queue.dispatch(NOW)
    assert bodies(consumer) == ["now"]
    assert broker.release_due(NOW + 1999) == 0
    assert bodies(consumer) == ["now"]
    assert broker.release_due(NOW + 2000) == 1
    assert bodies(consumer) == ["now", "later"]
    assert queue.scheduled == 0
    stored = consumer.got[1].payload
    assert codec.read_message_annotations(stored)[DELIVERY_TIME] == NOW + 2000


def test_due_messages_take_their_priority_place() -> None:
    broker = Broker()
    queue = broker.ensure_queue("jobs", Plan())
    broker.publish("jobs", payload=codec.encode_message("low"), priority=1, now=NOW)
    broker.publish("jobs", payload=scheduled_body("urgent", time=NOW + 100), priority=9, now=NOW)
    broker.publish("jobs", payload=codec.encode_message("plain"), now=NOW)
    broker.release_due(NOW + 100)
    consumer = Recorder()
    queue.add_consumer(consumer)
    queue.dispatch(NOW + 100)
    assert bodies(consumer) == ["urgent", "plain", "low"]


def test_ttl_still_applies_to_a_scheduled_message() -> None:
    broker = Broker()
    queue = broker.ensure_queue("jobs", Plan())
    removed: list[Removal] = []
    queue.on_removed = lambda q, e, r: removed.append(r)
    broker.publish("jobs", payload=scheduled_body("x", delay=5000), ttl_ms=1000, now=NOW)
    assert broker.reap(NOW + 1000) == 1
    assert removed == [Removal.EXPIRED]
    assert queue.scheduled == 0
    assert queue.bytes == 0
    assert broker.release_due(NOW + 5000) == 0


def test_a_topic_subscription_gets_it_at_its_time() -> None:
    broker = Broker()
    broker.ensure_topic("news", Plan())
    sub = broker.subscribe("news", identity="s1", durable=False)
    consumer = Recorder()
    sub.queue.add_consumer(consumer)
    broker.publish("news", payload=scheduled_body("later", delay=1000), now=NOW)
    assert consumer.got == []
    assert sub.queue.scheduled == 1
    broker.release_due(NOW + 1000)
    assert bodies(consumer) == ["later"]


def test_a_durable_scheduled_message_keeps_its_time_across_a_restart(tmp_path: Path) -> None:
    start = now_ms()  # recovery reads the real clock: a due time in the past is "at once"
    broker = Broker(data_dir=tmp_path)
    broker.start()
    broker.ensure_queue("jobs", Plan(persistent=True))
    payload = codec.encode_message(
        "later", durable=True, message_annotations={DELIVERY_DELAY: 60_000}
    )
    broker.publish("jobs", payload=payload, durable=True, now=start)
    broker.commit()
    broker.close()
    again = Broker(data_dir=tmp_path)
    again.start()
    queue = again.find_queue("jobs")
    assert queue is not None
    assert (queue.scheduled, queue.depth) == (1, 0)
    consumer = Recorder()
    queue.add_consumer(consumer)
    assert again.release_due(start + 59_999) == 0
    assert consumer.got == []
    assert again.release_due(start + 60_000) == 1
    assert bodies(consumer) == ["later"]
    again.close()


def test_a_drain_takes_scheduled_messages_with_the_rest() -> None:
    broker = Broker()
    queue = broker.ensure_queue("jobs", Plan())
    broker.publish("jobs", payload=scheduled_body("later", delay=60_000), now=NOW)
    broker.publish("jobs", payload=codec.encode_message("now"), now=NOW)
    taken = queue.take_ready(10)
    assert [codec.read_body(e.payload) for e in taken] == ["now", "later"]
    for entry in taken:
        queue.finish_hand_off(entry)
    assert queue.scheduled == 0
    assert queue.bytes == 0


def test_deleting_the_queue_removes_what_it_had_scheduled() -> None:
    broker = Broker()
    queue = broker.ensure_queue("jobs", Plan())
    broker.publish("jobs", payload=scheduled_body("later", delay=60_000), now=NOW)
    assert broker.delete_queue("jobs") == 1
    assert queue.bytes == 0
    assert broker.budget.used == 0


def test_a_selective_consumer_gets_a_message_that_fell_due_after_newer_ones() -> None:
    broker = Broker()
    queue = broker.ensure_queue("jobs", Plan())
    consumer = Recorder()
    queue.add_consumer(consumer, selector=compile_selector("kind = 'wanted'"))
    wanted = {"kind": "wanted"}
    later = codec.encode_message(
        "later", application_properties=wanted, message_annotations={DELIVERY_DELAY: 1000}
    )
    broker.publish("jobs", payload=later, now=NOW)
    broker.publish("jobs", payload=codec.encode_message("other"), now=NOW)
    broker.publish(
        "jobs", payload=codec.encode_message("now", application_properties=wanted), now=NOW
    )
    assert bodies(consumer) == ["now"]
    broker.release_due(NOW + 1000)
    assert bodies(consumer) == ["now", "later"]
    assert queue.depth == 1  # "other" waits for someone who selects it
