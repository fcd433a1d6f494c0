"""Provisioning figures of the storage-controller: CreateAddress -> status "broker ready".

Figures, not assertions; not collected by pytest. Runs a real etcd and the config service (in
this process), `enmasse-storage-controller` as its own process, and plays the local runtime: a
real `enmasse-broker` process for every broker the controller renders. A warm-up address first
(so its broker runs), then N queues of a pooled plan of the given credit, one CreateAddress at a
time (`one`, 50 ms apart) or in Apply batches of 500 (`apply`); an Informer on the config service
notes when each status first says `broker ready`.

    .venv/bin/python services/storage-controller/bench/provisioning.py 100 0.01 one
    .venv/bin/python services/storage-controller/bench/provisioning.py 5000 0.001 apply

Prints p50 / p99 / max latency, the time until all are ready, the brokers started and the
controller's resident memory at the end. The controller's log goes to <tmp>/controller.log.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repo root, for tests.fixtures

import grpc
from enmasse.common.logging import configure_logging
from enmasse.resources.informer import Informer
from enmasse.resources.kinds import resource_of
from enmasse.resources.rendered_brokers import GitOpsOutput
from enmasse.v1 import config_pb2, config_pb2_grpc, resources_pb2

from tests.fixtures.broker import BrokerProcess
from tests.fixtures.config_service import start_in_process, stop_in_process
from tests.fixtures.etcd import EtcdProcess

CONSOLE_SCRIPT = Path(sys.executable).parent / "enmasse-storage-controller"
BATCH = 500
GIVE_UP = 900.0


def resident_memory(pid: int) -> str:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS"):
            return " ".join(line.split()[1:])
    return "?"


def start_controller(config: str, output: GitOpsOutput, log_path: Path) -> subprocess.Popen[bytes]:
    with open(log_path, "wb") as log:
        return subprocess.Popen(
            [str(CONSOLE_SCRIPT), f"--config={config}", f"--gitops-dir={output.root}"],
            stdout=log,
            stderr=subprocess.STDOUT,
        )


def queue(name: str) -> resources_pb2.Address:
    return resources_pb2.Address(
        metadata={"name": name, "space": "bench"},
        spec={"address": name, "type": "queue", "plan": "bench-queue"},
    )


class Runtime:
    """Starts a broker per rendered file (one at a time, as they appear)."""

    def __init__(self, output: GitOpsOutput, workdir: Path) -> None:
        self.output = output
        self.workdir = workdir
        self.brokers: dict[str, BrokerProcess] = {}

    async def follow(self) -> None:
        while True:
            for workloads in self.output.read_all().values():
                for broker_id, workload in workloads.items():
                    if broker_id not in self.brokers:
                        broker = BrokerProcess(workdir=self.workdir / broker_id)
                        broker.amqp_port = workload.ports.amqp
                        broker.admin_port = workload.ports.admin
                        self.brokers[broker_id] = broker
                        await asyncio.to_thread(broker.start)
            await asyncio.sleep(0.1)

    def stop(self) -> None:
        for broker in self.brokers.values():
            broker.stop(timeout=5)


async def declare(stub: config_pb2_grpc.ConfigServiceStub, credit: float) -> None:
    await stub.CreateAddressPlan(
        resources_pb2.AddressPlan(
            metadata={"name": "bench-queue"},
            spec={"address_type": "queue", "broker": credit, "persistent": True},
        )
    )
    await stub.CreateAddressSpacePlan(
        resources_pb2.AddressSpacePlan(
            metadata={"name": "bench"},
            spec={
                "address_space_type": "standard",
                "address_plans": ["bench-queue"],
                "quotas": {"max_addresses": 10000, "max_brokers": 100},
            },
        )
    )
    await stub.CreateAddressSpace(
        resources_pb2.AddressSpace(
            metadata={"name": "bench"}, spec={"type": "standard", "plan": "bench"}
        )
    )


async def create(
    stub: config_pb2_grpc.ConfigServiceStub, count: int, mode: str, created: dict[str, float]
) -> None:
    if mode == "one":
        for i in range(count):
            created[f"q{i}"] = time.monotonic()
            await stub.CreateAddress(queue(f"q{i}"), timeout=10)
            await asyncio.sleep(0.05)
        return
    for start in range(0, count, BATCH):
        batch = [resource_of(queue(f"q{i}")) for i in range(start, min(count, start + BATCH))]
        now = time.monotonic()
        created.update({r.address.metadata.name: now for r in batch})
        await stub.Apply(
            config_pb2.ApplyRequest(space="bench", manager="bench", resources=batch), timeout=60
        )


async def measure(count: int, credit: float, mode: str) -> None:
    workdir = Path(tempfile.mkdtemp(prefix="storage-controller-bench-"))
    etcd = EtcdProcess(data_dir=workdir / "etcd")
    etcd.start()
    config = await start_in_process(etcd_endpoint=etcd.endpoint, prefix="/bench")
    output = GitOpsOutput(workdir / "gitops")
    controller = start_controller(config.target, output, workdir / "controller.log")
    runtime = Runtime(output, workdir / "brokers")
    ready: dict[str, float] = {}
    warm, done = asyncio.Event(), asyncio.Event()

    def note(resource: resources_pb2.Resource) -> None:
        address = resource.address
        messages = address.status.status.messages
        if address.metadata.name not in ready and any(
            m.startswith("broker ready") for m in messages
        ):
            ready[address.metadata.name] = time.monotonic()
            warm.set()
            if len(ready) == count + 1:
                done.set()

    informer = Informer(target=config.target, kinds=["Address"], on_modified=note)
    informer.start()
    following = asyncio.create_task(runtime.follow())
    created: dict[str, float] = {}
    try:
        async with grpc.aio.insecure_channel(config.target) as channel:
            stub = config_pb2_grpc.ConfigServiceStub(channel)
            await declare(stub, credit)
            await stub.CreateAddress(queue("warm-up"), timeout=10)
            async with asyncio.timeout(GIVE_UP):
                await warm.wait()
            began = time.monotonic()
            await create(stub, count, mode, created)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(GIVE_UP):
                    await done.wait()
        report(count, credit, mode, created, ready, began, runtime, controller.pid)
    finally:
        following.cancel()
        await informer.stop()
        os.kill(controller.pid, signal.SIGTERM)
        controller.wait(10)
        await asyncio.to_thread(runtime.stop)
        await stop_in_process(config)
        etcd.stop()


def report(
    count: int,
    credit: float,
    mode: str,
    created: dict[str, float],
    ready: dict[str, float],
    began: float,
    runtime: Runtime,
    pid: int,
) -> None:
    latencies = sorted(ready[n] - created[n] for n in created if n in ready)
    if not latencies:
        sys.stdout.write("nothing became ready\n")
        return

    def ms(q: float) -> str:
        return f"{latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1000:.0f} ms"

    last = max(ready[n] for n in created if n in ready)
    sys.stdout.write(
        f"{count} queues, credit {credit}, {mode}: ready {len(latencies)}/{count}, "
        f"brokers {len(runtime.brokers)}\n"
        f"  CreateAddress -> broker ready: p50 {ms(0.5)}, p99 {ms(0.99)}, "
        f"max {latencies[-1] * 1000:.0f} ms\n"
        f"  all ready after {last - began:.1f} s; controller RSS {resident_memory(pid)}\n"
    )


if __name__ == "__main__":
    os.environ.setdefault("ENMASSE_LOG_LEVEL", "WARNING")  # the controller's, too
    configure_logging(service="bench", renderer="console", level="WARNING")
    asyncio.run(measure(int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]))
