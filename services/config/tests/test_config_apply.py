"""Apply: the declarative GitOps path (scope, manager, prune, dry run, atomic, concurrency)."""
# ruff: noqa: E501  (the exact messages read best on one line each)

from __future__ import annotations

import asyncio

import grpc
import pytest
from enmasse.resources.kinds import resource_of
from enmasse.v1 import config_pb2, config_pb2_grpc, resources_pb2

from tests.fixtures.config_service import SPACE_QUEUES, start_in_process, stop_in_process

Action = config_pb2.ApplyResult.Action
Ref = config_pb2.ObjectRef


def space(name: str = "shop") -> resources_pb2.Resource:
    return resource_of(
        resources_pb2.AddressSpace(
            metadata={"name": name}, spec={"type": "standard", "plan": "standard-small"}
        )
    )


def queue(
    name: str,
    *,
    plan: str = "standard-small-queue",
    address: str | None = None,
    space_name: str = "",
) -> resources_pb2.Resource:
    return resource_of(
        resources_pb2.Address(
            metadata={"name": name, "space": space_name},
            spec={"address": address or name, "type": "queue", "plan": plan},
        )
    )


def actions(response: config_pb2.ApplyResponse) -> list[tuple[str, str, str]]:
    return [(r.kind, r.ref.name, Action.Name(r.action)) for r in response.results]


async def apply(stub, resources, *, manager: str = "gitops", **flags) -> config_pb2.ApplyResponse:
    return await stub.Apply(
        config_pb2.ApplyRequest(space="shop", manager=manager, resources=resources, **flags)
    )


async def addresses(stub) -> dict[str, resources_pb2.Address]:
    listed = await stub.ListAddresses(config_pb2.ListRequest(space="shop"))
    return {a.metadata.name: a for a in listed.items}


async def test_create_then_unchanged_then_updated(config_stub) -> None:
    first = await apply(config_stub, [space(), queue("a"), queue("b")])
    assert actions(first) == [
        ("AddressSpace", "shop", "CREATED"),
        ("Address", "a", "CREATED"),
        ("Address", "b", "CREATED"),
        # the space's own (the plan serves MQTT, and their queue plan names the DLQ)
        ("Address", "dlq", "CREATED"),
        ("Address", "mqtt-retained", "CREATED"),
        ("Address", "mqtt-wills", "CREATED"),
        ("Address", "mqtt-sessions", "CREATED"),
    ]
    stored = await addresses(config_stub)
    assert stored["a"].metadata.managed_by == "gitops"
    assert stored["a"].metadata.resource_version == first.revision

    again = await apply(config_stub, [space(), queue("a"), queue("b")])
    assert [a for _, _, a in actions(again)] == ["UNCHANGED"] * 3
    assert again.revision == first.revision, "nothing unchanged is written"

    changed = await apply(
        config_stub, [space(), queue("a", plan="standard-large-queue"), queue("b")]
    )
    assert actions(changed) == [
        ("AddressSpace", "shop", "UNCHANGED"),
        ("Address", "a", "UPDATED"),
        ("Address", "b", "UNCHANGED"),
    ]
    after = await addresses(config_stub)
    assert after["a"].spec.plan == "standard-large-queue"
    assert after["a"].metadata.generation == 2
    assert after["b"].metadata.resource_version == first.revision


async def test_prune_removes_exactly_what_left_the_batch_and_only_its_own(config_stub) -> None:
    await apply(config_stub, [space(), queue("a"), queue("b"), queue("c")])
    await apply(config_stub, [queue("mine")], manager="cli")
    pruned = await apply(config_stub, [space(), queue("a"), queue("b")], prune=True)
    assert actions(pruned) == [
        ("AddressSpace", "shop", "UNCHANGED"),
        ("Address", "a", "UNCHANGED"),
        ("Address", "b", "UNCHANGED"),
        ("Address", "c", "PRUNED"),
    ]
    assert sorted(await addresses(config_stub)) == sorted(["a", "b", "mine", *SPACE_QUEUES])


