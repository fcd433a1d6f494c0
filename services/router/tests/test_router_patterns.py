"""Address patterns, without a network: the matcher (MQTT filter syntax), who may hold a pattern,
which addresses of a configuration a pattern matches, and what a pattern link is told at attach
and when the configuration changes (`PatternLinks`, on a stand-in link that records what it is
sent: the same calls the engine's links take)."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
from enmasse.amqp import codec
from enmasse.amqp.engine import Condition
from enmasse.resources import address_patterns as patterns
from enmasse.resources.authorization import Rule
from enmasse.resources.permissions import Permissions
from enmasse.router.config import AddressRoute, Distribution, RouterConfig
from enmasse.router.patterns import PatternLinks, matched_addresses, pattern_refusal


@pytest.mark.parametrize(
    ("pattern", "address", "matched"),
    [
        ("sensors/+", "sensors/kitchen", True),
        ("sensors/+", "sensors/kitchen/temp", False),
        ("sensors/+", "sensors", False),
        ("sensors/+/temp", "sensors/hall/temp", True),
        ("sensors/+/temp", "sensors/hall/humidity", False),
        ("sensors/#", "sensors", True),  # '#' matches the parent level too
        ("sensors/#", "sensors/kitchen/temp", True),
        ("sensors/#", "sensorsx/kitchen", False),
        ("#", "anything/at/all", True),
        ("+", "top", True),
        ("+", "a/b", False),
        ("+/+", "a/", True),  # an empty level is a level
        ("sensors/+", "sensors/a.b", True),  # '.' is no level separator here
        ("#", "$sys/uptime", False),  # '$' addresses: only by their literal first level
        ("+/uptime", "$sys/uptime", False),
        ("$sys/#", "$sys/uptime", True),
        ("sensors/kitchen", "sensors/kitchen", True),  # a literal pattern matches itself
        ("sensors/kitchen", "sensors/hall", False),
    ],
)
def test_the_matcher_reads_mqtt_filters(pattern: str, address: str, matched: bool) -> None:
    assert patterns.matches(pattern, address) is matched


@pytest.mark.parametrize(
    ("pattern", "problem"),
    [
        ("", "an address pattern must not be empty"),
        ("a/#/b", "'a/#/b': '#' must be the whole last level (as in 'sensors/#')"),
        ("a/b#", "'a/b#': '#' must be the whole last level (as in 'sensors/#')"),
        ("a/b+/c", "'a/b+/c': '+' must be a whole level (as in 'sensors/+/temp')"),
        ("a/+/#", None),
        ("#", None),
    ],
)
def test_a_malformed_pattern_is_named(pattern: str, problem: str | None) -> None:
    assert patterns.pattern_problem(pattern) == problem


def test_a_trailing_hash_is_probed_at_every_depth() -> None:
    assert patterns.recv_probes("a/+", depth=3) == ["a/+"]
    assert patterns.recv_probes("a/#", depth=2) == ["a", "a/+", "a/+/+"]
    assert patterns.recv_probes("#", depth=2) == ["+", "+/+"]


def _user(*recv: str) -> Permissions:
    return Permissions(user="u", rules=(Rule(addresses=recv, operations=frozenset({"recv"})),))


@pytest.mark.parametrize(
    ("rules", "pattern", "allowed"),
    [
        (("#",), "#", True),
        (("sensors/#",), "sensors/#", True),
        (("sensors/#",), "sensors/+/temp", True),
        (("sensors/*",), "sensors/+", True),
        (("sensors/*",), "sensors/#", False),  # '#' reaches sensors/a/b, which '*' does not
        (("sensors/kitchen",), "sensors/+", False),
        (("sensors/kitchen", "sensors/hall"), "sensors/+", False),  # not every one there could be
        (("sensors", "sensors/*/*/#"), "sensors/#", False),  # sensors/x is not covered
        (("sensors", "sensors/*/#"), "sensors/#", True),
        (("*",), "#", False),
        (("a*",), "+", False),
        (("telemetry/#",), "#", False),
    ],
)
def test_a_pattern_needs_recv_on_everything_it_can_match(
    rules: tuple[str, ...], pattern: str, allowed: bool
) -> None:
    refusal = pattern_refusal(_user(*rules), pattern)
    assert (refusal is None) is allowed
    if not allowed:
        assert refusal == (
            f"user 'u' may not recv from every address '{pattern}' matches: "
            "a pattern receiver needs recv on all of them"
        )


def test_an_anonymous_connection_may_hold_any_pattern() -> None:
    assert pattern_refusal(Permissions(user=None), "#") is None


def _config(generation: int, **addresses: str) -> RouterConfig:
    return RouterConfig(
        generation=generation,
        addresses={
            name.replace("__", "/"): AddressRoute(
                address=name.replace("__", "/"), distribution=Distribution(kind)
            )
            for name, kind in addresses.items()
        },
    )


def test_a_pattern_matches_multicast_and_topic_addresses_only() -> None:
    config = _config(
        1, s__a="multicast", s__b="topic", s__c="queue", s__d="anycast", s__e="subscription"
    )
    assert matched_addresses("s/+", config) == {"s/a": "multicast", "s/b": "topic"}
    assert matched_addresses("nothing/+", config) == {}


@dataclass(eq=False)
class StandInLink:
    """What `PatternLinks` calls on a link, recorded."""

    address: str
    permissions: Permissions
    sent: list[dict[str, Any]] = field(default_factory=list)
    accepted: bool = False
    refused: Condition | None = None
    closed: Condition | None = None

    @property
    def connection(self) -> Any:
        return SimpleNamespace(context=SimpleNamespace(permissions=self.permissions))

    def accept(self) -> None:
        self.accepted = True

    def refuse(self, condition: Condition) -> None:
        self.refused = condition

    def close(self, condition: Condition) -> None:
        self.closed = condition

    def send_settled(self, payload: bytes) -> None:
        self.sent.append(codec.read_application_properties(payload))


def _attach(links: PatternLinks, link: StandInLink, config: RouterConfig) -> None:
    links.attach(link, permissions=link.permissions, config=config)  # type: ignore[arg-type]


def _matched(address: str, kind: str) -> dict[str, str]:
    return {"event": "matched", "address": address, "type": kind}


def test_a_pattern_link_is_told_what_matches_now_and_what_comes_later() -> None:
    links = PatternLinks()
    link = StandInLink("sensors/#", _user("#"))
    _attach(links, link, _config(1, sensors__a="multicast"))
    assert link.accepted
    assert link.sent == [_matched("sensors/a", "multicast"), {"event": "current"}]
    link.sent.clear()
    links.config_changed(_config(2, sensors__a="multicast", sensors__b__c="topic", other="topic"))
    assert link.sent == [_matched("sensors/b/c", "topic")]
    link.sent.clear()
    links.config_changed(_config(3, sensors__b__c="multicast"))  # a deleted, b/c changed type
    assert link.sent == [
        {"event": "unmatched", "address": "sensors/a", "type": ""},
        {"event": "unmatched", "address": "sensors/b/c", "type": ""},
        _matched("sensors/b/c", "multicast"),
    ]


def test_a_pattern_that_matches_nothing_waits() -> None:
    links = PatternLinks()
    link = StandInLink("later/+", _user("#"))
    _attach(links, link, _config(1))
    assert link.accepted
    assert link.sent == [{"event": "current"}]
    links.config_changed(_config(2, later__x="topic"))
    assert link.sent[-1] == _matched("later/x", "topic")


def test_only_addresses_the_user_may_receive_from_are_told() -> None:
    links = PatternLinks()
    # recv on `s/*`: the pattern `s/+` is theirs, but `s/a.b` is two segments to a rule.
    link = StandInLink("s/+", _user("s/*"))
    config = _config(1, s__a="topic", **{"s__a.b": "topic"})
    _attach(links, link, config)
    assert link.sent == [_matched("s/a", "topic"), {"event": "current"}]


def test_a_pattern_link_whose_user_lost_the_right_is_closed() -> None:
    links = PatternLinks()
    link = StandInLink("s/#", _user("#"))
    _attach(links, link, _config(1, s__a="topic"))
    link.permissions = _user("s/a")  # a new generation's rules
    links.config_changed(_config(2, s__a="topic", s__b="topic"))
    assert link.closed == Condition(
        "amqp:unauthorized-access",
        "user 'u' may not recv from every address 's/#' matches: "
        "a pattern receiver needs recv on all of them",
    )
    assert link not in links.receivers


def test_a_pattern_beyond_the_users_rights_is_refused() -> None:
    links = PatternLinks()
    link = StandInLink("#", _user("telemetry/#"))
    _attach(links, link, _config(1, telemetry="topic"))
    assert not link.accepted
    assert link.sent == []
    assert link.refused == Condition(
        "amqp:unauthorized-access",
        "user 'u' may not recv from every address '#' matches: "
        "a pattern receiver needs recv on all of them",
    )
    malformed = StandInLink("a/#/b", _user("#"))
    _attach(links, malformed, _config(1))
    assert malformed.refused == Condition(
        "amqp:invalid-field", "'a/#/b': '#' must be the whole last level (as in 'sensors/#')"
    )
