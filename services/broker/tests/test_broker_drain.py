"""Drain with real broker processes: subscriptions move into the same subscription, deliveries held
by consumers are waited for, an empty target is stocked first, and only a drain may feed a
subscription queue.

Each test starts two `enmasse-broker` processes (tests/fixtures/broker.py) and drains the first
into the second through BrokerAdmin, with `target_admin` naming the second's BrokerAdmin unless
the test is about its absence.
"""

from __future__ import annotations

import concurrent.futures

import grpc
import pytest
from enmasse.amqp import codec
from enmasse.amqp.client import AmqpError, Client
from enmasse.amqp.engine import Outcome, Terminus
from enmasse.broker.inbox import DRAIN_TOKEN_PROPERTY
from enmasse.v1 import broker_pb2, resources_pb2

from tests.fixtures.broker import BrokerFactory, BrokerProcess
from tests.fixtures.waiting import wait_for


def message(text: str, *, durable: bool = True) -> bytes:
    return codec.encode_message(text, durable=durable)


def body(payload: bytes) -> str:
    return str(codec.read_body(payload))


def durable_source(topic: str, *, shared: bool = False) -> Terminus:
    capabilities = ("shared",) if shared else ()
    return Terminus(address=topic, durable=2, expiry_policy="never", capabilities=capabilities)


def drain_request(
    target: BrokerProcess, *names: str, admin: bool = True
) -> broker_pb2.DrainRequest:
    return broker_pb2.DrainRequest(
        target_host="127.0.0.1",
        target_port=target.amqp_port,
        addresses=list(names),
        target_admin=f"127.0.0.1:{target.admin_port}" if admin else "",
    )


def send_all(process: BrokerProcess, address: str, texts: list[str], **kw: bool) -> None:
    with Client("127.0.0.1", process.amqp_port) as c:
        sender = c.sender(address)
        for text in texts:
            assert sender.send(message(text, **kw)).outcome == Outcome.ACCEPTED


def receive_all(receiver: object, count: int) -> list[str]:
    got = []
    for _ in range(count):
        delivery = receiver.receive()  # type: ignore[attr-defined]
        got.append(body(delivery.payload))
        receiver.accept(delivery)  # type: ignore[attr-defined]
    return got


def test_durable_subscriptions_move_into_the_same_subscription_on_an_empty_target(
    broker_factory: BrokerFactory,
) -> None:
    source, target = broker_factory(), broker_factory()
    source.ensure_topic("alerts", max_delivery_attempts=4)
    with Client("127.0.0.1", source.amqp_port, container_id="app") as c:
        c.receiver("alerts", name="alerts-sub", source=durable_source("alerts")).detach()
    with Client("127.0.0.1", source.amqp_port, container_id="x") as c:
        shared_source = durable_source("alerts", shared=True)
        c.receiver("alerts", name="board|global", source=shared_source).detach()
    texts = [f"alert {i}" for i in range(30)]
    # Durable and not: both are the subscription's, both move (the plan is persistent).
    send_all(source, "alerts", texts[:20])
    send_all(source, "alerts", texts[20:], durable=False)
    assert target.addresses() == {}  # nothing there: the drain must create it all

    moved = source.admin().Drain(drain_request(target), timeout=60)
    assert moved.messages_moved == 60
    assert sorted(moved.addresses) == ["alerts::app|alerts-sub", "alerts::board"]
    listed = source.addresses()
    assert listed["alerts::app|alerts-sub"].depth == listed["alerts::board"].depth == 0
    there = target.addresses()
    assert there["alerts"].plan.max_delivery_attempts == 4
    assert there["alerts::app|alerts-sub"].durable
    assert there["alerts::board"].durable

    with Client("127.0.0.1", target.amqp_port, container_id="app") as c:
        sub = c.receiver("alerts", name="alerts-sub", source=durable_source("alerts"), credit=10)
        assert receive_all(sub, 30) == texts  # all, in order
        with pytest.raises(TimeoutError):
            sub.receive(timeout=0.3)  # and nothing more
    with Client("127.0.0.1", target.amqp_port, container_id="y") as c:
        shared = c.receiver(
            "alerts", name="board|global", source=durable_source("alerts", shared=True)
        )
        assert receive_all(shared, 30) == texts


