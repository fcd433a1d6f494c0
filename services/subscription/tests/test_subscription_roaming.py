"""A durable subscriber roams between routers and misses nothing, with the control plane in charge.

Real parts: the config service over etcd, the router-agent pushing to two router processes, a
broker process holding the topic (placed there as the storage-controller would), and the
subscription service answering where the subscription lives. The subscriber attaches through one
router, goes away, messages are published meanwhile, and it comes back through the OTHER router
with the same container id and link name: it gets exactly what it missed, in order.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from enmasse.amqp import codec
from enmasse.amqp.client import Client, Receiver
from enmasse.amqp.engine import Outcome, Terminus
from enmasse.resources.discovery import LocalDirectory, write_ports
from enmasse.router_agent.agent import RouterAgent
from enmasse.subscription.subscriptions import DurableSubscriptions
from enmasse.v1 import config_pb2, config_pb2_grpc, resources_pb2, subscription_pb2

from tests.fixtures.broker import BrokerProcess
from tests.fixtures.router import RouterFleet

pytestmark = pytest.mark.timeout(120)
Ref = config_pb2.ObjectRef


@pytest.fixture
async def plane(
    config_server: Any,
    config_stub: config_pb2_grpc.ConfigServiceStub,
    routers: RouterFleet,
    broker_factory: Callable[..., BrokerProcess],
    tmp_path: Path,
) -> AsyncIterator[dict[str, Any]]:
    broker = broker_factory()
    r0, r1 = routers.start("r0"), routers.start("r1")
    # what the runtime's processes do: their ports under <var>/<kind>/<space>/<id>/
    for router in (r0, r1):
        write_ports(
            tmp_path / "routers/shop" / router.router_id / "ports.json",
            {
                "amqp": router.amqp_port,
                "inter_router": router.inter_router_port,
                "admin": router.admin_port,
            },
        )
    write_ports(
        tmp_path / "brokers/shop/broker-0/ports.json",
        {"amqp": broker.amqp_port, "admin": broker.admin_port},
    )
    agent = RouterAgent(
        config_target=config_server.target,
        directory=LocalDirectory(tmp_path),
        tick=0.1,
    )
    subscriptions = DurableSubscriptions(
        config_target=config_server.target, directory=LocalDirectory(tmp_path)
    )
    agent.start()
    subscriptions.start()
    clients: list[Client] = []
    try:
        yield {"broker": broker, "subscriptions": subscriptions, "clients": clients}
    finally:
        for client in clients:
            client.close()
        await subscriptions.stop()
        await agent.stop()


async def test_a_durable_subscriber_roams_to_another_router_and_gets_what_it_missed(
    plane: dict[str, Any], config_stub: config_pb2_grpc.ConfigServiceStub, routers: RouterFleet
) -> None:
    await config_stub.CreateAddressSpace(
        resources_pb2.AddressSpace(
            metadata=resources_pb2.Metadata(name="shop"),
            spec=resources_pb2.AddressSpaceSpec(type="standard", plan="standard-small"),
        )
    )
    await config_stub.CreateAddress(
        resources_pb2.Address(
            metadata=resources_pb2.Metadata(name="prices", space="shop"),
            spec=resources_pb2.AddressSpec(
                address="prices", type="topic", plan="standard-small-topic"
            ),
        )
    )
    # the storage-controller's part: the topic on its broker, and the placement in the status
    plane["broker"].ensure_topic("prices")
    await config_stub.UpdateAddressStatus(
        config_pb2.UpdateAddressStatusRequest(
            ref=Ref(space="shop", name="prices"),
            status=resources_pb2.AddressStatus(
                brokers=[resources_pb2.BrokerPlacement(broker="broker-0", state="Active")]
            ),
        )
    )
    deadline = time.monotonic() + 20
    while (await config_stub.GetAddress(Ref(space="shop", name="prices"))).status.status.phase != (
        "Active"
    ):
        assert time.monotonic() < deadline, "prices never became Active"
        await asyncio.sleep(0.1)

    where = await plane["subscriptions"].lookup(
        subscription_pb2.LookupRequest(
            space="shop", address="prices", container_id="trader-7", link_name="ticks"
        )
    )
    assert (where.broker, where.port) == ("broker-0", plane["broker"].amqp_port)

    r0, r1 = routers.routers["r0"], routers.routers["r1"]
    got = await asyncio.to_thread(_roam, r0.amqp_port, r1.amqp_port, plane["clients"])
    assert got == {"first": ["m1"], "while away": ["m2", "m3", "m4"], "after": []}


def _roam(first_port: int, second_port: int, clients: list[Client]) -> dict[str, list[str]]:
    durable = Terminus(address="prices", durable=2, expiry_policy="never")

    def connect(port: int, container_id: str | None = None) -> Client:
        client = Client("127.0.0.1", port, container_id=container_id)
        clients.append(client)
        return client

    subscriber = connect(first_port, "trader-7")
    subscription = subscriber.receiver("prices", name="ticks", source=durable, credit=10)
    publisher = connect(second_port).sender("prices")
    send = _publisher(publisher)
    send("m1")
    first = _take(subscription, 1)
    subscription.detach()  # away, not gone: the subscription keeps collecting
    subscriber.close()
    for body in ("m2", "m3", "m4"):
        send(body)
    back = connect(second_port, "trader-7")
    resumed = back.receiver("prices", name="ticks", source=durable, credit=10)
    away = _take(resumed, 3)
    after = []
    with contextlib.suppress(TimeoutError):  # nothing more: no duplicates
        after.append(str(codec.read_body(resumed.receive(0.5).payload)))
    return {"first": first, "while away": away, "after": after}


def _publisher(sender: Any) -> Callable[[str], None]:
    def send(body: str) -> None:
        outcome = sender.send(codec.encode_message(body, durable=True), timeout=15).outcome
        assert outcome is Outcome.ACCEPTED, f"{body}: {outcome}"

    return send


def _take(receiver: Receiver, count: int) -> list[str]:
    bodies = []
    for _ in range(count):
        delivery = receiver.receive(15)
        bodies.append(str(codec.read_body(delivery.payload)))
        receiver.accept(delivery)
    return bodies


async def test_a_subscription_address_keeps_what_was_published_before_its_consumer_came(
    plane: dict[str, Any], config_stub: config_pb2_grpc.ConfigServiceStub, routers: RouterFleet
) -> None:
    await config_stub.CreateAddressSpace(
        resources_pb2.AddressSpace(
            metadata=resources_pb2.Metadata(name="shop"),
            spec=resources_pb2.AddressSpaceSpec(type="standard", plan="standard-small"),
        )
    )
    for name, kind, topic in (("prices", "topic", ""), ("audit", "subscription", "prices")):
        await config_stub.CreateAddress(
            resources_pb2.Address(
                metadata=resources_pb2.Metadata(name=name, space="shop"),
                spec=resources_pb2.AddressSpec(
                    address=name, type=kind, plan=f"standard-small-{kind}", topic=topic
                ),
            )
        )
        # the storage-controller's part: placement on the one broker (it ensures the topic)
        await config_stub.UpdateAddressStatus(
            config_pb2.UpdateAddressStatusRequest(
                ref=Ref(space="shop", name=name),
                status=resources_pb2.AddressStatus(
                    brokers=[resources_pb2.BrokerPlacement(broker="broker-0", state="Active")]
                ),
            )
        )
    plane["broker"].ensure_topic("prices")
    deadline = time.monotonic() + 20
    while True:
        phases = [
            (await config_stub.GetAddress(Ref(space="shop", name=n))).status.status.phase
            for n in ("prices", "audit")
        ]
        made = "prices::audit" in await asyncio.to_thread(plane["broker"].addresses)
        if phases == ["Active", "Active"] and made:
            break
        assert time.monotonic() < deadline, f"not ready: {phases}, subscription made: {made}"
        await asyncio.sleep(0.1)

    r0, r1 = routers.routers["r0"], routers.routers["r1"]
    got = await asyncio.to_thread(_publish_then_read, r0.amqp_port, r1.amqp_port, plane["clients"])
    assert got == ["before-1", "before-2", "after"]


def _publish_then_read(publish_port: int, read_port: int, clients: list[Client]) -> list[str]:
    publisher = Client("127.0.0.1", publish_port)
    clients.append(publisher)
    send = _publisher(publisher.sender("prices"))
    send("before-1")
    send("before-2")
    reader = Client("127.0.0.1", read_port)
    clients.append(reader)
    receiver = reader.receiver("audit", credit=10)
    send("after")
    return _take(receiver, 3)
