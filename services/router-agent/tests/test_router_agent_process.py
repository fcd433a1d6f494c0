"""`enmasse-router-agent` as a real process: SIGKILLed in the middle of a change, it converges;
a router SIGKILLed under it takes its space's addresses out of Active until it is back.

The agent runs as its console script against the config service and a router process. It is
killed (SIGKILL) right after a burst of new addresses, more addresses are created and one deleted
while it is down, and a new agent process then brings every router and every address to where
the store says: every address Active, none stuck in Configuring, the deleted one gone from the
router, and the router's generation moved forward (never refused as stale).

The other way round, the router is SIGKILLed: every address of its space (anycast, multicast,
and a queue the storage-controller placed) leaves Active in the store, naming the router, and
turns Active again once the router runs on the same ports and has its configuration. How long
the store took to say so is printed (`-s`), never asserted beyond a generous bound.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from enmasse.resources.discovery import write_ports
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
CONSOLE_SCRIPT = Path(sys.executable).parent / "enmasse-router-agent"
Ref = config_pb2.ObjectRef


class AgentProcess:
    def __init__(self, *, config: str, var: Path, tick: float = 0.2) -> None:
        self.config = config
        self.var = var
        self.tick = tick
        self.process: subprocess.Popen[bytes] | None = None
        self.port = 0

    def start(self, *, limit: float = 20.0) -> None:
        port_file = self.var / "router-agent.port"
        port_file.unlink(missing_ok=True)
        command = [
            str(CONSOLE_SCRIPT),
            f"--config={self.config}",
            f"--var={self.var}",
            f"--port-file={port_file}",
            f"--tick={self.tick}",
        ]
        with open(self.var / "router-agent.log", "ab") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + limit
        while not port_file.exists():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"router-agent did not start; see {self.var}/router-agent.log")
            time.sleep(0.05)
        self.port = int(port_file.read_text())

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait(10)


@pytest.fixture
def agent_process() -> Iterator[list[AgentProcess]]:
    started: list[AgentProcess] = []
    try:
        yield started
    finally:
        for agent in started:
            agent.kill()


def anycast(name: str) -> resources_pb2.Address:
    return resources_pb2.Address(
        metadata=resources_pb2.Metadata(name=name, space="shop"),
        spec=resources_pb2.AddressSpec(address=name, type="anycast", plan="standard-anycast"),
    )


async def create_shop(stub: config_pb2_grpc.ConfigServiceStub) -> None:
    """The space `shop`, of standard-small without `mqtt`: these tests follow their own
    addresses to Active with no storage-controller, so the space must not hold the MQTT store
    queues a plan serving MQTT gives it (nobody here would place them)."""
    plan = await stub.GetAddressSpacePlan(Ref(name="standard-small"), timeout=10)
    plan.metadata.Clear()
    plan.metadata.name = "standard-small-no-mqtt"
    plan.spec.mqtt = False
    await stub.CreateAddressSpacePlan(plan, timeout=10)
    await stub.CreateAddressSpace(
        resources_pb2.AddressSpace(
            metadata=resources_pb2.Metadata(name="shop"),
            spec=resources_pb2.AddressSpaceSpec(type="standard", plan="standard-small-no-mqtt"),
        ),
        timeout=10,
    )


async def phases(stub: config_pb2_grpc.ConfigServiceStub) -> dict[str, str]:
    try:
        listed = await stub.ListAddresses(config_pb2.ListRequest(space="shop"), timeout=5)
    except grpc.aio.AioRpcError as error:
        return {"(config service)": error.code().name}  # restarting: ask again
    return {a.metadata.name: a.status.status.phase for a in listed.items}


async def all_active(stub: config_pb2_grpc.ConfigServiceStub, names: set[str]) -> dict[str, str]:
    deadline = time.monotonic() + 30
    while True:
        seen = await phases(stub)
        if set(seen) == names and all(p == "Active" for p in seen.values()):
            return seen
        if time.monotonic() > deadline:
            raise AssertionError(f"not all Active: {seen}")
        await asyncio.sleep(0.1)


async def test_a_killed_agent_converges_after_restart(
    config_server: Any,
    config_stub: config_pb2_grpc.ConfigServiceStub,
    routers: RouterFleet,
    agent_process: list[AgentProcess],
    tmp_path: Path,
) -> None:
    router = routers.start("r0")
    write_ports(
        tmp_path / "routers/shop/r0/ports.json",
        {
            "amqp": router.amqp_port,
            "inter_router": router.inter_router_port,
            "admin": router.admin_port,
        },
    )
    first = AgentProcess(config=config_server.target, var=tmp_path)
    agent_process.append(first)
    first.start()
    await create_shop(config_stub)
    names = {f"a{i:02d}" for i in range(10)}
    for name in sorted(names):
        await config_stub.CreateAddress(anycast(name))
    await all_active(config_stub, names)
    before = router.stats().generation

    burst = {f"b{i:02d}" for i in range(20)}
    for name in sorted(burst):
        await config_stub.CreateAddress(anycast(name))
    first.kill()  # mid-change: some of the burst are pushed, some are not
    late = {f"c{i:02d}" for i in range(5)}
    for name in sorted(late):
        await config_stub.CreateAddress(anycast(name))
    await config_stub.DeleteAddress(config_pb2.DeleteRequest(ref=Ref(space="shop", name="a00")))
    expected = (names | burst | late) - {"a00"}

    second = AgentProcess(config=config_server.target, var=tmp_path)
    agent_process.append(second)
    second.start()
    await all_active(config_stub, expected)
    running = router.admin().GetConfig(router_pb2.GetConfigRequest(), timeout=5)
    assert sorted(a.address for a in running.addresses) == sorted(expected)
    assert running.generation > before

    async with grpc.aio.insecure_channel(f"127.0.0.1:{second.port}") as channel:
        api = router_agent_pb2_grpc.RouterAgentStub(channel)
        topology = await api.GetTopology(router_agent_pb2.TopologyRequest(), timeout=5)
    (shop,) = topology.spaces
    (state,) = shop.routers
    assert (shop.space, shop.addresses) == ("shop", len(expected))
    assert (state.router_id, state.applied_generation, state.reachable, state.error) == (
        "r0",
        running.generation,
        True,
        "",
    )
    assert second.process is not None
    assert second.process.poll() is None  # still serving


async def test_the_agent_rides_out_config_and_etcd_crashes(
    fresh_etcd: Any,
    etcd_prefix: str,
    config_process_factory: Any,
    routers: RouterFleet,
    tmp_path: Path,
) -> None:
    """SIGKILL the config service mid-change, then etcd: the agent (in this process) follows the
    store again after each restart and every address ends Active on the router."""
    from enmasse.resources.discovery import LocalDirectory
    from enmasse.router_agent.agent import RouterAgent

    config = config_process_factory(etcd_endpoint=fresh_etcd.endpoint, prefix=etcd_prefix)
    router = routers.start("r0")
    write_ports(
        tmp_path / "routers/shop/r0/ports.json",
        {
            "amqp": router.amqp_port,
            "inter_router": router.inter_router_port,
            "admin": router.admin_port,
        },
    )
    agent = RouterAgent(
        config_target=config.target,
        directory=LocalDirectory(tmp_path),
        tick=0.1,
    )
    agent.start()
    channel = grpc.aio.insecure_channel(config.target)
    stub = config_pb2_grpc.ConfigServiceStub(channel)
    try:
        await create_shop(stub)
        first = {f"a{i}" for i in range(5)}
        for name in sorted(first):
            await stub.CreateAddress(anycast(name), timeout=10)
        await all_active(stub, first)

        more = {f"b{i}" for i in range(10)}
        for name in sorted(more):
            await stub.CreateAddress(anycast(name), timeout=10)
        config.kill()  # the agent's watch breaks in the middle of the change
        await asyncio.sleep(0.5)
        await asyncio.to_thread(config.start)
        await all_active(stub, first | more)

        fresh_etcd.kill()
        await asyncio.sleep(0.5)
        await asyncio.to_thread(fresh_etcd.start)
        last = {f"c{i}" for i in range(5)}
        for name in sorted(last):
            await created_when_possible(stub, anycast(name))
        await all_active(stub, first | more | last)
        running = router.admin().GetConfig(router_pb2.GetConfigRequest(), timeout=5)
        assert sorted(a.address for a in running.addresses) == sorted(first | more | last)
    finally:
        await channel.close()
        await agent.stop()


async def created_when_possible(
    stub: config_pb2_grpc.ConfigServiceStub, address: resources_pb2.Address
) -> None:
    """CreateAddress, retried (bounded) while the config service finds etcd again."""
    deadline = time.monotonic() + 30
    while True:
        try:
            await stub.CreateAddress(address, timeout=5)
            return
        except grpc.aio.AioRpcError as error:
            if error.code() == grpc.StatusCode.ALREADY_EXISTS:
                return  # an earlier try went through after all
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


def publish_router(var: Path, space: str, router: RouterProcess) -> None:
    write_ports(
        var / "routers" / space / router.router_id / "ports.json",
        {
            "amqp": router.amqp_port,
            "inter_router": router.inter_router_port,
            "admin": router.admin_port,
        },
    )


def closed_port() -> int:
    """A loopback port nobody listens on (the broker a placement names; never started here)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def place_like_the_storage_controller(
    stub: config_pb2_grpc.ConfigServiceStub, name: str, *, broker: str
) -> None:
    """What the storage-controller writes once the broker holds the address."""
    status = resources_pb2.AddressStatus(
        status=resources_pb2.Status(
            phase="Configuring",
            messages=[f"placed on broker {broker}", f"broker ready: {broker}"],
        ),
        brokers=[resources_pb2.BrokerPlacement(broker=broker, state="Active")],
    )
    await stub.UpdateAddressStatus(
        config_pb2.UpdateAddressStatusRequest(ref=Ref(space="shop", name=name), status=status),
        timeout=5,
    )


