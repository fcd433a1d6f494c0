"""What Address statuses say about placement, and the placement read back from them (no network)."""

from __future__ import annotations

from dataclasses import replace

from enmasse.resources.contracts import DRAINING
from enmasse.resources.discovery import BrokerEndpoint
from enmasse.resources.rendered_brokers import Broker, BrokerWorkload, LocalPorts
from enmasse.storage_controller.placement import Placement
from enmasse.storage_controller.statuses import address_status, recorded_placement, space_status
from enmasse.v1 import resources_pb2

PLACEMENT = Placement(
    "shop",
    brokers={
        "shop-broker-0": Broker("shop-broker-0", pooled=True),
        "shop-broker-1": Broker("shop-broker-1", pooled=True, state=DRAINING),
        "shop-events-0": Broker("shop-events-0", pooled=False, owner="events"),
        "shop-events-1": Broker("shop-events-1", pooled=False, owner="events"),
    },
    addresses={
        "orders": ("shop-broker-0",),
        "moved": ("shop-broker-0",),
        "events": ("shop-events-0", "shop-events-1"),
    },
    moves={"moved": ("shop-broker-1",)},
    pending={"late": "quota exceeded: no room"},
)


def address(
    name: str, *, status: resources_pb2.AddressStatus | None = None
) -> resources_pb2.Address:
    return resources_pb2.Address(
        metadata={"name": name, "space": "shop", "generation": 3},
        spec={"address": name, "type": "queue", "plan": "p"},
        status=status,
    )


def summary(status: resources_pb2.AddressStatus) -> tuple[str, list[str], list[tuple[str, str]]]:
    return (
        status.status.phase,
        list(status.status.messages),
        [(b.broker, b.state) for b in status.brokers],
    )


def test_a_placed_address_waits_for_its_broker_then_says_it_is_ready() -> None:
    waiting = address_status(address=address("orders"), placement=PLACEMENT, ready=set())
    assert summary(waiting) == (
        "Configuring",
        ["placed on broker shop-broker-0", "waiting for broker: shop-broker-0"],
        [("shop-broker-0", "Active")],
    )
    assert waiting.status.observed_generation == 3
    ready = address_status(address=address("orders"), placement=PLACEMENT, ready={"shop-broker-0"})
    assert summary(ready)[1] == ["placed on broker shop-broker-0", "broker ready: shop-broker-0"]


def test_a_sharded_address_is_ready_only_when_every_shard_has_it() -> None:
    status = address_status(address=address("events"), placement=PLACEMENT, ready={"shop-events-0"})
    assert summary(status)[1] == [
        "placed on brokers shop-events-0, shop-events-1",
        "waiting for broker: shop-events-1",
    ]


def test_a_moving_address_lists_the_broker_it_is_leaving_as_draining() -> None:
    status = address_status(address=address("moved"), placement=PLACEMENT, ready={"shop-broker-0"})
    assert summary(status) == (
        "Configuring",
        [
            "placed on broker shop-broker-0",
            "broker ready: shop-broker-0",
            "draining from broker: shop-broker-1",
        ],
        [("shop-broker-0", "Active"), ("shop-broker-1", "Draining")],
    )


def test_pending_and_refused_addresses_say_why() -> None:
    pending = address_status(address=address("late"), placement=PLACEMENT, ready=set())
    assert summary(pending) == ("Pending", ["quota exceeded: no room"], [])
    refused = address_status(
        address=address("orders"),
        placement=PLACEMENT,
        ready=set(),
        refusal="broker shop-broker-0 refused queue 'orders': bad name",
    )
    assert summary(refused)[:2] == (
        "Failed",
        ["broker shop-broker-0 refused queue 'orders': bad name"],
    )


def test_an_active_address_whose_placement_holds_is_left_to_the_router_agent() -> None:
    active = resources_pb2.AddressStatus(
        status={"phase": "Active", "messages": ["routed by 2 routers"], "observed_generation": 3},
        brokers=[{"broker": "shop-broker-0", "state": "Active"}],
    )
    status = address_status(
        address=address("orders", status=active), placement=PLACEMENT, ready={"shop-broker-0"}
    )
    assert status == active
    # but a placement that changed takes it back to Configuring
    moved = address_status(
        address=address("moved", status=active), placement=PLACEMENT, ready={"shop-broker-0"}
    )
    assert moved.status.phase == "Configuring"


