"""Placement rules, table by table, and properties over random histories (no network)."""

from __future__ import annotations

import dataclasses
import random

import pytest
from enmasse.resources.contracts import ACTIVE, DRAINING
from enmasse.resources.rendered_brokers import Broker
from enmasse.storage_controller.placement import MAX_BROKER_ID, Placement, place
from enmasse.v1 import resources_pb2

CREDITS = {
    "pooled-01": ("queue", 0.01),
    "pooled-3": ("queue", 0.3),
    "pooled-4": ("queue", 0.4),
    "pooled-5": ("queue", 0.5),
    "pooled-6": ("queue", 0.6),
    "dedicated": ("queue", 1.0),
    "sharded-2": ("queue", 2.0),
    "sharded-25": ("queue", 2.5),
    "topic-3": ("topic", 0.3),
    "topic-dedicated": ("topic", 1.0),
    "sub-01": ("subscription", 0.01),
    "sub-3": ("subscription", 0.3),
    "anycast": ("anycast", 0.0),
}
PLANS = {
    name: resources_pb2.AddressPlan(
        metadata={"name": name}, spec={"address_type": kind, "broker": credit}
    )
    for name, (kind, credit) in CREDITS.items()
}


def space_plan(max_brokers: float = 4, kind: str = "standard") -> resources_pb2.AddressSpacePlan:
    return resources_pb2.AddressSpacePlan(
        metadata={"name": f"{kind}-plan"},
        spec={"address_space_type": kind, "quotas": {"max_brokers": max_brokers}},
    )


def address(name: str, plan: str, *, topic: str = "", order: int = 0) -> resources_pb2.Address:
    kind = CREDITS[plan][0] if plan in CREDITS else "queue"
    return resources_pb2.Address(
        metadata={"name": name, "space": "shop", "created_at": {"seconds": order}},
        spec={"address": name, "type": kind, "plan": plan, "topic": topic},
    )


def numbered(plans: list[str]) -> list[resources_pb2.Address]:
    """Addresses a0, a1, ... created in list order."""
    return [address(f"a{i}", plan, order=i) for i, plan in enumerate(plans)]


def run(
    addresses: list[resources_pb2.Address],
    *,
    current: Placement | None = None,
    max_brokers: float = 4,
    kind: str = "standard",
) -> Placement:
    return place(
        space="shop",
        addresses=addresses,
        plans=PLANS,
        space_plan=space_plan(max_brokers, kind),
        current=current or Placement("shop"),
    )


# ------------------------------------------------------------------ packing, table-driven


@pytest.mark.parametrize(
    ("plans", "expected"),
    [
        (["pooled-01"] * 3, {"a0": "shop-broker-0", "a1": "shop-broker-0", "a2": "shop-broker-0"}),
        (["pooled-6", "pooled-6"], {"a0": "shop-broker-0", "a1": "shop-broker-1"}),
        # best fit, not first fit: a2 (0.3) goes to the fuller broker-1 (0.6), not broker-0 (0.5)
        (
            ["pooled-5", "pooled-6", "pooled-3"],
            {"a0": "shop-broker-0", "a1": "shop-broker-1", "a2": "shop-broker-1"},
        ),
        # equally full: the oldest broker
        (["pooled-6", "pooled-6", "pooled-3"], {"a2": "shop-broker-0"}),
        # exactly full is still a fit
        (["pooled-5", "pooled-5"], {"a0": "shop-broker-0", "a1": "shop-broker-0"}),
        (["pooled-01"] * 100 + ["pooled-01"], {"a99": "shop-broker-0", "a100": "shop-broker-1"}),
    ],
)
def test_pooled_addresses_go_to_the_fullest_broker_that_fits(
    plans: list[str], expected: dict[str, str]
) -> None:
    placement = run(numbered(plans))
    assert {name: placement.addresses[name] for name in expected} == {
        name: (broker,) for name, broker in expected.items()
    }
    assert not placement.pending


