"""Hand-off rules without a network: what a drain selects, what a target prepares, how a drained
queue treats its consumers, and modified + undeliverable-here.

- `select`: every queue (and topic with target_admin), durable subscriptions only, unknown names
  topics without target_admin and queues another drain moves refused with the admin's words.
- `Broker.prepare_drain`: creates queues, topics and durable subscriptions with the given plans
  in one go; a bad name, plan or identity, or a name of the other kind, changes nothing.
- A queue with `hand_off` set gives consumers nothing; ready, returned and newly published
  entries go to the hand-off; `in_flight` counts what consumers still hold.
- undeliverable-here: the refused entry goes to another consumer, or waits for a new one, and
  never back to the consumer that refused it; a drain takes it like any other.
- Real process: the same over AMQP.
"""

from __future__ import annotations

import pytest
from enmasse.amqp import codec
from enmasse.amqp.client import Client
from enmasse.amqp.engine import Outcome
from enmasse.broker.broker import Broker, Conflict, InvalidName, NotFound
from enmasse.broker.drain import DrainRefused, NeedsTargetAdmin, select
from enmasse.broker.entry import Entry
from enmasse.broker.inbox import DrainTokens, InboxAddress
from enmasse.broker.plan import Plan
from enmasse.broker.queue import Queue, Settlement

from tests.fixtures.broker import BrokerProcess, Recorder


def stocked() -> Broker:
    broker = Broker()
    broker.ensure_queue("orders", Plan(max_delivery_attempts=2))
    broker.ensure_topic("news", Plan(persistent=False))
    broker.subscribe("news", identity="app|keep", durable=True)
    broker.subscribe("news", identity="app|live|1", durable=False)
    return broker


def test_select_moves_queues_and_durable_subscriptions_only() -> None:
    broker = stocked()
    everything = select(broker, [], with_topics=True)
    assert [q.name for q in everything.queues] == ["orders", "news::app|keep"]
    assert everything.inbox == [
        InboxAddress(name="orders", kind="queue", plan=Plan(max_delivery_attempts=2)),
        InboxAddress(
            name="news", kind="topic", plan=Plan(persistent=False), subscriptions=("app|keep",)
        ),
    ]
    assert [q.name for q in select(broker, [], with_topics=False).queues] == ["orders"]


def test_select_refuses_unknown_names_and_topics_without_target_admin() -> None:
    broker = stocked()
    with pytest.raises(NotFound, match="no queue or topic 'nope' on this broker"):
        select(broker, ["orders", "nope"], with_topics=True)
    with pytest.raises(NeedsTargetAdmin, match="'news' is a topic: moving its subscriptions"):
        select(broker, ["news"], with_topics=False)
    broker.queues["orders"].hand_off = lambda q: None
    with pytest.raises(DrainRefused, match="another drain is moving 'orders'"):
        select(broker, [], with_topics=True)


def test_prepare_drain_creates_everything_with_the_same_plans() -> None:
    target = Broker()
    token = target.prepare_drain(select(stocked(), [], with_topics=True).inbox)
    assert target.drain_tokens.valid(token)
    target.prepare_drain([InboxAddress(name="orders", kind="queue", plan=Plan())])
    assert target.queues["orders"].plan == Plan(max_delivery_attempts=2)  # kept as it was
    assert not target.drain_tokens.valid("guessed")
    assert target.queues["orders"].plan == Plan(max_delivery_attempts=2)
    sub = target.topics["news"].subscriptions["app|keep"]
    assert sub.durable
    assert target.find_queue("news::app|keep") is sub.queue
    assert "app|live|1" not in target.topics["news"].subscriptions
    # Messages for the subscription queue land in it (the handler lets only drains do this).
    assert target.publish("news::app|keep", payload=b"m", delivery_count=2)
    assert [e.delivery_count for e in sub.queue.snapshot()] == [2]


