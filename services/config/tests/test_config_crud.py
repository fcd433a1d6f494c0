"""CRUD of every kind through the real ConfigService over a real etcd, and what callers see."""

from __future__ import annotations

import grpc
import pytest
import scramp
from enmasse.v1 import config_pb2, resources_pb2

from tests.fixtures.config_service import SPACE_QUEUES

Ref = config_pb2.ObjectRef


def space(name: str = "shop", *, plan: str = "standard-small", type_: str = "standard"):
    return resources_pb2.AddressSpace(
        metadata=resources_pb2.Metadata(name=name), spec={"type": type_, "plan": plan}
    )


def address(
    name: str,
    *,
    space_name: str = "shop",
    type_: str = "queue",
    plan: str = "standard-small-queue",
    address_string: str | None = None,
    topic: str = "",
):
    return resources_pb2.Address(
        metadata=resources_pb2.Metadata(name=name, space=space_name),
        spec={"address": address_string or name, "type": type_, "plan": plan, "topic": topic},
    )


async def test_default_plans_are_stored_on_first_start(config_stub) -> None:
    plans = await config_stub.ListAddressPlans(config_pb2.ListRequest())
    names = sorted(p.metadata.name for p in plans.items)
    assert names == [
        "brokered-queue",
        "brokered-topic",
        "standard-anycast",
        "standard-large-queue",
        "standard-multicast",
        "standard-small-queue",
        "standard-small-subscription",
        "standard-small-topic",
        "standard-xlarge-queue",
    ]
    pooled = await config_stub.GetAddressPlan(Ref(name="standard-small-queue"))
    assert pooled.spec.broker == pytest.approx(0.01)
    space_plans = await config_stub.ListAddressSpacePlans(config_pb2.ListRequest())
    assert sorted(p.metadata.name for p in space_plans.items) == [
        "brokered-single",
        "development",
        "standard-small",
    ]


async def test_address_space_and_address_crud(config_stub) -> None:
    created = await config_stub.CreateAddressSpace(space())
    assert created.metadata.resource_version > 0
    assert created.metadata.generation == 1
    assert created.metadata.uid
    got = await config_stub.GetAddressSpace(Ref(name="shop"))
    assert got == created

    orders = await config_stub.CreateAddress(address("orders"))
    assert orders.metadata.resource_version > created.metadata.resource_version
    listed = await config_stub.ListAddresses(config_pb2.ListRequest(space="shop"))
    # + the space's own: the MQTT store queues, and the DLQ their plan and orders' name
    assert [a.metadata.name for a in listed.items] == sorted(["orders", *SPACE_QUEUES])
    assert listed.revision >= orders.metadata.resource_version

    orders.spec.plan = "standard-large-queue"
    updated = await config_stub.UpdateAddress(orders)
    assert updated.spec.plan == "standard-large-queue"
    assert updated.metadata.generation == 2
    assert updated.metadata.uid == orders.metadata.uid

    status = resources_pb2.AddressStatus(
        status={"phase": "Active", "observed_generation": 2},
        brokers=[{"broker": "b0", "state": "Active"}],
    )
    with_status = await config_stub.UpdateAddressStatus(
        config_pb2.UpdateAddressStatusRequest(ref=Ref(space="shop", name="orders"), status=status)
    )
    assert with_status.status.status.phase == "Active"
    assert with_status.metadata.generation == 2, "a status update does not bump generation"
    assert with_status.spec == updated.spec

    deleted = await config_stub.DeleteAddress(
        config_pb2.DeleteRequest(ref=Ref(space="shop", name="orders"))
    )
    assert deleted.revision > with_status.metadata.resource_version
    with pytest.raises(grpc.aio.AioRpcError) as missing:
        await config_stub.GetAddress(Ref(space="shop", name="orders"))
    assert missing.value.code() == grpc.StatusCode.NOT_FOUND
    assert missing.value.details() == "Address shop/orders not found"


