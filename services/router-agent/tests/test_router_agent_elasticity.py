"""Routers by load (elasticity.py), with the clock in the test's hands: up one at a time after
the load has needed more for `up_after`, down one at a time after it would have fitted on one
fewer with room to spare for `down_after`, never outside the plan's bounds, and nothing between
the two bands. The agent's render follows the count (workloads.elastic_count)."""

from __future__ import annotations

from enmasse.router_agent.elasticity import Elasticity, Load, elastic, load_of, needed
from enmasse.router_agent.workloads import elastic_count
from enmasse.v1 import resources_pb2, router_pb2

QUOTAS = resources_pb2.Quotas(min_routers=1, max_routers=3, connections_per_router=100)


def at(
    count: Elasticity, seconds: float, *, connections: int, deliveries: int = 0, q=QUOTAS
) -> bool:
    return count.observe(Load(connections, deliveries, at=seconds), quotas=q)


def test_a_plan_without_a_per_router_figure_or_room_is_not_elastic() -> None:
    assert elastic(QUOTAS)
    assert not elastic(resources_pb2.Quotas(min_routers=1, max_routers=3))
    assert not elastic(resources_pb2.Quotas(min_routers=2, max_routers=2, deliveries_per_router=5))


def test_needed_takes_the_larger_of_connections_and_deliveries() -> None:
    quotas = resources_pb2.Quotas(connections_per_router=100, deliveries_per_router=1000)
    assert needed(connections=250, rate=500.0, quotas=quotas) == 3
    assert needed(connections=10, rate=4500.0, quotas=quotas) == 5


def test_load_above_for_up_after_adds_one_router_at_a_time() -> None:
    count = Elasticity(routers=1, up_after=15, down_after=120)
    assert not at(count, 0, connections=250)  # the first sample only remembers
    assert not at(count, 5, connections=250)
    assert not at(count, 19, connections=250)  # above for 14 s: not yet
    assert at(count, 20, connections=250)
    assert count.routers == 2
    assert count.reason == "load above 15 s (250 client connections, 0 deliveries/s)"
    assert not at(count, 30, connections=250)  # the clock starts again for the next one
    assert not at(count, 40, connections=250)
    assert at(count, 45, connections=250)
    assert count.routers == 3
    assert not at(count, 100, connections=900), "never above max_routers"
    assert count.routers == 3


def test_a_blip_changes_nothing() -> None:
    count = Elasticity(routers=1, up_after=15, down_after=120)
    at(count, 0, connections=10)
    assert not at(count, 5, connections=250)
    assert not at(count, 10, connections=10)  # gone before up_after: the clock resets
    assert not at(count, 25, connections=250)
    assert count.routers == 1


def test_down_one_at_a_time_only_with_room_to_spare_for_down_after() -> None:
    count = Elasticity(routers=3, up_after=15, down_after=120)
    at(count, 0, connections=150)
    # 150 on 2 routers is 75 each: above 70% of 100, so inside the band: no change
    assert not at(count, 500, connections=150)
    assert count.routers == 3
    at(count, 600, connections=130)  # 65 each on 2: fits with room
    assert not at(count, 700, connections=130)
    assert at(count, 720, connections=130)
    assert count.routers == 2
    assert count.reason == "load fits on fewer for 120 s (130 client connections, 0 deliveries/s)"
    at(count, 800, connections=0)
    assert at(count, 920, connections=0)
    assert count.routers == 1
    assert not at(count, 2000, connections=0), "never below min_routers"


def test_the_delivery_rate_is_the_counter_s_growth_between_samples() -> None:
    quotas = resources_pb2.Quotas(min_routers=1, max_routers=2, deliveries_per_router=1000)
    count = Elasticity(routers=1, up_after=10, down_after=60)
    at(count, 0, connections=1, deliveries=0, q=quotas)
    # a rate needs two samples: above from the second one on
    assert not at(count, 5, connections=1, deliveries=7_500, q=quotas)  # 1,500/s
    assert not at(count, 10, connections=1, deliveries=15_000, q=quotas)
    assert at(count, 15, connections=1, deliveries=22_500, q=quotas)
    assert count.routers == 2
    assert count.reason == "load above 10 s (1 client connections, 1500 deliveries/s)"


def test_a_plan_that_moves_its_bounds_is_followed_at_once() -> None:
    count = Elasticity(routers=3)
    narrower = resources_pb2.Quotas(min_routers=1, max_routers=2, connections_per_router=100)
    assert at(count, 0, connections=500, q=narrower)
    assert count.routers == 2
    assert count.reason == "plan bounds 1..2"


def test_only_client_connections_count_as_load() -> None:
    answers = [
        router_pb2.ConnectionList(
            connections=[
                router_pb2.ConnectionInfo(role="normal", deliveries_in=10),
                router_pb2.ConnectionInfo(role="inter-router", deliveries_in=1000),
                router_pb2.ConnectionInfo(role="broker", deliveries_in=1000),
            ]
        ),
        router_pb2.ConnectionList(
            connections=[router_pb2.ConnectionInfo(role="normal", deliveries_in=5)]
        ),
    ]
    assert load_of(answers, at=1.0) == Load(connections=2, deliveries=15, at=1.0)


def test_the_render_says_why_in_its_commit_message() -> None:
    count = elastic_count(space="shop", plan_name="elastic", routers=2, why="load above 15 s")
    assert count.routers == 2
    assert count.why == "space shop: 2 routers (plan elastic, by load: load above 15 s)"
