"""The space's dead-letter queue in placement and status, without a network.

Placement: a queue that is a dead-letter address is placed as its plan says and then also on
every other broker holding an address whose plan names it (a broker moves dead letters only on
itself), in a stable order, without credit, never on a broker nobody else needs; a broker that
stops holding such an address is one the queue leaves (a move: drained like any). Status: the
brokers' dead-letter counts are summed into it; a broker that does not answer leaves the status
as it is.
"""

from __future__ import annotations

from enmasse.resources.contracts import ACTIVE, DRAINING
from enmasse.storage_controller.placement import Placement, place
from enmasse.storage_controller.statuses import DeadLetters, address_status, dead_letters_of
from enmasse.v1 import broker_pb2, resources_pb2

PLANS = {
    name: resources_pb2.AddressPlan(
        metadata={"name": name},
        spec={"address_type": kind, "broker": credit, "dead_letter_address": dlq},
    )
    for name, kind, credit, dlq in (
        ("small", "queue", 0.01, "DLQ"),
        ("large", "queue", 1.0, "DLQ"),
        ("sharded", "queue", 2.0, "DLQ"),
        ("topic", "topic", 0.01, "DLQ"),
        ("plain", "queue", 0.01, ""),
    )
}
SPACE_PLAN = resources_pb2.AddressSpacePlan(
    metadata={"name": "standard"},
    spec={"address_space_type": "standard", "quotas": {"max_brokers": 6}},
)


def address(name: str, plan: str, *, value: str = "", order: int = 0) -> resources_pb2.Address:
    return resources_pb2.Address(
        metadata={"name": name, "space": "shop", "created_at": {"seconds": order}},
        spec={"address": value or name, "type": PLANS[plan].spec.address_type, "plan": plan},
    )


DLQ = address("dlq", "small", value="DLQ", order=0)


def run(addresses: list[resources_pb2.Address], current: Placement | None = None) -> Placement:
    return place(
        space="shop",
        addresses=addresses,
        plans=PLANS,
        space_plan=SPACE_PLAN,
        current=current or Placement(space="shop"),
    )


def test_the_dlq_follows_every_queue_that_names_it_onto_its_broker() -> None:
    placed = run(
        [
            DLQ,
            address("q", "small", order=1),
            address("big", "large", order=2),
            address("wide", "sharded", order=3),
            address("t", "topic", order=4),
        ]
    )
    assert placed.addresses["dlq"] == (
        "shop-broker-0",  # its own, first: where drains of it go
        "shop-big-0",
        "shop-wide-0",
        "shop-wide-1",
    )
    assert placed.addresses["big"] == ("shop-big-0",)
    assert sorted(placed.brokers) == ["shop-big-0", "shop-broker-0", "shop-wide-0", "shop-wide-1"]
    assert not placed.moves


def test_a_queue_whose_plan_names_no_dlq_brings_it_nowhere() -> None:
    placed = run([DLQ, address("own", "large", order=1)])
    plain = run([DLQ, address("p", "plain", order=1)])
    assert placed.addresses["dlq"] == ("shop-broker-0", "shop-own-0")
    assert plain.addresses["dlq"] == ("shop-broker-0",)


def test_the_dlqs_placement_is_stable_across_passes_and_a_restart() -> None:
    addresses = [DLQ, address("big", "large", order=1)]
    first = run(addresses)
    assert run(addresses, current=first) == first
    recorded = Placement(space="shop", brokers=first.brokers, addresses=dict(first.addresses))
    assert run(addresses, current=recorded) == first


def test_a_broker_whose_queue_is_deleted_hands_its_dead_letters_over_before_it_goes() -> None:
    first = run([DLQ, address("big", "large", order=1)])
    after = run([DLQ], current=first)
    assert after.addresses["dlq"] == ("shop-broker-0",)
    assert after.moves == {"dlq": ("shop-big-0",)}
    assert after.brokers["shop-big-0"].state == DRAINING
    done = after.move_done("dlq", "shop-big-0")
    assert sorted(done.brokers) == ["shop-broker-0"]
    assert done.brokers["shop-broker-0"].state == ACTIVE


def _listing(**counts: tuple[int, int]) -> dict[str, broker_pb2.BrokerAddress]:
    return {
        name: broker_pb2.BrokerAddress(name=name, dead_lettered=dead, dead_letters_held=held)
        for name, (dead, held) in counts.items()
    }


def test_dead_letters_are_summed_over_the_brokers_and_unknown_while_one_is_silent() -> None:
    one, two = _listing(big=(2, 1)), _listing(big=(3, 0))
    assert dead_letters_of("big", [one, two]) == DeadLetters(dead_lettered=5, held=1)
    assert dead_letters_of("big", [one, _listing()]) == DeadLetters(dead_lettered=2, held=1)
    assert dead_letters_of("big", [one, None]) is None
    assert dead_letters_of("big", []) is None


def test_the_status_carries_the_figures_and_keeps_them_while_unknown() -> None:
    placement = run([DLQ, address("big", "large", order=1)])
    big = address("big", "large", order=1)
    counted = address_status(
        address=big,
        placement=placement,
        ready={"shop-big-0"},
        dead_letters=DeadLetters(dead_lettered=2, held=1),
    )
    assert (counted.dead_lettered, counted.dead_letters_held) == (2, 1)
    big.status.CopyFrom(counted)
    assert address_status(address=big, placement=placement, ready={"shop-big-0"}) is big.status
    assert (
        address_status(
            address=big,
            placement=placement,
            ready={"shop-big-0"},
            dead_letters=DeadLetters(dead_lettered=3, held=0),
        ).dead_lettered
        == 3
    )
