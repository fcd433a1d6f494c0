"""The message size limit with a real router in front of a real broker: an oversized delivery
is rejected for its producer alone (amqp:link:message-size-exceeded, settled, never RELEASED),
while a neighbour producer sends to the same queue through the same router and its router ->
broker link: at the router (the space's limit, advertised at attach), and at the broker when a
broker's own limit is the smaller one (the broker rejects that delivery on the link the
router's producers share, and the router passes the rejection back to its producer alone)."""

from __future__ import annotations

from concurrent.futures import Future

from enmasse.amqp import codec
from enmasse.amqp.client import Client, Sender
from enmasse.amqp.engine import Condition, Delivery, Outcome
from enmasse.v1 import router_pb2

from tests.fixtures.broker import BrokerFactory, BrokerProcess
from tests.fixtures.router import RouterFleet, RouterProcess

NEIGHBOUR_MESSAGES = 200


def _router(routers: RouterFleet, broker: BrokerProcess, *, limit: int) -> RouterProcess:
    broker.ensure_queue("orders")
    return routers.start_before_queue(
        "orders",
        broker_port=broker.amqp_port,
        limits=router_pb2.RouterLimits(max_message_size=limit),
    )


def _beside_a_neighbour(
    router: RouterProcess, clients: list[Client], oversized: bytes
) -> tuple[Sender, Delivery]:
    """The neighbour's messages in flight around the oversized one; checks that every one of
    them was accepted and arrived; returns the offending sender and its outcome."""
    clients += [Client("127.0.0.1", router.amqp_port, timeout=30) for _ in range(3)]
    consumer, neighbour_client, offender_client = clients[-3:]
    receiver = consumer.receiver("orders", credit=NEIGHBOUR_MESSAGES + 10)
    neighbour = neighbour_client.sender("orders")
    offender = offender_client.sender("orders")
    sends = (neighbour.send_async(codec.encode_message(f"n{i}")) for i in range(NEIGHBOUR_MESSAGES))
    neighbours: list[Future[Delivery]] = [next(sends) for _ in range(NEIGHBOUR_MESSAGES // 2)]
    refused = offender.send_async(oversized)
    neighbours += list(sends)

    outcome = refused.result(30)
    assert [f.result(30).outcome for f in neighbours] == [Outcome.ACCEPTED] * NEIGHBOUR_MESSAGES
    bodies = set()
    for _ in range(NEIGHBOUR_MESSAGES):
        delivery = receiver.receive(10)
        receiver.accept(delivery)
        bodies.add(str(codec.read_body(delivery.payload)))
    assert bodies == {f"n{i}" for i in range(NEIGHBOUR_MESSAGES)}
    return offender, outcome


def test_the_router_rejects_an_oversized_message_for_its_producer_alone(
    routers: RouterFleet, broker: BrokerProcess, clients: list[Client]
) -> None:
    router = _router(routers, broker, limit=65536)
    oversized = codec.encode_message(b"x" * 300_000)
    offender, outcome = _beside_a_neighbour(router, clients, oversized)
    assert offender.link is not None
    assert offender.link.remote_max_message_size == 65536, "advertised at attach"
    assert outcome.outcome is Outcome.REJECTED
    assert outcome.error == Condition(
        "amqp:link:message-size-exceeded",
        f"message of {len(oversized)} bytes exceeds the limit of 65536 bytes",
    ), "the router's limit: the message never reached the broker"
    assert offender.send(codec.encode_message("fits")).outcome is Outcome.ACCEPTED
    assert not offender.detached.done()


def test_a_broker_rejects_on_the_link_the_routers_producers_share(
    routers: RouterFleet, broker_factory: BrokerFactory, clients: list[Client]
) -> None:
    broker = broker_factory("--max-message-size=4096")
    router = _router(routers, broker, limit=1 << 20)
    oversized = codec.encode_message(b"x" * 10_000)
    offender, outcome = _beside_a_neighbour(router, clients, oversized)
    assert outcome.outcome is Outcome.REJECTED
    assert outcome.error == Condition(
        "amqp:link:message-size-exceeded",
        f"message of {len(oversized)} bytes exceeds the limit of 4096 bytes",
    ), "the broker's limit, passed back by the router"
    assert offender.send(codec.encode_message("fits")).outcome is Outcome.ACCEPTED
    links = router.admin().ListLinks(router_pb2.ListLinksRequest(), timeout=10).links
    assert [link.name for link in links].count("r1/orders") >= 1, "the broker link lives on"