def test_dedicated_and_sharded_plans_get_brokers_of_their_own() -> None:
    placement = run(
        [
            address("orders", "dedicated", order=1),
            address("events", "sharded-2", order=2),
            address("small", "pooled-01", order=3),
        ],
        max_brokers=10,
    )
    assert placement.addresses == {
        "orders": ("shop-orders-0",),
        "events": ("shop-events-0", "shop-events-1"),
        "small": ("shop-broker-0",),
    }
    assert placement.brokers["shop-orders-0"] == Broker(
        "shop-orders-0", pooled=False, owner="orders"
    )
    assert placement.brokers["shop-events-1"].owner == "events"
    assert placement.brokers["shop-broker-0"] == Broker("shop-broker-0", pooled=True)


def test_a_fractional_credit_above_one_is_rounded_up_to_whole_shards() -> None:
    placement = run([address("huge", "sharded-25")])
    assert placement.addresses["huge"] == ("shop-huge-0", "shop-huge-1", "shop-huge-2")


def test_over_the_broker_quota_the_newest_address_stays_pending_with_the_reason() -> None:
    placement = run(numbered(["pooled-6", "pooled-6", "dedicated"]), max_brokers=2)
    assert placement.addresses == {"a0": ("shop-broker-0",), "a1": ("shop-broker-1",)}
    assert placement.pending == {
        "a2": "quota exceeded: address 'a2' needs 1 more broker than the 2 that address space "
        "'shop' may have with plan 'standard-plan'"
    }


def test_a_sharded_address_that_does_not_fit_the_quota_takes_no_broker_at_all() -> None:
    placement = run(numbered(["pooled-01", "sharded-2"]), max_brokers=2)
    assert set(placement.brokers) == {"shop-broker-0"}
    assert placement.pending["a1"].startswith("quota exceeded: address 'a1' needs 2 more brokers")


def test_subscriptions_live_on_their_topics_broker() -> None:
    placement = run(
        [
            address("prices", "topic-dedicated", order=1),
            address("audit", "sub-01", topic="prices", order=2),
            address("news", "topic-3", order=3),
            address("reader", "sub-3", topic="news", order=4),
        ]
    )
    assert placement.addresses["audit"] == placement.addresses["prices"] == ("shop-prices-0",)
    assert placement.addresses["reader"] == placement.addresses["news"] == ("shop-broker-0",)


@pytest.mark.parametrize(
    ("addresses", "name", "message"),
    [
        (
            [address("audit", "sub-01", topic="nothing")],
            "audit",
            "topic 'nothing' is not placed on a broker",
        ),
        ([address("odd", "no-such-plan")], "odd", "address plan 'no-such-plan' not found"),
        (
            [
                address("news", "topic-3", order=1),
                address("filler", "pooled-6", order=2),
                address("reader", "sub-3", topic="news", order=3),
            ],
            "reader",
            "quota exceeded: broker shop-broker-0 of topic 'news' is full",
        ),
    ],
)
def test_what_cannot_be_placed_says_why(
    addresses: list[resources_pb2.Address], name: str, message: str
) -> None:
    placement = run(addresses, max_brokers=1)
    assert placement.pending[name] == message
    assert name not in placement.addresses


def test_direct_addresses_take_no_broker() -> None:
    placement = run([address("rpc", "anycast")])
    assert placement == Placement("shop")


def test_a_brokered_space_has_one_broker_for_everything() -> None:
    placement = run(
        numbered(["pooled-6"] * 5 + ["dedicated", "topic-3"]), max_brokers=1, kind="brokered"
    )
    assert set(placement.brokers) == {"shop-broker-0"}
    assert set(placement.addresses.values()) == {("shop-broker-0",)}
    assert not placement.pending


