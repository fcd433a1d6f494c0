"""Compare-and-swap on resource_version, and bad input that changes nothing."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from enmasse.v1 import config_pb2, resources_pb2

Ref = config_pb2.ObjectRef


async def _space_and_queue(stub) -> resources_pb2.Address:
    await stub.CreateAddressSpace(
        resources_pb2.AddressSpace(
            metadata={"name": "shop"}, spec={"type": "standard", "plan": "standard-small"}
        )
    )
    return await stub.CreateAddress(
        resources_pb2.Address(
            metadata={"name": "orders", "space": "shop"},
            spec={"address": "orders", "type": "queue", "plan": "standard-small-queue"},
        )
    )


async def test_two_writers_one_wins_the_other_is_aborted(config_stub) -> None:
    orders = await _space_and_queue(config_stub)
    first, second = resources_pb2.Address(), resources_pb2.Address()
    first.CopyFrom(orders)
    second.CopyFrom(orders)
    first.spec.plan = "standard-large-queue"
    second.spec.plan = "standard-xlarge-queue"
    results = await asyncio.gather(
        config_stub.UpdateAddress(first), config_stub.UpdateAddress(second), return_exceptions=True
    )
    winners = [r for r in results if isinstance(r, resources_pb2.Address)]
    losers = [r for r in results if isinstance(r, grpc.aio.AioRpcError)]
    assert len(winners) == 1
    assert len(losers) == 1
    assert losers[0].code() == grpc.StatusCode.ABORTED
    current = winners[0].metadata.resource_version
    assert losers[0].details() == (
        f"Address shop/orders has been modified: resource_version "
        f"{orders.metadata.resource_version} is stale, current is {current}"
    )
    stored = await config_stub.GetAddress(Ref(space="shop", name="orders"))
    assert stored.spec.plan == winners[0].spec.plan
    assert stored.metadata.resource_version == current


async def test_create_twice_is_already_exists(config_stub) -> None:
    orders = await _space_and_queue(config_stub)
    again = resources_pb2.Address()
    again.CopyFrom(orders)
    again.metadata.resource_version = 0
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await config_stub.CreateAddress(again)
    assert error.value.code() == grpc.StatusCode.ALREADY_EXISTS
    assert error.value.details() == "Address shop/orders already exists"


async def test_stale_delete_is_aborted_and_changes_nothing(config_stub) -> None:
    orders = await _space_and_queue(config_stub)
    orders.spec.plan = "standard-large-queue"
    newer = await config_stub.UpdateAddress(orders)
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await config_stub.DeleteAddress(
            config_pb2.DeleteRequest(
                ref=Ref(space="shop", name="orders"),
                resource_version=orders.metadata.resource_version,
            )
        )
    assert error.value.code() == grpc.StatusCode.ABORTED
    assert await config_stub.GetAddress(Ref(space="shop", name="orders")) == newer


async def test_update_of_missing_object_is_not_found(config_stub) -> None:
    await _space_and_queue(config_stub)
    ghost = resources_pb2.Address(
        metadata={"name": "ghost", "space": "shop", "resource_version": 5},
        spec={"address": "ghost", "type": "queue", "plan": "standard-small-queue"},
    )
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await config_stub.UpdateAddress(ghost)
    assert error.value.code() == grpc.StatusCode.NOT_FOUND
    assert error.value.details() == "Address shop/ghost not found"


async def test_bad_input_is_refused_precisely_and_changes_nothing(config_stub) -> None:
    await _space_and_queue(config_stub)
    before = await config_stub.ListAddresses(config_pb2.ListRequest())
    bad = resources_pb2.Address(
        metadata={"name": "Bad_Name", "space": "shop"},
        spec={"address": "has space", "type": "queue", "plan": "standard-small-queue"},
    )
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await config_stub.CreateAddress(bad)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.value.details() == (
        "Address shop/Bad_Name: metadata.name: 'Bad_Name' is not a DNS-1123 label (lower-case "
        "letters, digits and '-', starting and ending with a letter or digit); "
        "Address shop/Bad_Name: spec.address: 'has space' must not contain whitespace"
    )
    duplicate = resources_pb2.Address(
        metadata={"name": "orders-2", "space": "shop"},
        spec={"address": "orders", "type": "queue", "plan": "standard-small-queue"},
    )
    with pytest.raises(grpc.aio.AioRpcError) as dup:
        await config_stub.CreateAddress(duplicate)
    assert dup.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert dup.value.details() == (
        "Address shop/orders-2: spec.address: address 'orders' is already used by address "
        "'orders' in address space 'shop'"
    )
    no_space = resources_pb2.Address(
        metadata={"name": "x", "space": "nowhere"},
        spec={"address": "x", "type": "queue", "plan": "standard-small-queue"},
    )
    with pytest.raises(grpc.aio.AioRpcError) as missing:
        await config_stub.CreateAddress(no_space)
    assert missing.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert (
        missing.value.details()
        == "Address nowhere/x: metadata.space: address space 'nowhere' not found"
    )
    with pytest.raises(grpc.aio.AioRpcError) as empty_ref:
        await config_stub.GetAddress(Ref(name="orders"))
    assert empty_ref.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert empty_ref.value.details() == "ref.space must name the address space of the Address"
    after = await config_stub.ListAddresses(config_pb2.ListRequest())
    assert list(after.items) == list(before.items)
    assert after.revision == before.revision, "nothing was written"
    # and the service keeps serving
    fine = resources_pb2.Address(
        metadata={"name": "fine", "space": "shop"},
        spec={"address": "fine", "type": "queue", "plan": "standard-small-queue"},
    )
    assert (await config_stub.CreateAddress(fine)).metadata.name == "fine"
