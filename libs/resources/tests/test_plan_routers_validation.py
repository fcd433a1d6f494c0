"""How many routers a plan gives each standard space (`min_routers`, at least one) and the
validation that keeps it possible: within `max_routers` (0: no maximum), not negative, and only
on a standard plan, since a brokered space has no routers."""

from __future__ import annotations

from enmasse.resources.kinds import resource_of
from enmasse.resources.plans import load_default_plans
from enmasse.resources.rendered_routers import plan_routers
from enmasse.resources.validation import Catalog, validate_resource
from enmasse.v1 import resources_pb2


def _catalog() -> Catalog:
    catalog = Catalog()
    for resource in load_default_plans():
        catalog.put(resource)
    return catalog


def _plan(space_type: str, **quotas: int) -> resources_pb2.AddressSpacePlan:
    plans = {"standard": ["standard-anycast"], "brokered": ["brokered-queue"]}
    return resources_pb2.AddressSpacePlan(
        metadata={"name": "pair"},
        spec={
            "address_space_type": space_type,
            "address_plans": plans[space_type],
            "quotas": quotas,
        },
    )


def _problems(plan: resources_pb2.AddressSpacePlan) -> list[str]:
    return [str(v) for v in validate_resource(resource_of(plan), catalog=_catalog())]


def test_a_plan_gives_its_min_routers_and_at_least_one() -> None:
    assert plan_routers(resources_pb2.Quotas(min_routers=3, max_routers=4)) == 3
    assert plan_routers(resources_pb2.Quotas()) == 1
    defaults = {
        r.address_space_plan.metadata.name: plan_routers(r.address_space_plan.spec.quotas)
        for r in load_default_plans()
        if r.address_space_plan.spec.address_space_type == "standard"
    }
    assert defaults == {"standard-small": 1, "development": 1}


def test_min_routers_within_max_routers_is_accepted() -> None:
    assert _problems(_plan("standard", min_routers=2, max_routers=2)) == []
    assert _problems(_plan("standard", min_routers=5)) == [], "max_routers 0: no maximum"


def test_min_routers_above_max_routers_is_refused_saying_both() -> None:
    assert _problems(_plan("standard", min_routers=3, max_routers=2)) == [
        "AddressSpacePlan pair: spec.quotas.min_routers: must be at most max_routers (2), got 3"
    ]


def test_negative_min_routers_is_refused() -> None:
    assert _problems(_plan("standard", min_routers=-1)) == [
        "AddressSpacePlan pair: spec.quotas.min_routers: must not be negative, got -1 "
        "(0 means one router)"
    ]


def test_a_brokered_plan_has_no_routers_to_ask_for() -> None:
    assert _problems(_plan("brokered", min_routers=1)) == [
        "AddressSpacePlan pair: spec.quotas.min_routers: applies to standard address spaces "
        "only: a brokered space has no routers"
    ]


def test_load_figures_per_router_are_accepted_on_a_standard_plan() -> None:
    plan = _plan("standard", min_routers=1, max_routers=3, connections_per_router=500)
    assert _problems(plan) == []
    assert _problems(_plan("standard", deliveries_per_router=20_000)) == []


def test_negative_or_brokered_load_figures_are_refused() -> None:
    assert _problems(_plan("standard", connections_per_router=-5)) == [
        "AddressSpacePlan pair: spec.quotas.connections_per_router: must not be negative, "
        "got -5 (0 means not scaled by it)"
    ]
    assert _problems(_plan("brokered", deliveries_per_router=100)) == [
        "AddressSpacePlan pair: spec.quotas.deliveries_per_router: applies to standard address "
        "spaces only: a brokered space has no routers"
    ]
