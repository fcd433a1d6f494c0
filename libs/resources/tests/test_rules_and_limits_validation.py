"""What validation says of a MessagingUser's rule patterns (the matcher's own `pattern_problem`,
after the field) and of the plan limits that reach the routers (never negative)."""

from __future__ import annotations

import yaml
from enmasse.resources.contracts import max_message_size
from enmasse.resources.kinds import resource_of
from enmasse.resources.plans import load_default_plans, resource_from_manifest
from enmasse.resources.validation import Catalog, validate_resource
from enmasse.v1 import resources_pb2


def _messages(obj: resources_pb2.MessagingUser | resources_pb2.AddressSpacePlan) -> list[str]:
    catalog = Catalog()
    for resource in load_default_plans():
        catalog.put(resource)
    catalog.put(
        resource_of(
            resources_pb2.AddressSpace(
                metadata={"name": "shop"}, spec={"type": "standard", "plan": "standard-small"}
            )
        )
    )
    return [str(v) for v in validate_resource(resource_of(obj), catalog=catalog)]


def _user(*patterns: str) -> resources_pb2.MessagingUser:
    return resources_pb2.MessagingUser(
        metadata={"name": "alice", "space": "shop"},
        spec={
            "username": "alice",
            "password": "s3cret",
            "authorization": [{"addresses": list(patterns), "operations": ["send"]}],
        },
    )


def test_rule_patterns_are_checked_by_the_matcher() -> None:
    assert _messages(_user("orders/#", "sensors.*", "orders*", "#", "*")) == []
    where = "MessagingUser shop/alice: spec.authorization[0].addresses"
    assert _messages(_user("orders#", "a..b", "a b")) == [
        f"{where}: 'orders#': '#' stands for any number of whole segments and must stand alone "
        "between separators (as in 'orders/#')",
        f"{where}: 'a..b' has an empty segment",
        f"{where}: 'a b' holds ' ': a pattern is letters, digits and _ . - / # *",
    ]


def test_plan_limits_are_not_negative() -> None:
    plan = resources_pb2.AddressSpacePlan(
        metadata={"name": "limited"},
        spec={
            "address_space_type": "standard",
            "quotas": {
                "max_connections": 10,
                "max_connections_per_user": -1,
                "max_message_size": -1,
                "max_links_per_connection": -1,
                "max_sessions_per_connection": -1,
            },
        },
    )
    assert _messages(plan) == [
        *(
            f"AddressSpacePlan limited: spec.quotas.{name}: must not be negative "
            "(0 means unlimited)"
            for name in (
                "max_connections_per_user",
                "max_links_per_connection",
                "max_sessions_per_connection",
            )
        ),
        "AddressSpacePlan limited: spec.quotas.max_message_size: must be a positive number of "
        "bytes, got -1 (leave it out for the default, 104857600 bytes = 100 MiB)",
    ]


def _sized(size: int) -> resources_pb2.AddressSpacePlan:
    return resources_pb2.AddressSpacePlan(
        metadata={"name": "sized"},
        spec={"address_space_type": "standard", "quotas": {"max_message_size": size}},
    )


def test_a_plan_max_message_size_is_bounded() -> None:
    assert _messages(_sized(512 << 20)) == []
    assert _messages(_sized((512 << 20) + 1)) == [
        "AddressSpacePlan sized: spec.quotas.max_message_size: must be at most 536870912 bytes "
        "(512 MiB), got 536870913"
    ]


def test_a_plan_without_max_message_size_takes_100_mib() -> None:
    assert max_message_size(_sized(0).spec.quotas.max_message_size) == 100 * 1024 * 1024
    assert max_message_size(_sized(4096).spec.quotas.max_message_size) == 4096
    plans = [
        r.address_space_plan
        for r in load_default_plans()
        if r.WhichOneof("kind") == "address_space_plan"
    ]
    assert {p.metadata.name: max_message_size(p.spec.quotas.max_message_size) for p in plans} == {
        "standard-small": 100 << 20,
        "development": 100 << 20,
        "brokered-single": 100 << 20,
    }


def test_a_manifest_names_the_session_limit_as_the_other_quotas_and_it_is_checked() -> None:
    manifest = yaml.safe_load(
        """
        apiVersion: enmasse.io/v1
        kind: AddressSpacePlan
        metadata: {name: chatty}
        spec:
          addressSpaceType: standard
          quotas: {maxConnections: 10, maxLinksPerConnection: 20, maxSessionsPerConnection: -4}
        """
    )
    plan = resource_from_manifest(manifest).address_space_plan
    assert plan.spec.quotas.max_sessions_per_connection == -4
    assert _messages(plan) == [
        "AddressSpacePlan chatty: spec.quotas.max_sessions_per_connection: "
        "must not be negative (0 means unlimited)"
    ]


def test_the_default_standard_plans_limit_sessions_per_connection() -> None:
    plans = {
        r.address_space_plan.metadata.name: r.address_space_plan
        for r in load_default_plans()
        if r.WhichOneof("kind") == "address_space_plan"
    }
    assert {
        name: plan.spec.quotas.max_sessions_per_connection
        for name, plan in plans.items()
        if plan.spec.address_space_type == "standard"
    } == {"standard-small": 64, "development": 64}