async def test_plans_crud_and_plan_in_use(config_stub) -> None:
    plan = resources_pb2.AddressPlan(
        metadata={"name": "tiny-queue"}, spec={"address_type": "queue", "broker": 0.001}
    )
    created = await config_stub.CreateAddressPlan(plan)
    space_plan = resources_pb2.AddressSpacePlan(
        metadata={"name": "tiny"},
        spec={
            "address_space_type": "standard",
            "address_plans": ["tiny-queue"],
            "quotas": {"max_addresses": 2},
        },
    )
    await config_stub.CreateAddressSpacePlan(space_plan)
    await config_stub.CreateAddressSpace(space("t1", plan="tiny"))
    await config_stub.CreateAddress(address("q1", space_name="t1", plan="tiny-queue"))

    with pytest.raises(grpc.aio.AioRpcError) as in_use:
        await config_stub.DeleteAddressPlan(config_pb2.DeleteRequest(ref=Ref(name="tiny-queue")))
    assert in_use.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert in_use.value.details() == (
        "AddressPlan tiny-queue: metadata.name: is used by address 't1/q1'; "
        "AddressPlan tiny-queue: metadata.name: is listed by address space plan 'tiny'"
    )
    with pytest.raises(grpc.aio.AioRpcError) as space_plan_in_use:
        await config_stub.DeleteAddressSpacePlan(config_pb2.DeleteRequest(ref=Ref(name="tiny")))
    assert space_plan_in_use.value.details() == (
        "AddressSpacePlan tiny: metadata.name: is used by address space 't1'"
    )
    still = await config_stub.GetAddressPlan(Ref(name="tiny-queue"))
    assert still.metadata.resource_version == created.metadata.resource_version

    created.spec.description = "smallest"
    updated = await config_stub.UpdateAddressPlan(created)
    assert updated.spec.description == "smallest"

    await config_stub.DeleteAddressSpace(config_pb2.DeleteRequest(ref=Ref(name="t1")))
    await config_stub.DeleteAddressSpacePlan(config_pb2.DeleteRequest(ref=Ref(name="tiny")))
    await config_stub.DeleteAddressPlan(config_pb2.DeleteRequest(ref=Ref(name="tiny-queue")))
    remaining = await config_stub.ListAddressPlans(config_pb2.ListRequest())
    assert "tiny-queue" not in [p.metadata.name for p in remaining.items]


async def test_messaging_user_password_is_hashed_never_returned(config_stub, config_server) -> None:
    await config_stub.CreateAddressSpace(space())
    user = resources_pb2.MessagingUser(
        metadata={"name": "alice", "space": "shop"},
        spec={
            "username": "alice",
            "password": "s3cret",
            "authorization": [{"addresses": ["orders*"], "operations": ["send", "recv"]}],
        },
    )
    created = await config_stub.CreateMessagingUser(user)
    assert created.spec.password == ""
    # Issue #15: the hash is stored, and never returned by any call (only the control plane's
    # Watch with_secrets carries it: test_config_auth.py).
    assert created.spec.password_hash == ""
    stored = await config_server.store.get(("MessagingUser", "shop", "alice"))
    assert stored.spec.password_hash.startswith("scrypt$")
    assert "s3cret" not in stored.spec.password_hash
    got = await config_stub.GetMessagingUser(Ref(space="shop", name="alice"))
    assert got.spec.password == ""
    assert got.spec.password_hash == ""

    got.spec.authorization[0].operations.append("view")
    updated = await config_stub.UpdateMessagingUser(got)
    assert updated.spec.password_hash == ""
    kept = await config_server.store.get(("MessagingUser", "shop", "alice"))
    assert kept.spec.password_hash == stored.spec.password_hash, "no password: hash kept"
    assert list(updated.spec.authorization[0].operations) == ["send", "recv", "view"]

    users = await config_stub.ListMessagingUsers(config_pb2.ListRequest(space="shop"))
    assert [u.spec.username for u in users.items] == ["alice"]
    assert [u.spec.password_hash for u in users.items] == [""]
    await config_stub.DeleteMessagingUser(
        config_pb2.DeleteRequest(ref=Ref(space="shop", name="alice"))
    )
    assert not (await config_stub.ListMessagingUsers(config_pb2.ListRequest(space="shop"))).items


def _scram_login(credential: resources_pb2.ScramCredential, password: str) -> bool:
    """scramp's client with `password` against the stored credential: True if it gets in."""
    server = scramp.ScramMechanism(credential.mechanism).make_server(
        lambda _user: (
            credential.salt,
            credential.stored_key,
            credential.server_key,
            credential.iterations,
        )
    )
    client = scramp.ScramClient([credential.mechanism], "alice", password)
    server.set_client_first(client.get_client_first())
    client.set_server_first(server.get_server_first())
    try:
        server.set_client_final(client.get_client_final())
    except scramp.ScramException:
        return False
    return True


