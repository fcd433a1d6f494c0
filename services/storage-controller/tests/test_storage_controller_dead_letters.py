"""No silent drops, end to end: a real config service over etcd, the real controller, real broker
processes, real AMQP clients; nothing dead-letter related is declared by hand.

- A brokered space: its first queue brings the space's `DLQ` (the config service creates it); a
  poison message (modified with delivery-failed until the plan's attempts run out) ends there,
  readable by a consumer, and the queue's status counts it. A message rejected in the DLQ itself
  has nowhere to go: it is held there (never delivered again) and the DLQ's status says so.
- A standard space: the `DLQ` is placed on every broker that holds a queue whose plan names it,
  so a queue with a broker of its own dead-letters on that broker; when that queue is deleted,
  the dead letters waiting there move to the DLQ's own broker before its broker goes.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from enmasse.amqp import codec, sasl
from enmasse.amqp.client import Client
from enmasse.amqp.engine import Outcome
from enmasse.resources.discovery import LocalDirectory
from enmasse.resources.rendered_brokers import GitOpsOutput
from enmasse.storage_controller.controller import StorageController
from enmasse.v1 import config_pb2, config_pb2_grpc, resources_pb2

from tests.fixtures.broker import BrokerProcess
from tests.fixtures.config_service import InProcessConfig
from tests.fixtures.rendered_brokers import RenderedBrokers, eventually, placed

pytestmark = pytest.mark.slow
PASSWORD = "wonderland"
ATTEMPTS = 10  # maxDeliveryAttempts of the default queue plans


def address(space: str, name: str, plan: str) -> resources_pb2.Address:
    return resources_pb2.Address(
        metadata={"name": name, "space": space},
        spec={"address": name, "type": "queue", "plan": plan},
    )


async def dead_letters(
    config: config_pb2_grpc.ConfigServiceStub, space: str, name: str
) -> tuple[int, int]:
    found = await config.GetAddress(config_pb2.ObjectRef(space=space, name=name), timeout=5)
    return found.status.dead_lettered, found.status.dead_letters_held


async def listed(config: config_pb2_grpc.ConfigServiceStub, space: str) -> list[tuple[str, ...]]:
    answer = await config.ListAddresses(config_pb2.ListRequest(space=space), timeout=5)
    return [
        (a.metadata.name, a.spec.address, a.spec.type, a.spec.plan, a.metadata.managed_by)
        for a in answer.items
    ]


def _poison(client: Client, queue: str, *, attempts: int) -> list[int]:
    """Sends one durable message and fails it `attempts` times; the delivery-counts seen."""
    client.sender(queue).send(codec.encode_message("poison", durable=True))
    worker = client.receiver(queue, credit=0)
    counts = []
    for _ in range(attempts):
        worker.flow(1)
        delivery = worker.receive()
        counts.append(codec.read_header(delivery.payload).delivery_count)
        worker.settle(delivery, Outcome.MODIFIED, delivery_failed=True)
    worker.close()
    return counts


def _read_one(client: Client, queue: str) -> tuple[str, int]:
    """Takes exactly one message (credit for one, no prefetch refill), accepted."""
    receiver = client.receiver(queue, credit=0)
    receiver.flow(1)
    delivery = receiver.receive()
    receiver.accept(delivery)
    receiver.close()
    return str(codec.read_body(delivery.payload)), codec.read_header(
        delivery.payload
    ).delivery_count


async def test_a_poison_message_ends_in_the_brokered_spaces_dlq_and_its_count_in_the_status(
    config_server: InProcessConfig,
    config_stub: config_pb2_grpc.ConfigServiceStub,
    tmp_path: Path,
) -> None:
    config = config_stub
    output = GitOpsOutput(tmp_path / "gitops")
    var_dir = tmp_path / "var"
    controller = StorageController(
        config_target=config_server.target,
        output=output,
        directory=LocalDirectory(var_dir),
        resync_interval=0.2,
        access_check_interval=0.2,
        figures_interval=0.2,
    )
    broker: BrokerProcess | None = None
    controller.start()
    try:
        await config.CreateAddressSpace(
            resources_pb2.AddressSpace(
                metadata={"name": "jms"}, spec={"type": "brokered", "plan": "brokered-single"}
            ),
            timeout=5,
        )
        await config.CreateAddress(address("jms", "invoices", "brokered-queue"), timeout=5)
        await config.CreateMessagingUser(
            resources_pb2.MessagingUser(
                metadata={"name": "app", "space": "jms"},
                spec={
                    "username": "app",
                    "password": PASSWORD,
                    "authorization": [{"addresses": ["#"], "operations": ["send", "recv"]}],
                },
            ),
            timeout=5,
        )
        assert await listed(config, "jms") == [
            ("dlq", "DLQ", "queue", "brokered-queue", "enmasse-space"),
            ("invoices", "invoices", "queue", "brokered-queue", ""),
        ]

        async def one_broker() -> bool:
            return len(output.read_space("jms")) == 1

        await eventually(one_broker, "the space's broker rendered")
        (broker_id,) = output.read_space("jms")
        broker = BrokerProcess(
            workdir=var_dir / "brokers" / "jms" / broker_id, args=["--client-auth=required"]
        )
        await asyncio.to_thread(broker.start)

        async def active() -> bool:
            phases = [(await placed(config, n, space="jms"))[0] for n in ("dlq", "invoices")]
            space = await config.GetAddressSpace(config_pb2.ObjectRef(name="jms"), timeout=5)
            return phases == ["Active", "Active"] and space.status.status.phase == "Active"

        await eventually(active, "the space, its queue and its DLQ Active")
        assert broker is not None
        with Client(
            "127.0.0.1",
            broker.amqp_port,
            timeout=10,
            user="app",
            password=PASSWORD,
            mechanisms=sasl.CLIENT_MECHANISMS,
        ) as client:
            counts = await asyncio.to_thread(_poison, client, "invoices", attempts=ATTEMPTS)
            assert counts == list(range(ATTEMPTS))
            assert await asyncio.to_thread(_read_one, client, "DLQ") == ("poison", ATTEMPTS)

            async def counted() -> bool:
                return await dead_letters(config, "jms", "invoices") == (1, 0)

            await eventually(counted, "the queue's status counting its dead letter")

            # Rejected in the DLQ itself (whose plan names the DLQ): nowhere to go, held.
            def reject_in_dlq() -> None:
                client.sender("DLQ").send(codec.encode_message("unreadable"))
                reader = client.receiver("DLQ", credit=1)
                reader.settle(reader.receive(), Outcome.REJECTED)
                reader.close()

            await asyncio.to_thread(reject_in_dlq)

            async def held() -> bool:
                return await dead_letters(config, "jms", "dlq") == (1, 1)

            await eventually(held, "the DLQ's status reporting the dead letter it holds")
            reader = client.receiver("DLQ", credit=1)
            with pytest.raises(TimeoutError):  # a held dead letter is never delivered again
                await asyncio.to_thread(reader.receive, 1.0)
        listing = await asyncio.to_thread(broker.addresses)
        assert (listing["DLQ"].depth, listing["DLQ"].dead_letters_held) == (0, 1)
    finally:
        await controller.stop()
        if broker is not None:
            await asyncio.to_thread(broker.stop)


async def test_a_queue_with_a_broker_of_its_own_dead_letters_there_and_nothing_is_lost_moving(
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
        figures_interval=0.2,
    )
    controller.start()
    try:
        await config.CreateAddressSpace(
            resources_pb2.AddressSpace(
                metadata={"name": "shop"}, spec={"type": "standard", "plan": "standard-small"}
            ),
            timeout=5,
        )
        await config.CreateAddress(address("shop", "big", "standard-large-queue"), timeout=5)

        async def placements() -> bool:
            return (await placed(config, "dlq"))[2] == [
                ("shop-broker-0", "Active"),
                ("shop-big-0", "Active"),
            ]

        await eventually(placements, "the DLQ on its own broker and on big's")
        await runtime.sync()

        async def ready() -> bool:
            messages = [(await placed(config, n))[1] for n in ("dlq", "big")]
            return all(m and m[-1].startswith("broker ready") for m in messages)

        await eventually(ready, "big and the DLQ held by their brokers")
        own = runtime.running["shop-big-0"]
        with Client("127.0.0.1", own.amqp_port, timeout=10) as client:
            for _ in range(2):
                counts = await asyncio.to_thread(_poison, client, "big", attempts=ATTEMPTS)
                assert counts == list(range(ATTEMPTS))
            # on big's own broker: a consumer of the DLQ there reads one
            assert await asyncio.to_thread(_read_one, client, "DLQ") == ("poison", ATTEMPTS)

        async def counted() -> bool:
            return await dead_letters(config, "shop", "big") == (2, 0)

        await eventually(counted, "big's status counting its dead letters")

        # big goes, its broker with it: the dead letter still waiting there moves first
        await config.DeleteAddress(
            config_pb2.DeleteRequest(ref=config_pb2.ObjectRef(space="shop", name="big")), timeout=5
        )

        async def big_broker_gone() -> bool:
            return sorted(output.read_space("shop")) == ["shop-broker-0"]

        await eventually(big_broker_gone, "big's broker drained and removed")
        await runtime.sync()
        pooled = runtime.running["shop-broker-0"]
        with Client("127.0.0.1", pooled.amqp_port, timeout=10) as client:
            assert await asyncio.to_thread(_read_one, client, "DLQ") == ("poison", ATTEMPTS)
    finally:
        await controller.stop()
        await asyncio.to_thread(runtime.stop_all)
