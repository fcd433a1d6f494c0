"""UpdateAddressStatuses: many addresses' statuses in one call, all or nothing, split by etcd.

A batch with one stale entry (or one missing address, or one named twice) writes nothing and says
which entry; a batch of 1,000 goes through an etcd with its default limits (128 operations a
transaction), which refuses any single transaction that large, so it must be split, and every
status is stored. Another process writing between two transactions of a batch (config runs as
one replica, so only a stray one could) makes the rest be checked again: written over when still
current, refused naming the entry (and how much was written) when not. The batch is authorized
as the single UpdateAddressStatus.
"""
# ruff: noqa: E501  (the exact messages read best on one line each)

from __future__ import annotations

import grpc
import pytest
from enmasse.config.access import OPERATIONS, Identity, authorize
from enmasse.config.store import Commit, Store
from enmasse.resources.kinds import resource_of
from enmasse.resources.paging import every_item_async
from enmasse.resources.status_batches import ENTRY_TRAILER, write_batch
from enmasse.v1 import config_pb2, config_pb2_grpc, resources_pb2

from tests.fixtures.config_service import start_in_process, stop_in_process
from tests.fixtures.etcd import EtcdProcess

Ref = config_pb2.ObjectRef
PLAN = "batch-unlimited"


async def _space(stub, *, space: str = "shop") -> None:
    """A space whose plan has no quotas (the default ones cap pooled queues)."""
    await stub.CreateAddressSpacePlan(
        resources_pb2.AddressSpacePlan(
            metadata={"name": PLAN},
            spec={"address_space_type": "standard", "address_plans": ["standard-anycast"]},
        )
    )
    await stub.CreateAddressSpace(
        resources_pb2.AddressSpace(
            metadata={"name": space}, spec={"type": "standard", "plan": PLAN}
        )
    )


async def _addresses(stub, count: int, *, space: str = "shop", per_apply: int = 100) -> None:
    """`count` anycast addresses, `per_apply` an Apply (one transaction each: small etcds too)."""
    for start in range(0, count, per_apply):
        resources = [
            resource_of(
                resources_pb2.Address(
                    metadata={"name": f"a{n:04d}", "space": space},
                    spec={
                        "address": f"a{n:04d}",
                        "type": "anycast",
                        "plan": "standard-anycast",
                    },
                )
            )
            for n in range(start, min(count, start + per_apply))
        ]
        await stub.Apply(config_pb2.ApplyRequest(space=space, manager="test", resources=resources))


async def _listed(stub, *, space: str = "shop") -> dict[str, resources_pb2.Address]:
    listed = await every_item_async(stub.ListAddresses, config_pb2.ListRequest(space=space))
    return {a.metadata.name: a for a in listed}  # every page: a List answers 500 at a time


def _entry(address: resources_pb2.Address, phase: str, *, version: int | None = None):
    status = resources_pb2.AddressStatus()
    status.status.phase = phase
    status.status.messages.append(f"{address.metadata.name} is {phase}")
    return config_pb2.UpdateAddressStatusRequest(
        ref=Ref(space=address.metadata.space, name=address.metadata.name),
        status=status,
        resource_version=address.metadata.resource_version if version is None else version,
    )


async def test_a_batch_with_one_stale_entry_writes_nothing_and_names_it(config_stub) -> None:
    await _space(config_stub)
    await _addresses(config_stub, 10)
    before = await _listed(config_stub)
    culprit = before["a0006"]
    moved = await config_stub.UpdateAddressStatus(_entry(culprit, "Configuring"))
    current = await _listed(config_stub)
    entries = [_entry(before[name], "Active") for name in sorted(before)]
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await config_stub.UpdateAddressStatuses(
            config_pb2.UpdateAddressStatusesRequest(entries=entries)
        )
    assert error.value.code() == grpc.StatusCode.ABORTED
    assert error.value.details() == (
        f"entries[6] of 10: Address shop/a0006 has been modified: resource_version "
        f"{culprit.metadata.resource_version} is stale, current is {moved.metadata.resource_version}; "
        f"none written"
    )
    assert (ENTRY_TRAILER, "6") in tuple(error.value.trailing_metadata()), "for programs"
    assert await _listed(config_stub) == current, "not one status of the batch was written"
    assert all(a.status.status.phase != "Active" for a in current.values())


