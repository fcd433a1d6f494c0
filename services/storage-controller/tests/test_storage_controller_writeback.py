"""Write-back: the storage-controller's rendered brokers reach a git remote as commits that say why.

A real config service (in-process, session etcd), the real controller, and a real bare git
repository in a temp dir as the remote. An address whose plan needs a broker of its own must
produce a commit adding that broker's file; deleting the address, a commit removing it. What is
asserted is what a person reading the remote sees: the files at the branch head and the messages.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from pathlib import Path

import pytest
from enmasse.resources.gitops_writeback import Credentials, WorkloadRepository, commit_message
from enmasse.resources.rendered_brokers import Broker, GitOpsOutput
from enmasse.storage_controller.controller import StorageController
from enmasse.storage_controller.gitops_writeback import change_reasons
from enmasse.storage_controller.placement import Placement
from enmasse.v1 import config_pb2, config_pb2_grpc, resources_pb2

from tests.fixtures.config_service import InProcessConfig

pytestmark = pytest.mark.slow
WAIT = 30.0


def git(*args: str, cwd: Path) -> str:
    return subprocess.run(
        ["git", *args], cwd=cwd, capture_output=True, text=True, check=True, timeout=30
    ).stdout.strip()


def remote_state(bare: Path) -> tuple[list[str], list[str]]:
    """(files at main's head, commit subjects newest first); empty before the first push."""
    done = subprocess.run(
        ["git", "rev-parse", "--verify", "--quiet", "refs/heads/main"],
        cwd=bare,
        capture_output=True,
        check=False,
    )
    if done.returncode != 0:
        return [], []
    files = git("ls-tree", "-r", "--name-only", "main", cwd=bare).splitlines()
    subjects = git("log", "--format=%s", "main", cwd=bare).splitlines()
    return files, subjects


async def until_remote(bare: Path, check, what: str) -> tuple[list[str], list[str]]:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        state = await asyncio.to_thread(remote_state, bare)
        if check(*state):
            return state
        await asyncio.sleep(0.2)
    raise AssertionError(f"not within {WAIT} s: {what}; remote has {state}")


def space(name: str, *, plan: str = "standard-small") -> resources_pb2.AddressSpace:
    found = resources_pb2.AddressSpace()
    found.metadata.name = name
    found.spec.type = "standard"
    found.spec.plan = plan
    return found


async def solo_plans(stub: config_pb2_grpc.ConfigServiceStub) -> None:
    """A space plan `solo` whose one queue plan takes a broker of its own and names no
    dead-letter address: such a queue is all its space has (no DLQ beside it)."""
    await stub.CreateAddressPlan(
        resources_pb2.AddressPlan(
            metadata={"name": "solo-queue"}, spec={"address_type": "queue", "broker": 1}
        ),
        timeout=5,
    )
    await stub.CreateAddressSpacePlan(
        resources_pb2.AddressSpacePlan(
            metadata={"name": "solo"},
            spec={"address_space_type": "standard", "address_plans": ["solo-queue"]},
        ),
        timeout=5,
    )


def queue(name: str, *, space_name: str, plan: str) -> resources_pb2.Address:
    found = resources_pb2.Address()
    found.metadata.name = name
    found.metadata.space = space_name
    found.spec.address = name
    found.spec.type = "queue"
    found.spec.plan = plan
    return found


async def test_a_new_broker_is_committed_and_its_removal_too(
    config_server: InProcessConfig,
    config_stub: config_pb2_grpc.ConfigServiceStub,
    tmp_path: Path,
) -> None:
    bare = tmp_path / "gitops.git"
    await asyncio.to_thread(
        git, "init", "--quiet", "--bare", "--initial-branch=main", str(bare), cwd=tmp_path
    )
    output = GitOpsOutput(tmp_path / "checkout")
    repository = WorkloadRepository(
        output.root, remote=str(bare), author="enmasse-storage-controller", branch="main"
    )
    await asyncio.to_thread(repository.prepare)
    controller = StorageController(
        config_target=config_server.target,
        output=output,
        directory=None,
        resync_interval=0.2,
        writeback=repository,
    )
    writeback = asyncio.create_task(repository.run())
    controller.start()
    try:
        await solo_plans(config_stub)
        await config_stub.CreateAddressSpace(space("shop", plan="solo"), timeout=5)
        await config_stub.CreateAddress(
            queue("orders", space_name="shop", plan="solo-queue"), timeout=5
        )
        files, subjects = await until_remote(
            bare, lambda files, _s: any(f.startswith("workloads/shop/") for f in files), "a broker"
        )
        broker_files = [f for f in files if f.startswith("workloads/shop/")]
        assert len(broker_files) == 1
        broker_id = Path(broker_files[0]).stem
        assert subjects[0] == (f"add broker {broker_id} for address shop/orders (plan solo-queue)")

        await config_stub.DeleteAddress(
            config_pb2.DeleteRequest(ref=config_pb2.ObjectRef(space="shop", name="orders")),
            timeout=5,
        )
        files, subjects = await until_remote(
            bare,
            lambda files, _s: not any(f.startswith("workloads/shop/") for f in files),
            "the broker removed",
        )
        assert subjects[0] == f"remove broker {broker_id} after drain"
        assert len(subjects) == 2
    finally:
        await controller.stop()
        writeback.cancel()


def test_reasons_say_what_changed_and_why() -> None:
    before = {}
    placement = Placement(
        space="shop",
        brokers={"shop-pool-1": Broker(id="shop-pool-1", pooled=True)},
        addresses={"a": ("shop-pool-1",), "b": ("shop-pool-1",)},
    )
    plans = [
        queue("a", space_name="shop", plan="standard-small-queue"),
        queue("b", space_name="shop", plan="standard-small-queue"),
    ]
    reasons = change_reasons(
        space="shop",
        before=before,
        placement=placement,
        changed=["shop-pool-1", "shop-gone-1"],
        addresses=plans,
    )
    assert reasons == [
        "add broker shop-pool-1 for address shop/a (plan standard-small-queue), "
        "shop/b (plan standard-small-queue)",
        "remove broker shop-gone-1 after drain",
    ]
    message = commit_message(reasons)
    assert message.splitlines()[0] == reasons[0] + " (+1 more)"
    assert f"- {reasons[1]}" in message.splitlines()
    gone = change_reasons(space="shop", before={}, placement=None, changed=["shop-pool-1"])
    assert gone == ["remove broker shop-pool-1: address space shop deleted"]


def test_credentials_come_from_the_mounted_secret_and_never_from_the_command_line(
    tmp_path: Path,
) -> None:
    assert Credentials.from_dir(tmp_path) is None
    (tmp_path / "username").write_text("robot\n")
    (tmp_path / "password").write_text("s3cret\n")
    credentials = Credentials.from_dir(tmp_path)
    assert credentials == Credentials("robot", "s3cret")
    env = credentials.git_environment()
    assert env["GIT_CONFIG_KEY_0"] == "http.extraHeader"
    assert env["GIT_CONFIG_VALUE_0"] == "Authorization: Basic cm9ib3Q6czNjcmV0"