def test_without_a_space_plan_every_stored_address_is_pending() -> None:
    placement = place(
        space="shop",
        addresses=numbered(["pooled-01"]),
        plans=PLANS,
        space_plan=None,
        current=Placement("shop"),
    )
    assert placement.pending == {"a0": "address space 'shop' has no known address space plan"}


def test_long_names_make_broker_ids_that_fit_a_kubernetes_label() -> None:
    long = "a" * 63
    placement = place(
        space="s" * 63,
        addresses=[address(long, "dedicated")],
        plans=PLANS,
        space_plan=space_plan(),
        current=Placement("s" * 63),
    )
    (broker_id,) = placement.addresses[long]
    assert len(broker_id) <= MAX_BROKER_ID
    assert broker_id.endswith("-0")
    again = place(
        space="s" * 63,
        addresses=[address(long, "dedicated")],
        plans=PLANS,
        space_plan=space_plan(),
        current=Placement("s" * 63),
    )
    assert again == placement


# ------------------------------------------------------------------ change over time


def test_adding_an_address_moves_no_other() -> None:
    first = run(numbered(["pooled-5", "pooled-6", "pooled-3"]))
    second = run(numbered(["pooled-5", "pooled-6", "pooled-3", "pooled-4"]), current=first)
    for name, brokers in first.addresses.items():
        assert second.addresses[name] == brokers
    assert not second.moves
    assert second.addresses["a3"] == ("shop-broker-0",)  # 0.5 + 0.4 fits; 0.6 + 0.3 is full


def test_deleting_addresses_frees_their_room_and_drops_an_empty_broker() -> None:
    first = run(numbered(["pooled-6", "pooled-6", "pooled-3"]))
    assert first.addresses["a1"] == ("shop-broker-1",)
    second = run(
        [address("a0", "pooled-6", order=0), address("a2", "pooled-3", order=2)], current=first
    )
    assert set(second.brokers) == {"shop-broker-0"}
    assert not second.moves
    third = run(
        [
            address("a0", "pooled-6", order=0),
            address("a2", "pooled-3", order=2),
            address("a5", "pooled-4", order=5),
        ],
        current=second,
    )
    assert third.addresses["a5"] == ("shop-broker-1",)  # a new broker takes the lowest free id


def test_a_pool_with_a_broker_too_many_hands_one_over_and_lets_it_go() -> None:
    first = run(numbered(["pooled-3"] * 4))
    assert first.addresses["a3"] == ("shop-broker-1",)
    remaining = numbered(["pooled-3"] * 4)[1:]  # a0 deleted: 0.9 in all, fits one broker
    second = run(remaining, current=first)
    assert second.addresses["a3"] == ("shop-broker-0",)
    assert second.moves == {"a3": ("shop-broker-1",)}
    assert second.brokers["shop-broker-1"].state == DRAINING
    # until the controller reports the move done, the Draining broker stays, however often asked
    assert run(remaining, current=second) == second
    done = second.move_done("a3", "shop-broker-1")
    assert set(done.brokers) == {"shop-broker-0"}
    assert run(remaining, current=done) == done


def test_a_plan_that_becomes_dedicated_moves_its_address_off_the_pool() -> None:
    first = run(numbered(["pooled-3", "pooled-3"]))
    changed = [address("a0", "pooled-3", order=0), address("a1", "dedicated", order=1)]
    second = run(changed, current=first)
    assert second.addresses["a1"] == ("shop-a1-0",)
    assert second.moves == {"a1": ("shop-broker-0",)}
    assert second.brokers["shop-broker-0"].state == ACTIVE  # it still holds a0


def test_a_grown_credit_makes_the_newest_address_leave_a_full_broker() -> None:
    first = run(numbered(["pooled-3", "pooled-3", "pooled-3"]))
    grown = [
        address("a0", "pooled-3", order=0),
        address("a1", "pooled-3", order=1),
        address("a2", "pooled-6", order=2),
    ]
    second = run(grown, current=first)
    assert second.addresses["a0"] == second.addresses["a1"] == ("shop-broker-0",)
    assert second.addresses["a2"] == ("shop-broker-1",)
    assert second.moves == {"a2": ("shop-broker-0",)}


