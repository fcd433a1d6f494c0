"""Waypoints with real broker processes behind real routers: queues through the router, shards
and a Draining broker, outcomes passed back to the broker, and a durable topic subscription that a
subscriber finds again through another router."""

from __future__ import annotations

import time

import pytest
from enmasse.amqp import codec
from enmasse.amqp.client import AmqpError, Client
from enmasse.amqp.engine import Condition, Outcome, Terminus
from enmasse.v1 import router_pb2

from tests.fixtures.broker import BrokerFactory, BrokerProcess
from tests.fixtures.router import RouterFleet, RouterProcess


def _waypoint(name: str, broker: BrokerProcess, state: str = "Active") -> router_pb2.BrokerWaypoint:
    return router_pb2.BrokerWaypoint(
        name=name, host="127.0.0.1", port=broker.amqp_port, state=state
    )


def _connect(port: int, opened: list[Client], **options: object) -> Client:
    opened.append(Client("127.0.0.1", port, **options))  # type: ignore[arg-type]
    return opened[-1]


def _numbers(receiver: object, count: int) -> list[int]:
    got = []
    for _ in range(count):
        delivery = receiver.receive(10)  # type: ignore[attr-defined]
        got.append(int(codec.read_body(delivery.payload)))
        receiver.accept(delivery)  # type: ignore[attr-defined]
    return got


def _depth(broker: BrokerProcess, name: str) -> int:
    return broker.addresses()[name].depth


def _wait_depth(broker: BrokerProcess, name: str, depth: int) -> None:
    deadline = time.monotonic() + 10
    while _depth(broker, name) != depth:
        assert time.monotonic() < deadline, f"{name} depth {_depth(broker, name)} != {depth}"
        time.sleep(0.05)


def _wait_broker_credit(router: RouterProcess, *, links: int) -> None:
    """Until `links` of the router's links to brokers have credit."""
    deadline = time.monotonic() + 10
    while True:
        infos = router.admin().ListLinks(router_pb2.ListLinksRequest(), timeout=10).links
        ready = [i for i in infos if i.name == f"{router.router_id}/orders" and i.credit > 0]
        if len(ready) == links:
            return
        assert time.monotonic() < deadline, infos
        time.sleep(0.02)


def _orders_router(routers: RouterFleet, broker: BrokerProcess) -> RouterProcess:
    """One router whose queue `orders` lives on `broker`."""
    broker.ensure_queue("orders")
    router = routers.start("r1")
    router.apply(
        routers.mesh_config(
            generation=1,
            addresses={"orders": "queue"},
            waypoints={"orders": [_waypoint("b1", broker)]},
        )
    )
    return router


def test_queue_through_the_router_is_acked_by_the_broker_and_consumed_through_it(
    routers: RouterFleet, broker: BrokerProcess, clients: list[Client]
) -> None:
    router = _orders_router(routers, broker)
    sender = _connect(router.amqp_port, clients).sender("orders")
    for n in range(20):
        assert sender.send(codec.encode_message(str(n).encode(), durable=True)).outcome is (
            Outcome.ACCEPTED
        )
    assert _depth(broker, "orders") == 20  # the producer's ack meant: the broker has it
    receiver = _connect(router.amqp_port, clients).receiver("orders", credit=5)
    assert _numbers(receiver, 20) == list(range(20))
    _wait_depth(broker, "orders", 0)


def test_a_draining_consumer_gets_what_the_broker_holds_then_its_credit_back(
    routers: RouterFleet, broker: BrokerProcess, clients: list[Client]
) -> None:
    router = _orders_router(routers, broker)
    sender = _connect(router.amqp_port, clients).sender("orders")
    for n in (1, 2):
        assert sender.send(codec.encode_message(str(n).encode())).outcome is Outcome.ACCEPTED
    consumer = _connect(router.amqp_port, clients)
    receiver = consumer.receiver("orders", credit=0)
    link = receiver.link
    assert link is not None
    consumer.call(lambda: link.drain(10))
    assert _numbers(receiver, 2) == [1, 2]
    deadline = time.monotonic() + 10
    while consumer.call(lambda: link.credit) != 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert consumer.call(lambda: link.credit) == 0  # the 8 left over came back
    _wait_depth(broker, "orders", 0)
    assert sender.send(codec.encode_message(b"3")).outcome is Outcome.ACCEPTED
    with pytest.raises(TimeoutError):
        receiver.receive(0.5)  # no credit left: nothing comes until asked again
    receiver.flow(1)
    assert _numbers(receiver, 1) == [3]


def test_consumer_outcome_goes_back_to_the_broker(
    routers: RouterFleet, broker: BrokerProcess, clients: list[Client]
) -> None:
    router = _orders_router(routers, broker)
    _connect(router.amqp_port, clients).sender("orders").send(codec.encode_message(b"1"))
    consumer = _connect(router.amqp_port, clients)
    receiver = consumer.receiver("orders", credit=1)
    first = receiver.receive(10)
    receiver.settle(first, Outcome.RELEASED)  # back on the broker's queue: delivered again
    again = receiver.receive(10)
    assert codec.read_body(again.payload) == b"1"
    receiver.accept(again)
    _wait_depth(broker, "orders", 0)
    assert broker.addresses()["orders"].dequeued == 1


