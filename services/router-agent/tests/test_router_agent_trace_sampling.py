"""The space plan's trace sampling on its way to the routers, pure: rendered into every router's
RouterConfig when the plan names it (left unset otherwise: the routers' default), and a change
of it is a new generation for every router."""

from __future__ import annotations

from enmasse.resources.discovery import RouterEndpoint
from enmasse.router_agent.routing import SpaceRouting, trace_sampling_of
from enmasse.v1 import resources_pb2

ROUTERS = [
    RouterEndpoint("r0", "127.0.0.1", admin_port=1000, amqp_port=1001, inter_router_port=1002),
    RouterEndpoint("r1", "127.0.0.1", admin_port=2000, amqp_port=2001, inter_router_port=2002),
]


def _plan(share: float | None) -> resources_pb2.AddressSpacePlan:
    plan = resources_pb2.AddressSpacePlan(metadata={"name": "p"}, spec={"address_plans": []})
    if share is not None:
        plan.spec.trace_sampling = share
    return plan


def test_the_plans_share_is_read_and_none_when_unset() -> None:
    assert trace_sampling_of(None) is None
    assert trace_sampling_of(_plan(None)) is None
    assert trace_sampling_of(_plan(0.0)) == 0.0  # set to 0: off, not "unset"
    assert trace_sampling_of(_plan(0.25)) == 0.25


def test_every_router_gets_the_share_and_a_change_is_a_new_generation() -> None:
    routing = SpaceRouting(space="shop")
    assert routing.update(routes={}, held_back={}, routers=ROUTERS, now_ms=100)
    assert not routing.config("r0").HasField("trace_sampling")
    assert routing.update(routes={}, held_back={}, routers=ROUTERS, now_ms=200, trace_sampling=1.0)
    assert not routing.update(
        routes={}, held_back={}, routers=ROUTERS, now_ms=250, trace_sampling=1.0
    )
    for router in ROUTERS:
        config = routing.config(router.router_id)
        assert (config.generation, config.trace_sampling) == (200, 1.0)
    assert routing.update(routes={}, held_back={}, routers=ROUTERS, now_ms=300, trace_sampling=0.0)
    config = routing.config("r1")
    assert config.HasField("trace_sampling")
    assert config.trace_sampling == 0.0
