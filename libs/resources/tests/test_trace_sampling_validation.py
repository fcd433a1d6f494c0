"""A space plan's `trace_sampling` (the share of untraced messages whose trace its routers start):
unset in the default plans (the routers' 0.1%), 0 (off) or 0.0001..1 when given, and anything
else refused on the field with the reason."""

from __future__ import annotations

import pytest
from enmasse.resources.kinds import resource_of
from enmasse.resources.plans import load_default_plans
from enmasse.resources.validation import Catalog, validate_resource
from enmasse.v1 import resources_pb2


def _catalog() -> Catalog:
    catalog = Catalog()
    for resource in load_default_plans():
        catalog.put(resource)
    return catalog


def _plan(**spec: object) -> resources_pb2.AddressSpacePlan:
    return resources_pb2.AddressSpacePlan(
        metadata={"name": "traced"},
        spec={"address_space_type": "standard", "address_plans": ["standard-anycast"], **spec},
    )


@pytest.mark.parametrize("share", [None, 0.0, 0.0001, 0.01, 1.0])
def test_a_plan_may_name_a_share_or_none(share: float | None) -> None:
    plan = _plan() if share is None else _plan(trace_sampling=share)
    assert plan.spec.HasField("trace_sampling") is (share is not None)
    assert validate_resource(resource_of(plan), catalog=_catalog()) == []


@pytest.mark.parametrize("share", [-0.5, 0.00001, 1.5, float("nan")])
def test_a_share_out_of_range_is_refused_on_its_field(share: float) -> None:
    problems = [
        str(p)
        for p in validate_resource(resource_of(_plan(trace_sampling=share)), catalog=_catalog())
    ]
    assert problems == [
        f"AddressSpacePlan traced: spec.trace_sampling: {share} is not 0 (off) or a share from "
        "0.0001 to 1"
    ]
