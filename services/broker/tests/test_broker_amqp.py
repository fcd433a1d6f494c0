"""The broker process over real AMQP on loopback: what a client sees, rule by rule.

Each test starts its own `enmasse-broker` (tests/fixtures/broker.py), creates its queues and topics
through BrokerAdmin, and talks to it with the engine's blocking client.
"""

from __future__ import annotations

import socket

import grpc
import pytest
from enmasse.amqp import codec
from enmasse.amqp.client import AmqpError, Client
from enmasse.amqp.engine import Condition, Outcome, Terminus
from enmasse.broker.config import Settings
from enmasse.resources.contracts import MAX_MESSAGE_SIZE_BOUND
from enmasse.v1 import broker_pb2, resources_pb2

from tests.fixtures.broker import BrokerFactory, BrokerProcess
from tests.fixtures.waiting import wait_for


def message(text: str, **kw: object) -> bytes:
    return codec.encode_message(text, **kw)  # type: ignore[arg-type]


def body(payload: bytes) -> str:
    return str(codec.read_body(payload))


def client(process: BrokerProcess, container_id: str | None = None) -> Client:
    return Client("127.0.0.1", process.amqp_port, container_id=container_id)


def test_competing_consumers_share_fairly_in_order_none_lost(broker: BrokerProcess) -> None:
    broker.ensure_queue("orders")
    with client(broker) as c:
        a = c.receiver("orders", credit=5)
        b = c.receiver("orders", credit=5)
        sender = c.sender("orders")
        for i in range(40):
            assert sender.send(message(f"m{i}")).outcome == Outcome.ACCEPTED
        got: dict[str, list[int]] = {"a": [], "b": []}
        for name, receiver in (("a", a), ("b", b)):
            for _ in range(20):
                delivery = receiver.receive()
                got[name].append(int(body(delivery.payload)[1:]))
                receiver.accept(delivery)
    assert sorted(got["a"] + got["b"]) == list(range(40))
    assert got["a"] == sorted(got["a"])
    assert got["b"] == sorted(got["b"])
    assert len(got["a"]) == len(got["b"]) == 20


def test_released_is_redelivered_unchanged_and_a_consumer_gone_counts_one(
    broker: BrokerProcess,
) -> None:
    broker.ensure_queue("work")
    with client(broker) as c:
        first = c.receiver("work", credit=1)
        c.sender("work").send(message("job"))
        delivery = first.receive()
        assert codec.read_header(delivery.payload).delivery_count == 0
        first.close()  # gone holding it: it may have been processed, count + 1
        second = c.receiver("work", credit=1)
        first_attempt = second.receive()
        assert codec.read_header(first_attempt.payload).delivery_count == 1
        second.settle(first_attempt, Outcome.RELEASED)  # not processed: unchanged
        again = second.receive()
        assert body(again.payload) == "job"
        assert codec.read_header(again.payload).delivery_count == 1
        second.accept(again)
    listed = broker.addresses()["work"]
    assert (listed.depth, listed.dequeued) == (0, 1)


def test_poison_message_ends_in_dead_letter_queue_after_max_attempts(broker: BrokerProcess) -> None:
    broker.ensure_queue("DLQ")
    broker.ensure_queue("jobs", max_delivery_attempts=3, dead_letter_address="DLQ")
    with client(broker) as c:
        c.sender("jobs").send(message("poison", durable=True))
        worker = c.receiver("jobs", credit=1)
        seen = []
        for _ in range(3):
            delivery = worker.receive()
            seen.append(body(delivery.payload))
            worker.settle(delivery, Outcome.MODIFIED, delivery_failed=True)
        assert seen == ["poison"] * 3
        c.sender("jobs").send(message("fine"))
        assert body(worker.receive().payload) == "fine"  # the poison is gone from the queue
        dead = c.receiver("DLQ").receive()
        assert body(dead.payload) == "poison"
        assert codec.read_header(dead.payload).delivery_count == 3
    listed = broker.addresses()
    assert listed["jobs"].dead_lettered == 1
    assert listed["DLQ"].enqueued == 1


