"""Git-driven, end to end on the local runtime: a commit becomes a working address, and back.

`enmasse up` (the session's `local_runtime`), a bare git repository in a temp dir as the tenants'
remote, and `enmasse gitops sync --once` as the one-machine Argo CD. Each step is a commit pushed
by a person, then a sync, then what a client sees:
1. a space and an Address committed -> applied -> Active -> a message flows through the router;
2. the Address's removal committed -> pruned (gone from the store);
3. a broken manifest committed -> refused with file and reason in the sync status, and the rest
   keeps working (a message still flows through the address that was there).
"""

from __future__ import annotations

import contextlib
import json
import subprocess
from pathlib import Path

import pytest
from enmasse.amqp import codec
from enmasse.amqp.client import Client
from enmasse.amqp.engine import Outcome
from enmasse.resources.kinds import KINDS

from tests.fixtures.config_service import SPACE_QUEUES
from tests.fixtures.local_runtime import LocalRuntime, enmasse

pytestmark = pytest.mark.slow
SPACE = "gitshop"


def space_manifest() -> str:
    return (
        "apiVersion: enmasse.io/v1\nkind: AddressSpace\n"
        f"metadata: {{name: {SPACE}}}\nspec: {{type: standard, plan: development}}\n"
    )


def queue_manifest(name: str) -> str:
    return (
        "apiVersion: enmasse.io/v1\nkind: Address\n"
        f"metadata: {{name: {name}}}\n"
        f"spec: {{address: {name}, type: queue, plan: standard-small-queue}}\n"
    )


class Remote:
    def __init__(self, root: Path) -> None:
        self.bare = root / "tenants.git"
        self.work = root / "work"
        self.git("init", "--quiet", "--bare", "--initial-branch=main", str(self.bare), cwd=root)
        self.git("clone", "--quiet", str(self.bare), str(self.work), cwd=root)
        self.git("checkout", "--quiet", "-B", "main")

    def git(self, *args: str, cwd: Path | None = None) -> str:
        return subprocess.run(
            ["git", "-c", "user.name=Tenant", "-c", "user.email=t@example.invalid", *args],
            cwd=cwd or self.work,
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout.strip()

    def commit(self, message: str, files: dict[str, str | None]) -> str:
        for name, text in files.items():
            if text is None:
                self.git("rm", "--quiet", name)
                continue
            (self.work / name).parent.mkdir(parents=True, exist_ok=True)
            (self.work / name).write_text(text)
            self.git("add", name)
        self.git("commit", "--quiet", "-m", message)
        self.git("push", "--quiet", "origin", "main")
        return self.git("rev-parse", "HEAD")


def sync(runtime: LocalRuntime, remote: Remote) -> tuple[int, str, dict]:  # type: ignore[type-arg]
    done = enmasse(
        runtime.var,
        *("gitops", "sync", "--repo", str(remote.bare), "--path", "tenants", "--once"),
        timeout=60,
    )
    status = json.loads((runtime.var / "gitops" / "sync-status.json").read_text())
    return done.returncode, done.stdout + done.stderr, status


def round_trip(port: int, address: str, body: str) -> str:
    """Sends one durable message and receives it back through the space's router."""
    client = Client("127.0.0.1", port, timeout=15)
    try:
        sender = client.sender(address)
        outcome = sender.send(codec.encode_message(body, durable=True), timeout=15).outcome
        assert outcome is Outcome.ACCEPTED, outcome
        receiver = client.receiver(address)
        delivery = receiver.receive(15)
        receiver.accept(delivery)
        return str(codec.read_body(delivery.payload))
    finally:
        with contextlib.suppress(Exception):
            client.close()


def addresses(runtime: LocalRuntime) -> set[str]:
    with runtime.client() as client:
        return {r.address.metadata.name for r in client.list(KINDS["Address"], space=SPACE)}


def test_commits_drive_addresses_from_git_to_traffic(
    local_runtime: LocalRuntime, tmp_path: Path
) -> None:
    remote = Remote(tmp_path)
    tenants = f"tenants/{SPACE}"
    head = remote.commit(
        "gitshop with orders",
        {
            f"{tenants}/space.yaml": space_manifest(),
            f"{tenants}/orders.yaml": queue_manifest("orders"),
        },
    )
    code, out, status = sync(local_runtime, remote)
    assert code == 0, out
    assert f"{SPACE}: address/orders created" in out
    assert status["revision"] == head
    local_runtime.wait_active(SPACE, ["orders"], timeout=180)
    port = local_runtime.router_port(SPACE)
    assert round_trip(port, "orders", "from git 1") == "from git 1"

    remote.commit("add news", {f"{tenants}/news.yaml": queue_manifest("news")})
    code, out, _status = sync(local_runtime, remote)
    assert code == 0, out
    local_runtime.wait_active(SPACE, ["orders", "news"], timeout=120)
    assert round_trip(port, "news", "news from git") == "news from git"

    remote.commit("drop news", {f"{tenants}/news.yaml": None})
    code, out, _status = sync(local_runtime, remote)
    assert code == 0, out
    assert f"{SPACE}: address/news pruned" in out
    # The space's dead-letter queue and MQTT store queues are the space's own, never pruned.
    assert addresses(local_runtime) == {"orders", *SPACE_QUEUES}

    head = remote.commit(
        "a typo",
        {f"{tenants}/bad.yaml": queue_manifest("bad").replace("plan:", "plann:")},
    )
    code, out, status = sync(local_runtime, remote)
    assert code == 1
    assert status["revision"] == head
    [refusal] = status["refused"]
    assert refusal["file"].endswith(f"{tenants}/bad.yaml")
    assert refusal["line"] == 4
    assert refusal["reason"].startswith('unknown field "plann" in spec of Address')
    assert addresses(local_runtime) == {"orders", *SPACE_QUEUES}
    assert round_trip(port, "orders", "from git 2") == "from git 2"
