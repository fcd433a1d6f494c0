"""Router workloads from the plan, written back to the GitOps repository with the reason.

Pure: how many routers a space gets (`router_count`: its plan's min_routers and at least one,
`--routers-per-space` over it, the routers already rendered kept while the plan is unknown) and
the sentence that says why. With real parts (a config service on the session etcd, the real
agent, a bare git repository in a temp dir as the remote): a space whose plan asks for 2 routers
reaches the remote as two router files in a commit saying so, by the router-agent; a fresh
working copy gets them back with their ports; the plan lowered to 1 removes one in a commit
saying so; the space deleted removes the last. And `enmasse-router-agent` as a real process,
given --gitops-repo and --routers-per-space, commits and pushes what it renders. What is asserted
is what a person reading the remote sees: the files at the branch head, the subjects and the
author.
"""

from __future__ import annotations

import asyncio
import functools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from enmasse.resources.discovery import LocalDirectory
from enmasse.resources.gitops_writeback import WorkloadRepository
from enmasse.router_agent.agent import RouterAgent
from enmasse.router_agent.workloads import RouterCount, RouterWorkloads, router_count
from enmasse.v1 import config_pb2, config_pb2_grpc, resources_pb2

from tests.fixtures.config_service import InProcessConfig

pytestmark = pytest.mark.timeout(120)
WAIT = 30.0
Remote = tuple[list[str], list[str], list[str]]  # files at the head, subjects, authors


def _plan(min_routers: int, *, max_routers: int = 3) -> resources_pb2.AddressSpacePlan:
    return resources_pb2.AddressSpacePlan(
        metadata={"name": "standard-pair"},
        spec={
            "address_space_type": "standard",
            "address_plans": ["standard-anycast"],
            "quotas": {"min_routers": min_routers, "max_routers": max_routers},
        },
    )


def test_the_plan_says_how_many_routers_and_the_reason_says_so() -> None:
    count = functools.partial(router_count, space="shop", plan_name="standard-pair")
    assert count(plan=_plan(2)) == RouterCount(
        2, "space shop: 2 routers (plan standard-pair: min 2)"
    )
    assert count(plan=_plan(0)) == RouterCount(
        1, "space shop: 1 router (plan standard-pair: no min_routers: one)"
    )
    assert count(plan=_plan(2), override=3) == RouterCount(
        3, "space shop: 3 routers (--routers-per-space 3)"
    )
    # Not knowing the plan (not synced yet, or gone) removes no router.
    assert count(plan=None, rendered=2) == RouterCount(
        2, "space shop: 2 routers (plan standard-pair not found: kept)"
    )
    assert count(plan=None) == RouterCount(
        1, "space shop: 1 router (plan standard-pair not found: one)"
    )


def git(*args: str, cwd: Path) -> str:
    return subprocess.run(
        ["git", *args], cwd=cwd, capture_output=True, text=True, check=True, timeout=30
    ).stdout.strip()


def remote_state(bare: Path) -> Remote:
    head = subprocess.run(
        ["git", "rev-parse", "--verify", "--quiet", "refs/heads/main"],
        cwd=bare,
        capture_output=True,
        check=False,
    )
    if head.returncode != 0:
        return [], [], []
    files = git("ls-tree", "-r", "--name-only", "main", cwd=bare).splitlines()
    subjects = git("log", "--format=%s", "main", cwd=bare).splitlines()
    authors = git("log", "--format=%an <%ae>", "main", cwd=bare).splitlines()
    return files, subjects, authors


async def until_remote(bare: Path, check: Callable[[list[str]], bool], what: str) -> Remote:
    deadline = time.monotonic() + WAIT
    state: Remote = ([], [], [])
    while time.monotonic() < deadline:
        state = await asyncio.to_thread(remote_state, bare)
        if check(state[0]):
            return state
        await asyncio.sleep(0.2)
    raise AssertionError(f"not within {WAIT} s: {what}; remote has {state}")


