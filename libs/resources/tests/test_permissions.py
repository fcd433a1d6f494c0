"""The per-connection decision every client endpoint makes (a router, a brokered space's broker),
pure: who a connection is, what its rules allow, browsing (`view`, which `recv` implies, on a
queue only), and the words of each refusal; pushed users validated as a whole."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from enmasse.common.passwords import hash_password
from enmasse.resources.authorization import Rule
from enmasse.resources.client_access import UserError, client_users_from_proto, endpoint_users
from enmasse.resources.permissions import Permissions, browses, logged_in_as
from enmasse.v1 import resources_pb2, router_pb2


def rules(**operations: list[str]) -> tuple[Rule, ...]:
    return tuple(
        Rule(addresses=tuple(a), operations=frozenset({op})) for op, a in operations.items()
    )


def asked(answer: bool, seen: list[str]) -> Callable[[], bool]:
    """An `is_queue` that records that it was asked."""

    def is_queue() -> bool:
        seen.append("asked")
        return answer

    return is_queue


def test_who_a_connection_is() -> None:
    users = {"alice": "scrypt$a"}
    assert logged_in_as(None, configured=users) is None
    assert logged_in_as("anonymous", configured=users) is None, "SASL ANONYMOUS"
    assert logged_in_as("alice", configured=users) == "alice"
    assert logged_in_as("gone", configured=users) == "gone", "removed since: no rules, no rights"
    assert [browses(mode) for mode in ("copy", "move", None)] == [True, False, False]


def test_receiving_and_browsing() -> None:
    viewer = Permissions(user="viewer", rules=rules(view=["pq", "events"]))
    reader = Permissions(user="reader", rules=rules(recv=["pq"]))
    sender = Permissions(user="sender", rules=rules(send=["pq"]))
    seen: list[str] = []
    queue, other = asked(True, seen), asked(False, seen)
    assert reader.receive_refusal("pq", browse=False, is_queue=queue) is None
    assert reader.receive_refusal("pq", browse=True, is_queue=queue) is None, "recv implies view"
    assert seen == [], "a user who may receive is not asked about the address"
    assert viewer.receive_refusal("pq", browse=True, is_queue=queue) is None
    assert viewer.receive_refusal("pq", browse=False, is_queue=queue) == (
        "user 'viewer' may not recv from 'pq'"
    )
    assert viewer.receive_refusal("events", browse=True, is_queue=other) == (
        "user 'viewer' may not recv from 'events': only a queue is browsed"
    )
    seen.clear()
    assert sender.receive_refusal("pq", browse=True, is_queue=queue) == (
        "user 'sender' may not view 'pq'"
    )
    assert seen == [], "no right on it: nothing is told of the address, not even its kind"
    anonymous = Permissions(user=None)
    assert anonymous.receive_refusal("pq", browse=True, is_queue=other) is None
    assert anonymous.may("send", "anything")
    assert anonymous.sends_everywhere
    assert not Permissions(user="gone").may("view", "pq")


HASH = hash_password("secret")


def _user(name: str, *rules: router_pb2.RouterRule) -> router_pb2.RouterUser:
    return router_pb2.RouterUser(username=name, password_hash=HASH, authorization=rules)


def test_pushed_users_are_validated_as_a_whole() -> None:
    rule = router_pb2.RouterRule(addresses=["orders/#"], operations=["send", "view"])
    users = client_users_from_proto([_user("alice", rule)])
    assert users.rules == {
        "alice": (Rule(addresses=("orders/#",), operations=frozenset({"send", "view"})),)
    }
    assert users.scram == {"alice": {}}
    for bad, error in (
        ([_user("alice"), _user("alice")], "user 'alice' is listed twice"),
        (
            [router_pb2.RouterUser(username="bob", password_hash="plain")],
            "user 'bob' has no usable password hash (expected scrypt$<n>$<r>$<p>$<salt>$<hash>)",
        ),
        (
            [_user("carol", router_pb2.RouterRule(addresses=["a..b"], operations=["recv"]))],
            "user 'carol': rule 1: 'a..b' has an empty segment",
        ),
    ):
        with pytest.raises(UserError) as refused:
            client_users_from_proto(bad)
        assert str(refused.value) == error


def test_endpoints_get_each_user_with_a_hash_by_name() -> None:
    def user(name: str, password_hash: str) -> resources_pb2.MessagingUser:
        return resources_pb2.MessagingUser(
            metadata=resources_pb2.Metadata(name=name, space="shop"),
            spec=resources_pb2.MessagingUserSpec(username=name, password_hash=password_hash),
        )

    pushed = endpoint_users([user("bob", "scrypt$b"), user("alice", "scrypt$a"), user("eve", "")])
    assert [u.username for u in pushed] == ["alice", "bob"]
