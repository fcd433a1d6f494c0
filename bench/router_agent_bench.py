"""Router-agent benchmark: figures, not assertions.

Starts its own etcd, `enmasse-config`, two `enmasse-router` processes in a mesh and
`enmasse-router-agent` (real processes, as `enmasse up` runs them) on free loopback ports in a temp
dir, measures, prints a table and stops every process it started, by PID:

- provisioning latency of direct addresses: CreateAddress (anycast) -> the first message accepted
  through a router (a consumer on router r1, the producer on r0, so the mesh must know the address
  too); the client retries its attach while the router still answers "not found"; p50 / p99;
- scale: N anycast addresses in one space (Apply in batches of 500), time from the first Apply to
  every address Active (every router applied a generation that includes it, status written), the
  agent's pass time, the generation pushes, and the resident memory of the agent and each router.

Waypoint types (queue, topic, subscription) also need the storage-controller to place them; they
are not measured here.

Run: `.venv/bin/python -m bench router-agent [--quick]` or
`.venv/bin/python -m bench.router_agent_bench [--latency N] [--scale N]`.
The machine's cores are shared with whatever else runs: read the figures as orders of magnitude.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import grpc
from enmasse.amqp import codec
from enmasse.amqp.client import AmqpError, Client
from enmasse.resources.discovery import write_ports
from enmasse.resources.kinds import resource_of
from enmasse.resources.paging import every_item_async
from enmasse.v1 import config_pb2, config_pb2_grpc, resources_pb2, router_pb2

from bench.harness import Context, Table, suite
from tests.fixtures.config_service import ConfigProcess
from tests.fixtures.etcd import EtcdProcess
from tests.fixtures.router import RouterFleet, RouterProcess

AGENT = Path(sys.executable).parent / "enmasse-router-agent"
CHANNEL_OPTIONS = [("grpc.max_receive_message_length", 256 * 1024 * 1024)]
SPACE = "bench"
PLAN = "bench-direct"


def anycast(name: str) -> resources_pb2.Address:
    return resources_pb2.Address(
        metadata={"name": name, "space": SPACE},
        spec={"address": name, "type": "anycast", "plan": "standard-anycast"},
    )


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def first_message(r0: int, r1: int, address: str, *, limit: float = 30.0) -> None:
    """Blocks until one message on `address` went r0 -> r1 and was accepted (bounded)."""
    deadline = time.monotonic() + limit
    with Client("127.0.0.1", r1) as consumer, Client("127.0.0.1", r0) as producer:
        while True:
            try:
                receiver = consumer.receiver(address)
                sender = producer.sender(address)
                break
            except AmqpError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.01)
        outcome = sender.send_async(codec.encode_message(b"first"))
        delivery = receiver.receive(limit)
        receiver.accept(delivery)
        outcome.result(limit)


def start_agent(*, config: str, var: Path) -> subprocess.Popen[bytes]:
    with open(var / "router-agent.log", "ab") as log:
        return subprocess.Popen(
            [str(AGENT), f"--config={config}", f"--var={var}", "--tick=0.2"],
            stdout=log,
            stderr=subprocess.STDOUT,
        )


def wait_routed(routers: tuple[RouterProcess, ...], count: int) -> float:
    """perf_counter() when every router runs a configuration with `count` addresses."""
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        sizes = [
            len(r.admin().GetConfig(router_pb2.GetConfigRequest(), timeout=30).addresses)
            for r in routers
        ]
        if min(sizes) >= count:
            return time.perf_counter()
        time.sleep(0.2)
    raise TimeoutError(f"routers never routed all {count} addresses")


async def wait_all_active(stub: config_pb2_grpc.ConfigServiceStub, count: int) -> None:
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        listed = await every_item_async(
            partial(stub.ListAddresses, timeout=60), config_pb2.ListRequest(space=SPACE)
        )
        active = sum(1 for a in listed if a.status.status.phase == "Active")
        if active >= count:
            return
        await asyncio.sleep(0.5)
    raise TimeoutError(f"not all {count} addresses Active within 600 s")


async def run(args: argparse.Namespace, tmp: Path) -> list[tuple[str, object]]:
    etcd = EtcdProcess(data_dir=tmp / "etcd")
    etcd.start()
    workdir = tmp / "config"
    workdir.mkdir()
    config = ConfigProcess(etcd_endpoint=etcd.endpoint, prefix="/bench/enmasse/v1", workdir=workdir)
    fleet = RouterFleet(workdir=tmp)
    agent: subprocess.Popen[bytes] | None = None
    try:
        config.start()
        r0, r1 = fleet.start("r0"), fleet.start("r1")
        for router in (r0, r1):  # what the runtime's routers do: their ports files
            write_ports(
                tmp / "routers" / SPACE / router.router_id / "ports.json",
                {
                    "amqp": router.amqp_port,
                    "inter_router": router.inter_router_port,
                    "admin": router.admin_port,
                },
            )
        agent = start_agent(config=config.target, var=tmp)
        async with grpc.aio.insecure_channel(config.target, options=CHANNEL_OPTIONS) as channel:
            stub = config_pb2_grpc.ConfigServiceStub(channel)
            await stub.CreateAddressSpacePlan(
                resources_pb2.AddressSpacePlan(
                    metadata={"name": PLAN},
                    spec={"address_space_type": "standard", "address_plans": ["standard-anycast"]},
                )
            )
            await stub.CreateAddressSpace(
                resources_pb2.AddressSpace(
                    metadata={"name": SPACE}, spec={"type": "standard", "plan": PLAN}
                )
            )
            fleet.wait_for_mesh(timeout=30)
            latencies = []
            for n in range(args.latency):
                name = f"lat-{n}"
                started = time.perf_counter()
                await stub.CreateAddress(anycast(name), timeout=30)
                await asyncio.to_thread(first_message, r0.amqp_port, r1.amqp_port, name)
                latencies.append(time.perf_counter() - started)

            started = time.perf_counter()
            routed = asyncio.create_task(
                asyncio.to_thread(wait_routed, (r0, r1), args.latency + args.scale)
            )
            for first in range(0, args.scale, 500):
                batch = [
                    resource_of(anycast(f"s-{n}"))
                    for n in range(first, min(args.scale, first + 500))
                ]
                await stub.Apply(
                    config_pb2.ApplyRequest(space=SPACE, manager="bench", resources=batch),
                    timeout=120,
                )
            applied = time.perf_counter() - started
            await wait_all_active(stub, args.latency + args.scale)
            to_active = time.perf_counter() - started
            to_routed = await routed - started
        rows: list[tuple[str, object]] = [
            (
                f"CreateAddress -> first message, anycast, n={args.latency}: p50 (ms)",
                round(statistics.median(latencies) * 1000, 1),
            ),
            ("  p99 (ms)", round(percentile(latencies, 0.99) * 1000, 1)),
            ("  max (ms)", round(max(latencies) * 1000, 1)),
            (f"{args.scale} addresses: Apply (s)", round(applied, 1)),
            (
                f"{args.scale} addresses: first Apply -> both routers route all (s)",
                round(to_routed, 1),
            ),
            (f"{args.scale} addresses: first Apply -> all Active (s)", round(to_active, 1)),
            ("router-agent RSS (MiB)", round(rss_mib(agent.pid), 1)),
            ("router r0 RSS (MiB)", round(rss_mib(r0.pid), 1)),
            ("router r1 RSS (MiB)", round(rss_mib(r1.pid), 1)),
            ("config RSS (MiB)", round(rss_mib(config.process.pid), 1) if config.process else 0),
        ]
        return rows
    finally:
        if agent is not None and agent.poll() is None:
            os.kill(agent.pid, signal.SIGKILL)
            agent.wait(10)
        fleet.stop_all()
        config.stop()
        etcd.stop()


@suite("router-agent", "router-agent: CreateAddress -> first message, 5,000 addresses to Active")
def router_agent_suite(ctx: Context) -> Iterator[Table]:
    """The same measurements through the shared harness (`python -m bench router-agent`)."""
    args = argparse.Namespace(latency=20 if ctx.quick else 100, scale=500 if ctx.quick else 5_000)
    with tempfile.TemporaryDirectory(prefix="router-agent-bench-") as tmp:
        rows = asyncio.run(run(args, Path(tmp)))
    table = Table(title="Router-agent", columns=["measure", "value"])
    for name, value in rows:
        table.add(name, value)
    yield table


def main() -> None:
    parser = argparse.ArgumentParser(description="router-agent benchmark")
    parser.add_argument("--latency", type=int, default=100)
    parser.add_argument("--scale", type=int, default=5_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="router-agent-bench-") as tmp:
        rows = asyncio.run(run(args, Path(tmp)))
    width = max(len(name) for name, _ in rows)
    sys.stdout.write(f"{'measure'.ljust(width)}  value\n")
    for name, value in rows:
        sys.stdout.write(f"{name.ljust(width)}  {value}\n")


if __name__ == "__main__":
    main()