async def test_routers_from_the_plan_are_committed_with_why(
    config_server: InProcessConfig,
    config_stub: config_pb2_grpc.ConfigServiceStub,
    tmp_path: Path,
) -> None:
    bare = tmp_path / "gitops.git"
    await asyncio.to_thread(
        git, "init", "--quiet", "--bare", "--initial-branch=main", str(bare), cwd=tmp_path
    )
    checkout = tmp_path / "checkout"
    repository = WorkloadRepository(checkout, remote=str(bare), author="enmasse-router-agent")
    await asyncio.to_thread(repository.prepare)
    output = RouterWorkloads(checkout)
    agent = RouterAgent(
        config_target=config_server.target,
        directory=LocalDirectory(tmp_path / "var"),
        tick=0.1,
        workloads=output,
        writeback=repository,
    )
    writing = asyncio.create_task(repository.run())
    agent.start()
    try:
        await config_stub.CreateAddressSpacePlan(_plan(2), timeout=5)
        await config_stub.CreateAddressSpace(
            resources_pb2.AddressSpace(
                metadata={"name": "shop"}, spec={"type": "standard", "plan": "standard-pair"}
            ),
            timeout=5,
        )
        files, subjects, authors = await until_remote(bare, bool, "the space's routers")
        assert files == ["workloads/shop/router-0.yaml", "workloads/shop/router-1.yaml"]
        assert subjects == ["space shop: 2 routers (plan standard-pair: min 2)"]
        assert authors == ["enmasse-router-agent <router-agent@enmasse.invalid>"]

        # A restarted agent's empty working copy gets its routers back, ports and all.
        fresh = WorkloadRepository(tmp_path / "fresh", remote=str(bare), author="x")
        await asyncio.to_thread(fresh.prepare)
        assert RouterWorkloads(tmp_path / "fresh").read_space("shop") == output.read_space("shop")

        await config_stub.UpdateAddressSpacePlan(_plan(1), timeout=5)
        files, subjects, _ = await until_remote(
            bare, lambda files: len(files) == 1, "the second router removed"
        )
        assert files == ["workloads/shop/router-0.yaml"]
        assert subjects[0] == "space shop: 1 router (plan standard-pair: min 1)"

        await config_stub.DeleteAddressSpace(
            config_pb2.DeleteRequest(ref=config_pb2.ObjectRef(name="shop")), timeout=5
        )
        files, subjects, _ = await until_remote(bare, lambda files: not files, "no router left")
        assert subjects == [
            "space shop deleted: remove router-0",
            "space shop: 1 router (plan standard-pair: min 1)",
            "space shop: 2 routers (plan standard-pair: min 2)",
        ]
    finally:
        await agent.stop()
        writing.cancel()


@pytest.fixture
def agent_process() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    try:
        yield started
    finally:
        for process in started:
            if process.poll() is None:
                os.kill(process.pid, signal.SIGKILL)
                process.wait(10)


async def test_the_agent_process_commits_what_its_flags_say(
    config_server: InProcessConfig,
    config_stub: config_pb2_grpc.ConfigServiceStub,
    tmp_path: Path,
    agent_process: list[subprocess.Popen[bytes]],
) -> None:
    bare = tmp_path / "gitops.git"
    await asyncio.to_thread(
        git, "init", "--quiet", "--bare", "--initial-branch=main", str(bare), cwd=tmp_path
    )
    command = [
        str(Path(sys.executable).parent / "enmasse-router-agent"),
        f"--config={config_server.target}",
        f"--var={tmp_path / 'var'}",
        f"--gitops-dir={tmp_path / 'checkout'}",
        f"--gitops-repo={bare}",
        "--gitops-branch=main",
        f"--git-credentials={tmp_path / 'no-credentials'}",
        "--routers-per-space=2",
        "--tick=0.2",
    ]
    with open(tmp_path / "router-agent.log", "ab") as log:  # noqa: ASYNC230
        agent_process.append(subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT))  # noqa: ASYNC220
    await config_stub.CreateAddressSpace(
        resources_pb2.AddressSpace(
            metadata={"name": "shop"}, spec={"type": "standard", "plan": "standard-small"}
        ),
        timeout=5,
    )
    files, subjects, authors = await until_remote(bare, bool, "the agent's commit")
    assert files == ["workloads/shop/router-0.yaml", "workloads/shop/router-1.yaml"]
    assert subjects == ["space shop: 2 routers (--routers-per-space 2)"]
    assert authors == ["enmasse-router-agent <router-agent@enmasse.invalid>"]
    process = agent_process[0]
    process.send_signal(signal.SIGTERM)
    assert await asyncio.to_thread(process.wait, 20) == 0
