"""The broker root without a network: topics and subscription identity, dead-letter and expiry
addresses, settlement contract (owned now vs after fsync), names refused, catalog across restart."""

from __future__ import annotations

from pathlib import Path

import pytest
from enmasse.broker.broker import Broker, Conflict, InvalidName, NotFound
from enmasse.broker.plan import Plan
from enmasse.broker.queue import Settlement
from enmasse.broker.topic import durable_identity

from tests.fixtures.broker import Recorder


def test_every_subscriber_gets_messages_published_after_it_subscribed() -> None:
    broker = Broker()
    broker.ensure_topic("news", Plan())
    broker.publish("news", payload=b"before")
    first = broker.subscribe("news", identity="a", durable=False)
    broker.publish("news", payload=b"one")
    second = broker.subscribe("news", identity="b", durable=False)
    broker.publish("news", payload=b"two")
    ra, rb = Recorder(), Recorder()
    first.queue.add_consumer(ra)
    second.queue.add_consumer(rb)
    first.queue.dispatch(0)
    second.queue.dispatch(0)
    assert [e.payload for e in ra.got] == [b"one", b"two"]
    assert [e.payload for e in rb.got] == [b"two"]


def test_durable_identity_follows_container_and_link_or_shared_name() -> None:
    assert durable_identity(container_id="c1", link_name="sub", shared=False) == "c1|sub"
    assert durable_identity(container_id="c1", link_name="sub|global", shared=True) == "sub"


def test_dead_letter_address_receives_poison_after_max_attempts() -> None:
    broker = Broker()
    broker.ensure_queue("DLQ", Plan())
    broker.ensure_queue("work", Plan(max_delivery_attempts=2, dead_letter_address="DLQ"))
    broker.publish("work", payload=b"poison")
    consumer = Recorder()
    work = broker.queues["work"]
    work.add_consumer(consumer)
    for _ in range(2):
        work.dispatch(0)
        work.settle(consumer, consumer.got[-1], Settlement.FAILED)
    assert work.depth == 0
    assert [e.payload for e in broker.queues["DLQ"].snapshot()] == [b"poison"]
    assert broker.queues["DLQ"].snapshot()[0].delivery_count == 2


def test_expired_message_moves_to_expiry_address() -> None:
    broker = Broker()
    broker.ensure_queue("expired", Plan())
    broker.ensure_queue("cmd", Plan(expiry_address="expired"))
    broker.publish("cmd", payload=b"open door", ttl_ms=50, now=1000)
    assert broker.reap(1049) == 0
    assert broker.reap(1050) == 1
    assert [e.payload for e in broker.queues["expired"].snapshot()] == [b"open door"]
    assert broker.queues["cmd"].expired == 1


def test_message_already_past_absolute_expiry_is_never_queued() -> None:
    broker = Broker()
    broker.ensure_queue("cmd", Plan())
    assert broker.publish("cmd", payload=b"late", absolute_expiry_ms=500, now=1000) is True
    assert broker.queues["cmd"].depth == 0


def test_plan_default_ttl_applies_when_message_has_none() -> None:
    broker = Broker()
    broker.ensure_queue("cmd", Plan(default_ttl_ms=10))
    broker.publish("cmd", payload=b"x", now=0)
    assert broker.reap(10) == 1


def test_durable_message_on_persistent_plan_is_owned_only_after_commit(tmp_path: Path) -> None:
    broker = Broker(data_dir=tmp_path)
    broker.start()
    broker.ensure_queue("q", Plan(persistent=True))
    broker.ensure_queue("volatile", Plan(persistent=False))
    owned: list[str] = []
    assert (
        broker.publish("q", payload=b"a", durable=True, on_owned=lambda: owned.append("a")) is False
    )
    assert broker.publish("q", payload=b"b", durable=False) is True
    assert broker.publish("volatile", payload=b"c", durable=True) is True
    assert owned == []
    broker.commit()
    assert owned == ["a"]
    broker.close()


def test_restart_recovers_durable_unacked_in_order_and_durable_subscriptions(
    tmp_path: Path,
) -> None:
    broker = Broker(data_dir=tmp_path)
    broker.start()
    broker.ensure_queue("q", Plan())
    broker.ensure_topic("t", Plan())
    broker.subscribe("t", identity="c1|s", durable=True)
    broker.subscribe("t", identity="gone", durable=False)
    for i in range(10):
        broker.publish("q", payload=f"m{i}".encode(), durable=True)
    broker.publish("q", payload=b"not durable")
    broker.publish("t", payload=b"for the subscriber", durable=True)
    consumer = Recorder(credit=3)
    queue = broker.queues["q"]
    queue.add_consumer(consumer)
    queue.dispatch(0)
    for entry in consumer.got:
        queue.settle(consumer, entry, Settlement.ACCEPTED)
    broker.commit()  # nothing closed: what a SIGKILL leaves

    again = Broker(data_dir=tmp_path)
    again.start()
    assert [e.payload for e in again.queues["q"].snapshot()] == [
        f"m{i}".encode() for i in range(3, 10)
    ]
    sub = again.find_queue("t::c1|s")
    assert sub is not None
    assert [e.payload for e in sub.snapshot()] == [b"for the subscriber"]
    assert again.find_queue("t::gone") is None
    again.publish("q", payload=b"after", durable=True)
    assert again.queues["q"].snapshot()[-1].id > again.queues["q"].snapshot()[-2].id
    again.close()


def test_bad_names_are_refused_and_change_nothing() -> None:
    broker = Broker()
    for bad, words in [
        ("", "must not be empty"),
        ("a::b", "reserved for subscriptions"),
        ("has space", "is invalid"),
        (".hidden", "is invalid"),
        ("x" * 256, "is invalid"),
    ]:
        with pytest.raises(InvalidName, match=words):
            broker.ensure_queue(bad, Plan())
    with pytest.raises(InvalidName, match="max_delivery_attempts must be >= 0"):
        broker.ensure_queue("ok", Plan(max_delivery_attempts=-1))
    assert broker.queues == {}
    broker.ensure_queue("orders", Plan())
    with pytest.raises(Conflict, match="'orders' is a queue on this broker, not a topic"):
        broker.ensure_topic("orders", Plan())
    with pytest.raises(NotFound, match="no queue 'nope' on this broker"):
        broker.delete_queue("nope")
    with pytest.raises(NotFound, match="no queue or topic 'nope'"):
        broker.publish("nope", payload=b"x")
    assert list(broker.queues) == ["orders"]


def test_deleting_a_queue_acks_its_journaled_messages(tmp_path: Path) -> None:
    broker = Broker(data_dir=tmp_path)
    broker.start()
    broker.ensure_queue("q", Plan())
    for _ in range(5):
        broker.publish("q", payload=b"x", durable=True)
    assert broker.delete_queue("q") == 5
    broker.commit()
    assert broker.journal is not None
    assert broker.journal.live_messages == 0
    broker.close()
    again = Broker(data_dir=tmp_path)
    assert again.start().count == 0