def test_durable_subscription_moves_across_a_target_restart(broker_factory: BrokerFactory) -> None:
    source, target = broker_factory(), broker_factory()
    source.ensure_topic("t")
    with Client("127.0.0.1", source.amqp_port, container_id="app") as c:
        c.receiver("t", name="s", source=durable_source("t")).detach()
    send_all(source, "t", ["a", "b", "c"])
    assert source.admin().Drain(drain_request(target, "t"), timeout=60).messages_moved == 3
    target.restart()  # SIGKILL: the subscription and its messages were fsync'd when accepted
    with Client("127.0.0.1", target.amqp_port, container_id="app") as c:
        sub = c.receiver("t", name="s", source=durable_source("t"))
        assert receive_all(sub, 3) == ["a", "b", "c"]


def test_drain_waits_for_held_deliveries_and_moves_the_released_ones(
    broker_factory: BrokerFactory,
) -> None:
    source, target = broker_factory(), broker_factory()
    source.ensure_queue("work", max_delivery_attempts=5)
    texts = [f"job {i}" for i in range(100)]
    send_all(source, "work", texts)
    with Client("127.0.0.1", source.amqp_port) as c:
        worker = c.receiver("work", credit=0)
        worker.flow(10)
        held = [worker.receive() for _ in range(10)]
        assert [body(d.payload) for d in held] == texts[:10]

        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            call = pool.submit(source.admin().Drain, drain_request(target, "work"), timeout=60)
            wait_for(lambda: target.addresses().get("work", None) is not None, what="target queue")
            wait_for(lambda: target.addresses()["work"].depth == 90, what="ready messages moved")
            listed = source.addresses()["work"]
            assert (listed.depth, listed.consumers) == (0, 1)
            assert not call.done()  # it cannot finish while the worker holds 10
            worker.flow(10)  # credit it will not be used while the queue drains
            for delivery in held[:5]:
                worker.accept(delivery)  # done: gone, never moved
            for delivery in held[5:8]:
                worker.settle(delivery, Outcome.RELEASED)
            for delivery in held[8:]:
                worker.settle(delivery, Outcome.MODIFIED, delivery_failed=True)
            answer = call.result(60)
        assert answer.messages_moved == 95
        with pytest.raises(TimeoutError):
            worker.receive(timeout=0.3)  # it got nothing new while the queue drained
    assert source.addresses()["work"].depth == 0

    with Client("127.0.0.1", target.amqp_port) as c:
        receiver = c.receiver("work", credit=0)
        receiver.flow(200)
        got = []
        counts = {}
        for _ in range(95):
            delivery = receiver.receive()
            got.append(body(delivery.payload))
            counts[got[-1]] = codec.read_header(delivery.payload).delivery_count
            receiver.accept(delivery)
        with pytest.raises(TimeoutError):
            receiver.receive(timeout=0.3)
    # None lost, none duplicated: the 5 accepted stayed done, the 5 given back moved.
    assert sorted(got + texts[:5]) == sorted(texts)
    assert len(set(got)) == len(got) == 95
    assert got[:90] == texts[10:]  # the ready ones first, in order; then the ones given back
    assert sorted(got[90:]) == sorted(texts[5:10])
    # Their delivery-count travelled: released ones unchanged, the failed ones one higher.
    assert [counts[t] for t in texts[5:10]] == [0, 0, 0, 1, 1]


def test_a_consumer_that_detaches_holding_deliveries_lets_them_move(
    broker_factory: BrokerFactory,
) -> None:
    source, target = broker_factory(), broker_factory()
    source.ensure_queue("q")
    texts = [f"m{i}" for i in range(20)]
    send_all(source, "q", texts)
    worker = Client("127.0.0.1", source.amqp_port)
    try:
        receiver = worker.receiver("q", credit=0)
        receiver.flow(4)
        held = [body(receiver.receive().payload) for _ in range(4)]
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            call = pool.submit(source.admin().Drain, drain_request(target, "q"), timeout=60)
            wait_for(lambda: target.addresses().get("q", None) is not None, what="target queue")
            wait_for(lambda: target.addresses()["q"].depth == 16, what="ready messages moved")
            assert not call.done()
            worker.close()  # gone without settling: its 4 come back and move
            assert call.result(60).messages_moved == 20
    finally:
        worker.close()
    with Client("127.0.0.1", target.amqp_port) as c:
        got = receive_all(c.receiver("q"), 20)
    assert sorted(got) == sorted(texts)
    assert sorted(got[16:]) == sorted(held)


