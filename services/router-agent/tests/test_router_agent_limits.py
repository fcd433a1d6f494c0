"""A space plan's quotas on their way to the routers, pure: the space-wide counts split across
the space's routers (ceil(max / routers) each, never 0 while the plan says a number), the
per-connection and per-message limits as they are (the message size 100 MiB when the plan names
none), and a changed plan (or router count) is a
new generation carrying the new limits."""

from __future__ import annotations

from enmasse.resources.discovery import RouterEndpoint
from enmasse.router_agent.routing import SpaceRouting, router_limits
from enmasse.v1 import resources_pb2, router_pb2


def routers(count: int) -> list[RouterEndpoint]:
    return [
        RouterEndpoint(f"r{i}", "127.0.0.1", admin_port=1000 + i, amqp_port=2000 + i,
                       inter_router_port=3000 + i)
        for i in range(count)
    ]  # fmt: skip


QUOTAS = resources_pb2.Quotas(
    max_connections=1000,
    max_connections_per_user=10,
    max_message_size=1 << 20,
    max_links_per_connection=100,
    max_sessions_per_connection=64,
    max_addresses=50,
)


def test_the_space_counts_are_split_across_its_routers() -> None:
    assert router_limits(QUOTAS, routers=3) == router_pb2.RouterLimits(
        max_connections=334,
        max_connections_per_user=4,
        max_message_size=1 << 20,
        max_links_per_connection=100,
        max_sessions_per_connection=64,
    ), "sessions are per connection: every router gets the plan's number, not a share"
    assert router_limits(QUOTAS, routers=1).max_connections == 1000
    assert router_limits(QUOTAS, routers=2).max_connections == 500
    few = resources_pb2.Quotas(max_connections=2, max_connections_per_user=1)
    assert router_limits(few, routers=3) == router_pb2.RouterLimits(
        max_connections=1, max_connections_per_user=1, max_message_size=100 << 20
    ), "never 0, which a router reads as no limit"
    assert router_limits(resources_pb2.Quotas(), routers=2) == router_pb2.RouterLimits(
        max_message_size=100 << 20
    ), "a plan without a message size: 100 MiB, never unlimited"


def test_a_plan_change_or_another_router_is_a_new_generation_with_new_limits() -> None:
    routing = SpaceRouting(space="shop")
    assert routing.update(routes={}, held_back={}, routers=routers(2), now_ms=100, quotas=QUOTAS)
    assert routing.config("r0").limits.max_connections == 500
    assert not routing.update(
        routes={}, held_back={}, routers=routers(2), now_ms=150, quotas=QUOTAS
    )
    smaller = resources_pb2.Quotas()
    smaller.CopyFrom(QUOTAS)
    smaller.max_connections = 100
    assert routing.update(routes={}, held_back={}, routers=routers(2), now_ms=200, quotas=smaller)
    assert [routing.config(f"r{i}").limits.max_connections for i in range(2)] == [50, 50]
    assert routing.update(routes={}, held_back={}, routers=routers(3), now_ms=300, quotas=smaller)
    assert routing.config("r2").limits == router_pb2.RouterLimits(
        max_connections=34,
        max_connections_per_user=4,
        max_message_size=1 << 20,
        max_links_per_connection=100,
        max_sessions_per_connection=64,
    )
    fewer_sessions = resources_pb2.Quotas()
    fewer_sessions.CopyFrom(smaller)
    fewer_sessions.max_sessions_per_connection = 4
    assert routing.update(
        routes={}, held_back={}, routers=routers(3), now_ms=350, quotas=fewer_sessions
    ), "a changed session limit alone is a new generation"
    assert [routing.config(f"r{i}").limits.max_sessions_per_connection for i in range(3)] == [
        4,
        4,
        4,
    ]
    assert routing.update(routes={}, held_back={}, routers=routers(3), now_ms=400, quotas=None)
    assert routing.config("r0").limits == router_pb2.RouterLimits(max_message_size=100 << 20), (
        "no plan: no limits but the default message size"
    )
