"""The write path without a network: compare-and-swap, bookkeeping, passwords, Apply planning."""

from __future__ import annotations

import grpc
import pytest
from enmasse.common.passwords import hash_password, verify_password
from enmasse.config import writes
from enmasse.resources.kinds import resource_of
from enmasse.resources.mqtt_stores import STORE_ADDRESSES
from enmasse.resources.plans import load_default_plans
from enmasse.resources.validation import Catalog
from enmasse.v1 import config_pb2, resources_pb2

Action = config_pb2.ApplyResult.Action


def catalog() -> Catalog:
    """The default plans and the space `shop`, with the queues the config service created with
    it: the MQTT store queues its plan promises and the dead-letter queue their plan names."""
    out = Catalog()
    for plan in load_default_plans():
        out.put(plan)
    out.put(
        resources_pb2.AddressSpace(
            metadata={"name": "shop", "resource_version": 7},
            spec={"type": "standard", "plan": "standard-small"},
        )
    )
    out.put(
        resources_pb2.Address(
            metadata={"name": "dlq", "space": "shop", "managed_by": "enmasse-space"},
            spec={"address": "DLQ", "type": "queue", "plan": "standard-small-queue"},
        )
    )
    for store in STORE_ADDRESSES:
        out.put(
            resources_pb2.Address(
                metadata={
                    "name": store.replace("/", "-"),
                    "space": "shop",
                    "managed_by": "enmasse-space",
                },
                spec={"address": store, "type": "queue", "plan": "standard-small-queue"},
            )
        )
    return out


def user(password: str = "pw") -> resources_pb2.MessagingUser:
    return resources_pb2.MessagingUser(
        metadata={"name": "alice", "space": "shop"},
        spec={"username": "alice", "password": password},
    )


def test_password_hash_is_salted_and_verifies() -> None:
    first, second = hash_password("s3cret"), hash_password("s3cret")
    assert first != second, "salted"
    assert first.startswith("scrypt$16384$8$1$")
    assert verify_password("s3cret", first)
    assert not verify_password("wrong", first)
    assert not verify_password("s3cret", "md5$abc")


def test_create_sets_bookkeeping_and_hashes_the_password() -> None:
    commit, stored = writes.plan_create(user(), catalog=catalog())
    assert stored.metadata.generation == 1
    assert stored.metadata.uid
    assert stored.metadata.created_at.seconds > 0
    assert stored.spec.password == ""
    assert verify_password("pw", stored.spec.password_hash)
    assert list(commit.puts) == [("MessagingUser", "shop", "alice")]


def test_a_caller_cannot_set_a_password_hash() -> None:
    forged = user(password="")
    forged.spec.password_hash = hash_password("mine")
    with pytest.raises(writes.Refused) as refused:
        writes.plan_create(forged, catalog=catalog())
    assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert (
        refused.value.message
        == "MessagingUser shop/alice: spec.password: is required when a messaging user is created"
    )


def test_update_bumps_generation_only_on_spec_change() -> None:
    base = catalog()
    _, stored = writes.plan_create(
        resources_pb2.Address(
            metadata={"name": "q", "space": "shop"},
            spec={"address": "q", "type": "queue", "plan": "standard-small-queue"},
        ),
        catalog=base,
    )
    stored.metadata.resource_version = 9
    base.put(stored)
    relabelled = resources_pb2.Address()
    relabelled.CopyFrom(stored)
    relabelled.metadata.labels["team"] = "red"
    _, same_spec = writes.plan_update(relabelled, catalog=base)
    assert same_spec.metadata.generation == 1
    assert same_spec.metadata.uid == stored.metadata.uid
    relabelled.spec.plan = "standard-large-queue"
    _, new_spec = writes.plan_update(relabelled, catalog=base)
    assert new_spec.metadata.generation == 2