def test_a_drain_whose_caller_gives_up_leaves_held_messages_with_the_source(
    broker_factory: BrokerFactory,
) -> None:
    source, target = broker_factory(), broker_factory()
    source.ensure_queue("q")
    send_all(source, "q", ["a", "b", "c"])
    with Client("127.0.0.1", source.amqp_port) as c:
        worker = c.receiver("q", credit=0)
        worker.flow(1)
        held = worker.receive()  # held through the drain: it cannot finish
        with pytest.raises(grpc.RpcError) as caught:
            source.admin().Drain(drain_request(target, "q"), timeout=3)
        assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        wait_for(lambda: not source.addresses()["q"].draining, what="the drain cancelled")
        assert target.addresses()["q"].depth == 2  # b and c had moved before the deadline
        # The queue is the consumers' again: a new message goes to the worker, not away.
        send_all(source, "q", ["d"])
        worker.flow(5)
        after = worker.receive()
        assert body(after.payload) == "d"
        worker.accept(after)
        worker.accept(held)
        # dequeued counts the 2 drained too
        wait_for(lambda: source.addresses()["q"].dequeued == 4, what="both acknowledged")
    listed = source.addresses()["q"]
    assert (listed.depth, listed.bytes) == (0, 0)


def test_only_a_drain_may_send_into_a_subscription_queue(broker_factory: BrokerFactory) -> None:
    broker = broker_factory()
    broker.ensure_topic("t")
    with Client("127.0.0.1", broker.amqp_port, container_id="app") as c:
        c.receiver("t", name="s", source=durable_source("t")).detach()
    # A token as a drain gets it; its connection sends into the subscription, once.
    used = (
        broker.admin()
        .PrepareDrain(
            broker_pb2.PrepareDrainRequest(
                addresses=[
                    broker_pb2.DrainAddress(
                        name="t", kind="topic", plan=resources_pb2.AddressPlanSpec(persistent=True)
                    )
                ]
            ),
            timeout=10,
        )
        .token
    )
    with Client("127.0.0.1", broker.amqp_port, properties={DRAIN_TOKEN_PROPERTY: used}) as c:
        drain_link = c.sender("t::app|s")  # the one connection the token serves
        assert drain_link.send(message("moved")).outcome == Outcome.ACCEPTED
    for properties in (None, {DRAIN_TOKEN_PROPERTY: "guessed"}, {DRAIN_TOKEN_PROPERTY: used}):
        with Client("127.0.0.1", broker.amqp_port, properties=properties) as c:
            with pytest.raises(AmqpError) as refused:
                c.sender("t::app|s")
            assert refused.value.condition is not None
            assert refused.value.condition.name == "amqp:unauthorized-access"
            assert "only a drain" in (refused.value.condition.description or "")
            assert c.sender("t").send(message("published")).outcome == Outcome.ACCEPTED
    # the drained one and the 3 published ones, nothing injected
    assert broker.addresses()["t::app|s"].depth == 4


def test_topic_without_target_admin_and_bad_prepare_change_nothing(
    broker_factory: BrokerFactory,
) -> None:
    source, target = broker_factory(), broker_factory()
    source.ensure_topic("t")
    with pytest.raises(grpc.RpcError) as caught:
        source.admin().Drain(drain_request(target, "t", admin=False), timeout=10)
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "needs target_admin" in caught.value.details()
    with pytest.raises(grpc.RpcError) as caught:
        source.admin().Drain(drain_request(target, "nope"), timeout=10)
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND

    plan = resources_pb2.AddressPlanSpec(persistent=True)
    bad = broker_pb2.PrepareDrainRequest(
        addresses=[
            broker_pb2.DrainAddress(name="fine", kind="queue", plan=plan),
            broker_pb2.DrainAddress(
                name="t", kind="topic", plan=plan, durable_subscriptions=["ok", "bad\x00id"]
            ),
        ]
    )
    with pytest.raises(grpc.RpcError) as caught:
        target.admin().PrepareDrain(bad, timeout=10)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "control characters" in caught.value.details()
    assert target.addresses() == {}  # nothing half-made
