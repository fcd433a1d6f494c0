"""Every address space holds the dead-letter and expiry queues its addresses' plans name: the
write path's decisions, without a network (the default plans, as a fresh store has them).

A space's first queue is stored with the space's `DLQ` queue (created in the same commit,
managed by `enmasse-space`, with the space plan's smallest queue plan); a space of anycast
addresses alone gets none (no broker for an empty DLQ); an Apply that lacks one gets it and says
so; one the space declares itself is the one; a plan that starts naming another gives every
space that uses it its queue; the queue cannot be deleted alone while a queue needs it, nor be
anything but a queue; a queue the rules refuse refuses the write that needed it, saying why.
The last tests go through the in-process config service on the session etcd: what `enmasse get
addresses` lists, and the start-up repair of a store written before.
"""

from __future__ import annotations

import grpc
import pytest
from enmasse.config import writes
from enmasse.config.store import Commit
from enmasse.resources.dead_letters import SPACE_MANAGER
from enmasse.resources.kinds import resource_of
from enmasse.resources.plans import load_default_plans
from enmasse.resources.validation import Catalog
from enmasse.v1 import config_pb2, config_pb2_grpc, resources_pb2

from tests.fixtures.config_service import InProcessConfig

Action = config_pb2.ApplyResult.Action


def plans() -> Catalog:
    """The default plans, their space plans without `mqtt`: these tests pin the dead-letter and
    expiry queues alone (the MQTT store queues, which come the same way, are pinned in
    test_config_mqtt_stores.py)."""
    out = Catalog()
    for plan in load_default_plans():
        if plan.WhichOneof("kind") == "address_space_plan":
            plan.address_space_plan.spec.mqtt = False
        out.put(plan)
    return out


def space(
    name: str = "shop", *, kind: str = "standard", plan: str = ""
) -> resources_pb2.AddressSpace:
    plan = plan or ("standard-small" if kind == "standard" else "brokered-single")
    return resources_pb2.AddressSpace(metadata={"name": name}, spec={"type": kind, "plan": plan})


def address(
    name: str, *, value: str = "", kind: str = "queue", plan: str = "standard-small-queue"
) -> resources_pb2.Address:
    return resources_pb2.Address(
        metadata={"name": name, "space": "shop"},
        spec={"address": value or name, "type": kind, "plan": plan},
    )


def with_space(*spaces: resources_pb2.AddressSpace) -> Catalog:
    catalog = plans()
    for one in spaces or (space(),):
        catalog.put(writes.created(one))
    return catalog


def stored_after(commit: Commit, catalog: Catalog) -> Catalog:
    for obj in commit.puts.values():
        catalog.put(obj)
    for key in commit.deletes:
        catalog.remove(key)
    return catalog


def addresses_of(commit: Commit) -> dict[str, tuple[str, str, str, str]]:
    return {
        key[2]: (obj.spec.address, obj.spec.type, obj.spec.plan, obj.metadata.managed_by)
        for key, obj in commit.puts.items()
        if key[0] == "Address"
    }


def test_the_first_queue_of_a_space_is_stored_with_its_dead_letter_queue_in_one_commit() -> None:
    commit, _ = writes.plan_create(space(), catalog=plans())
    assert list(commit.puts) == [("AddressSpace", "", "shop")]  # nothing to dead-letter yet
    commit, stored = writes.plan_create(address("orders"), catalog=with_space())
    assert stored.metadata.name == "orders"
    assert addresses_of(commit) == {
        "orders": ("orders", "queue", "standard-small-queue", ""),
        "dlq": ("DLQ", "queue", "standard-small-queue", SPACE_MANAGER),
    }
    dlq = commit.puts[("Address", "shop", "dlq")]
    assert dlq.metadata.generation == 1
    assert dlq.metadata.uid
    assert not dlq.HasField("status")


def test_a_space_of_anycast_addresses_alone_gets_no_dead_letter_queue() -> None:
    rpc = address("rpc", kind="anycast", plan="standard-anycast")
    commit, _ = writes.plan_create(rpc, catalog=with_space())
    assert list(addresses_of(commit)) == ["rpc"]


def test_a_brokered_space_gets_its_dead_letter_queue_with_its_own_queue_plan() -> None:
    invoices = address("invoices", plan="brokered-queue")
    invoices.metadata.space = "jms"
    commit, _ = writes.plan_create(invoices, catalog=with_space(space("jms", kind="brokered")))
    assert {k: v[:3] for k, v in addresses_of(commit).items()} == {
        "invoices": ("invoices", "queue", "brokered-queue"),
        "dlq": ("DLQ", "queue", "brokered-queue"),
    }


