"""Selectors in the broker's domain, without a network: a queue's consumers with selectors take
only what they select, in order, and leave the rest for the others; redeliveries come back once;
a subscription with a selector receives only what it selects, across a restart."""

from __future__ import annotations

from pathlib import Path

import pytest
from enmasse.amqp import codec
from enmasse.amqp.selector import MessageView, Selector, compile_selector
from enmasse.broker.broker import Broker, Conflict
from enmasse.broker.entry import Entry, Removal
from enmasse.broker.plan import Plan
from enmasse.broker.queue import Queue, Settlement

from tests.fixtures.broker import Recorder


def payload(n: int, **properties: object) -> bytes:
    return codec.encode_message(str(n).encode(), application_properties={"n": n, **properties})


def queue_of(messages: list[bytes]) -> tuple[Queue, list[tuple[int, Removal]]]:
    removed: list[tuple[int, Removal]] = []
    q = Queue(name="q", plan=Plan(), on_removed=lambda q, e, r: removed.append((e.id, r)))
    for i, message in enumerate(messages, start=1):
        q.enqueue(Entry(i, message))
    return q, removed


def halves(n: int) -> list[bytes]:
    """Messages 1..n, half 'a' for the odd ones, 'b' for the even ones."""
    return [payload(i, half="a" if i % 2 else "b") for i in range(1, n + 1)]


def counting(text: str) -> tuple[Selector, list[int]]:
    """The selector, and a list that grows by one per message it evaluates."""
    compiled = compile_selector(text)
    calls: list[int] = []

    def evaluate(view: MessageView) -> bool | None:
        calls.append(1)
        return compiled.evaluate(view)

    return Selector(text=text, evaluate=evaluate, reads_application=True), calls


def test_two_consumers_selecting_halves_each_get_their_half_in_order() -> None:
    q, removed = queue_of(halves(100))
    a, b = Recorder(1000), Recorder(1000)
    q.add_consumer(a, selector=compile_selector("half = 'a'"))
    q.add_consumer(b, selector=compile_selector("half = 'b'"))
    assert q.dispatch(0) == 100
    assert a.ids == list(range(1, 101, 2))
    assert b.ids == list(range(2, 101, 2))
    for consumer in (a, b):
        for entry in list(consumer.got):
            q.settle(consumer, entry, Settlement.ACCEPTED)
    assert (q.depth, q.bytes, q.in_flight) == (0, 0, 0)
    assert sorted(msg_id for msg_id, _ in removed) == list(range(1, 101))


def test_halves_with_little_credit_arriving_over_time() -> None:
    q, _ = queue_of([])
    a, b = Recorder(3), Recorder(2)
    q.add_consumer(a, selector=compile_selector("half = 'a'"))
    q.add_consumer(b, selector=compile_selector("half = 'b'"))
    for i, message in enumerate(halves(40), start=1):
        q.enqueue(Entry(i, message))
        q.dispatch(0)
        if i % 7 == 0:
            a.grant(4)
            b.grant(4)
    a.grant(100)
    b.grant(100)
    q.dispatch(0)
    assert a.ids == list(range(1, 41, 2))
    assert b.ids == list(range(2, 41, 2))
    assert q.depth == 0


def test_what_a_consumer_does_not_select_stays_for_the_others_in_order() -> None:
    messages = [payload(i, color="red" if i in (2, 5, 6) else "blue") for i in range(1, 9)]
    q, _ = queue_of(messages)
    reds = Recorder(10)
    q.add_consumer(reds, selector=compile_selector("color = 'red'"))
    q.dispatch(0)
    assert reds.ids == [2, 5, 6]
    assert q.depth == 5
    assert [e.id for e in q.snapshot()] == [1, 3, 4, 7, 8]
    everyone = Recorder(10)
    q.add_consumer(everyone)
    q.dispatch(0)
    assert everyone.ids == [1, 3, 4, 7, 8]
    assert q.depth == 0


def test_a_consumer_without_a_selector_is_not_starved_by_one_with() -> None:
    q, _ = queue_of([payload(i, color="blue") for i in range(1, 6)])
    reds, anything = Recorder(10), Recorder(10)
    q.add_consumer(reds, selector=compile_selector("color = 'red'"))
    q.add_consumer(anything)
    q.dispatch(0)
    assert (reds.ids, anything.ids) == ([], [1, 2, 3, 4, 5])


