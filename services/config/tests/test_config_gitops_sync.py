"""config's GitOps sync against a real store: a manifests directory in, the store and a status out.

The directory is laid out as the k8s sidecar writes it (`<root>/<space>/*.yaml`); the sync applies
it through the servicer's own Apply (in-process config service over the session etcd). What is
asserted is what a user sees: which objects the store holds afterwards, and the status JSON's
refusals with file:line and reason.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from enmasse.config.gitops_follow import follow_tree
from enmasse.resources.gitops_sync import owned_spaces_of, sync_tree, tree_revision
from enmasse.v1 import config_pb2, resources_pb2

from tests.fixtures.config_service import SPACE_QUEUES, InProcessConfig
from tests.fixtures.etcd import EtcdProcess

CONFIG_SCRIPT = Path(sys.executable).parent / "enmasse-config"

SPACE = """apiVersion: enmasse.io/v1
kind: AddressSpace
metadata: {name: shop}
spec: {type: standard, plan: standard-small}
"""


def address(name: str, *, plan: str = "standard-small-queue") -> str:
    return (
        "---\napiVersion: enmasse.io/v1\nkind: Address\n"
        f"metadata: {{name: {name}}}\n"
        f"spec: {{address: {name}, type: queue, plan: {plan}}}\n"
    )


def write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


async def stored(config: InProcessConfig) -> dict[tuple[str, str, str], str]:
    """(kind, space, name) -> manager, for every space-level object of the store."""
    catalog = await config.servicer.cache.at_least(await config.store.guard_revision())
    return {
        key: obj.metadata.managed_by
        for key, obj in catalog.objects()
        if key[0] in ("AddressSpace", "Address", "MessagingUser")
    }


async def sync(config: InProcessConfig, root: Path):  # type: ignore[no-untyped-def]
    async def owned(manager: str) -> set[str]:
        catalog = await config.servicer.cache.at_least(await config.store.guard_revision())
        return owned_spaces_of(catalog.objects(), manager=manager)

    return await sync_tree(root, apply=config.servicer.apply, owned_spaces=owned)


async def test_a_directory_is_applied_pruned_and_refusals_name_file_and_line(
    config_server: InProcessConfig, tmp_path: Path
) -> None:
    root = tmp_path / "manifests"
    write(
        root,
        {"shop/space.yaml": SPACE, "shop/addresses.yaml": address("orders") + address("audit")},
    )
    status = await sync(config_server, root)
    assert status.ok, status.refused
    assert status.applied == {"CREATED": 3 + len(SPACE_QUEUES)}  # + the space's own queues
    assert await stored(config_server) == {
        ("AddressSpace", "", "shop"): "gitops",
        ("Address", "shop", "orders"): "gitops",
        ("Address", "shop", "audit"): "gitops",
        # the directory declares no DLQ and no MQTT store; the plans promise them: the space
        # has them
        **{("Address", "shop", name): "enmasse-space" for name in SPACE_QUEUES},
    }

    # Somebody adds an address by hand: gitops must never prune it.
    by_hand = resources_pb2.Resource()
    by_hand.address.metadata.name = "manual"
    by_hand.address.metadata.space = "shop"
    by_hand.address.spec.address = "manual"
    by_hand.address.spec.type = "queue"
    by_hand.address.spec.plan = "standard-small-queue"
    await config_server.servicer.apply(
        config_pb2.ApplyRequest(space="shop", manager="cli", resources=[by_hand])
    )

    # audit's manifest is removed: pruned; manual (manager cli) stays.
    write(root, {"shop/addresses.yaml": address("orders")})
    status = await sync(config_server, root)
    assert status.applied == {"UNCHANGED": 2, "PRUNED": 1}
    assert set(await stored(config_server)) == {
        ("AddressSpace", "", "shop"),
        ("Address", "shop", "orders"),
        ("Address", "shop", "manual"),
        *[("Address", "shop", name) for name in SPACE_QUEUES],  # not the sync's to prune
    }

    # An object the store refuses (no such plan): refused with its file:line, the rest applies.
    write(root, {"shop/more.yaml": address("invoices") + address("bad", plan="no-such-plan")})
    status = await sync(config_server, root)
    assert [(r.name, Path(r.file).name, r.line) for r in status.refused] == [
        ("bad", "more.yaml", 7)
    ]
    assert "no-such-plan" in status.refused[0].reason
    assert status.applied["CREATED"] == 1
    assert ("Address", "shop", "invoices") in await stored(config_server)
    assert ("Address", "shop", "bad") not in await stored(config_server)

    # A file that cannot be read: refused with file:line; nothing else changes, nothing pruned.
    write(root, {"shop/more.yaml": "apiVersion: enmasse.io/v1\nkind: Address\nspec: {plann: x}\n"})
    before = await stored(config_server)
    status = await sync(config_server, root)
    assert [(Path(r.file).name, r.line) for r in status.refused] == [("more.yaml", 3)]
    assert 'unknown field "plann"' in status.refused[0].reason
    assert status.pruning_skipped == ["shop"]
    assert await stored(config_server) == before

    # The space's directory disappears: what gitops owns goes, the space with it.
    (root / "shop" / "more.yaml").unlink()
    (root / "shop" / "addresses.yaml").unlink()
    (root / "shop" / "space.yaml").unlink()
    (root / "shop").rmdir()
    status = await sync(config_server, root)
    assert status.ok
    assert ("AddressSpace", "", "shop") not in await stored(config_server)
    assert ("Address", "shop", "orders") not in await stored(config_server)
    assert ("Address", "shop", "dlq") not in await stored(config_server)


async def test_follow_writes_the_status_and_applies_each_new_revision(
    config_server: InProcessConfig, tmp_path: Path
) -> None:
    root = tmp_path / "manifests"
    write(root, {"shop/space.yaml": SPACE + address("orders")})
    status_path = tmp_path / "sync-status.json"

    async def owned(manager: str) -> set[str]:
        catalog = await config_server.servicer.cache.at_least(
            await config_server.store.guard_revision()
        )
        return owned_spaces_of(catalog.objects(), manager=manager)

    task = asyncio.create_task(
        follow_tree(
            root,
            apply=config_server.servicer.apply,
            owned_spaces=owned,
            status_path=status_path,
            interval=0.1,
        )
    )
    try:
        first = await _status_with(status_path, tree_revision(root))
        # the space, orders, and its own queues (SPACE_QUEUES: the MQTT stores, the DLQ)
        assert first["applied"] == {"CREATED": 2 + len(SPACE_QUEUES)}
        assert first["refused"] == []
        write(root, {"shop/broken.yaml": "kind: [unclosed\n"})
        second = await _status_with(status_path, tree_revision(root))
        assert len(second["refused"]) == 1
        assert second["refused"][0]["file"].endswith("shop/broken.yaml")
        assert second["refused"][0]["reason"].startswith("YAML syntax error")
        assert ("Address", "shop", "orders") in await stored(config_server)
    finally:
        task.cancel()


async def _status_with(path: Path, revision: str) -> dict:  # type: ignore[type-arg]
    for _ in range(100):  # bounded: 10 s
        status = _read(path)
        if status.get("revision") == revision:
            return status
        await asyncio.sleep(0.1)
    raise AssertionError(f"no status for {revision} in {path}")


def _read(path: Path) -> dict:  # type: ignore[type-arg]
    return json.loads(path.read_text()) if path.exists() else {}  # type: ignore[no-any-return]


def test_the_config_process_syncs_its_manifests_dir(
    etcd: EtcdProcess, etcd_prefix: str, tmp_path: Path
) -> None:
    """`enmasse-config --manifests-dir`: the flag k8s/base/config.yaml passes, end to end."""
    root = tmp_path / "manifests"
    write(root, {"shop/space.yaml": SPACE + address("orders")})
    status_path = tmp_path / "status.json"
    command = [
        str(CONFIG_SCRIPT),
        f"--etcd={etcd.endpoint}",
        f"--prefix={etcd_prefix}",
        f"--manifests-dir={root}",
        "--sync-interval=0.2",
        f"--sync-status={status_path}",
    ]
    with open(tmp_path / "config.log", "wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while not _read(status_path) and time.monotonic() < deadline:
            assert process.poll() is None, (tmp_path / "config.log").read_text()
            time.sleep(0.1)
        status = _read(status_path)
        assert status["revision"] == tree_revision(root)
        # the space, orders, and its own queues (SPACE_QUEUES: the MQTT stores, the DLQ)
        assert status["applied"] == {"CREATED": 2 + len(SPACE_QUEUES)}
        assert status["error"] == ""
    finally:
        os.kill(process.pid, signal.SIGKILL)
        process.wait(10)
