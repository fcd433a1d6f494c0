"""The router-agent against real parts: the config service over etcd, router processes in a mesh.

A space with two routers: the agent pushes their configuration, addresses become Active only once
both routers run it, a message crosses the mesh, a restarted router gets its configuration again,
and the RouterAgent API reports the topology and the summed per-address counters.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from enmasse.amqp import codec
from enmasse.amqp.client import Client
from enmasse.common.serving import start_server
from enmasse.resources.discovery import LocalDirectory, write_ports
from enmasse.router_agent.agent import RouterAgent
from enmasse.router_agent.servicer import SERVICE_NAME, RouterAgentServicer
from enmasse.v1 import (
    config_pb2,
    config_pb2_grpc,
    resources_pb2,
    router_agent_pb2,
    router_agent_pb2_grpc,
    router_pb2,
)

from tests.fixtures.router import RouterFleet, RouterProcess

pytestmark = pytest.mark.timeout(120)
Ref = config_pb2.ObjectRef


def publish(var: Path, space: str, router: RouterProcess) -> None:
    """What the runtime's router does: its ports under <var>/routers/<space>/<id>/."""
    write_ports(
        var / "routers" / space / router.router_id / "ports.json",
        {
            "amqp": router.amqp_port,
            "inter_router": router.inter_router_port,
            "admin": router.admin_port,
        },
    )


def agent_over(config_target: str, var: Path, **options: Any) -> RouterAgent:
    return RouterAgent(
        config_target=config_target,
        directory=LocalDirectory(var),
        **options,
    )


async def eventually(check: Callable[[], Any], *, what: str, limit: float = 20.0) -> Any:
    """Polls an async check until it returns something truthy; fails naming `what`."""
    deadline = time.monotonic() + limit
    last: Any = None
    while time.monotonic() < deadline:
        last = await check()
        if last:
            return last
        await asyncio.sleep(0.1)
    raise AssertionError(f"{what}: not reached in {limit} s (last: {last})")


@pytest.fixture
async def agent_setup(
    config_server: Any,
    config_stub: config_pb2_grpc.ConfigServiceStub,
    routers: RouterFleet,
    tmp_path: Path,
) -> AsyncIterator[dict[str, Any]]:
    for router_id in ("r0", "r1"):
        routers.start(router_id)
    for router in routers.routers.values():
        publish(tmp_path, "shop", router)
    write_ports(tmp_path / "brokers/shop/broker-0/ports.json", {"amqp": 5999, "admin": 5998})
    agent = agent_over(config_server.target, tmp_path, tick=0.1, probe_every=0.3)
    agent.start()
    running = await start_server(
        registrations=[
            (
                router_agent_pb2_grpc.add_RouterAgentServicer_to_server,
                RouterAgentServicer(agent),
                SERVICE_NAME,
            )
        ]
    )
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{running.port}")
    await config_stub.CreateAddressSpace(
        resources_pb2.AddressSpace(
            metadata=resources_pb2.Metadata(name="shop"),
            spec=resources_pb2.AddressSpaceSpec(type="standard", plan="standard-small"),
        )
    )
    try:
        yield {
            "agent": agent,
            "api": router_agent_pb2_grpc.RouterAgentStub(channel),
        }
    finally:
        await channel.close()
        await running.stop(grace=0.2)
        await agent.stop()


def new_address(name: str, kind: str, plan: str) -> resources_pb2.Address:
    return resources_pb2.Address(
        metadata=resources_pb2.Metadata(name=name, space="shop"),
        spec=resources_pb2.AddressSpec(address=name, type=kind, plan=plan),
    )


async def phase_of(stub: config_pb2_grpc.ConfigServiceStub, name: str) -> tuple[str, list[str]]:
    got = await stub.GetAddress(Ref(space="shop", name=name))
    return got.status.status.phase, list(got.status.status.messages)