def test_competing_selective_consumers_share_what_both_select() -> None:
    q, _ = queue_of([payload(i) for i in range(1, 11)])
    a, b = Recorder(10), Recorder(10)
    q.add_consumer(a, selector=compile_selector("n > 0"))
    q.add_consumer(b, selector=compile_selector("n <= 10"))
    q.dispatch(0)
    assert sorted(a.ids + b.ids) == list(range(1, 11))
    assert len(a.ids) == len(b.ids) == 5


def test_a_backlog_nobody_selects_is_looked_at_once_per_consumer() -> None:
    q, _ = queue_of([payload(i, color="blue") for i in range(1, 1001)])
    selector, calls = counting("color = 'red'")
    reds = Recorder(1000)
    q.add_consumer(reds, selector=selector)
    q.dispatch(0)
    assert len(calls) == 1000
    for i in range(1001, 1011):
        q.enqueue(Entry(i, payload(i, color="red")))
        q.dispatch(0)
    assert reds.ids == list(range(1001, 1011))
    assert len(calls) == 1010  # each new message once; the backlog never again
    assert q.depth == 1000


def test_released_entry_comes_back_once_and_first() -> None:
    q, _ = queue_of([payload(i, color="red" if i % 2 else "blue") for i in range(1, 7)])
    reds = Recorder(10)
    q.add_consumer(reds, selector=compile_selector("color = 'red'"))
    q.dispatch(0)
    assert reds.ids == [1, 3, 5]
    q.settle(reds, reds.got[1], Settlement.RELEASED)
    reds.got.clear()
    q.dispatch(0)
    assert reds.ids == [3]
    q.settle(reds, reds.got[0], Settlement.RELEASED)
    q.remove_consumer(reds)  # 1 and 5 come back too
    everyone = Recorder(20)
    q.add_consumer(everyone)
    q.dispatch(0)
    # each once, redeliveries first (as in any queue): no stale copy delivered again
    assert everyone.ids == [1, 3, 5, 2, 4, 6]
    assert q.depth == 0


def test_a_redelivery_no_consumer_selects_waits_and_is_not_duplicated() -> None:
    q, _ = queue_of([payload(1, color="red"), payload(2, color="blue")])
    reds = Recorder(10)
    q.add_consumer(reds, selector=compile_selector("color = 'red'"))
    q.dispatch(0)
    q.remove_consumer(reds)  # entry 1 comes back
    blues = Recorder(10)
    q.add_consumer(blues, selector=compile_selector("color = 'blue'"))
    q.dispatch(0)
    q.dispatch(0)
    assert blues.ids == [2]
    q.settle(blues, blues.got[0], Settlement.ACCEPTED)
    assert [e.id for e in q.snapshot()] == [1]
    assert q.purge() == 1  # one message, counted once


def test_stale_references_do_not_pile_up() -> None:
    q, _ = queue_of([payload(0, color="blue")])  # the head nobody selects, for ever
    reds = Recorder(0)
    q.add_consumer(reds, selector=compile_selector("color = 'red'"))
    for i in range(2, 5002):
        q.enqueue(Entry(i, payload(i, color="red")))
        reds.grant(1)
        q.dispatch(0)
        q.settle(reds, reds.got[-1], Settlement.ACCEPTED)
    assert len(reds.got) == 5000
    assert q.depth == 1
    assert len(q.snapshot()) == 1
    assert len(q._ready) < 200  # rebuilt as the taken entries' references went stale


def test_an_expired_entry_is_not_delivered_to_a_selective_consumer() -> None:
    q = Queue(name="q", plan=Plan())
    q.enqueue(Entry(1, payload(1, color="red"), expires_at=50))
    q.enqueue(Entry(2, payload(2, color="red")))
    reds = Recorder(10)
    q.add_consumer(reds, selector=compile_selector("color = 'red'"))
    q.dispatch(now_ms=100)
    assert reds.ids == [2]
    assert (q.depth, q.expired) == (0, 1)


def test_a_held_back_entry_goes_only_to_a_consumer_that_selects_it() -> None:
    q, _ = queue_of([payload(1, color="red")])
    first = Recorder(1)
    q.add_consumer(first)
    q.dispatch(0)
    blues, reds = Recorder(5), Recorder(5)
    q.add_consumer(blues, selector=compile_selector("color = 'blue'"))
    q.refuse_here(first, first.got[0], Settlement.MODIFIED)
    q.dispatch(0)
    assert blues.ids == []
    q.add_consumer(reds, selector=compile_selector("color = 'red'"))
    q.dispatch(0)
    assert reds.ids == [1]


