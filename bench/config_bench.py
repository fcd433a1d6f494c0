"""Config service benchmark: figures, not assertions.

Starts its own etcd and `enmasse-config` (a real process, as deployed) on free loopback ports in a
temp dir, measures, prints a table and stops both by PID:

- address create rate (CreateAddress ops/s), with 1 client and with 8 concurrent clients
  (one address space, so the 8 contend for the same space as tenants do);
- watch fan-out latency: from just before CreateAddress is sent to the ADDED event seen by each of
  10 watchers (p50 / p99 over every (create, watcher) pair);
- List of 10,000 addresses in one space (seconds to read every page of ListAddresses, 500 a page,
  through `enmasse.resources.paging`; the 10,000 are written by
  Apply in batches of 500), and the create rate in that crowded space (a write costs no scan of
  its space: it checks against the service's in-memory catalog);
- status writes/s in a space of 5,000 addresses, every address's status written once: one
  UpdateAddressStatus call per address (32 in flight, as the router-agent did), then
  UpdateAddressStatuses in calls of 1,000 (`enmasse.resources.status_batches`, as the
  controllers do now; config commits each call in transactions of 127 statuses), each on the
  resource_version a List just read (compare-and-swap, as the controllers write).

Run: `.venv/bin/python -m bench.config_bench [--creates N] [--fanout N] [--list-size N]
[--status-size N]`, or
through the shared harness: `.venv/bin/python -m bench config [--quick]`.
The machine's cores are shared with whatever else runs: read the figures as orders of magnitude.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import grpc
from enmasse.resources.kinds import resource_of
from enmasse.resources.paging import every_item_async
from enmasse.resources.status_batches import batch_request, status_batches, status_request
from enmasse.v1 import config_pb2, config_pb2_grpc, resources_pb2

from bench.harness import Context, Table, suite
from tests.fixtures.config_service import ConfigProcess
from tests.fixtures.etcd import EtcdProcess

CHANNEL_OPTIONS = [("grpc.max_receive_message_length", 256 * 1024 * 1024)]
BENCH_PLAN = "bench-unlimited"


def address(name: str, *, space: str) -> resources_pb2.Address:
    return resources_pb2.Address(
        metadata={"name": name, "space": space},
        spec={"address": name, "type": "queue", "plan": "standard-small-queue"},
    )


async def prepare(stub: config_pb2_grpc.ConfigServiceStub, spaces: list[str]) -> None:
    """A space plan without quotas (the default ones cap pooled queues by broker credit)."""
    await stub.CreateAddressSpacePlan(
        resources_pb2.AddressSpacePlan(
            metadata={"name": BENCH_PLAN},
            spec={"address_space_type": "standard", "address_plans": ["standard-small-queue"]},
        )
    )
    for name in spaces:
        await stub.CreateAddressSpace(
            resources_pb2.AddressSpace(
                metadata={"name": name}, spec={"type": "standard", "plan": BENCH_PLAN}
            )
        )


async def create_rate(target: str, *, clients: int, creates: int, space: str) -> float:
    """CreateAddress ops/s with `clients` concurrent clients, `creates` in all."""
    channels = [grpc.aio.insecure_channel(target) for _ in range(clients)]
    stubs = [config_pb2_grpc.ConfigServiceStub(c) for c in channels]
    per_client = creates // clients

    async def client(i: int) -> None:
        for n in range(per_client):
            await stubs[i].CreateAddress(address(f"c{clients}-{i}-{n}", space=space), timeout=30)

    started = time.perf_counter()
    await asyncio.gather(*(client(i) for i in range(clients)))
    elapsed = time.perf_counter() - started
    for channel in channels:
        await channel.close()
    return per_client * clients / elapsed


async def fanout_latency(target: str, *, watchers: int, creates: int, space: str) -> list[float]:
    """Seconds from create sent to ADDED seen, for every (create, watcher) pair."""
    channels = [grpc.aio.insecure_channel(target) for _ in range(watchers + 1)]
    writer = config_pb2_grpc.ConfigServiceStub(channels[0])
    calls = [
        config_pb2_grpc.ConfigServiceStub(c).Watch(
            config_pb2.WatchRequest(kinds=["Address"], space=space)
        )
        for c in channels[1:]
    ]
    for call in calls:  # past the initial list
        while (await call.read()).type != config_pb2.WatchEvent.SYNCED:
            pass
    latencies: list[float] = []
    for n in range(creates):
        name = f"f-{n}"
        sent = time.perf_counter()
        await writer.CreateAddress(address(name, space=space), timeout=30)
        for call in calls:
            async with asyncio.timeout(30):
                event = await call.read()
                while not event.object.address.metadata.name.startswith("f-"):
                    event = await call.read()  # the space's DLQ, created with its first queue
            if event.object.address.metadata.name != name:
                raise RuntimeError(f"watcher saw {event.object.address.metadata.name}, not {name}")
            latencies.append(time.perf_counter() - sent)
    for call in calls:
        call.cancel()
    for channel in channels:
        await channel.close()
    return latencies


async def list_time(target: str, *, size: int, space: str, batch: int = 500) -> float:
    """Median seconds of ListAddresses over `size` addresses (three calls)."""
    async with grpc.aio.insecure_channel(target, options=CHANNEL_OPTIONS) as channel:
        stub = config_pb2_grpc.ConfigServiceStub(channel)
        for start in range(0, size, batch):
            resources = [
                resource_of(address(f"l-{n}", space=space))
                for n in range(start, min(size, start + batch))
            ]
            response = await stub.Apply(
                config_pb2.ApplyRequest(space=space, manager="bench", resources=resources),
                timeout=120,
            )
            refused = [r.message for r in response.results if r.message]
            if refused:
                raise RuntimeError(f"apply refused: {refused[:3]}")
        times = []
        for _ in range(3):
            started = time.perf_counter()
            listed = await every_item_async(
                partial(stub.ListAddresses, timeout=120), config_pb2.ListRequest(space=space)
            )
            times.append(time.perf_counter() - started)
            mine = [a for a in listed if a.metadata.name.startswith("l-")]  # not the DLQ
            if len(mine) != size:
                raise RuntimeError(f"listed {len(mine)} addresses, expected {size}")
        return statistics.median(times)


async def status_rates(target: str, *, size: int, space: str) -> tuple[float, float]:
    """(status writes/s one call per address, status writes/s batched) over `size` addresses."""
    async with grpc.aio.insecure_channel(target, options=CHANNEL_OPTIONS) as channel:
        stub = config_pb2_grpc.ConfigServiceStub(channel)
        for start in range(0, size, 500):
            resources = [
                resource_of(address(f"s-{n}", space=space))
                for n in range(start, min(size, start + 500))
            ]
            await stub.Apply(
                config_pb2.ApplyRequest(space=space, manager="bench", resources=resources),
                timeout=120,
            )

        async def listed() -> list[resources_pb2.Address]:
            answer = await every_item_async(
                partial(stub.ListAddresses, timeout=120), config_pb2.ListRequest(space=space)
            )
            return [a for a in answer if a.metadata.name.startswith("s-")]

        def statused(phase: str) -> resources_pb2.AddressStatus:
            status = resources_pb2.AddressStatus()
            status.status.phase = phase
            return status

        slots = asyncio.Semaphore(32)

        async def single(a: resources_pb2.Address) -> None:
            async with slots:
                await stub.UpdateAddressStatus(
                    status_request(a, statused("Configuring")), timeout=120
                )

        addresses = await listed()
        started = time.perf_counter()
        await asyncio.gather(*(single(a) for a in addresses))
        one_by_one = len(addresses) / (time.perf_counter() - started)

        writes = [(a, statused("Active")) for a in await listed()]
        started = time.perf_counter()
        for batch in status_batches(writes):
            await stub.UpdateAddressStatuses(batch_request(batch), timeout=120)
        batched = len(writes) / (time.perf_counter() - started)
        if any(a.status.status.phase != "Active" for a in await listed()):
            raise RuntimeError("a batched status was not stored")
        return one_by_one, batched


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


async def run(args: argparse.Namespace, workdir: Path) -> list[tuple[str, str]]:
    etcd = EtcdProcess(data_dir=workdir / "etcd-data")
    etcd.start()
    (workdir / "config").mkdir()
    config = ConfigProcess(etcd_endpoint=etcd.endpoint, prefix="/bench", workdir=workdir / "config")
    try:
        config.start()
        async with grpc.aio.insecure_channel(config.target) as channel:
            await prepare(
                config_pb2_grpc.ConfigServiceStub(channel),
                ["one", "eight", "fan", "big", "statuses"],
            )
        one = await create_rate(config.target, clients=1, creates=args.creates, space="one")
        eight = await create_rate(config.target, clients=8, creates=args.creates, space="eight")
        latencies = await fanout_latency(
            config.target, watchers=10, creates=args.fanout, space="fan"
        )
        listing = await list_time(config.target, size=args.list_size, space="big")
        crowded = await create_rate(config.target, clients=1, creates=args.creates, space="big")
        single, batched = await status_rates(config.target, size=args.status_size, space="statuses")
    finally:
        config.stop()
        etcd.stop()
    return [
        (f"address create rate, 1 client ({args.creates} creates)", f"{one:.0f} ops/s"),
        (f"address create rate, 8 clients ({args.creates} creates)", f"{eight:.0f} ops/s"),
        (
            f"watch fan-out to 10 watchers, p50 ({args.fanout} creates)",
            f"{percentile(latencies, 0.50) * 1000:.1f} ms",
        ),
        (
            f"watch fan-out to 10 watchers, p99 ({args.fanout} creates)",
            f"{percentile(latencies, 0.99) * 1000:.1f} ms",
        ),
        (f"ListAddresses of {args.list_size} addresses, every page", f"{listing:.3f} s"),
        (
            f"address create rate, 1 client, in a space of {args.list_size} addresses",
            f"{crowded:.0f} ops/s",
        ),
        (
            f"status writes, UpdateAddressStatus, 1 a call ({args.status_size} addresses)",
            f"{single:.0f} writes/s",
        ),
        (
            f"status writes, UpdateAddressStatuses, 1,000 a call ({args.status_size} addresses)",
            f"{batched:.0f} writes/s",
        ),
    ]


@suite(
    "config",
    "config service: create rate, watch fan-out, List of 10,000 addresses, status writes/s",
)
def config_suite(ctx: Context) -> Iterator[Table]:
    """The same measurements through the shared harness (`python -m bench config [--quick]`)."""
    args = argparse.Namespace(
        creates=80 if ctx.quick else 400,
        fanout=40 if ctx.quick else 200,
        list_size=2_000 if ctx.quick else 10_000,
        status_size=1_000 if ctx.quick else 5_000,
    )
    with tempfile.TemporaryDirectory(prefix="config-bench-") as tmp:
        rows = asyncio.run(run(args, Path(tmp)))
    table = Table(title="Config service", columns=["measure", "value"])
    for name, value in rows:
        table.add(name, value)
    yield table


def main() -> None:
    parser = argparse.ArgumentParser(description="config service benchmark")
    parser.add_argument("--creates", type=int, default=400)
    parser.add_argument("--fanout", type=int, default=200)
    parser.add_argument("--list-size", type=int, default=10_000)
    parser.add_argument("--status-size", type=int, default=5_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="config-bench-") as tmp:
        rows = asyncio.run(run(args, Path(tmp)))
    width = max(len(name) for name, _ in rows)
    print(f"{'measure'.ljust(width)}  value")
    print(f"{'-' * width}  {'-' * 12}")
    for name, value in rows:
        print(f"{name.ljust(width)}  {value}")


if __name__ == "__main__":
    main()