def test_rejected_message_goes_to_dead_letter_address(broker: BrokerProcess) -> None:
    broker.ensure_queue("DLQ")
    broker.ensure_queue("jobs", dead_letter_address="DLQ")
    with client(broker) as c:
        c.sender("jobs").send(message("bad"))
        worker = c.receiver("jobs", credit=1)
        worker.settle(worker.receive(), Outcome.REJECTED)
        assert body(c.receiver("DLQ").receive().payload) == "bad"


def test_browse_sees_messages_without_consuming_them(broker: BrokerProcess) -> None:
    broker.ensure_queue("inbox")
    with client(broker) as c:
        sender = c.sender("inbox")
        for text in ("a", "b", "c"):
            sender.send(message(text))
        browser = c.receiver("inbox", source=Terminus(address="inbox", distribution_mode="copy"))
        assert [body(browser.receive().payload) for _ in range(3)] == ["a", "b", "c"]
        assert broker.addresses()["inbox"].depth == 3
        taker = c.receiver("inbox")
        taken = [taker.receive() for _ in range(3)]
        assert [body(d.payload) for d in taken] == ["a", "b", "c"]


def test_drain_gets_what_is_there_and_gives_the_rest_of_the_credit_back(
    broker: BrokerProcess,
) -> None:
    broker.ensure_queue("jobs")
    with client(broker) as c:
        sender = c.sender("jobs")
        for text in ("a", "b"):
            sender.send(message(text))
        receiver = c.receiver("jobs", credit=0)
        link = receiver.link
        assert link is not None
        c.call(lambda: link.drain(10))
        assert [body(receiver.receive().payload) for _ in range(2)] == ["a", "b"]
        wait_for(lambda: c.call(lambda: link.credit) == 0, what="the drained credit back")
        sender.send(message("c"))
        with pytest.raises(TimeoutError):
            receiver.receive(timeout=0.5)  # no credit left: nothing comes until asked again
        receiver.flow(1)
        assert body(receiver.receive().payload) == "c"


def test_every_topic_subscriber_gets_every_message_published_after_it_subscribed(
    broker: BrokerProcess,
) -> None:
    broker.ensure_topic("news")
    with client(broker) as c:
        sender = c.sender("news")
        sender.send(message("too early"))
        one = c.receiver("news")
        two = c.receiver("news")
        for text in ("x", "y"):
            assert sender.send(message(text)).outcome == Outcome.ACCEPTED
        assert [body(one.receive().payload) for _ in range(2)] == ["x", "y"]
        assert [body(two.receive().payload) for _ in range(2)] == ["x", "y"]
        one.close()
    # Non-durable subscriptions vanish with their links.
    assert [a.name for a in broker.addresses().values() if a.kind == "subscription"] == []


def durable_source(topic: str) -> Terminus:
    return Terminus(address=topic, durable=2, expiry_policy="never")


def test_durable_subscriber_gets_what_was_published_while_away_across_restart(
    broker: BrokerProcess,
) -> None:
    broker.ensure_topic("alerts")
    with client(broker, container_id="device-7") as c:
        c.receiver("alerts", name="alerts-sub", source=durable_source("alerts")).detach()
    with client(broker) as c:
        for i in range(5):
            c.sender("alerts").send(message(f"alert {i}", durable=True))
    broker.restart()  # SIGKILL, then start on the same data dir
    with client(broker, container_id="device-7") as c:
        sub = c.receiver("alerts", name="alerts-sub", source=durable_source("alerts"))
        got = [sub.receive() for _ in range(5)]
        assert [body(d.payload) for d in got] == [f"alert {i}" for i in range(5)]
        for delivery in got:
            sub.accept(delivery)
        sub.close()  # closed=true: the subscription is deleted
    assert not [a for a in broker.addresses().values() if a.kind == "subscription"]


def test_expired_message_is_never_delivered_and_reaped_without_consumer(
    broker: BrokerProcess,
) -> None:
    broker.ensure_queue("expired")
    broker.ensure_queue("commands", expiry_address="expired")
    with client(broker) as c:
        c.sender("commands").send(message("open door", ttl=100, durable=True))
        c.sender("commands").send(
            message("late already", properties={"absolute_expiry_time": 1000})
        )
        wait_for(lambda: broker.addresses()["commands"].expired == 1, what="the reaper")
        c.sender("commands").send(message("still valid"))
        device = c.receiver("commands")
        valid = device.receive()
        assert body(valid.payload) == "still valid"
        device.accept(valid)
        assert body(c.receiver("expired").receive().payload) == "open door"
    assert broker.addresses()["commands"].depth == 0