async def test_anycast_address_becomes_active_and_carries_a_message_across_the_mesh(
    agent_setup: dict[str, Any],
    config_stub: config_pb2_grpc.ConfigServiceStub,
    routers: RouterFleet,
) -> None:
    await config_stub.CreateAddress(new_address("calls", "anycast", "standard-anycast"))

    async def active() -> bool:
        return (await phase_of(config_stub, "calls"))[0] == "Active"

    await eventually(active, what="calls Active")
    r0, r1 = routers.routers["r0"], routers.routers["r1"]
    for router in (r0, r1):
        running = router.admin().GetConfig(router_pb2.GetConfigRequest(), timeout=5)
        assert [a.address for a in running.addresses] == ["calls"]
        assert [p.router_id for p in running.peers] == [
            o for o in ("r0", "r1") if o != router.router_id
        ]
    routers.wait_for_mesh()

    consumer = Client("127.0.0.1", r1.amqp_port)
    producer = Client("127.0.0.1", r0.amqp_port)
    try:
        receiver = consumer.receiver("calls")
        sender = producer.sender("calls")
        outcome = sender.send_async(codec.encode_message(body="hello over the mesh"))
        delivery = await asyncio.to_thread(receiver.receive, 15)
        assert codec.read_body(delivery.payload) == "hello over the mesh"
        receiver.accept(delivery)
        settled = await asyncio.to_thread(outcome.result, 15)
        assert settled.outcome.name == "ACCEPTED"

        stats = await agent_setup["api"].GetAddressStats(
            router_agent_pb2.AddressStatsRequest(space="shop", address="calls"), timeout=5
        )
        (calls,) = stats.addresses
        assert (calls.address, calls.consumers, calls.producers) == ("calls", 1, 1)
        assert calls.accepted >= 1
        assert list(stats.routers) == ["r0", "r1"]
        assert list(stats.unreachable) == []

        # deleting the address stops its traffic, with a clear error to the attached clients
        await config_stub.DeleteAddress(
            config_pb2.DeleteRequest(ref=Ref(space="shop", name="calls"))
        )
        for link in (receiver, sender):
            condition = await asyncio.to_thread(link.detached.result, 15)
            assert condition is not None
            assert (condition.name, condition.description) == (
                "amqp:not-found",
                "address 'calls' was deleted from space 'shop'",
            )
    finally:
        producer.close()
        consumer.close()

    space = await config_stub.GetAddressSpace(Ref(name="shop"))
    assert space.status.status.phase == "Active"
    # converged means quiet: passes go on (probes), but nothing is written again
    agent: RouterAgent = agent_setup["agent"]
    writes, passes = agent.status_writes, agent.passes
    await asyncio.sleep(1.0)
    assert agent.passes > passes
    assert agent.status_writes == writes
    unchanged = await config_stub.GetAddressSpace(Ref(name="shop"))
    assert unchanged.metadata.resource_version == space.metadata.resource_version
    assert sorted((e.name, e.port) for e in space.status.endpoints) == sorted(
        [("amqp", r0.amqp_port), ("amqp", r1.amqp_port)]
    )


async def test_queue_waits_for_placement_then_becomes_active(
    agent_setup: dict[str, Any],
    config_stub: config_pb2_grpc.ConfigServiceStub,
    routers: RouterFleet,
) -> None:
    await config_stub.CreateAddress(new_address("orders", "queue", "standard-small-queue"))

    async def waiting() -> bool:
        return await phase_of(config_stub, "orders") == (
            "Configuring",
            ["waiting for a broker placement"],
        )

    await eventually(waiting, what="orders Configuring for want of a placement")
    for router in routers.routers.values():
        running = router.admin().GetConfig(router_pb2.GetConfigRequest(), timeout=5)
        assert "orders" not in [a.address for a in running.addresses]

    # what the storage-controller does: it writes the placement into the status
    current = await config_stub.GetAddress(Ref(space="shop", name="orders"))
    status = resources_pb2.AddressStatus()
    status.CopyFrom(current.status)
    status.brokers.add(broker="broker-0", state="Active")
    await config_stub.UpdateAddressStatus(
        config_pb2.UpdateAddressStatusRequest(ref=Ref(space="shop", name="orders"), status=status)
    )

    async def active() -> bool:
        return (await phase_of(config_stub, "orders"))[0] == "Active"

    await eventually(active, what="orders Active")
    placed = await config_stub.GetAddress(Ref(space="shop", name="orders"))
    assert [(b.broker, b.state) for b in placed.status.brokers] == [("broker-0", "Active")]
    for router in routers.routers.values():
        running = router.admin().GetConfig(router_pb2.GetConfigRequest(), timeout=5)
        (orders,) = [a for a in running.addresses if a.address == "orders"]
        assert [(b.name, b.port, b.state) for b in orders.brokers] == [("broker-0", 5999, "Active")]


