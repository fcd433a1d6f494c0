"""The one rule for address strings (`validation.address_problem`), message by message.

The same function answers for `spec.address` (the config API, `enmasse validate`), an AddressPlan's
dead-letter and expiry addresses, and the broker's EnsureQueue and attach; the config, CLI and
broker tests drive it through those doors, this one states the rule itself.
"""
# ruff: noqa: E501  (the exact messages read best on one line each)

from __future__ import annotations

import pytest
from enmasse.resources.kinds import resource_of
from enmasse.resources.plans import load_default_plans
from enmasse.resources.validation import (
    MAX_ADDRESS_LENGTH,
    Catalog,
    address_problem,
    validate_resource,
)
from enmasse.v1 import resources_pb2

RESERVED = "(reserved for the router network and the control plane)"

# Each refused address string with its exact message (as it follows `spec.address: `).
BAD_ADDRESSES = [
    ("a..b", "'a..b' has an empty segment (segments are separated by '/' and '.')"),
    ("a\x00b", "'a\\x00b' must not contain control characters"),
    ("bell\x07", "'bell\\x07' must not contain control characters"),
    (
        "a::b",
        "'a::b' must not contain '::', which is reserved for subscriptions (<topic>::<name> on a broker)",
    ),
    ("ordérs", "'ord\\xe9rs' must hold ASCII characters only"),
    ("_dynamic/x", f"'_dynamic/x' must not start with '_dynamic/' {RESERVED}"),
    ("_mesh/x", f"'_mesh/x' must not start with '_mesh/' {RESERVED}"),
    ("$x", f"'$x' must not start with '$' {RESERVED}"),
    ("x" * (MAX_ADDRESS_LENGTH + 1), "must be at most 255 characters (got 256)"),
    ("", "must not be empty"),
    ("two words", "'two words' must not contain whitespace"),
    ("a:b", "'a:b' holds ':': an address is letters, digits and _ . - / #"),
    ("a*b", "'a*b' holds '*': an address is letters, digits and _ . - / #"),
    ("orders/", "'orders/' has an empty segment (segments are separated by '/' and '.')"),
    ("/orders", "'/orders' has an empty segment (segments are separated by '/' and '.')"),
    (".hidden", "'.hidden' has an empty segment (segments are separated by '/' and '.')"),
    ("-orders", "'-orders' must start with a letter, a digit or '_'"),
]
GOOD_ADDRESSES = ["orders", "orders/eu.west", "DLQ", "_private", "_dynamic", "a#1", "x" * 255]


@pytest.mark.parametrize(("address", "expected"), BAD_ADDRESSES)
def test_a_bad_address_string_is_refused_with_its_reason(address: str, expected: str) -> None:
    assert address_problem(address) == expected


@pytest.mark.parametrize("address", GOOD_ADDRESSES)
def test_a_good_address_string_passes(address: str) -> None:
    assert address_problem(address) is None


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        ("prices::app|ticker", None),
        ("prices::sub-1", None),
        ("prices::", "'prices::' names no subscription after '::'"),
        ("a..b::x", "'a..b' has an empty segment (segments are separated by '/' and '.')"),
        ("_mesh/x::y", f"'_mesh/x' must not start with '_mesh/' {RESERVED}"),
        ("t::a\x00", "subscription name 'a\\x00' must not contain control characters"),
        ("t::" + "n" * 1025, "subscription name must be at most 1024 characters (got 1025)"),
    ],
)
def test_where_a_subscription_queue_is_meant_topic_and_name_are_checked(
    address: str, expected: str | None
) -> None:
    assert address_problem(address, subscription_queue=True) == expected


def catalog() -> Catalog:
    found = Catalog()
    for resource in load_default_plans():
        found.put(resource)
    found.put(
        resources_pb2.AddressSpace(
            metadata={"name": "shop"}, spec={"type": "standard", "plan": "standard-small"}
        )
    )
    return found


@pytest.mark.parametrize(("address", "expected"), BAD_ADDRESSES[:9])
def test_spec_address_is_held_to_the_rule(address: str, expected: str) -> None:
    obj = resources_pb2.Address(
        metadata={"name": "bad", "space": "shop"},
        spec={"address": address, "type": "queue", "plan": "standard-small-queue"},
    )
    found = validate_resource(resource_of(obj), catalog=catalog())
    assert [str(v) for v in found] == [f"Address shop/bad: spec.address: {expected}"]
    assert not any(v.precondition for v in found)  # bad input: INVALID_ARGUMENT


def test_a_plans_dead_letter_and_expiry_addresses_are_held_to_the_rule() -> None:
    plan = resources_pb2.AddressPlan(
        metadata={"name": "p"},
        spec={
            "address_type": "queue",
            "broker": 0.1,
            "dead_letter_address": "_mesh/dlq",
            "expiry_address": "expired",
        },
    )
    assert [str(v) for v in validate_resource(resource_of(plan), catalog=catalog())] == [
        f"AddressPlan p: spec.dead_letter_address: '_mesh/dlq' must not start with '_mesh/' {RESERVED}"
    ]