async def test_dry_run_writes_nothing(config_stub) -> None:
    before = await apply(config_stub, [space(), queue("a")])
    dry = await apply(config_stub, [space(), queue("b")], prune=True, dry_run=True)
    assert actions(dry) == [
        ("AddressSpace", "shop", "UNCHANGED"),
        ("Address", "b", "CREATED"),
        ("Address", "a", "PRUNED"),
    ]
    assert dry.revision == before.revision
    assert sorted(await addresses(config_stub)) == sorted(["a", *SPACE_QUEUES])


async def test_atomic_refuses_the_whole_batch(config_stub) -> None:
    await apply(config_stub, [space()])
    before = await config_stub.ListAddresses(config_pb2.ListRequest())
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await apply(config_stub, [queue("good"), queue("bad", plan="gold")], atomic=True)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.value.details() == (
        "apply refused: Address shop/bad: spec.plan: address plan 'gold' not found"
    )
    after = await config_stub.ListAddresses(config_pb2.ListRequest())
    assert list(after.items) == list(before.items)
    assert after.revision == before.revision


async def test_non_atomic_applies_the_valid_and_refuses_the_rest(config_stub) -> None:
    await apply(config_stub, [space(), queue("old")], manager="cli")
    response = await apply(
        config_stub,
        [
            space(),
            queue("good"),
            queue("bad", plan="gold"),
            queue("twin", address="old"),
            queue("x", space_name="elsewhere"),
        ],
    )
    assert [(name, action) for _, name, action in actions(response)] == [
        ("shop", "UPDATED"),
        ("good", "CREATED"),
        ("bad", "REFUSED"),
        ("twin", "REFUSED"),
        ("x", "REFUSED"),
    ]
    messages = [r.message for r in response.results]
    assert messages[2] == "Address shop/bad: spec.plan: address plan 'gold' not found"
    assert (
        messages[3]
        == "Address shop/twin: spec.address: address 'old' is already used by address 'old' in address space 'shop'"
    )
    assert (
        messages[4]
        == "Address elsewhere/x: metadata: is outside the scope of this apply: address space 'shop'"
    )
    assert sorted(await addresses(config_stub)) == sorted(["good", "old", *SPACE_QUEUES])


async def test_twenty_concurrent_overlapping_applies_end_consistent(config_server) -> None:
    """Two service instances on one store, 20 Applys at once: each batch is all-or-nothing."""
    second = await start_in_process(
        etcd_endpoint=config_server.etcd_endpoint,
        prefix=config_server.store.prefix,
        seed=False,
    )
    try:
        async with (
            grpc.aio.insecure_channel(config_server.target) as one,
            grpc.aio.insecure_channel(second.target) as two,
        ):
            stubs = [config_pb2_grpc.ConfigServiceStub(one), config_pb2_grpc.ConfigServiceStub(two)]
            await apply(stubs[0], [space()])

            def batch(i: int) -> list[resources_pb2.Resource]:
                shared = [queue(f"q{n}") for n in range(10)]
                for resource in shared:
                    resource.address.metadata.labels["batch"] = str(i)
                return [*shared, queue(f"x{i}", address="shared")]

            responses = await asyncio.gather(
                *(apply(stubs[i % 2], batch(i), manager=f"m{i}") for i in range(20))
            )
            final = await addresses(stubs[0])
    finally:
        await stop_in_process(second)
    queues = [final[f"q{n}"] for n in range(10)]
    assert len({q.metadata.labels["batch"] for q in queues}) == 1, "one batch's, never a mix"
    assert len({q.metadata.resource_version for q in queues}) == 1, "written by one transaction"
    assert {q.metadata.managed_by for q in queues} == {f"m{queues[0].metadata.labels['batch']}"}
    holders = [a for a in final.values() if a.spec.address == "shared"]
    assert len(holders) == 1, "the address string is used once, whatever the race"
    created_x = [
        r.ref.name
        for resp in responses
        for r in resp.results
        if r.ref.name.startswith("x") and r.action == Action.CREATED
    ]
    assert created_x == [holders[0].metadata.name]
    refused_x = [
        r
        for resp in responses
        for r in resp.results
        if r.ref.name.startswith("x") and r.action == Action.REFUSED
    ]
    assert len(refused_x) == 19
    assert all(
        f"address 'shared' is already used by address '{holders[0].metadata.name}'" in r.message
        for r in refused_x
    )
    revisions = sorted(resp.revision for resp in responses)
    assert len(set(revisions)) == 20, "every batch committed in its own transaction"