async def test_a_restarted_router_gets_its_configuration_again(
    agent_setup: dict[str, Any],
    config_stub: config_pb2_grpc.ConfigServiceStub,
    routers: RouterFleet,
) -> None:
    await config_stub.CreateAddress(new_address("calls", "anycast", "standard-anycast"))

    async def active() -> bool:
        return (await phase_of(config_stub, "calls"))[0] == "Active"

    await eventually(active, what="calls Active")
    topology = await agent_setup["api"].GetTopology(router_agent_pb2.TopologyRequest(space="shop"))
    (shop,) = topology.spaces
    generation = shop.generation
    assert [(r.router_id, r.applied_generation) for r in shop.routers] == [
        ("r0", generation),
        ("r1", generation),
    ]

    # same admin port after a crash: only the probe can tell
    r1 = routers.routers["r1"]
    r1.kill()
    routers.start(
        "r1",
        amqp_port=r1.amqp_port,
        inter_router_port=r1.inter_router_port,
        extra_args=("--admin-port", str(r1.admin_port)),
    )
    restarted = routers.routers["r1"]

    async def reconfigured() -> bool:
        stats = await asyncio.to_thread(restarted.stats)
        return stats.generation == generation

    await eventually(reconfigured, what="restarted r1 runs the space's generation")
    running = restarted.admin().GetConfig(router_pb2.GetConfigRequest(), timeout=5)
    assert [a.address for a in running.addresses] == ["calls"]


async def test_the_agent_api_refuses_bad_requests_precisely(tmp_path: Path) -> None:
    # never started: the API answers from what it knows
    agent = agent_over("127.0.0.1:1", tmp_path)
    running = await start_server(
        registrations=[
            (
                router_agent_pb2_grpc.add_RouterAgentServicer_to_server,
                RouterAgentServicer(agent),
                SERVICE_NAME,
            )
        ]
    )
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as channel:
            api = router_agent_pb2_grpc.RouterAgentStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as empty:
                await api.GetAddressStats(router_agent_pb2.AddressStatsRequest(), timeout=5)
            assert empty.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert empty.value.details() == "space: must not be empty"
            with pytest.raises(grpc.aio.AioRpcError) as unknown:
                await api.GetTopology(router_agent_pb2.TopologyRequest(space="nowhere"), timeout=5)
            assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
            assert unknown.value.details() == "address space 'nowhere' not found"
            everything = await api.GetTopology(router_agent_pb2.TopologyRequest(), timeout=5)
            assert list(everything.spaces) == []
    finally:
        await running.stop(grace=0.2)


async def test_two_spaces_are_isolated_and_deleting_one_leaves_the_other_untouched(
    config_server: Any,
    config_stub: config_pb2_grpc.ConfigServiceStub,
    routers: RouterFleet,
    tmp_path: Path,
) -> None:
    shop, lab = routers.start("shop-r0"), routers.start("lab-r0")
    publish(tmp_path, "shop", shop)
    publish(tmp_path, "lab", lab)
    agent = agent_over(config_server.target, tmp_path, tick=0.1)
    agent.start()
    try:
        for space, kind in (("shop", "anycast"), ("lab", "multicast")):
            await config_stub.CreateAddressSpace(
                resources_pb2.AddressSpace(
                    metadata=resources_pb2.Metadata(name=space),
                    spec=resources_pb2.AddressSpaceSpec(type="standard", plan="standard-small"),
                )
            )
            # the same address name in both spaces, of different types
            await config_stub.CreateAddress(
                resources_pb2.Address(
                    metadata=resources_pb2.Metadata(name="events", space=space),
                    spec=resources_pb2.AddressSpec(
                        address="events", type=kind, plan=f"standard-{kind}"
                    ),
                )
            )

        async def both_active() -> bool:
            got = [
                await config_stub.GetAddress(Ref(space=space, name="events"))
                for space in ("shop", "lab")
            ]
            return all(a.status.status.phase == "Active" for a in got)

        await eventually(both_active, what="events Active in both spaces")
        configs = {
            r.router_id: r.admin().GetConfig(router_pb2.GetConfigRequest(), timeout=5)
            for r in (shop, lab)
        }
        assert [
            (c.space, [(a.address, a.type) for a in c.addresses], list(c.peers))
            for c in configs.values()
        ] == [
            ("shop", [("events", "anycast")], []),
            ("lab", [("events", "multicast")], []),
        ]

        await config_stub.DeleteAddressSpace(config_pb2.DeleteRequest(ref=Ref(name="lab")))
        await eventually(
            lambda: _forgotten(agent, "lab"), what="the agent forgets the deleted space"
        )
        after = shop.admin().GetConfig(router_pb2.GetConfigRequest(), timeout=5)
        assert after == configs["shop-r0"]  # same generation, same routes: untouched
        still = await config_stub.GetAddress(Ref(space="shop", name="events"))
        assert still.status.status.phase == "Active"
    finally:
        await agent.stop()


async def _forgotten(agent: RouterAgent, space: str) -> bool:
    return space not in agent.spaces