def test_stale_version_message() -> None:
    base = catalog()
    with pytest.raises(writes.Refused) as refused:
        writes.plan_delete(("AddressSpace", "", "shop"), resource_version=3, catalog=base)
    assert refused.value.code == grpc.StatusCode.ABORTED
    assert (
        refused.value.message
        == "AddressSpace shop has been modified: resource_version 3 is stale, current is 7"
    )
    commit = writes.plan_delete(("AddressSpace", "", "shop"), resource_version=7, catalog=base)
    assert commit.deletes == [("AddressSpace", "", "shop")]
    assert commit.emptied_spaces == ["shop"]


def test_apply_with_the_same_password_is_unchanged() -> None:
    base = catalog()
    _, stored = writes.plan_create(user("pw"), catalog=base)
    base.put(stored)
    request = config_pb2.ApplyRequest(space="shop", resources=[resource_of(user("pw"))])
    assert [r.action for r in writes.plan_apply(request, catalog=base).results] == [
        Action.UNCHANGED
    ]
    request = config_pb2.ApplyRequest(space="shop", resources=[resource_of(user("new"))])
    plan = writes.plan_apply(request, catalog=base)
    assert [r.action for r in plan.results] == [Action.UPDATED]
    assert verify_password(
        "new", plan.commit.puts[("MessagingUser", "shop", "alice")].spec.password_hash
    )


def test_a_user_stored_without_scram_keys_gets_them_when_applied_again() -> None:
    base = catalog()
    _, stored = writes.plan_create(user("pw"), catalog=base)
    assert [c.mechanism for c in stored.spec.scram_credentials] == [
        "SCRAM-SHA-512",
        "SCRAM-SHA-256",
    ]
    stored.spec.ClearField("scram_credentials")  # as stored before SCRAM keys existed
    base.put(stored)
    request = config_pb2.ApplyRequest(space="shop", resources=[resource_of(user("pw"))])
    plan = writes.plan_apply(request, catalog=base)
    assert [r.action for r in plan.results] == [Action.UPDATED]
    again = plan.commit.puts[("MessagingUser", "shop", "alice")]
    assert len(again.spec.scram_credentials) == 2
    assert verify_password("pw", again.spec.password_hash)


def test_apply_fills_the_space_and_refuses_plans_outside_plan_scope() -> None:
    bare = resources_pb2.Address(
        metadata={"name": "q"},
        spec={"address": "q", "type": "queue", "plan": "standard-small-queue"},
    )
    plan_in_space_scope = resources_pb2.AddressPlan(
        metadata={"name": "p"}, spec={"address_type": "queue", "broker": 1}
    )
    request = config_pb2.ApplyRequest(
        space="shop", manager="git", resources=[resource_of(bare), resource_of(plan_in_space_scope)]
    )
    plan = writes.plan_apply(request, catalog=catalog())
    assert [(r.ref.space, r.ref.name, r.action, r.message) for r in plan.results] == [
        ("shop", "q", Action.CREATED, ""),
        (
            "",
            "p",
            Action.REFUSED,
            "AddressPlan p: metadata: is outside the scope of this apply: address space 'shop'",
        ),
    ]
    assert plan.commit.puts[("Address", "shop", "q")].metadata.managed_by == "git"


def test_prune_needs_a_manager() -> None:
    with pytest.raises(writes.Refused) as refused:
        writes.plan_apply(config_pb2.ApplyRequest(space="shop", prune=True), catalog=catalog())
    assert refused.value.message == "prune needs a manager"


def test_etcd_endpoints_become_one_grpc_target() -> None:
    from enmasse.config.store import channel_target

    assert channel_target(["127.0.0.1:2379"]) == "127.0.0.1:2379"
    assert channel_target(["127.0.0.1:1", "127.0.0.2:2"]) == "ipv4:127.0.0.1:1,127.0.0.2:2"
    assert channel_target(["etcd-0.etcd:2379", "etcd-1.etcd:2379"]) == "etcd-0.etcd:2379"
