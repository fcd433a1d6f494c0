"""What a brokered space's broker is told of its clients, pure: the space's users as routers get
them (hash, SCRAM keys, rules; none without a hash), the plan's login policy and its limits as
they are; one version per content, a new one for any change; pushed to a broker that holds any
other version (a restarted one holds none), not to one that holds it."""

from __future__ import annotations

from enmasse.storage_controller.client_access import access_to_push, client_access
from enmasse.v1 import resources_pb2, router_pb2

KEYS = resources_pb2.ScramCredential(
    mechanism="SCRAM-SHA-256",
    salt=b"salt",
    iterations=4096,
    stored_key=b"s" * 32,
    server_key=b"k" * 32,
)


def user(
    name: str,
    password_hash: str = "scrypt$x",
    *,
    space: str = "jms",
    rules: tuple[tuple[list[str], list[str]], ...] = ((["#"], ["send", "recv"]),),
) -> resources_pb2.MessagingUser:
    return resources_pb2.MessagingUser(
        metadata=resources_pb2.Metadata(name=name, space=space),
        spec=resources_pb2.MessagingUserSpec(
            username=name,
            password_hash=password_hash,
            scram_credentials=[KEYS],
            authorization=[
                resources_pb2.AuthorizationRule(addresses=addresses, operations=operations)
                for addresses, operations in rules
            ],
        ),
    )


def plan(**spec: object) -> resources_pb2.AddressSpacePlan:
    return resources_pb2.AddressSpacePlan(
        metadata=resources_pb2.Metadata(name="brokered-single"),
        spec=resources_pb2.AddressSpacePlanSpec(address_space_type="brokered", **spec),  # type: ignore[arg-type]
    )


QUOTAS = resources_pb2.Quotas(
    max_addresses=1000,
    max_brokers=1,
    max_routers=3,
    max_connections=500,
    max_connections_per_user=20,
    max_message_size=65536,
    max_links_per_connection=50,
    max_sessions_per_connection=4,
)


def test_the_broker_gets_the_spaces_users_its_plans_policy_and_limits() -> None:
    access = client_access(
        space="jms",
        plan=plan(quotas=QUOTAS, allow_plain_without_tls=True),
        users=[user("bob"), user("alice", rules=((["invoices"], ["send"]),)), user("eve", "")],
    )
    assert access.space == "jms"
    assert [u.username for u in access.users] == ["alice", "bob"], "by name; none without a hash"
    alice = access.users[0]
    assert (alice.password_hash, list(alice.scram_credentials)) == ("scrypt$x", [KEYS])
    assert list(alice.authorization) == [
        router_pb2.RouterRule(addresses=["invoices"], operations=["send"])
    ]
    assert (access.allow_anonymous, access.allow_plain_without_tls) == (False, True)
    # the one broker is the whole client endpoint: the plan's numbers as they are, not shared
    assert access.limits == router_pb2.RouterLimits(
        max_connections=500,
        max_connections_per_user=20,
        max_message_size=65536,
        max_links_per_connection=50,
        max_sessions_per_connection=4,
    )
    assert len(access.version) == 64


def test_a_missing_plan_allows_logins_and_nothing_more() -> None:
    access = client_access(space="jms", plan=None, users=[user("alice")])
    assert (access.allow_anonymous, access.allow_plain_without_tls) == (False, False)
    assert access.limits == router_pb2.RouterLimits(max_message_size=100 << 20)
    assert [u.username for u in access.users] == ["alice"]


def test_one_version_per_content() -> None:
    def version(**changes: object) -> str:
        inputs: dict[str, object] = {
            "space": "jms",
            "plan": plan(quotas=QUOTAS),
            "users": [user("alice"), user("bob")],
            **changes,
        }
        return client_access(**inputs).version  # type: ignore[arg-type]

    same = version()
    assert version(users=[user("bob"), user("alice")]) == same, "the order users come in"
    changed = [
        version(users=[user("alice", "scrypt$new"), user("bob")]),  # a new password
        version(users=[user("alice", rules=((["#"], ["send"]),)), user("bob")]),  # new rules
        version(users=[user("alice")]),  # a user removed
        version(plan=plan(quotas=QUOTAS, allow_anonymous=True)),  # the login policy
        version(plan=plan(quotas=resources_pb2.Quotas(max_connections=1))),  # the limits
        version(space="other"),
    ]
    assert len({same, *changed}) == 1 + len(changed)


def test_pushed_to_a_broker_that_holds_another_version_only() -> None:
    wanted = client_access(space="jms", plan=plan(quotas=QUOTAS), users=[user("alice")])
    assert access_to_push(wanted, held="") is wanted, "a broker that (re)started holds none"
    assert access_to_push(wanted, held="an older version") is wanted
    assert access_to_push(wanted, held=wanted.version) is None