async def test_messaging_user_scram_keys_are_derived_stored_and_never_returned(
    config_stub, config_server
) -> None:
    await config_stub.CreateAddressSpace(space())
    user = resources_pb2.MessagingUser(
        metadata={"name": "alice", "space": "shop"},
        spec={
            "username": "alice",
            "password": "s3cret",
            "authorization": [{"addresses": ["#"], "operations": ["send"]}],
            # output only: what a caller sends here is dropped, never stored
            "scram_credentials": [{"mechanism": "SCRAM-SHA-256", "salt": b"mine"}],
        },
    )
    created = await config_stub.CreateMessagingUser(user)
    assert not created.spec.scram_credentials
    stored = await config_server.store.get(("MessagingUser", "shop", "alice"))
    keys = list(stored.spec.scram_credentials)
    assert [(k.mechanism, k.iterations) for k in keys] == [
        ("SCRAM-SHA-512", 4096),
        ("SCRAM-SHA-256", 4096),
    ]
    assert all(k.salt != b"mine" and len(k.salt) >= 16 for k in keys)
    assert all(_scram_login(k, "s3cret") and not _scram_login(k, "s3cre") for k in keys)
    assert b"s3cret" not in stored.SerializeToString()
    got = await config_stub.GetMessagingUser(Ref(space="shop", name="alice"))
    assert not got.spec.scram_credentials
    listed = await config_stub.ListMessagingUsers(config_pb2.ListRequest(space="shop"))
    assert not listed.items[0].spec.scram_credentials

    got.spec.authorization[0].operations.append("recv")
    await config_stub.UpdateMessagingUser(got)
    kept = await config_server.store.get(("MessagingUser", "shop", "alice"))
    assert list(kept.spec.scram_credentials) == keys, "no password: keys kept"
    got = await config_stub.GetMessagingUser(Ref(space="shop", name="alice"))
    got.spec.password = "n3w"
    await config_stub.UpdateMessagingUser(got)
    changed = await config_server.store.get(("MessagingUser", "shop", "alice"))
    assert all(_scram_login(k, "n3w") for k in changed.spec.scram_credentials)
    assert not any(_scram_login(k, "s3cret") for k in changed.spec.scram_credentials)


async def test_cascade_delete_removes_addresses_and_users(config_stub) -> None:
    await config_stub.CreateAddressSpace(space("a"))
    await config_stub.CreateAddressSpace(space("b"))
    for name in ("q1", "q2", "t1"):
        kind = "topic" if name.startswith("t") else "queue"
        plan = "standard-small-topic" if kind == "topic" else "standard-small-queue"
        await config_stub.CreateAddress(address(name, space_name="a", type_=kind, plan=plan))
    await config_stub.CreateAddress(address("q1", space_name="b"))
    await config_stub.CreateMessagingUser(
        resources_pb2.MessagingUser(
            metadata={"name": "u", "space": "a"}, spec={"username": "u", "password": "p"}
        )
    )
    await config_stub.DeleteAddressSpace(config_pb2.DeleteRequest(ref=Ref(name="a")))
    left = await config_stub.ListAddresses(config_pb2.ListRequest())
    assert [(a.metadata.space, a.metadata.name) for a in left.items] == [
        ("b", name) for name in sorted(["q1", *SPACE_QUEUES])
    ]
    assert not (await config_stub.ListMessagingUsers(config_pb2.ListRequest())).items
    spaces = await config_stub.ListAddressSpaces(config_pb2.ListRequest())
    assert [s.metadata.name for s in spaces.items] == ["b"]


async def test_label_selector(config_stub) -> None:
    await config_stub.CreateAddressSpace(space())
    tagged = address("orders")
    tagged.metadata.labels["team"] = "red"
    await config_stub.CreateAddress(tagged)
    await config_stub.CreateAddress(address("other"))
    red = await config_stub.ListAddresses(
        config_pb2.ListRequest(space="shop", label_selector={"team": "red"})
    )
    assert [a.metadata.name for a in red.items] == ["orders"]