async def test_a_controller_sends_the_batch_again_without_the_stale_entries(config_stub) -> None:
    await _space(config_stub)
    await _addresses(config_stub, 10)
    before = await _listed(config_stub)
    for name in ("a0002", "a0007"):
        await config_stub.UpdateAddressStatus(_entry(before[name], "Configuring"))
    batch = [(before[name], _entry(before[name], "Active").status) for name in sorted(before)]
    outcome = await write_batch(config_stub, batch, deadline=30)
    assert [a.metadata.name for a, _ in outcome.refused] == ["a0002", "a0007"]
    assert outcome.rest == []
    written = [a.metadata.name for (a, _), _ in outcome.written]
    assert written == [n for n in sorted(before) if n not in ("a0002", "a0007")]
    after = await _listed(config_stub)
    assert {n: a.status.status.phase for n, a in after.items()} == {
        n: "Configuring" if n in ("a0002", "a0007") else "Active" for n in before
    }
    assert [after[n].metadata.resource_version for n in written] == [v for _, v in outcome.written]


async def test_a_missing_or_repeated_address_refuses_the_batch(config_stub) -> None:
    await _space(config_stub)
    await _addresses(config_stub, 3)
    before = await _listed(config_stub)
    gone = resources_pb2.Address(metadata={"name": "gone", "space": "shop"})
    entries = [
        _entry(before["a0000"], "Active"),
        _entry(gone, "Active"),
        _entry(before["a0001"], "Active"),
    ]
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await config_stub.UpdateAddressStatuses(
            config_pb2.UpdateAddressStatusesRequest(entries=entries)
        )
    assert error.value.code() == grpc.StatusCode.NOT_FOUND
    assert error.value.details() == "entries[1] of 3: Address shop/gone not found; none written"

    twice = [
        _entry(before["a0000"], "Active"),
        _entry(before["a0002"], "Active"),
        _entry(before["a0000"], "Pending"),
    ]
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await config_stub.UpdateAddressStatuses(
            config_pb2.UpdateAddressStatusesRequest(entries=twice)
        )
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.value.details() == (
        "entries[2] of 3: Address shop/a0000 appears more than once in the batch; none written"
    )
    assert await _listed(config_stub) == before


async def test_a_batch_of_one_thousand_commits_across_transactions(tmp_path, etcd_prefix) -> None:
    # etcd's own defaults, which refuse a transaction of more than 128 operations
    small = EtcdProcess(
        data_dir=tmp_path / "default-etcd",
        extra_args=["--max-txn-ops=128", "--max-request-bytes=1572864"],
    )
    small.start()
    config = None
    try:
        config = await start_in_process(etcd_endpoint=small.endpoint, prefix=etcd_prefix)
        async with grpc.aio.insecure_channel(config.target) as channel:
            stub = config_pb2_grpc.ConfigServiceStub(channel)
            await _space(stub)
            await _addresses(stub, 1000)
            before = await _listed(stub)
            names = sorted(before)
            entries = [_entry(before[name], "Active") for name in names]
            answer = await stub.UpdateAddressStatuses(
                config_pb2.UpdateAddressStatusesRequest(entries=entries)
            )
            assert len(answer.resource_versions) == 1000
            transactions = sorted(set(answer.resource_versions))
            assert len(transactions) == 8, "127 statuses and the guard a transaction: 8 for 1,000"
            assert answer.revision == transactions[-1]
            after = await _listed(stub)
            for name, version in zip(names, answer.resource_versions, strict=True):
                assert after[name].status.status.phase == "Active", name
                assert list(after[name].status.status.messages) == [f"{name} is Active"]
                assert after[name].metadata.resource_version == version
                assert after[name].spec == before[name].spec
                assert after[name].metadata.generation == before[name].metadata.generation
    finally:
        if config is not None:
            await stop_in_process(config)
        small.kill()