def test_the_placement_is_rebuilt_from_rendered_brokers_and_written_statuses() -> None:
    workloads = {
        b.id: BrokerWorkload(space="shop", broker=b, ports=LocalPorts(1, 2))
        for b in PLACEMENT.brokers.values()
    }
    addresses = [
        address(
            name, status=address_status(address=address(name), placement=PLACEMENT, ready=set())
        )
        for name in ("orders", "moved", "events", "late")
    ]
    rebuilt = recorded_placement(space="shop", workloads=workloads, addresses=addresses)
    assert rebuilt.brokers == PLACEMENT.brokers
    assert rebuilt.addresses == PLACEMENT.addresses
    assert rebuilt.moves == PLACEMENT.moves
    # a broker whose file is gone is forgotten, with the addresses on it
    del workloads["shop-broker-0"]
    partial = recorded_placement(space="shop", workloads=workloads, addresses=addresses)
    assert "orders" not in partial.addresses


BROKERED = Placement(
    "jms",
    brokers={"jms-broker-0": Broker("jms-broker-0", pooled=True)},
    addresses={"invoices": ("jms-broker-0",)},
)


def brokered_space(
    status: resources_pb2.AddressSpaceStatus | None = None,
) -> resources_pb2.AddressSpace:
    return resources_pb2.AddressSpace(
        metadata={"name": "jms", "generation": 2},
        spec={"type": "brokered", "plan": "brokered-single"},
        status=status,
    )


def test_a_brokered_address_is_active_once_its_broker_holds_it() -> None:
    held = address_status(
        address=address("invoices"), placement=BROKERED, ready={"jms-broker-0"}, brokered=True
    )
    assert summary(held) == (
        "Active",
        ["placed on broker jms-broker-0", "broker ready: jms-broker-0"],
        [("jms-broker-0", "Active")],
    )
    waiting = address_status(
        address=address("invoices"), placement=BROKERED, ready=set(), brokered=True
    )
    assert summary(waiting)[0] == "Configuring"
    # the same in a standard space waits for the router-agent
    standard = address_status(
        address=address("invoices"), placement=BROKERED, ready={"jms-broker-0"}
    )
    assert summary(standard)[0] == "Configuring"


def test_a_brokered_space_publishes_its_brokers_endpoints_once_it_answers() -> None:
    no_broker = space_status(space=brokered_space(), placement=Placement("jms"), broker=None)
    assert (no_broker.status.phase, list(no_broker.status.messages)) == (
        "Configuring",
        ["no broker yet: the first address starts it"],
    )
    waiting = space_status(space=brokered_space(), placement=BROKERED, broker=None)
    assert (waiting.status.phase, list(waiting.status.messages), list(waiting.endpoints)) == (
        "Configuring",
        ["waiting for broker: jms-broker-0"],
        [],
    )
    answering = BrokerEndpoint("jms-broker-0", "127.0.0.1", amqp_port=5999, admin_port=5998)
    active = space_status(space=brokered_space(), placement=BROKERED, broker=answering)
    assert active.status.phase == "Active"
    assert list(active.status.messages) == ["broker ready: jms-broker-0"]
    assert active.status.observed_generation == 2
    assert [(e.name, e.host, e.port) for e in active.endpoints] == [("amqp", "127.0.0.1", 5999)]
    # A broker with its amqps listener: the space's clients get both.
    secure = space_status(
        space=brokered_space(), placement=BROKERED, broker=replace(answering, amqps_port=5997)
    )
    assert [(e.name, e.port) for e in secure.endpoints] == [("amqp", 5999), ("amqps", 5997)]


def test_a_status_the_router_agent_lowered_is_left_with_its_reason() -> None:
    """The router-agent takes an Active address back to Configuring when a router loses it:
    what this controller would write, plus its reason after. Left as it is, so that neither
    undoes the other's write; a placement that changed is written anew, without it."""
    lowered = resources_pb2.AddressStatus(
        status={
            "phase": "Configuring",
            "messages": [
                "placed on broker shop-broker-0",
                "broker ready: shop-broker-0",
                "waiting for router router-0: unreachable",
            ],
            "observed_generation": 3,
        },
        brokers=[{"broker": "shop-broker-0", "state": "Active"}],
    )
    kept = address_status(
        address=address("orders", status=lowered), placement=PLACEMENT, ready={"shop-broker-0"}
    )
    assert kept == lowered
    # the broker lost the address meanwhile: this controller's verdict replaces the agent's
    lacking = address_status(
        address=address("orders", status=lowered), placement=PLACEMENT, ready=set()
    )
    assert summary(lacking)[1] == [
        "placed on broker shop-broker-0",
        "waiting for broker: shop-broker-0",
    ]
    # other messages first are not ours: written anew
    foreign = resources_pb2.AddressStatus()
    foreign.CopyFrom(lowered)
    foreign.status.messages[:] = ["something else", *lowered.status.messages]
    rewritten = address_status(
        address=address("orders", status=foreign), placement=PLACEMENT, ready={"shop-broker-0"}
    )
    assert summary(rewritten)[1] == [
        "placed on broker shop-broker-0",
        "broker ready: shop-broker-0",
    ]