def test_a_draining_broker_takes_no_new_address() -> None:
    draining = Placement(
        "shop",
        brokers={"shop-broker-0": Broker("shop-broker-0", pooled=True, state=DRAINING)},
        moves={"a0": ("shop-broker-0",)},
    )
    placement = run(numbered(["pooled-01"]), current=draining)
    assert placement.addresses["a0"] == ("shop-broker-1",)
    assert placement.moves == {"a0": ("shop-broker-0",)}


def test_messages_of_an_address_that_became_pending_are_not_abandoned() -> None:
    first = run(numbered(["pooled-6"]), max_brokers=2)
    second = run([address("a0", "sharded-2", order=0)], current=first, max_brokers=1)
    assert second.pending["a0"].startswith("quota exceeded")
    assert second.moves == {"a0": ("shop-broker-0",)}
    assert second.brokers["shop-broker-0"].state == DRAINING


def test_a_space_with_nothing_left_has_no_broker() -> None:
    first = run(numbered(["pooled-01", "dedicated", "sharded-2"]))
    assert run([], current=first) == Placement("shop")


# ------------------------------------------------------------------ properties over histories


@pytest.mark.parametrize("seed", range(40))
def test_random_histories_keep_every_rule(seed: int) -> None:
    rng = random.Random(seed)
    choices = [
        "pooled-01",
        "pooled-3",
        "pooled-4",
        "pooled-6",
        "dedicated",
        "sharded-2",
        "topic-3",
        "sub-01",
    ]
    max_brokers = rng.choice([0, 3, 5, 8])
    live: dict[str, resources_pb2.Address] = {}
    placement = Placement("shop")
    for step in range(60):
        action = rng.random()
        added: str | None = None
        if action < 0.6 or not live:
            added = f"x{step}"
            plan = rng.choice(choices)
            topics = [n for n, a in live.items() if a.spec.type == "topic"]
            topic = rng.choice(topics) if plan == "sub-01" and topics else "missing"
            live[added] = address(added, plan, topic=topic if plan == "sub-01" else "", order=step)
        elif action < 0.85:
            del live[rng.choice(sorted(live))]
        else:
            for name, brokers in sorted(placement.moves.items()):  # the controller drained some
                for broker in brokers:
                    if rng.random() < 0.5:
                        placement = placement.move_done(name, broker)
        before = placement
        placement = run(list(live.values()), current=before, max_brokers=max_brokers)
        _check(placement, live, max_brokers)
        assert run(list(live.values()), current=placement, max_brokers=max_brokers) == placement
        if added is not None:
            for name, brokers in before.addresses.items():
                assert placement.addresses.get(name) == brokers, f"{name} moved when {added} came"


def _check(placement: Placement, live: dict[str, resources_pb2.Address], max_brokers: int) -> None:
    used: dict[str, float] = {}
    for name, brokers in placement.addresses.items():
        assert name in live
        assert name not in placement.pending
        for broker in brokers:
            assert placement.brokers[broker].state == ACTIVE
            if placement.brokers[broker].pooled:
                used[broker] = used.get(broker, 0.0) + CREDITS[live[name].spec.plan][1]
    assert all(total <= 1.0 + 1e-9 for total in used.values()), used
    active = [b for b in placement.brokers.values() if b.state == ACTIVE]
    if max_brokers:
        assert len(active) <= max_brokers
    needed = {
        b for brokers in [*placement.addresses.values(), *placement.moves.values()] for b in brokers
    }
    assert set(placement.brokers) == needed  # nothing idle is kept
    for name in live:
        if live[name].spec.type in ("queue", "topic", "subscription"):
            assert (name in placement.addresses) != (name in placement.pending)
    for broker in placement.brokers.values():
        assert dataclasses.replace(broker).id.startswith("shop-")
