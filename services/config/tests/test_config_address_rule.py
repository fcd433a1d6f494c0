"""Hostile input at the config service (in-process, over the session etcd): bad address strings
are refused by the API before anything is stored, and a YAML bomb in one tenant's manifests
directory is refused by the GitOps sync while another tenant's directory applies and the API
keeps answering.
"""
# ruff: noqa: E501  (the exact messages read best on one line each)

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest
from enmasse.resources.gitops_sync import owned_spaces_of, sync_tree
from enmasse.v1 import config_pb2, resources_pb2

from tests.fixtures.config_service import SPACE_QUEUES, InProcessConfig

RESERVED = "(reserved for the router network and the control plane)"
BAD = [
    ("a..b", "'a..b' has an empty segment (segments are separated by '/' and '.')"),
    ("a\x00b", "'a\\x00b' must not contain control characters"),
    (
        "a::b",
        "'a::b' must not contain '::', which is reserved for subscriptions (<topic>::<name> on a broker)",
    ),
    ("ordérs", "'ord\\xe9rs' must hold ASCII characters only"),
    ("_dynamic/x", f"'_dynamic/x' must not start with '_dynamic/' {RESERVED}"),
    ("_mesh/x", f"'_mesh/x' must not start with '_mesh/' {RESERVED}"),
    ("$x", f"'$x' must not start with '$' {RESERVED}"),
    ("x" * 256, "must be at most 255 characters (got 256)"),
]


def space(name: str) -> resources_pb2.AddressSpace:
    return resources_pb2.AddressSpace(
        metadata={"name": name}, spec={"type": "standard", "plan": "standard-small"}
    )


def address(address_string: str) -> resources_pb2.Address:
    return resources_pb2.Address(
        metadata={"name": "bad", "space": "shop"},
        spec={"address": address_string, "type": "queue", "plan": "standard-small-queue"},
    )


@pytest.mark.parametrize(("address_string", "expected"), BAD)
async def test_create_refuses_a_bad_address_string_and_stores_nothing(
    config_stub, address_string: str, expected: str
) -> None:
    await config_stub.CreateAddressSpace(space("shop"))
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await config_stub.CreateAddress(address(address_string))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert refused.value.details() == f"Address shop/bad: spec.address: {expected}"
    listed = await config_stub.ListAddresses(config_pb2.ListRequest(space="shop"))
    assert [a.metadata.name for a in listed.items] == SPACE_QUEUES  # the space's own alone


async def test_apply_refuses_each_bad_address_string_with_its_reason(config_stub) -> None:
    await config_stub.CreateAddressSpace(space("shop"))
    batch = []
    for index, (address_string, _) in enumerate(BAD):
        bad = address(address_string)
        bad.metadata.name = f"bad-{index}"
        batch.append(resources_pb2.Resource(address=bad))
    reply = await config_stub.Apply(
        config_pb2.ApplyRequest(space="shop", resources=batch, atomic=False)
    )
    Action = config_pb2.ApplyResult.Action
    assert [(Action.Name(r.action), r.message) for r in reply.results] == [
        ("REFUSED", f"Address shop/bad-{index}: spec.address: {expected}")
        for index, (_, expected) in enumerate(BAD)
    ]


SPACE_MANIFEST = """\
apiVersion: enmasse.io/v1
kind: AddressSpace
metadata: {{name: {name}}}
spec: {{type: standard, plan: standard-small}}
"""


def billion_laughs() -> str:
    lines = [
        "apiVersion: enmasse.io/v1",
        "kind: Address",
        "metadata: {name: lol}",
        "spec:",
        "  address: lol",
        "  type: queue",
        "  plan: standard-small-queue",
        '  a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]',
    ]
    for previous, name in zip("abcdefgh", "bcdefghi", strict=True):
        lines.append(f"  {name}: &{name} [" + ",".join([f"*{previous}"] * 9) + "]")
    return "\n".join(lines) + "\n"


async def test_a_bomb_in_one_tenants_directory_is_refused_and_the_others_apply(
    config_server: InProcessConfig, config_stub, tmp_path: Path
) -> None:
    root = tmp_path / "manifests"
    for name in ("evil", "shop"):
        (root / name).mkdir(parents=True)
        (root / name / "space.yaml").write_text(SPACE_MANIFEST.format(name=name))
    (root / "evil" / "bomb.yaml").write_text(billion_laughs())

    async def owned(manager: str) -> set[str]:
        catalog = await config_server.servicer.cache.at_least(
            await config_server.store.guard_revision()
        )
        return owned_spaces_of(catalog.objects(), manager=manager)

    sync = asyncio.create_task(
        sync_tree(root, apply=config_server.servicer.apply, owned_spaces=owned)
    )
    # The API answers while the sync runs (its reading is off the event loop).
    await config_stub.ListAddressSpacePlans(config_pb2.ListRequest(), timeout=5)
    status = await sync
    assert [str(r) for r in status.refused] == [
        f"{root}/evil/bomb.yaml:8: YAML anchors and aliases are not allowed in manifests (&a)"
    ]
    assert status.pruning_skipped == ["evil"]
    # both spaces and each one's queues (SPACE_QUEUES); the bomb's address never existed
    assert status.applied == {"CREATED": 2 + 2 * len(SPACE_QUEUES)}
    listed = await config_stub.ListAddressSpaces(config_pb2.ListRequest())
    assert sorted(s.metadata.name for s in listed.items) == ["evil", "shop"]