def test_an_apply_without_a_dead_letter_queue_creates_one_and_reports_it() -> None:
    request = config_pb2.ApplyRequest(
        space="shop",
        manager="gitops",
        prune=True,
        resources=[resource_of(space()), resource_of(address("orders"))],
    )
    plan = writes.plan_apply(request, catalog=plans())
    assert [(r.kind, r.ref.name, r.action) for r in plan.results] == [
        ("AddressSpace", "shop", Action.CREATED),
        ("Address", "orders", Action.CREATED),
        ("Address", "dlq", Action.CREATED),
    ]
    assert addresses_of(plan.commit)["dlq"][3] == SPACE_MANAGER

    # The same directory again: the queue is not the sync's to prune, and nothing changes.
    again = writes.plan_apply(request, catalog=stored_after(plan.commit, plans()))
    assert [r.action for r in again.results] == [Action.UNCHANGED, Action.UNCHANGED]
    assert not again.commit


def test_a_space_that_declares_its_dead_letter_queue_gets_none_created() -> None:
    own = address("dead-letters", value="DLQ", plan="standard-large-queue")
    request = config_pb2.ApplyRequest(
        space="shop", resources=[resource_of(space()), resource_of(own)]
    )
    plan = writes.plan_apply(request, catalog=plans())
    assert [r.ref.name for r in plan.results] == ["shop", "dead-letters"]
    assert addresses_of(plan.commit) == {
        "dead-letters": ("DLQ", "queue", "standard-large-queue", "")
    }


def test_the_dead_letter_address_must_be_a_queue() -> None:
    wrong = address("dlq", value="DLQ", kind="anycast", plan="standard-anycast")
    request = config_pb2.ApplyRequest(
        space="shop",
        resources=[resource_of(space()), resource_of(wrong), resource_of(address("q"))],
    )
    plan = writes.plan_apply(request, catalog=plans())
    assert [(r.ref.name, r.action, r.message) for r in plan.results] == [
        ("shop", Action.CREATED, ""),
        (
            "dlq",
            Action.REFUSED,
            "Address shop/dlq: spec.type: address 'DLQ' is the dead-letter address of address "
            "plans 'standard-small-queue', 'standard-large-queue', 'standard-xlarge-queue' in "
            "address space 'shop': it must be a queue, not 'anycast'",
        ),
        ("q", Action.CREATED, ""),
        ("dlq", Action.CREATED, ""),  # the space's own, in place of the refused one
    ]
    assert addresses_of(plan.commit)["dlq"][:2] == ("DLQ", "queue")


def test_the_dead_letter_queue_cannot_be_deleted_alone_while_a_queue_needs_it() -> None:
    catalog = with_space()
    commit, _ = writes.plan_create(address("orders"), catalog=catalog)
    catalog = stored_after(commit, catalog)
    with pytest.raises(writes.Refused) as refused:
        writes.plan_delete(("Address", "shop", "dlq"), resource_version=0, catalog=catalog)
    assert refused.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert refused.value.message == (
        "Address shop/dlq: metadata.name: holds 'DLQ', the dead-letter address of address plan "
        "'standard-small-queue', which addresses of address space 'shop' use: it can be deleted "
        "once none does, or with the space"
    )
    deleted = writes.plan_delete(("AddressSpace", "", "shop"), resource_version=0, catalog=catalog)
    assert deleted.emptied_spaces == ["shop"]  # ... it goes with its space
    catalog = stored_after(
        writes.plan_delete(("Address", "shop", "orders"), resource_version=0, catalog=catalog),
        catalog,
    )
    gone = writes.plan_delete(("Address", "shop", "dlq"), resource_version=0, catalog=catalog)
    assert gone.deletes == [("Address", "shop", "dlq")]  # ... or alone once no queue needs it


def test_a_plan_that_starts_naming_an_expiry_address_gives_every_space_using_it_its_queue() -> None:
    catalog = with_space(space("shop"), space("idle"))
    commit, _ = writes.plan_create(address("big", plan="standard-large-queue"), catalog=catalog)
    catalog = stored_after(commit, catalog)
    queue_plan = resources_pb2.AddressPlan()
    queue_plan.CopyFrom(catalog.address_plans["standard-large-queue"])
    queue_plan.spec.expiry_address = "expired"
    commit, _ = writes.plan_update(queue_plan, catalog=catalog)
    assert list(commit.puts) == [
        ("AddressPlan", "", "standard-large-queue"),
        ("Address", "shop", "expired"),  # `idle` has no address of that plan
    ]
    assert addresses_of(commit) == {
        "expired": ("expired", "queue", "standard-small-queue", SPACE_MANAGER)
    }


def test_a_queue_name_taken_by_another_address_gets_a_number() -> None:
    catalog = with_space()
    catalog.put(writes.created(address("dlq", value="orders")))  # a store written before
    commit, made = writes.plan_space_queues(catalog=catalog)
    assert [(q.address.metadata.name, q.violations) for q in made] == [("dlq-2", [])]
    assert addresses_of(commit) == {
        "dlq-2": ("DLQ", "queue", "standard-small-queue", SPACE_MANAGER)
    }


