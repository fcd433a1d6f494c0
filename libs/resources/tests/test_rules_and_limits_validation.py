"""What validation says of a MessagingUser's rule patterns (the matcher's own `pattern_problem`,
after the field) and of the plan limits that reach the routers (never negative)."""

from __future__ import annotations

from enmasse.resources.kinds import resource_of
from enmasse.resources.plans import load_default_plans
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
            },
        },
    )
    assert _messages(plan) == [
        f"AddressSpacePlan limited: spec.quotas.{name}: must not be negative (0 means unlimited)"
        for name in ("max_connections_per_user", "max_message_size", "max_links_per_connection")
    ]
