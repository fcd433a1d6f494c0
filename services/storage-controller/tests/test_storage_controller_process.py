"""`enmasse-storage-controller` as a process: it serves, survives SIGKILL mid-change, stops on
SIGTERM. No brokers run here: the statuses say so ("waiting for broker")."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import grpc
import pytest
from enmasse.resources.rendered_brokers import GitOpsOutput
from enmasse.v1 import config_pb2, config_pb2_grpc, resources_pb2

from tests.fixtures.config_service import InProcessConfig

pytestmark = pytest.mark.slow
CONSOLE_SCRIPT = Path(sys.executable).parent / "enmasse-storage-controller"
WAIT = 30.0


class ControllerProcess:
    def __init__(self, *, config_target: str, gitops_dir: Path, log_path: Path) -> None:
        self.command = [
            str(CONSOLE_SCRIPT),
            f"--config={config_target}",
            f"--gitops-dir={gitops_dir}",
            "--resync=0.2",
        ]
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT)

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait(10)

    def terminate(self) -> int:
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGTERM)
        return self.process.wait(10)


@pytest.fixture
def controller_process(
    config_server: InProcessConfig, tmp_path: Path
) -> Iterator[ControllerProcess]:
    process = ControllerProcess(
        config_target=config_server.target,
        gitops_dir=tmp_path / "gitops",
        log_path=tmp_path / "controller.log",
    )
    try:
        yield process
    finally:
        process.kill()


@pytest.fixture
async def config(
    config_server: InProcessConfig,
) -> AsyncIterator[config_pb2_grpc.ConfigServiceStub]:
    async with grpc.aio.insecure_channel(config_server.target) as channel:
        yield config_pb2_grpc.ConfigServiceStub(channel)


async def eventually(check: Callable[[], Awaitable[bool]], what: str, log: Path) -> None:
    deadline = time.monotonic() + WAIT
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {WAIT} s: {what}\n{_tail(log)}")
        await asyncio.sleep(0.1)


def _tail(log: Path) -> str:
    return log.read_text(errors="replace")[-3000:]


def queue(name: str, plan: str = "standard-small-queue") -> resources_pb2.Address:
    return resources_pb2.Address(
        metadata={"name": name, "space": "shop"},
        spec={"address": name, "type": "queue", "plan": plan},
    )


async def test_a_killed_controller_converges_after_restart(
    controller_process: ControllerProcess,
    config: config_pb2_grpc.ConfigServiceStub,
    tmp_path: Path,
) -> None:
    output = GitOpsOutput(tmp_path / "gitops")
    log = controller_process.log_path

    async def brokers_of(name: str) -> list[tuple[str, str]]:
        found = await config.GetAddress(config_pb2.ObjectRef(space="shop", name=name), timeout=5)
        return [(b.broker, b.state) for b in found.status.brokers]

    async def settled(expected: dict[str, list[tuple[str, str]]], files: list[str]) -> bool:
        if sorted(output.read_space("shop")) != files:
            return False
        return all([await brokers_of(n) == b for n, b in expected.items()])

    await config.CreateAddressSpace(
        resources_pb2.AddressSpace(
            metadata={"name": "shop"}, spec={"type": "standard", "plan": "standard-small"}
        ),
        timeout=5,
    )
    for name in ("q1", "q2", "q3"):
        await config.CreateAddress(queue(name), timeout=5)
    controller_process.start()
    pooled = [("shop-broker-0", "Active")]
    await eventually(
        lambda: settled({"q1": pooled, "q2": pooled, "q3": pooled}, ["shop-broker-0"]),
        "three pooled queues placed",
        log,
    )

    controller_process.kill()
    await config.CreateAddress(queue("big", "standard-large-queue"), timeout=5)
    await config.DeleteAddress(
        config_pb2.DeleteRequest(ref=config_pb2.ObjectRef(space="shop", name="q3")), timeout=5
    )
    controller_process.start()
    await eventually(
        lambda: settled(
            {"q1": pooled, "q2": pooled, "big": [("shop-big-0", "Active")]},
            ["shop-big-0", "shop-broker-0"],
        ),
        "the change made while it was down is placed, nothing else moved",
        log,
    )
    big = await config.GetAddress(config_pb2.ObjectRef(space="shop", name="big"), timeout=5)
    assert big.status.status.phase == "Configuring"
    assert list(big.status.status.messages) == [
        "placed on broker shop-big-0",
        "waiting for broker: shop-big-0",
    ]
    assert controller_process.terminate() == 0
