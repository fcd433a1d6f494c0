"""A plan's login policy (`allow_anonymous`, `allow_plain_without_tls`): off in the default plans,
on in `development`, and refused on a brokered plan, whose spaces have no routers to enforce it."""

from __future__ import annotations

import pytest
from enmasse.resources.kinds import object_of, resource_of
from enmasse.resources.plans import load_default_plans
from enmasse.resources.validation import Catalog, validate_resource
from enmasse.v1 import resources_pb2


def _space_plans() -> dict[str, resources_pb2.AddressSpacePlan]:
    plans = [object_of(r) for r in load_default_plans()]
    return {p.metadata.name: p for p in plans if isinstance(p, resources_pb2.AddressSpacePlan)}


def test_only_the_development_plan_lets_anyone_in() -> None:
    policy = {
        name: (plan.spec.allow_anonymous, plan.spec.allow_plain_without_tls)
        for name, plan in _space_plans().items()
    }
    assert policy == {
        "brokered-single": (False, False),
        "development": (True, True),
        "standard-small": (False, False),
    }
    development, standard = _space_plans()["development"], _space_plans()["standard-small"]
    assert development.spec.address_plans == standard.spec.address_plans


@pytest.mark.parametrize("field", ["allow_anonymous", "allow_plain_without_tls"])
def test_a_brokered_plan_cannot_allow_more(field: str) -> None:
    catalog = Catalog()
    for resource in load_default_plans():
        catalog.put(resource)
    plan = resources_pb2.AddressSpacePlan(
        metadata={"name": "open-jms"},
        spec={"address_space_type": "brokered", "address_plans": ["brokered-queue"], field: True},
    )
    assert [str(v) for v in validate_resource(resource_of(plan), catalog=catalog)] == [
        f"AddressSpacePlan open-jms: spec.{field}: applies to standard address spaces' routers only"
    ]
    plan.spec.address_space_type = "standard"
    plan.spec.address_plans[:] = ["standard-anycast"]
    assert validate_resource(resource_of(plan), catalog=catalog) == []