def test_the_batch_is_authorized_as_the_single_status_write() -> None:
    assert OPERATIONS["UpdateAddressStatuses"] == OPERATIONS["UpdateAddressStatus"]
    for role in ("admin", "controller", "subscription", "gitops", "viewer", "tenant-admin"):
        identity = Identity(name="x", role=role, spaces=frozenset({"shop"}))
        single = authorize(identity, "UpdateAddressStatus", "shop")
        batch = authorize(identity, "UpdateAddressStatuses", "shop")
        assert batch.allowed == single.allowed, role
    controller = Identity(name="router-agent", role="controller")
    assert authorize(controller, "UpdateAddressStatuses", "shop").allowed
    tenant = Identity(name="t", role="tenant-admin", spaces=frozenset({"shop"}))
    assert authorize(tenant, "UpdateAddressStatuses", "shop").reason == (
        "token 't' (tenant-admin of shop) may not UpdateAddressStatuses in address space 'shop'"
    )


async def _intrude_before_transaction(monkeypatch, config, number: int, key, phase: str) -> None:
    """Another process (a second Store on the same etcd) writes `key`'s status just before the
    batch's transaction `number` (1-based): the guard moves under the batch."""
    other = Store(endpoints=[config.etcd_endpoint], prefix=config.store.prefix)
    original = config.store._guarded
    seen = 0

    async def guarded(ops, *, guard):
        nonlocal seen
        seen += 1
        if seen == number:
            stored = await other.get(key)
            stored.status.status.phase = phase
            assert await other.commit(
                Commit(puts={key: stored}), guard=await other.guard_revision()
            )
            await other.close()
        return await original(ops, guard=guard)

    monkeypatch.setattr(config.store, "_guarded", guarded)


async def test_a_write_between_transactions_is_checked_and_written_over(
    config_server, config_stub, monkeypatch
) -> None:
    await _space(config_stub)
    await _addresses(config_stub, 201)
    before = await _listed(config_stub)
    names = [f"a{n:04d}" for n in range(200)]
    await _intrude_before_transaction(
        monkeypatch, config_server, 2, ("Address", "shop", "a0200"), "Pending"
    )
    answer = await config_stub.UpdateAddressStatuses(
        config_pb2.UpdateAddressStatusesRequest(
            entries=[_entry(before[n], "Active") for n in names]
        )
    )
    after = await _listed(config_stub)
    assert [after[n].status.status.phase for n in names] == ["Active"] * 200
    assert after["a0200"].status.status.phase == "Pending", "the other write is kept"
    assert [after[n].metadata.resource_version for n in names] == list(answer.resource_versions)
    assert len(set(answer.resource_versions)) == 2  # 127, then the rest after the other write


async def test_an_entry_gone_stale_between_transactions_stops_the_rest(
    config_server, config_stub, monkeypatch
) -> None:
    await _space(config_stub)
    await _addresses(config_stub, 200)
    before = await _listed(config_stub)
    names = sorted(before)
    await _intrude_before_transaction(
        monkeypatch, config_server, 2, ("Address", "shop", "a0150"), "Pending"
    )
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await config_stub.UpdateAddressStatuses(
            config_pb2.UpdateAddressStatusesRequest(
                entries=[_entry(before[n], "Active") for n in names]
            )
        )
    after = await _listed(config_stub)
    assert error.value.code() == grpc.StatusCode.ABORTED
    assert error.value.details() == (
        f"entries[150] of 200: Address shop/a0150 has been modified: resource_version "
        f"{before['a0150'].metadata.resource_version} is stale, current is "
        f"{after['a0150'].metadata.resource_version}; 127 of the batch were written"
    )
    phases = [after[n].status.status.phase for n in names]
    assert phases[:127] == ["Active"] * 127, "the first transaction was in before the other write"
    assert phases[127:150] + phases[151:] == [""] * 72
    assert after["a0150"].status.status.phase == "Pending"