def test_producer_waits_at_memory_limit_and_nothing_is_dropped(
    broker_factory: BrokerFactory,
) -> None:
    broker = broker_factory("--credit-window=4")
    broker.ensure_queue("slow", memory_limit_bytes=4096)
    payloads = [message(f"{i:04d}" + "x" * 1000) for i in range(40)]
    with client(broker) as c:
        sender = c.sender("slow")
        futures = [sender.send_async(p) for p in payloads]
        wait_for(lambda: broker.addresses()["slow"].depth >= 4, what="the queue to fill")
        listed = broker.addresses()["slow"]
        # Credit stops at the limit: at most the limit plus one credit window got in.
        assert listed.depth <= 4 + 4
        assert not futures[-1].done()
        receiver = c.receiver("slow", credit=2)
        got = []
        for _ in range(40):
            delivery = receiver.receive()
            got.append(body(delivery.payload)[:4])
            receiver.accept(delivery)
        assert got == [f"{i:04d}" for i in range(40)]
        assert all(f.result(10).outcome == Outcome.ACCEPTED for f in futures)


def test_unknown_address_is_refused_with_not_found(broker: BrokerProcess) -> None:
    with client(broker) as c:
        with pytest.raises(
            AmqpError, match="amqp:not-found: no queue or topic 'ghost' on this broker"
        ):
            c.sender("ghost")
        with pytest.raises(AmqpError, match="amqp:not-found"):
            c.receiver("ghost")


def test_an_oversized_delivery_is_rejected_alone_on_a_link_producers_share(
    broker_factory: BrokerFactory,
) -> None:
    """One link carries several producers' messages (a standard space's router shares one per
    broker): the oversized one is rejected, the others before and after it are taken."""
    broker = broker_factory("--max-message-size=2000")
    broker.ensure_queue("q")
    with client(broker) as c:
        sender = c.sender("q")
        assert sender.link is not None
        assert sender.link.remote_max_message_size == 2000, "advertised at attach"
        before = sender.send_async(message("before"))
        oversized = message("x" * 5000)
        refused = sender.send_async(oversized)
        after = sender.send_async(message("after"))
        assert before.result(10).outcome == Outcome.ACCEPTED
        assert refused.result(10).outcome == Outcome.REJECTED
        assert refused.result().error == Condition(
            "amqp:link:message-size-exceeded",
            f"message of {len(oversized)} bytes exceeds the limit of 2000 bytes",
        )
        assert after.result(10).outcome == Outcome.ACCEPTED
        assert not sender.detached.done()
        receiver = c.receiver("q", credit=10)
        assert [body(receiver.receive().payload) for _ in range(2)] == ["before", "after"]


def test_the_default_limit_takes_a_message_of_any_size_a_plan_allows() -> None:
    assert Settings().max_message_size == MAX_MESSAGE_SIZE_BOUND == 512 << 20


def test_garbage_and_half_open_connections_close_while_others_are_served(
    broker_factory: BrokerFactory,
) -> None:
    broker = broker_factory("--idle-timeout=1")
    broker.ensure_queue("q")
    with client(broker) as good:
        sender = good.sender("q")
        garbage = socket.create_connection(("127.0.0.1", broker.amqp_port))
        garbage.sendall(b"GET / HTTP/1.1\r\n\r\n" * 10)
        half_open = socket.create_connection(("127.0.0.1", broker.amqp_port))
        half_open.sendall(b"AMQP\x00\x01\x00\x00")  # a header, then silence
        for sock in (garbage, half_open):
            sock.settimeout(15)
            received = b""
            while chunk := sock.recv(4096):
                received += chunk  # the broker's answer, then EOF when it closes
            sock.close()
        assert sender.send(message("still here")).outcome == Outcome.ACCEPTED
        assert body(good.receiver("q").receive().payload) == "still here"


