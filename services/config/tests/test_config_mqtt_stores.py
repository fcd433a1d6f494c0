"""A space whose plan serves MQTT holds the gateway's store queues from its creation on, and the
gateway's store identity stays its own: the write path's decisions and the rules, without a
network (the default plans, as a fresh store has them), and the router users the router-agent
builds for such a space.

A standard-small space is stored with `mqtt/retained`, `mqtt/wills`, `mqtt/sessions` (durable:
the smallest persistent queue plan, managed by `enmasse-space`) and the `DLQ` that plan names,
in the creating commit; a plan without `mqtt` gives none; a plan that starts serving MQTT gives
every space of it its stores. A store queue cannot be deleted alone or declared as anything but
a queue; a plan serving MQTT must be standard and offer a persistent queue plan; no
MessagingUser may be called `$mqtt-store`. The store identity goes to the routers of a space
whose plan serves MQTT only, with send, recv and view on the three queues and send elsewhere
(wills), and a tenant's user of that name never reaches a router.
"""

from __future__ import annotations

import grpc
import pytest
from enmasse.common.passwords import verify_password
from enmasse.config import writes
from enmasse.config.store import Commit
from enmasse.resources.client_access import endpoint_users
from enmasse.resources.contracts import MQTT_STORE_USER
from enmasse.resources.dead_letters import SPACE_MANAGER
from enmasse.resources.mqtt_stores import space_users, store_identity
from enmasse.resources.plans import load_default_plans
from enmasse.resources.validation import Catalog
from enmasse.v1 import resources_pb2, router_pb2

STORES = {
    "mqtt-retained": ("mqtt/retained", "queue", "standard-small-queue", SPACE_MANAGER),
    "mqtt-wills": ("mqtt/wills", "queue", "standard-small-queue", SPACE_MANAGER),
    "mqtt-sessions": ("mqtt/sessions", "queue", "standard-small-queue", SPACE_MANAGER),
}


def plans() -> Catalog:
    out = Catalog()
    for plan in load_default_plans():
        out.put(plan)
    return out


def space(name: str = "iot", *, plan: str = "standard-small") -> resources_pb2.AddressSpace:
    return resources_pb2.AddressSpace(
        metadata={"name": name}, spec={"type": "standard", "plan": plan}
    )


def addresses_of(commit: Commit) -> dict[str, tuple[str, str, str, str]]:
    return {
        key[2]: (obj.spec.address, obj.spec.type, obj.spec.plan, obj.metadata.managed_by)
        for key, obj in commit.puts.items()
        if key[0] == "Address"
    }


def stored_after(commit: Commit, catalog: Catalog) -> Catalog:
    for obj in commit.puts.values():
        catalog.put(obj)
    for key in commit.deletes:
        catalog.remove(key)
    return catalog


def space_plan(catalog: Catalog, name: str, *, mqtt: bool) -> resources_pb2.AddressSpacePlan:
    plan = resources_pb2.AddressSpacePlan()
    plan.CopyFrom(catalog.address_space_plans["standard-small"])
    plan.metadata.name = name
    plan.spec.mqtt = mqtt
    return plan


def test_a_space_of_a_plan_serving_mqtt_is_stored_with_its_store_queues() -> None:
    commit, _ = writes.plan_create(space(), catalog=plans())
    assert addresses_of(commit) == {
        **STORES,
        # the store queues' plan names a dead-letter address: the space has it too
        "dlq": ("DLQ", "queue", "standard-small-queue", SPACE_MANAGER),
    }
    assert plans().address_plans["standard-small-queue"].spec.persistent  # durable
    assert ("AddressSpace", "", "iot") in commit.puts


def test_a_space_of_a_plan_without_mqtt_gets_no_store_queue() -> None:
    catalog = plans()
    catalog.put(space_plan(catalog, "no-mqtt", mqtt=False))
    commit, _ = writes.plan_create(space(plan="no-mqtt"), catalog=catalog)
    assert addresses_of(commit) == {}


def test_a_plan_that_starts_serving_mqtt_gives_every_space_of_it_its_stores() -> None:
    catalog = plans()
    catalog.put(writes.created(space_plan(catalog, "later", mqtt=False)))
    catalog.put(writes.created(space("a", plan="later")))
    catalog.put(writes.created(space("b", plan="later")))
    commit, _ = writes.plan_update(space_plan(catalog, "later", mqtt=True), catalog=catalog)
    made = {(key[1], key[2]) for key in commit.puts if key[0] == "Address"}
    assert made == {(s, name) for s in ("a", "b") for name in [*STORES, "dlq"]}