def test_a_browser_with_a_selector_sees_only_what_it_selects() -> None:
    q, _ = queue_of([payload(i, color="red" if i % 3 == 0 else "blue") for i in range(1, 10)])
    browser = Recorder(100)
    q.add_consumer(browser, browse=True, selector=compile_selector("color = 'red'"))
    q.dispatch(0)
    assert browser.ids == [3, 6, 9]
    assert q.depth == 9  # a look, not a take


def test_without_selectors_nothing_changes() -> None:
    q, _ = queue_of([payload(i) for i in range(1, 10)])
    a, b, c = Recorder(10), Recorder(10), Recorder(10)
    for consumer in (a, b, c):
        q.add_consumer(consumer)
    assert q.dispatch(0) == 9
    assert (a.ids, b.ids, c.ids) == ([1, 4, 7], [2, 5, 8], [3, 6, 9])


# ------------------------------------------------------------------ topics


def published(broker: Broker, topic: str, colors: list[str]) -> None:
    for i, color in enumerate(colors):
        broker.publish(topic, payload=payload(i, color=color))


def test_a_subscription_with_a_selector_receives_only_what_it_selects() -> None:
    broker = Broker()
    broker.ensure_topic("prices", Plan())
    reds = broker.subscribe(
        "prices", identity="reds", durable=False, selector=compile_selector("color = 'red'")
    )
    everything = broker.subscribe("prices", identity="all", durable=False)
    published(broker, "prices", ["red", "blue", "red", "green"])
    assert [codec.read_body(e.payload) for e in reds.queue.snapshot()] == [b"0", b"2"]
    assert everything.queue.depth == 4


def test_a_durable_subscription_keeps_its_selector_across_a_restart(tmp_path: Path) -> None:
    broker = Broker(data_dir=tmp_path)
    broker.start()
    broker.ensure_topic("prices", Plan())
    broker.subscribe(
        "prices", identity="c|sub", durable=True, selector=compile_selector("color = 'red'")
    )
    broker.close()
    again = Broker(data_dir=tmp_path)
    again.start()
    published(again, "prices", ["blue", "red"])
    sub = again.topics["prices"].subscriptions["c|sub"]
    assert sub.selector_text == "color = 'red'"
    assert [codec.read_body(e.payload) for e in sub.queue.snapshot()] == [b"1"]
    again.close()


def test_resuming_a_durable_subscription_with_another_selector_makes_a_new_one(
    tmp_path: Path,
) -> None:
    broker = Broker(data_dir=tmp_path)
    broker.start()
    broker.ensure_topic("prices", Plan())
    old = broker.subscribe(
        "prices", identity="c|sub", durable=True, selector=compile_selector("color = 'red'")
    )
    published(broker, "prices", ["red"])
    same = broker.subscribe(
        "prices", identity="c|sub", durable=True, selector=compile_selector("color = 'red'")
    )
    assert same is old
    assert same.queue.depth == 1
    new = broker.subscribe(
        "prices", identity="c|sub", durable=True, selector=compile_selector("color = 'blue'")
    )
    assert new is not old
    assert new.queue.depth == 0  # JMS: another selector is another subscription
    published(broker, "prices", ["red", "blue"])
    assert new.queue.depth == 1
    broker.close()
    again = Broker(data_dir=tmp_path)
    again.start()
    assert again.topics["prices"].subscriptions["c|sub"].selector_text == "color = 'blue'"
    again.close()


def test_a_selector_cannot_change_while_the_subscription_has_consumers() -> None:
    broker = Broker()
    broker.ensure_topic("prices", Plan())
    sub = broker.subscribe(
        "prices", identity="shared", durable=True, selector=compile_selector("color = 'red'")
    )
    sub.queue.add_consumer(Recorder(1))
    with pytest.raises(Conflict, match="has consumers with the selector \"color = 'red'\""):
        broker.subscribe("prices", identity="shared", durable=True, selector=None)


def test_a_subscription_without_a_selector_takes_the_subscribers() -> None:
    broker = Broker()
    broker.ensure_topic("prices", Plan())
    drained = broker.subscribe("prices", identity="c|sub", durable=True)
    published(broker, "prices", ["blue"])  # arrived (as drained messages would) before
    resumed = broker.subscribe(
        "prices", identity="c|sub", durable=True, selector=compile_selector("color = 'red'")
    )
    assert resumed is drained
    assert resumed.queue.depth == 1  # kept
    published(broker, "prices", ["blue", "red"])
    assert resumed.queue.depth == 2
