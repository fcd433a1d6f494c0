"""MessagingUsers on their way to the routers, pure: which users a router gets (with the stored
hash, by username, none without a hash), and that a user change is a new generation."""

from __future__ import annotations

from enmasse.resources.discovery import RouterEndpoint
from enmasse.router_agent.routing import SpaceRouting, router_users
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
    users = router_users([user("bob", "scrypt$b"), user("alice", "scrypt$a"), user("eve", "")])
    assert users == (
        router_pb2.RouterUser(username="alice", password_hash="scrypt$a"),
        router_pb2.RouterUser(username="bob", password_hash="scrypt$b"),
    )


def test_a_user_change_is_a_new_generation_for_every_router() -> None:
    routing = SpaceRouting(space="shop")
    alice = router_users([user("alice", "scrypt$1")])
    assert routing.update(routes={}, held_back={}, routers=ROUTERS, now_ms=100, users=alice)
    assert not routing.update(routes={}, held_back={}, routers=ROUTERS, now_ms=150, users=alice)
    new_password = router_users([user("alice", "scrypt$2")])
    assert routing.update(routes={}, held_back={}, routers=ROUTERS, now_ms=200, users=new_password)
    assert routing.generation == 200
    for router in ROUTERS:
        config = routing.config(router.router_id)
        assert config.generation == 200
        assert list(config.users) == list(new_password)
    assert routing.update(routes={}, held_back={}, routers=ROUTERS, now_ms=300, users=())
    assert list(routing.config("r0").users) == []