def test_a_store_queue_cannot_be_deleted_alone_and_goes_with_its_space() -> None:
    catalog = plans()
    commit, _ = writes.plan_create(space(), catalog=catalog)
    catalog = stored_after(commit, catalog)
    with pytest.raises(writes.Refused) as refused:
        writes.plan_delete(("Address", "iot", "mqtt-wills"), resource_version=0, catalog=catalog)
    assert refused.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert refused.value.message == (
        "Address iot/mqtt-wills: metadata.name: holds 'mqtt/wills', the MQTT will store address "
        "of address space plan 'standard-small', which the MQTT gateway of address space 'iot' "
        "uses: it goes with the space, or once its plan no longer serves MQTT"
    )
    deleted = writes.plan_delete(("AddressSpace", "", "iot"), resource_version=0, catalog=catalog)
    assert deleted.emptied_spaces == ["iot"]


def test_a_store_address_must_be_a_queue() -> None:
    catalog = plans()
    catalog = stored_after(writes.plan_create(space(), catalog=catalog)[0], catalog)
    catalog.remove(("Address", "iot", "mqtt-retained"))  # as if it were not there yet
    topic = resources_pb2.Address(
        metadata={"name": "retained", "space": "iot"},
        spec={"address": "mqtt/retained", "type": "topic", "plan": "standard-small-topic"},
    )
    with pytest.raises(writes.Refused) as refused:
        writes.plan_create(topic, catalog=catalog)
    assert refused.value.message == (
        "Address iot/retained: spec.type: address 'mqtt/retained' is the MQTT retained-message "
        "store address of address space plan 'standard-small' in address space 'iot': it must "
        "be a queue, not 'topic'"
    )


def test_a_plan_serving_mqtt_must_be_standard_with_a_persistent_queue_plan() -> None:
    catalog = plans()
    brokered = resources_pb2.AddressSpacePlan()
    brokered.CopyFrom(catalog.address_space_plans["brokered-single"])
    brokered.metadata.name = "jms-mqtt"
    brokered.spec.mqtt = True
    with pytest.raises(writes.Refused) as refused:
        writes.plan_create(brokered, catalog=catalog)
    assert refused.value.message == (
        "AddressSpacePlan jms-mqtt: spec.mqtt: applies to standard address spaces only "
        "(their MQTT gateway)"
    )
    routed = resources_pb2.AddressSpacePlan(
        metadata={"name": "routed"},
        spec={
            "address_space_type": "standard",
            "address_plans": ["standard-anycast", "standard-multicast"],
            "mqtt": True,
        },
    )
    with pytest.raises(writes.Refused) as refused:
        writes.plan_create(routed, catalog=catalog)
    assert refused.value.message == (
        "AddressSpacePlan routed: spec.mqtt: an address space of this plan gets the MQTT "
        "gateway's store queues (mqtt/retained, mqtt/wills, mqtt/sessions), but the plan lists "
        "no persistent queue plan to create them with"
    )


def test_no_messaging_user_may_take_the_store_identity() -> None:
    catalog = stored_after(writes.plan_create(space(), catalog=plans())[0], plans())
    impostor = resources_pb2.MessagingUser(
        metadata={"name": "gateway", "space": "iot"},
        spec={"username": MQTT_STORE_USER, "password": "guess"},
    )
    with pytest.raises(writes.Refused) as refused:
        writes.plan_create(impostor, catalog=catalog)
    assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert refused.value.message == (
        "MessagingUser iot/gateway: spec.username: '$mqtt-store' is reserved: the MQTT "
        "gateway's store identity logs in as it"
    )


def test_the_store_identity_reaches_the_routers_of_a_space_serving_mqtt_only() -> None:
    catalog = plans()
    identity = store_identity("store-secret")
    declared = resources_pb2.MessagingUser(
        metadata={"name": "app", "space": "iot"},
        spec={
            "username": "app",
            "password": "app-password",
            "authorization": [{"addresses": ["telemetry"], "operations": ["send"]}],
        },
    )
    with_space = stored_after(writes.plan_create(space(), catalog=catalog)[0], catalog)
    _, app = writes.plan_create(declared, catalog=with_space)
    # a user of that name stored before the rule refused it never reaches a router
    impostor = resources_pb2.MessagingUser()
    impostor.CopyFrom(app)
    impostor.spec.username = MQTT_STORE_USER
    users = endpoint_users([app, impostor])

    serving = space_users(
        users, space_plan=catalog.address_space_plans["standard-small"], identity=identity
    )
    assert [u.username for u in serving] == ["app", MQTT_STORE_USER]
    store = serving[1]
    assert store is identity
    assert verify_password("store-secret", store.password_hash)
    assert list(store.authorization) == [
        router_pb2.RouterRule(
            addresses=["mqtt/retained", "mqtt/wills", "mqtt/sessions"],
            operations=["send", "recv", "view"],
        ),
        # a will goes to its client's topic: the will service sends on the client's behalf
        router_pb2.RouterRule(addresses=["#"], operations=["send"]),
    ]
    # the tenant's user keeps exactly its own rules
    assert [list(r.addresses) for r in serving[0].authorization] == [["telemetry"]]

    quiet = space_plan(catalog, "no-mqtt", mqtt=False)
    assert [u.username for u in space_users(users, space_plan=quiet, identity=identity)] == ["app"]
    assert [u.username for u in space_users(users, space_plan=None, identity=identity)] == ["app"]