def test_shards_share_new_messages_and_a_draining_broker_gets_none(
    routers: RouterFleet, broker_factory: BrokerFactory, clients: list[Client]
) -> None:
    b1, b2, b3 = broker_factory(), broker_factory(), broker_factory()
    for b in (b1, b2, b3):
        b.ensure_queue("orders")
    # A message left on the broker that is being drained: consumers must still get it.
    with Client("127.0.0.1", b3.amqp_port) as direct:
        direct.sender("orders").send(codec.encode_message(b"999"))
    router = routers.start("r1")
    router.apply(
        routers.mesh_config(
            generation=1,
            addresses={"orders": "queue"},
            waypoints={
                "orders": [
                    _waypoint("b1", b1),
                    _waypoint("b2", b2),
                    _waypoint("b3", b3, "Draining"),
                ]
            },
        )
    )
    sender = _connect(router.amqp_port, clients).sender("orders")
    _wait_broker_credit(router, links=2)  # a broker's first attach can take a while
    for n in range(40):
        assert sender.send(codec.encode_message(str(n).encode())).outcome is Outcome.ACCEPTED
    depths = [_depth(b, "orders") for b in (b1, b2, b3)]
    assert depths[0] + depths[1] == 40
    assert depths[0] >= 10
    assert depths[1] >= 10
    assert depths[2] == 1
    receiver = _connect(router.amqp_port, clients).receiver("orders", credit=10)
    assert sorted(_numbers(receiver, 41)) == [*range(40), 999]


def test_durable_subscription_is_found_again_through_another_router(
    routers: RouterFleet, broker: BrokerProcess, clients: list[Client]
) -> None:
    broker.ensure_topic("prices")
    r1, r2 = routers.start("r1"), routers.start("r2")
    routers.apply_all(
        routers.mesh_config(
            generation=1,
            addresses={"prices": "topic"},
            waypoints={"prices": [_waypoint("b1", broker)]},
        )
    )
    durable = Terminus(address="prices", durable=2, expiry_policy="never")
    subscriber = _connect(r1.amqp_port, clients, container_id="trader-7")
    subscription = subscriber.receiver("prices", name="ticks", source=durable, credit=10)
    publisher = _connect(r2.amqp_port, clients).sender("prices")
    assert publisher.send(codec.encode_message(b"1")).outcome is Outcome.ACCEPTED
    assert _numbers(subscription, 1) == [1]
    subscription.detach()  # away, not gone: the subscription keeps collecting
    for n in (2, 3):
        assert publisher.send(codec.encode_message(str(n).encode())).outcome is Outcome.ACCEPTED
    back = _connect(r2.amqp_port, clients, container_id="trader-7")
    resumed = back.receiver("prices", name="ticks", source=durable, credit=10)
    assert _numbers(resumed, 2) == [2, 3]


def test_a_subscription_address_reads_its_queue_on_the_broker(
    routers: RouterFleet, broker: BrokerProcess, clients: list[Client]
) -> None:
    broker.ensure_topic("prices")
    # The subscription service's part, by hand: a shared durable subscription named `sub1`.
    shared = Terminus(address="prices", durable=2, expiry_policy="never", capabilities=("shared",))
    with Client("127.0.0.1", broker.amqp_port) as direct:
        direct.receiver("prices", name="sub1", source=shared, credit=0).detach()
    router = routers.start("r1")
    router.apply(
        routers.mesh_config(
            generation=1,
            addresses={"prices": "topic", "sub1": "subscription"},
            waypoints={"prices": [_waypoint("b1", broker)], "sub1": [_waypoint("b1", broker)]},
            topics={"sub1": "prices"},
        )
    )
    client = _connect(router.amqp_port, clients)
    with pytest.raises(AmqpError) as refused:
        client.sender("sub1")
    assert refused.value.condition == Condition(
        "amqp:not-allowed", "address 'sub1' is a subscription: send to its topic 'prices'"
    )
    publisher = client.sender("prices")
    for n in range(3):
        assert publisher.send(codec.encode_message(str(n).encode())).outcome is Outcome.ACCEPTED
    reader = _connect(router.amqp_port, clients).receiver("sub1", credit=10)
    assert _numbers(reader, 3) == [0, 1, 2]


def test_a_crashed_broker_is_found_again_by_producers_and_consumers(
    routers: RouterFleet, broker: BrokerProcess, clients: list[Client]
) -> None:
    router = _orders_router(routers, broker)
    receiver = _connect(router.amqp_port, clients).receiver("orders", credit=10)
    sender = _connect(router.amqp_port, clients).sender("orders")
    assert sender.send(codec.encode_message(b"0", durable=True)).outcome is Outcome.ACCEPTED
    assert _numbers(receiver, 1) == [0]
    broker.restart()  # SIGKILL, then the same ports and data
    outcomes = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        # Released while the router has no broker for the queue; accepted once it has again.
        outcome = sender.send(codec.encode_message(b"1", durable=True)).outcome
        outcomes.append(outcome)
        if outcome is Outcome.ACCEPTED:
            break
        time.sleep(0.1)
    assert outcomes[-1] is Outcome.ACCEPTED
    assert set(outcomes[:-1]) <= {Outcome.RELEASED}
    # The same consumer link, fed again. The broker may hand out "0" once more: its ack may
    # not have reached the journal before the SIGKILL (at-least-once), but nothing is lost.
    got = _numbers(receiver, 1)
    if got == [0]:
        got = _numbers(receiver, 1)
    assert got == [1]