def test_admin_refuses_bad_names_with_invalid_argument_and_changes_nothing(
    broker: BrokerProcess,
) -> None:
    for bad, words in [
        ("", "address name must not be empty"),
        ("a::b", "reserved for subscriptions"),
        ("white space", "is invalid"),
    ]:
        with pytest.raises(grpc.RpcError) as caught:
            broker.ensure_queue(bad)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert words in caught.value.details()
    broker.ensure_queue("orders")
    with pytest.raises(grpc.RpcError) as caught:
        broker.ensure_topic("orders")
    assert caught.value.code() == grpc.StatusCode.ALREADY_EXISTS
    with pytest.raises(grpc.RpcError) as caught:
        broker.admin().DeleteQueue(broker_pb2.DeleteAddressRequest(name="nope"), timeout=5)
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    assert list(broker.addresses()) == ["orders"]
    plan = resources_pb2.AddressPlanSpec(max_delivery_attempts=-1)
    with pytest.raises(grpc.RpcError) as caught:
        broker.admin().EnsureQueue(broker_pb2.EnsureAddressRequest(name="x", plan=plan), timeout=5)
    assert "max_delivery_attempts must be >= 0" in caught.value.details()


def test_shared_durable_subscription_is_one_queue_for_several_connections(
    broker: BrokerProcess,
) -> None:
    broker.ensure_topic("prices")
    shared = Terminus(address="prices", durable=2, expiry_policy="never", capabilities=("shared",))
    with client(broker, container_id="a") as a, client(broker, container_id="b") as b:
        # Credit is granted by hand, one connection after the other: which consumer the broker
        # picks when both have credit depends on when each flow frame arrives.
        first = a.receiver("prices", name="ticker|global", source=shared, credit=0)
        second = b.receiver("prices", name="ticker|global", source=shared, credit=0)
        sender = a.sender("prices")
        for i in range(4):
            sender.send(message(f"p{i}"))
        first.flow(2)
        taken_first = [first.receive(), first.receive()]
        second.flow(2)
        taken_second = [second.receive(), second.receive()]
        for delivery in taken_first:
            first.accept(delivery)
        for delivery in taken_second:
            second.accept(delivery)
        # One queue: what the first connection took is gone for the second (two queues would
        # have given the second p0 and p1 as well).
        assert [body(d.payload) for d in taken_first] == ["p0", "p1"]
        assert [body(d.payload) for d in taken_second] == ["p2", "p3"]
        first.flow(10)
        second.flow(10)
        for receiver in (first, second):
            with pytest.raises(TimeoutError):
                receiver.receive(timeout=0.3)
        listed = broker.addresses()
        assert listed["prices::ticker"].durable
        assert listed["prices::ticker"].consumers == 2
        assert listed["prices"].enqueued == 4


def test_admin_lists_counters_and_deletes_topics(broker: BrokerProcess) -> None:
    broker.ensure_queue("q")
    broker.ensure_topic("t")
    with client(broker) as c:
        receiver = c.receiver("q")
        for i in range(3):
            c.sender("q").send(message(f"m{i}"))
        receiver.accept(receiver.receive())
        # accept() returns once the disposition is queued; the broker counts it when it arrives.
        wait_for(lambda: broker.addresses()["q"].dequeued == 1, what="the accept counted")
        listed = broker.addresses()["q"]
        assert (listed.enqueued, listed.dequeued, listed.consumers) == (3, 1, 1)
        c.receiver("t", name="keep", source=durable_source("t")).detach()
        c.sender("t").send(message("kept", durable=True))
    deleted = broker.admin().DeleteTopic(broker_pb2.DeleteAddressRequest(name="t"), timeout=5)
    assert deleted.messages_deleted == 1
    assert sorted(broker.addresses()) == ["q"]


def test_pre_settled_sends_arrive_at_most_once_in_order(broker: BrokerProcess) -> None:
    broker.ensure_queue("fire-and-forget")
    with client(broker) as c:
        sender = c.sender("fire-and-forget", settled=True)
        for i in range(50):
            sender.send(message(f"m{i}"))
        receiver = c.receiver("fire-and-forget")
        got = [body(receiver.receive().payload) for _ in range(50)]
    assert got == [f"m{i}" for i in range(50)]
