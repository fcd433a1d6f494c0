"""A topic leaves its broker: its durable subscriptions, and what waits in them, go with it.

Real parts: the config service over the session etcd, the controller, and one `enmasse-broker`
process per broker the controller renders (the test plays the local runtime, as in
test_storage_controller_reconcile.py). The topic `news` starts on a broker of its own with three
durable subscriptions: one detached with messages waiting, one whose consumer holds deliveries
unsettled while the move runs, and a `subscription` address's shared one. Its plan then becomes
pooled, so its broker must be emptied and removed; every subscriber, attaching to the new broker,
must find every message published for it, in order, and nothing more.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from enmasse.amqp import codec
from enmasse.amqp.client import Client, Receiver
from enmasse.amqp.engine import Outcome, Terminus
from enmasse.resources.rendered_brokers import GitOpsOutput
from enmasse.storage_controller.controller import StorageController
from enmasse.v1 import config_pb2, config_pb2_grpc, resources_pb2

from tests.fixtures.config_service import InProcessConfig
from tests.fixtures.rendered_brokers import RenderedBrokers, eventually, placed, ready_on

pytestmark = pytest.mark.slow
TEXTS = [f"headline {i}" for i in range(20)]
HELD = 5  # deliveries the busy subscriber holds unsettled while its subscription moves


async def declare(config: config_pb2_grpc.ConfigServiceStub) -> None:
    """A dedicated topic plan, a space plan allowing it, the space, the topic, a subscription."""
    await config.CreateAddressPlan(
        resources_pb2.AddressPlan(
            metadata={"name": "large-topic"},
            spec={"address_type": "topic", "broker": 1, "persistent": True},
        ),
        timeout=5,
    )
    await config.CreateAddressSpacePlan(
        resources_pb2.AddressSpacePlan(
            metadata={"name": "news-room"},
            spec={
                "address_space_type": "standard",
                "address_plans": [
                    "large-topic",
                    "standard-small-topic",
                    "standard-small-subscription",
                ],
                "quotas": {"max_brokers": 4},
            },
        ),
        timeout=5,
    )
    await config.CreateAddressSpace(
        resources_pb2.AddressSpace(
            metadata={"name": "shop"}, spec={"type": "standard", "plan": "news-room"}
        ),
        timeout=5,
    )
    await config.CreateAddress(
        resources_pb2.Address(
            metadata={"name": "news", "space": "shop"},
            spec={"address": "news", "type": "topic", "plan": "large-topic"},
        ),
        timeout=5,
    )
    await config.CreateAddress(
        resources_pb2.Address(
            metadata={"name": "board", "space": "shop"},
            spec={
                "address": "board",
                "type": "subscription",
                "plan": "standard-small-subscription",
                "topic": "news",
            },
        ),
        timeout=5,
    )


def durable(topic: str, *, shared: bool = False) -> Terminus:
    capabilities = ("shared",) if shared else ()
    return Terminus(address=topic, durable=2, expiry_policy="never", capabilities=capabilities)


def subscribe(port: int, *, container: str, link: str, shared: bool = False) -> None:
    """Creates the durable subscription and leaves it: it keeps what is published meanwhile."""
    with Client("127.0.0.1", port, container_id=container) as client:
        client.receiver("news", name=link, source=durable("news", shared=shared)).detach()


def receive_all(receiver: Receiver, count: int) -> list[str]:
    got = []
    for _ in range(count):
        delivery = receiver.receive(timeout=10)
        got.append(str(codec.read_body(delivery.payload)))
        receiver.accept(delivery)
    with pytest.raises(TimeoutError):
        receiver.receive(timeout=0.3)  # and nothing more
    return got


async def test_durable_subscriptions_follow_their_topic_off_a_removed_broker(
    config_server: InProcessConfig,
    config_stub: config_pb2_grpc.ConfigServiceStub,
    tmp_path: Path,
) -> None:
    config = config_stub
    output = GitOpsOutput(tmp_path / "gitops")
    runtime = RenderedBrokers(output=output, workdir=tmp_path / "brokers")
    controller = StorageController(
        config_target=config_server.target,
        output=output,
        directory=None,
        resync_interval=0.2,
    )
    controller.start()
    busy: Client | None = None
    try:
        await declare(config)

        async def rendered(*ids: str) -> bool:
            return sorted(output.read_space("shop")) == sorted(ids)

        async def ready(name: str, broker: str) -> bool:
            return await placed(config, name) == ready_on(broker)

        await eventually(lambda: rendered("shop-news-0"), "the topic's own broker rendered")
        await runtime.sync()
        old = runtime.running["shop-news-0"]
        await eventually(lambda: ready("news", "shop-news-0"), "news ready on its broker")
        await eventually(lambda: ready("board", "shop-news-0"), "board ready with its topic")

        # three durable subscriptions on the old broker, then the news is published
        subscribe(old.amqp_port, container="app", link="news-sub")
        subscribe(old.amqp_port, container="x", link="board", shared=True)
        busy = Client("127.0.0.1", old.amqp_port, container_id="busy")
        held = busy.receiver("news", name="reader", source=durable("news"), credit=HELD)
        with Client("127.0.0.1", old.amqp_port) as publisher:
            sender = publisher.sender("news")
            for text in TEXTS:
                delivery = sender.send(codec.encode_message(text, durable=True))
                assert delivery.outcome == Outcome.ACCEPTED
        unsettled = [held.receive(timeout=10) for _ in range(HELD)]
        assert [codec.read_body(d.payload) for d in unsettled] == TEXTS[:HELD]

        # the topic becomes pooled: its broker has to hand everything over, then go
        news = await config.GetAddress(config_pb2.ObjectRef(space="shop", name="news"), timeout=5)
        news.spec.plan = "standard-small-topic"
        await config.UpdateAddress(news, timeout=5)
        await eventually(lambda: rendered("shop-news-0", "shop-broker-0"), "the pooled broker")
        await runtime.sync()

        async def draining() -> bool:
            listed = await asyncio.to_thread(old.addresses)
            return listed["news::busy|reader"].draining

        # the drain has the subscriptions; the busy reader's unsettled deliveries hold it
        await eventually(draining, "the drain owns the busy reader's subscription")
        assert await rendered("shop-news-0", "shop-broker-0")  # not removed while they are out
        await asyncio.to_thread(busy.close)  # gone without settling: its deliveries go back
        busy = None

        await eventually(lambda: rendered("shop-broker-0"), "the topic's old broker removed")
        await runtime.sync()
        assert "shop-news-0" not in runtime.running
        await eventually(lambda: ready("news", "shop-broker-0"), "news ready on the pooled one")
        await eventually(lambda: ready("board", "shop-broker-0"), "board moved with its topic")

        new = runtime.running["shop-broker-0"]
        listed = new.addresses()
        assert listed["news"].kind == "topic"
        for name in ("news::app|news-sub", "news::board", "news::busy|reader"):
            assert listed[name].durable, name
        with Client("127.0.0.1", new.amqp_port, container_id="app") as client:
            sub = client.receiver("news", name="news-sub", source=durable("news"), credit=50)
            assert receive_all(sub, len(TEXTS)) == TEXTS
        with Client("127.0.0.1", new.amqp_port, container_id="y") as client:
            board = client.receiver(
                "news", name="board", source=durable("news", shared=True), credit=50
            )
            assert receive_all(board, len(TEXTS)) == TEXTS
        with Client("127.0.0.1", new.amqp_port, container_id="busy") as client:
            again = client.receiver("news", name="reader", source=durable("news"), credit=50)
            assert receive_all(again, len(TEXTS)) == TEXTS  # the held ones too, in their place
    finally:
        if busy is not None:
            await asyncio.to_thread(busy.close)
        await controller.stop()
        await asyncio.to_thread(runtime.stop_all)