def test_a_write_that_needs_a_queue_the_quota_refuses_is_refused_saying_why() -> None:
    catalog = plans()
    tight = resources_pb2.AddressSpacePlan()
    tight.CopyFrom(catalog.address_space_plans["standard-small"])
    tight.metadata.name = "tight"
    tight.spec.quotas.max_addresses = 2
    catalog.put(tight)
    catalog.put(writes.created(space(plan="tight")))
    commit, _ = writes.plan_create(address("orders"), catalog=catalog)
    catalog = stored_after(commit, catalog)  # shop holds orders and its DLQ: full
    queue_plan = resources_pb2.AddressPlan()
    queue_plan.CopyFrom(catalog.address_plans["standard-small-queue"])
    queue_plan.spec.expiry_address = "expired"
    with pytest.raises(writes.Refused) as refused:
        writes.plan_update(queue_plan, catalog=catalog)
    assert refused.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert refused.value.message == (
        "address space 'shop' needs a queue for 'expired', the expiry address of address plan "
        "'standard-small-queue', and it cannot be created: Address shop/expired: metadata.name: "
        "address space 'shop' already has 2 addresses, the most its plan 'tight' allows"
    )


def test_a_space_plan_that_names_a_dead_letter_address_must_offer_a_queue_plan() -> None:
    catalog = plans()
    topics_only = resources_pb2.AddressSpacePlan(
        metadata={"name": "topics-only"},
        spec={"address_space_type": "standard", "address_plans": ["standard-small-topic"]},
    )
    topic_plan = resources_pb2.AddressPlan()
    topic_plan.CopyFrom(catalog.address_plans["standard-small-topic"])
    topic_plan.spec.dead_letter_address = "DLQ"
    catalog.put(topic_plan)
    with pytest.raises(writes.Refused) as refused:
        writes.plan_create(topics_only, catalog=catalog)
    assert refused.value.message == (
        "AddressSpacePlan topics-only: spec.address_plans: 'DLQ' is the dead-letter address of "
        "address plan 'standard-small-topic', which an address space of this plan gets as a "
        "queue, but the plan lists no queue plan to create it with"
    )


# ------------------------------------------------------------------ the config service


async def test_the_config_service_lists_the_queue_refuses_its_deletion_deletes_it_with_the_space(
    config_server: InProcessConfig, config_stub: config_pb2_grpc.ConfigServiceStub
) -> None:
    await config_stub.CreateAddressSpace(space(), timeout=10)
    await config_stub.CreateAddress(address("orders"), timeout=10)
    listed = await config_stub.ListAddresses(config_pb2.ListRequest(space="shop"), timeout=10)
    assert [
        (a.metadata.name, a.spec.address, a.spec.type, a.metadata.managed_by) for a in listed.items
    ] == [
        ("dlq", "DLQ", "queue", SPACE_MANAGER),
        # the default plan serves MQTT: the gateway's store queues came with the space
        ("mqtt-retained", "mqtt/retained", "queue", SPACE_MANAGER),
        ("mqtt-sessions", "mqtt/sessions", "queue", SPACE_MANAGER),
        ("mqtt-wills", "mqtt/wills", "queue", SPACE_MANAGER),
        ("orders", "orders", "queue", ""),
    ]
    ref = config_pb2.ObjectRef(space="shop", name="dlq")
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await config_stub.DeleteAddress(config_pb2.DeleteRequest(ref=ref), timeout=10)
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "holds 'DLQ', the dead-letter address of address plan" in str(refused.value.details())
    await config_stub.DeleteAddressSpace(
        config_pb2.DeleteRequest(ref=config_pb2.ObjectRef(name="shop")), timeout=10
    )
    listed = await config_stub.ListAddresses(config_pb2.ListRequest(space="shop"), timeout=10)
    assert list(listed.items) == []


async def test_a_store_written_before_gets_its_queues_when_config_starts(
    config_server: InProcessConfig,
) -> None:
    # stored by a config service that created no queues
    old = Commit(
        puts={
            ("AddressSpace", "", "shop"): writes.created(space()),
            ("Address", "shop", "orders"): writes.created(address("orders")),
        }
    )
    await config_server.store.commit(old, guard=await config_server.store.guard_revision())
    assert await config_server.servicer.create_space_queues() == 4  # DLQ, 3 MQTT stores
    assert await config_server.servicer.create_space_queues() == 0  # once is enough
    found = await config_server.store.get(("Address", "shop", "dlq"))
    assert found is not None
    assert (found.spec.address, found.metadata.managed_by) == ("DLQ", SPACE_MANAGER)
