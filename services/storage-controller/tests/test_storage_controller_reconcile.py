"""The controller end to end: a real config service over etcd, real broker processes.

The test plays the local runtime itself: it starts an `enmasse-broker` process for every broker
the controller renders (on the ports the manifest names) and stops the ones whose files vanish,
which is what `enmasse up` does with the same files.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from enmasse.amqp import codec
from enmasse.amqp.client import Client
from enmasse.amqp.engine import Outcome
from enmasse.resources.rendered_brokers import GitOpsOutput
from enmasse.storage_controller.controller import StorageController
from enmasse.v1 import config_pb2, config_pb2_grpc, resources_pb2

from tests.fixtures.config_service import InProcessConfig
from tests.fixtures.rendered_brokers import RenderedBrokers, eventually, placed, ready_on

pytestmark = pytest.mark.slow


def queue(name: str, plan: str = "standard-small-queue") -> resources_pb2.Address:
    return resources_pb2.Address(
        metadata={"name": name, "space": "shop"},
        spec={"address": name, "type": "queue", "plan": plan},
    )


async def test_addresses_become_brokers_queues_and_statuses(
    config_server: InProcessConfig,
    config_stub: config_pb2_grpc.ConfigServiceStub,
    tmp_path: Path,
) -> None:
    config = config_stub
    output = GitOpsOutput(tmp_path / "gitops")
    runtime = RenderedBrokers(output=output, workdir=tmp_path / "brokers")

    def start_controller() -> StorageController:
        controller = StorageController(
            config_target=config_server.target,
            output=output,
            directory=None,
            resync_interval=0.2,
        )
        controller.start()
        return controller

    space_dir = output.space_dir("shop")
    controller = start_controller()
    try:
        await config.CreateAddressSpace(
            resources_pb2.AddressSpace(
                metadata={"name": "shop"}, spec={"type": "standard", "plan": "standard-small"}
            ),
            timeout=5,
        )
        for name in ("q1", "q2", "q3"):
            await config.CreateAddress(queue(name), timeout=5)

        # three pooled queues: one broker rendered, waiting for it to run
        async def rendered(*ids: str) -> bool:
            return sorted(output.read_space("shop")) == sorted(ids)

        await eventually(lambda: rendered("shop-broker-0"), "one pooled broker rendered")
        waiting = (
            "Configuring",
            ["placed on broker shop-broker-0", "waiting for broker: shop-broker-0"],
            [("shop-broker-0", "Active")],
        )

        async def q1_waiting() -> bool:
            # The file is written before the status: wait for the status, not for luck.
            return await placed(config, "q1") == waiting

        await eventually(q1_waiting, "q1's status says it waits for its broker")
        await runtime.sync()
        pooled = runtime.running["shop-broker-0"]

        async def all_ready(names: tuple[str, ...], broker: str) -> bool:
            return all([await placed(config, n) == ready_on(broker) for n in names])

        await eventually(lambda: all_ready(("q1", "q2", "q3"), "shop-broker-0"), "queues ready")
        held = pooled.addresses()
        assert set(held) >= {"q1", "q2", "q3", "DLQ"}  # DLQ: the space's, its queues' plan names it
        assert held["q2"].kind == "queue"
        assert held["q2"].plan.persistent
        assert held["q2"].plan.max_delivery_attempts == 10
        assert held["q2"].plan.dead_letter_address == "DLQ"

        # messages wait in q2 on the pooled broker
        with Client("127.0.0.1", pooled.amqp_port) as client:
            sender = client.sender("q2")
            for i in range(5):
                delivery = sender.send(codec.encode_message(f"m{i}", durable=True))
                assert delivery.outcome == Outcome.ACCEPTED

        # a dedicated queue: a second broker of its own
        await config.CreateAddress(queue("big", "standard-large-queue"), timeout=5)
        await eventually(lambda: rendered("shop-broker-0", "shop-big-0"), "dedicated broker")
        await runtime.sync()
        await eventually(lambda: all_ready(("big",), "shop-big-0"), "dedicated queue ready")
        assert "big" in runtime.running["shop-big-0"].addresses()
        assert "big" not in pooled.addresses()

        # q2's plan becomes dedicated: a broker of its own, and its messages follow it
        current = await config.GetAddress(config_pb2.ObjectRef(space="shop", name="q2"), timeout=5)
        current.spec.plan = "standard-large-queue"
        await config.UpdateAddress(current, timeout=5)
        await eventually(lambda: rendered("shop-broker-0", "shop-big-0", "shop-q2-0"), "q2 broker")
        # ... but the broker holding its messages crashes first: the move must wait for it
        await asyncio.to_thread(pooled.kill)
        await runtime.sync()
        leaving = (
            "Configuring",
            [
                "placed on broker shop-q2-0",
                "broker ready: shop-q2-0",
                "draining from broker: shop-broker-0",
            ],
            [("shop-q2-0", "Active"), ("shop-broker-0", "Draining")],
        )

        async def q2_is(expected: tuple[str, list[str], list[tuple[str, str]]]) -> bool:
            return await placed(config, "q2") == expected

        await eventually(lambda: q2_is(leaving), "q2 on its new broker, still draining")
        passes = controller.passes
        await eventually(lambda: _after_passes(controller, passes + 3), "three more passes")
        assert await placed(config, "q2") == leaving  # never drained while its broker is down
        await asyncio.to_thread(pooled.start)  # same ports, same journal
        await eventually(lambda: all_ready(("q2",), "shop-q2-0"), "q2 moved and drained")
        assert "q2" not in pooled.addresses()
        moved = runtime.running["shop-q2-0"]
        with Client("127.0.0.1", moved.amqp_port) as client:
            receiver = client.receiver("q2", credit=10)
            bodies = []
            for _ in range(5):
                delivery = receiver.receive(timeout=10)
                bodies.append(codec.read_body(delivery.payload))
                receiver.accept(delivery)
        assert sorted(bodies) == ["m0", "m1", "m2", "m3", "m4"]

        # deleting the dedicated queue's address removes its broker (nothing to hand over)
        await config.DeleteAddress(
            config_pb2.DeleteRequest(ref=config_pb2.ObjectRef(space="shop", name="big")), timeout=5
        )
        await eventually(lambda: rendered("shop-broker-0", "shop-q2-0"), "dedicated broker gone")
        await runtime.sync()
        assert await all_ready(("q1", "q3"), "shop-broker-0")

        # deleting a pooled address deletes its queue (and messages) on the broker
        await config.DeleteAddress(
            config_pb2.DeleteRequest(ref=config_pb2.ObjectRef(space="shop", name="q3")), timeout=5
        )

        async def q3_deleted() -> bool:
            return "q3" not in await asyncio.to_thread(pooled.addresses)

        await eventually(q3_deleted, "q3 deleted on the pooled broker")
        assert "q1" in pooled.addresses()

        # a restarted controller rebuilds its placement and changes nothing
        files = {p.name: p.read_bytes() for p in space_dir.iterdir()}
        versions = {
            n: (
                await config.GetAddress(config_pb2.ObjectRef(space="shop", name=n), timeout=5)
            ).metadata.resource_version
            for n in ("q1", "q2")
        }
        await controller.stop()
        controller = start_controller()
        await eventually(lambda: _after_passes(controller, 1), "a pass of the restarted controller")
        assert {p.name: p.read_bytes() for p in space_dir.iterdir()} == files
        for name, version in versions.items():
            found = await config.GetAddress(
                config_pb2.ObjectRef(space="shop", name=name), timeout=5
            )
            assert found.metadata.resource_version == version, f"{name} status rewritten"

        # deleting the space removes all its brokers
        await config.DeleteAddressSpace(
            config_pb2.DeleteRequest(ref=config_pb2.ObjectRef(name="shop")), timeout=5
        )

        async def no_space() -> bool:
            return output.spaces() == []

        await eventually(no_space, "the space's broker files removed")
    finally:
        await controller.stop()
        await asyncio.to_thread(runtime.stop_all)


async def _after_passes(controller: StorageController, count: int) -> bool:
    return controller.passes >= count
