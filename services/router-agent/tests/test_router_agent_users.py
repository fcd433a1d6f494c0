"""MessagingUsers on their way to the routers, pure: which users a router gets (with the stored
hash, SCRAM keys and authorization rules, by username, none without a hash), and that a user
change (password or rules) is a new generation; the space plan's login policy with them."""

from __future__ import annotations

from enmasse.resources.client_access import endpoint_users
from enmasse.resources.discovery import RouterEndpoint
from enmasse.router_agent.routing import LoginPolicy, SpaceRouting
from enmasse.v1 import resources_pb2, router_pb2

ROUTERS = [
    RouterEndpoint("r0", "127.0.0.1", admin_port=1000, amqp_port=1001, inter_router_port=1002),
    RouterEndpoint("r1", "127.0.0.1", admin_port=2000, amqp_port=2001, inter_router_port=2002),
]


def user(name: str, password_hash: str) -> resources_pb2.MessagingUser:
    return resources_pb2.MessagingUser(
        metadata=resources_pb2.Metadata(name=name, space="shop"),
        spec=resources_pb2.MessagingUserSpec(username=name, password_hash=password_hash),
    )


def test_routers_get_each_user_with_its_stored_hash() -> None:
    users = endpoint_users([user("bob", "scrypt$b"), user("alice", "scrypt$a"), user("eve", "")])
    assert users == (
        router_pb2.RouterUser(username="alice", password_hash="scrypt$a"),
        router_pb2.RouterUser(username="bob", password_hash="scrypt$b"),
    )


def test_a_user_change_is_a_new_generation_for_every_router() -> None:
    routing = SpaceRouting(space="shop")
    alice = endpoint_users([user("alice", "scrypt$1")])
    assert routing.update(routes={}, held_back={}, routers=ROUTERS, now_ms=100, users=alice)
    assert not routing.update(routes={}, held_back={}, routers=ROUTERS, now_ms=150, users=alice)
    new_password = endpoint_users([user("alice", "scrypt$2")])
    assert routing.update(routes={}, held_back={}, routers=ROUTERS, now_ms=200, users=new_password)
    assert routing.generation == 200
    for router in ROUTERS:
        config = routing.config(router.router_id)
        assert config.generation == 200
        assert list(config.users) == list(new_password)
    assert routing.update(routes={}, held_back={}, routers=ROUTERS, now_ms=300, users=())
    assert list(routing.config("r0").users) == []


def test_routers_get_each_users_rules_and_a_rule_change_is_a_new_generation() -> None:
    alice = user("alice", "scrypt$a")
    alice.spec.authorization.add(addresses=["orders/#", "pq"], operations=["send", "recv"])
    alice.spec.authorization.add(addresses=["*"], operations=["view"])
    rendered = endpoint_users([alice])
    assert rendered == (
        router_pb2.RouterUser(
            username="alice",
            password_hash="scrypt$a",
            authorization=[
                router_pb2.RouterRule(addresses=["orders/#", "pq"], operations=["send", "recv"]),
                router_pb2.RouterRule(addresses=["*"], operations=["view"]),
            ],
        ),
    )
    routing = SpaceRouting(space="shop")
    assert routing.update(routes={}, held_back={}, routers=ROUTERS, now_ms=100, users=rendered)
    del alice.spec.authorization[0]
    assert routing.update(
        routes={}, held_back={}, routers=ROUTERS, now_ms=200, users=endpoint_users([alice])
    ), "a rule taken away reaches the routers as a new generation"
    assert list(routing.config("r1").users[0].authorization) == [
        router_pb2.RouterRule(addresses=["*"], operations=["view"])
    ]


def test_routers_get_each_users_scram_keys() -> None:
    alice = user("alice", "scrypt$a")
    key = resources_pb2.ScramCredential(
        mechanism="SCRAM-SHA-256", salt=b"s", iterations=4096, stored_key=b"k", server_key=b"v"
    )
    alice.spec.scram_credentials.append(key)
    (rendered,) = endpoint_users([alice])
    assert list(rendered.scram_credentials) == [key]
    routing = SpaceRouting(space="shop")
    assert routing.update(routes={}, held_back={}, routers=ROUTERS, now_ms=100, users=[rendered])
    new_keys = endpoint_users([user("alice", "scrypt$a")])  # e.g. keys derived again: new salt
    assert routing.update(routes={}, held_back={}, routers=ROUTERS, now_ms=200, users=new_keys)


def test_the_plans_login_policy_reaches_every_router_and_a_change_is_a_new_generation() -> None:
    plan = resources_pb2.AddressSpacePlan(
        metadata=resources_pb2.Metadata(name="standard-small"),
        spec=resources_pb2.AddressSpacePlanSpec(address_space_type="standard"),
    )
    assert LoginPolicy.of(None) == LoginPolicy.of(plan) == LoginPolicy()
    routing = SpaceRouting(space="shop")
    assert routing.update(
        routes={}, held_back={}, routers=ROUTERS, now_ms=100, logins=LoginPolicy.of(plan)
    )
    config = routing.config("r0")
    assert (config.allow_anonymous, config.allow_plain_without_tls) == (False, False)
    plan.spec.allow_anonymous = plan.spec.allow_plain_without_tls = True  # a development plan
    assert routing.update(
        routes={}, held_back={}, routers=ROUTERS, now_ms=200, logins=LoginPolicy.of(plan)
    )
    for router in ROUTERS:
        config = routing.config(router.router_id)
        assert (config.generation, config.allow_anonymous, config.allow_plain_without_tls) == (
            200,
            True,
            True,
        )
    assert not routing.update(
        routes={}, held_back={}, routers=ROUTERS, now_ms=300, logins=LoginPolicy.of(plan)
    )