async def statuses(stub: config_pb2_grpc.ConfigServiceStub) -> dict[str, resources_pb2.Status]:
    listed = await stub.ListAddresses(config_pb2.ListRequest(space="shop"), timeout=5)
    return {a.metadata.name: a.status.status for a in listed.items}


async def test_a_killed_router_takes_its_addresses_out_of_active_until_it_is_back(
    etcd: Any,
    etcd_prefix: str,
    config_process_factory: Any,
    routers: RouterFleet,
    agent_process: list[AgentProcess],
    tmp_path: Path,
) -> None:
    config = config_process_factory(etcd_endpoint=etcd.endpoint, prefix=etcd_prefix)
    router = routers.start("r0")
    publish_router(tmp_path, "shop", router)
    write_ports(tmp_path / "brokers/shop/broker-0/ports.json", {"amqp": closed_port(), "admin": 1})
    agent = AgentProcess(config=config.target, var=tmp_path, tick=0.5)  # the default tick
    agent_process.append(agent)
    agent.start()
    async with grpc.aio.insecure_channel(config.target) as channel:
        stub = config_pb2_grpc.ConfigServiceStub(channel)
        await create_shop(stub)
        await stub.CreateAddress(anycast("calls"), timeout=5)
        await stub.CreateAddress(
            resources_pb2.Address(
                metadata=resources_pb2.Metadata(name="news", space="shop"),
                spec=resources_pb2.AddressSpec(
                    address="news", type="multicast", plan="standard-multicast"
                ),
            ),
            timeout=5,
        )
        await stub.CreateAddress(
            resources_pb2.Address(
                metadata=resources_pb2.Metadata(name="orders", space="shop"),
                spec=resources_pb2.AddressSpec(
                    address="orders", type="queue", plan="standard-small-queue"
                ),
            ),
            timeout=5,
        )
        await place_like_the_storage_controller(stub, "orders", broker="broker-0")
        # orders' plan names DLQ: the space got its `dlq` queue, placed the same way
        await place_like_the_storage_controller(stub, "dlq", broker="broker-0")
        names = {"calls", "news", "orders", "dlq"}
        await all_active(stub, names)

        killed_at = time.monotonic()
        os.kill(router.pid, signal.SIGKILL)
        while any(s.phase == "Active" for s in (await statuses(stub)).values()):
            assert time.monotonic() - killed_at < 10, await statuses(stub)
            await asyncio.sleep(0.01)
        took = time.monotonic() - killed_at
        print(f"\nSIGKILL of router r0 -> every address of its space out of Active: {took:.3f} s")
        router.process.wait(10)

        lost = await statuses(stub)
        reason = "waiting for router r0: unreachable"
        assert {n: s.phase for n, s in lost.items()} == dict.fromkeys(names, "Configuring")
        assert [list(lost[n].messages) for n in ("calls", "news")] == [[reason], [reason]]
        # the queue keeps the storage-controller's messages, the agent's reason after them
        assert list(lost["orders"].messages) == [
            "placed on broker broker-0",
            "broker ready: broker-0",
            reason,
        ]
        async with grpc.aio.insecure_channel(f"127.0.0.1:{agent.port}") as agent_channel:
            api = router_agent_pb2_grpc.RouterAgentStub(agent_channel)
            topology = await api.GetTopology(router_agent_pb2.TopologyRequest(), timeout=5)
        (state,) = topology.spaces[0].routers
        assert (state.reachable, state.applied_generation) == (False, 0)
        assert 0 < state.confirmed_at <= time.time()

        # the same router again, on the same ports: it starts with nothing, gets it all back
        back = routers.start(
            "r0",
            amqp_port=router.amqp_port,
            inter_router_port=router.inter_router_port,
            extra_args=("--admin-port", str(router.admin_port)),
        )
        await all_active(stub, names)
        running = back.admin().GetConfig(router_pb2.GetConfigRequest(), timeout=5)
        assert sorted(a.address for a in running.addresses) == ["DLQ", "calls", "news", "orders"]
        again = await statuses(stub)
        assert list(again["orders"].messages) == [
            "placed on broker broker-0",
            "broker ready: broker-0",
        ]
        assert all(list(again[n].messages) == [] for n in ("calls", "news"))