async def test_prune_of_plans_in_use_is_refused(config_stub) -> None:
    plans = [
        resource_of(
            resources_pb2.AddressPlan(
                metadata={"name": "p-queue"}, spec={"address_type": "queue", "broker": 0.5}
            )
        ),
        resource_of(
            resources_pb2.AddressSpacePlan(
                metadata={"name": "p-space"},
                spec={"address_space_type": "standard", "address_plans": ["p-queue"]},
            )
        ),
    ]
    created = await config_stub.Apply(config_pb2.ApplyRequest(manager="admin", resources=plans))
    assert [Action.Name(r.action) for r in created.results] == ["CREATED", "CREATED"]
    await config_stub.CreateAddressSpace(
        resources_pb2.AddressSpace(
            metadata={"name": "shop"}, spec={"type": "standard", "plan": "p-space"}
        )
    )
    pruned = await config_stub.Apply(
        config_pb2.ApplyRequest(manager="admin", resources=[], prune=True)
    )
    assert [(r.ref.name, Action.Name(r.action), r.message) for r in pruned.results] == [
        (
            "p-queue",
            "REFUSED",
            "AddressPlan p-queue: metadata.name: is listed by address space plan 'p-space'",
        ),
        (
            "p-space",
            "REFUSED",
            "AddressSpacePlan p-space: metadata.name: is used by address space 'shop'",
        ),
    ]
    names = [
        p.metadata.name
        for p in (await config_stub.ListAddressPlans(config_pb2.ListRequest())).items
    ]
    assert "p-queue" in names


async def test_a_batch_larger_than_etcd_takes_is_refused_whole(tmp_path, etcd_prefix) -> None:
    from tests.fixtures.etcd import EtcdProcess

    small = EtcdProcess(data_dir=tmp_path / "small-etcd", extra_args=["--max-txn-ops=16"])
    small.start()
    config = None
    try:
        config = await start_in_process(etcd_endpoint=small.endpoint, prefix=etcd_prefix)
        async with grpc.aio.insecure_channel(config.target) as channel:
            stub = config_pb2_grpc.ConfigServiceStub(channel)
            await apply(stub, [space()])
            before = await stub.ListAddresses(config_pb2.ListRequest())
            with pytest.raises(grpc.aio.AioRpcError) as error:
                await apply(stub, [queue(f"q{n}") for n in range(20)])
            assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert error.value.details() == (
                "the store refused the request: etcdserver: too many operations in txn request"
            )
            after = await stub.ListAddresses(config_pb2.ListRequest())
            assert after.revision == before.revision
            assert [a.metadata.name for a in after.items] == SPACE_QUEUES  # the space's own
            fits = await apply(stub, [queue(f"q{n}") for n in range(10)])
            assert [Action.Name(r.action) for r in fits.results] == ["CREATED"] * 10
    finally:
        if config is not None:
            await stop_in_process(config)
        small.kill()


async def test_pruning_the_space_itself_cascades(config_stub) -> None:
    await apply(config_stub, [space(), queue("a"), queue("b")])
    await apply(config_stub, [queue("mine")], manager="cli")
    pruned = await apply(config_stub, [], prune=True)
    assert actions(pruned) == [
        ("Address", "a", "PRUNED"),
        ("Address", "b", "PRUNED"),
        ("AddressSpace", "shop", "PRUNED"),
    ]
    assert await addresses(config_stub) == {}, "the space went, and all it held"
    assert not (await config_stub.ListAddressSpaces(config_pb2.ListRequest())).items