@pytest.mark.parametrize(
    ("bad", "error", "words"),
    [
        (InboxAddress(name="a::b", kind="queue", plan=Plan()), InvalidName, "reserved"),
        (InboxAddress(name="q", kind="queue", plan=Plan(default_ttl_ms=-1)), InvalidName, "ttl"),
        (
            InboxAddress(name="t", kind="topic", plan=Plan(), subscriptions=("",)),
            InvalidName,
            "empty",
        ),
        (InboxAddress(name="q", kind="lake", plan=Plan()), InvalidName, "queue or topic"),
        (InboxAddress(name="orders", kind="topic", plan=Plan()), Conflict, "is a queue"),
    ],
)
def test_prepare_drain_with_one_bad_address_changes_nothing(
    bad: InboxAddress, error: type[Exception], words: str
) -> None:
    target = Broker()
    target.ensure_queue("orders", Plan())
    good = InboxAddress(name="fresh", kind="topic", plan=Plan(), subscriptions=("x",))
    with pytest.raises(error, match=words):
        target.prepare_drain([good, bad])
    assert sorted(target.queues) == ["orders"]
    assert target.topics == {}


def test_drain_tokens_serve_once_and_are_bounded_oldest_first() -> None:
    tokens = DrainTokens()
    once = tokens.issue()
    assert tokens.redeem(once)
    assert not tokens.redeem(once)
    first = tokens.issue()
    for _ in range(100):
        tokens.issue()
    assert not tokens.valid(first)
    assert not tokens.valid(None)


def test_a_queue_in_hand_off_gives_consumers_nothing_and_counts_what_they_hold() -> None:
    queue = Queue(name="q", plan=Plan())
    for i in range(1, 6):
        queue.enqueue(Entry(id=i, payload=b"x"))
    consumer = Recorder(credit=2)
    queue.add_consumer(consumer)
    queue.dispatch(0)
    assert [e.id for e in consumer.got] == [1, 2]
    taken: list[int] = []
    queue.hand_off = lambda q: taken.extend(e.id for e in q.take_ready(100))
    consumer._credit = 10
    queue.dispatch(0)
    assert [e.id for e in consumer.got] == [1, 2]  # nothing new for the consumer
    assert taken == [3, 4, 5]
    assert (queue.depth, queue.in_flight) == (0, 2)
    queue.settle(consumer, consumer.got[1], Settlement.RELEASED)  # given back: to the drain
    queue.dispatch(0)
    assert taken == [3, 4, 5, 2]
    assert queue.in_flight == 1


def test_undeliverable_here_goes_to_another_consumer_never_back() -> None:
    queue = Queue(name="q", plan=Plan(max_delivery_attempts=5))
    queue.enqueue(Entry(id=1, payload=b"x"))
    a = Recorder(credit=10)
    queue.add_consumer(a)
    queue.dispatch(0)
    queue.refuse_here(a, a.got[0], Settlement.FAILED)
    queue.dispatch(0)
    assert len(a.got) == 1  # not offered again to the one that refused it
    assert queue.depth == 1
    queue.enqueue(Entry(id=2, payload=b"y"))
    queue.dispatch(0)
    assert [e.id for e in a.got] == [1, 2]  # ordinary entries still flow to it
    b = Recorder(credit=10)
    queue.add_consumer(b)
    queue.dispatch(0)
    assert [(e.id, e.delivery_count, e.failed_attempts) for e in b.got] == [(1, 1, 1)]
    queue.settle(b, b.got[0], Settlement.RELEASED)  # a plain release: still never to `a`
    queue.dispatch(0)
    assert [e.id for e in a.got] == [1, 2]
    assert [e.id for e in b.got] == [1, 1]
    queue.remove_consumer(b)
    assert [e.id for e in queue.take_ready(10)] == [1]  # a drain takes it like any other


def test_undeliverable_here_over_amqp_goes_to_the_other_consumer(broker: BrokerProcess) -> None:
    broker.ensure_queue("jobs")
    with Client("127.0.0.1", broker.amqp_port) as c:
        picky = c.receiver("jobs", credit=0)
        picky.flow(1)
        c.sender("jobs").send(codec.encode_message("job", durable=True))
        first = picky.receive()
        picky.flow(5)
        picky.settle(first, Outcome.MODIFIED, undeliverable_here=True)
        with pytest.raises(TimeoutError):
            picky.receive(timeout=0.5)  # held back: no other consumer yet
        other = c.receiver("jobs", credit=1)
        again = other.receive()
        assert codec.read_body(again.payload) == "job"
        assert codec.read_header(again.payload).delivery_count == 0  # modified, not failed
        other.accept(again)
        with pytest.raises(TimeoutError):
            picky.receive(timeout=0.3)
    assert broker.addresses()["jobs"].depth == 0
