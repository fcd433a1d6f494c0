"""The authorization matcher, pure: which addresses a pattern matches (`*` one segment or a run
within one, `#` any number of segments, separators literal), what a set of rules allows per
operation, and which strings are refused as patterns, with the text validation shows."""

from __future__ import annotations

import pytest
from enmasse.resources.authorization import (
    RECV,
    SEND,
    Rule,
    allows,
    allows_everything,
    pattern_problem,
)
from enmasse.v1 import resources_pb2


def rule(*addresses: str, operations: tuple[str, ...] = (SEND, RECV)) -> Rule:
    return Rule(addresses=addresses, operations=frozenset(operations))


MATCHES = [
    # exact
    ("pq", "pq", True),
    ("pq", "pq2", False),
    ("pq", "p", False),
    ("orders/eu", "orders/eu", True),
    # `*` as a whole segment: exactly one segment
    ("*", "pq", True),
    ("*", "orders/eu", False),
    ("*", "sensors.temp", False),
    ("sensors.*", "sensors.temp", True),
    ("sensors.*", "sensors", False),
    ("sensors.*", "sensors.temp.max", False),
    ("sensors.*", "sensors/temp", False),
    ("*.temp", "room1.temp", True),
    ("*.temp", "temp", False),
    ("a/*/c", "a/b/c", True),
    ("a/*/c", "a/b/b/c", False),
    # `*` inside a segment: a run of characters within it
    ("orders*", "orders", True),
    ("orders*", "orders-eu", True),
    ("orders*", "orders/eu", False),
    ("orders*", "order", False),
    ("*-audit", "prices-audit", True),
    ("*-audit", "prices/x-audit", False),
    ("a*z", "abcz", True),
    ("a*z", "a/z", False),
    # `#`: any number of whole segments, none included
    ("#", "pq", True),
    ("#", "orders/eu.north", True),
    ("#", "_dynamic/r1/ab.1", True),
    ("orders/#", "orders", True),
    ("orders/#", "orders/eu", True),
    ("orders/#", "orders/eu/north", True),
    ("orders/#", "orders/eu.north", True),
    ("orders/#", "ordersx", False),
    ("orders/#", "orders.eu", False),
    ("orders/#", "shop/orders/eu", False),
    ("#/audit", "audit", True),
    ("#/audit", "a/audit", True),
    ("#/audit", "a.b/audit", True),
    ("#/audit", "a/audits", False),
    ("#/audit", "a.audit", False),
    ("a/#/z", "a/z", True),
    ("a/#/z", "a/b/z", True),
    ("a/#/z", "a/b.c/d/z", True),
    ("a/#/z", "a/b", False),
    ("a/#/z", "az", False),
    ("a.#.*", "a.b", True),
    ("a.#.*", "a.b.c.d", True),
    ("a.#.*", "a", False),
    # regular-expression characters are plain text in a pattern
    ("a.b", "aXb", False),
    ("a-b", "a-b", True),
]


@pytest.mark.parametrize(("pattern", "address", "expected"), MATCHES)
def test_a_pattern_matches_by_segments(pattern: str, address: str, expected: bool) -> None:
    assert pattern_problem(pattern) is None
    assert allows([rule(pattern)], SEND, address) is expected


def test_rules_allow_per_operation() -> None:
    send_only = [rule("pq", operations=(SEND,))]
    assert allows(send_only, SEND, "pq")
    assert not allows(send_only, RECV, "pq")
    assert not allows(send_only, SEND, "pq2")
    mixed = [rule("pq", operations=(SEND,)), rule("orders/#", "sensors.*", operations=(RECV,))]
    assert allows(mixed, RECV, "orders/eu")
    assert allows(mixed, RECV, "sensors.temp")
    assert not allows(mixed, SEND, "orders/eu")
    assert not allows(mixed, RECV, "pq")
    assert not allows([], SEND, "pq"), "no rule allows nothing"
    assert not allows([rule("#", operations=("view", "manage"))], SEND, "pq")


def test_protobuf_rules_are_read_as_they_are() -> None:
    rules = [resources_pb2.AuthorizationRule(addresses=["orders/#"], operations=["recv"])]
    assert allows(rules, RECV, "orders/eu")
    assert not allows(rules, SEND, "orders/eu")


def test_everything_only_through_hash() -> None:
    assert allows_everything([rule("pq"), rule("#", operations=(SEND,))], SEND)
    assert not allows_everything([rule("#", operations=(SEND,))], RECV)
    assert not allows_everything([rule("*")], SEND), "`*` is one segment, not everything"
    assert not allows_everything([], SEND)


@pytest.mark.parametrize(
    ("pattern", "problem"),
    [
        ("", "a pattern must not be empty"),
        ("a" * 256, "a pattern must be at most 255 characters (got 256)"),
        ("orders eu", "'orders eu' holds ' ': a pattern is letters, digits and _ . - / # *"),
        ("orders\t", "'orders\t' holds '\\t': a pattern is letters, digits and _ . - / # *"),
        ("a:b", "'a:b' holds ':': a pattern is letters, digits and _ . - / # *"),
        ("a..b", "'a..b' has an empty segment"),
        ("/a", "'/a' has an empty segment"),
        ("a/", "'a/' has an empty segment"),
        (
            "orders#",
            "'orders#': '#' stands for any number of whole segments and must stand alone "
            "between separators (as in 'orders/#')",
        ),
        ("#/#", "'#/#' repeats '#': one already matches any number of segments"),
    ],
)
def test_bad_patterns_are_refused_with_a_reason(pattern: str, problem: str) -> None:
    assert pattern_problem(pattern) == problem


@pytest.mark.parametrize("pattern", ["pq", "*", "#", "orders*", "orders/#", "a/#/z", "#.temp"])
def test_good_patterns_pass(pattern: str) -> None:
    assert pattern_problem(pattern) is None
