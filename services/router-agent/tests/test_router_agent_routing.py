"""The pure routing of the router-agent: routes, per-router configs, generations and readiness."""

from __future__ import annotations

from enmasse.resources.discovery import BrokerEndpoint, RouterEndpoint
from enmasse.router_agent.routing import (
    Readiness,
    SpaceRouting,
    address_routes,
    next_generation,
    placements_of,
    readiness,
    router_config,
    space_readiness,
    status_to_write,
)
from enmasse.v1 import resources_pb2

ROUTERS = [
    RouterEndpoint("r0", "127.0.0.1", admin_port=1000, amqp_port=1001, inter_router_port=1002),
    RouterEndpoint("r1", "127.0.0.1", admin_port=2000, amqp_port=2001, inter_router_port=2002),
    RouterEndpoint("r2", "127.0.0.1", admin_port=3000, amqp_port=3001, inter_router_port=3002),
]
BROKERS = {
    "broker-0": BrokerEndpoint("broker-0", "127.0.0.1", amqp_port=5000, admin_port=5001),
    "broker-1": BrokerEndpoint("broker-1", "127.0.0.1", amqp_port=5100, admin_port=5101),
}


def address(
    name: str,
    kind: str,
    *,
    placed: tuple[tuple[str, str], ...] = (),
    topic: str = "",
    amqp: str | None = None,
    phase: str = "",
    messages: tuple[str, ...] = (),
    waiting: tuple[str, ...] = (),
) -> resources_pb2.Address:
    """`waiting`: the placed brokers the storage-controller says do not hold it yet."""
    return resources_pb2.Address(
        metadata=resources_pb2.Metadata(name=name, space="shop", generation=1),
        spec=resources_pb2.AddressSpec(
            address=amqp or name, type=kind, plan=f"standard-small-{kind}", topic=topic
        ),
        status=resources_pb2.AddressStatus(
            status=resources_pb2.Status(phase=phase, messages=messages),
            brokers=[
                resources_pb2.BrokerPlacement(broker=b, state=s, waiting=b in waiting)
                for b, s in placed
            ],
        ),
    )


ALL_TYPES = [
    address("orders-rr", "anycast", amqp="orders/rr"),
    address("news", "multicast"),
    address("orders", "queue", placed=(("broker-0", "Active"),)),
    address("prices", "topic", amqp="prices/all", placed=(("broker-0", "Active"),)),
    address("audit", "subscription", topic="prices", placed=(("broker-0", "Active"),)),
]


def config_for(router_id: str, addresses: list[resources_pb2.Address], generation: int = 7):
    return router_config(
        space="shop",
        router_id=router_id,
        addresses=addresses,
        placements=placements_of(addresses),
        routers=ROUTERS,
        brokers=BROKERS,
        generation=generation,
    )


def test_each_type_gets_its_route_and_stored_types_their_brokers() -> None:
    config = config_for("r1", ALL_TYPES)
    routes = {r.address: r for r in config.addresses}
    assert config.generation == 7
    assert config.space == "shop"
    assert sorted(routes) == ["audit", "news", "orders", "orders/rr", "prices/all"]
    assert routes["orders/rr"].type == "anycast"
    assert list(routes["orders/rr"].brokers) == []
    assert list(routes["news"].brokers) == []
    waypoint = routes["orders"].brokers[0]
    assert (waypoint.name, waypoint.host, waypoint.port, waypoint.state) == (
        "broker-0",
        "127.0.0.1",
        5000,
        "Active",
    )
    # the subscription reads the topic by its AMQP address, not by its resource name
    assert routes["audit"].topic == "prices/all"


def test_mesh_peers_are_the_other_routers_of_the_space() -> None:
    for router in ROUTERS:
        peers = config_for(router.router_id, ALL_TYPES).peers
        assert [p.router_id for p in peers] == [
            r.router_id for r in ROUTERS if r.router_id != router.router_id
        ]
    peers = config_for("r0", ALL_TYPES).peers
    assert [(p.host, p.port) for p in peers] == [("127.0.0.1", 2002), ("127.0.0.1", 3002)]
    # where each serves clients: a leaving router redirects its clients there
    assert [p.amqp_port for p in peers] == [r.amqp_port for r in ROUTERS[1:]]


def test_every_router_gets_the_same_routes() -> None:
    configs = [config_for(r.router_id, ALL_TYPES) for r in ROUTERS]
    assert all(list(c.addresses) == list(configs[0].addresses) for c in configs)


def test_per_broker_state_is_carried_to_the_waypoints() -> None:
    queue = address("orders", "queue", placed=(("broker-0", "Draining"), ("broker-1", "Active")))
    (route,) = config_for("r0", [queue]).addresses
    assert [(b.name, b.state, b.port) for b in route.brokers] == [
        ("broker-0", "Draining", 5000),
        ("broker-1", "Active", 5100),
    ]


def test_stored_addresses_without_placement_are_held_back_with_the_reason() -> None:
    unplaced = address("orders", "queue")
    unknown_broker = address("jobs", "queue", placed=(("broker-9", "Active"),))
    routes, held = address_routes(
        addresses=[unplaced, unknown_broker, *ALL_TYPES[:2]],
        placements=placements_of([unplaced, unknown_broker]),
        brokers=BROKERS,
    )
    assert sorted(routes) == ["news", "orders-rr"]
    assert held == {
        "orders": "waiting for a broker placement",
        "jobs": "no known endpoint yet for broker broker-9",
    }


def test_a_placement_of_an_unknown_and_a_known_broker_routes_to_the_known_one() -> None:
    queue = address("orders", "queue", placed=(("broker-9", "Active"), ("broker-1", "Active")))
    (route,) = config_for("r0", [queue]).addresses
    assert [b.name for b in route.brokers] == ["broker-1"]


def test_a_broker_that_does_not_hold_the_address_yet_stays_out_of_its_route() -> None:
    """The storage-controller's own words decide: a router sent to a broker lacking the queue
    would be refused; the route appears when the broker holds it."""
    from enmasse.storage_controller.placement import Placement
    from enmasse.storage_controller.statuses import address_status

    placement = Placement(space="shop", addresses={"orders": ("broker-0", "broker-1")})
    orders = address("orders", "queue")

    def routed(ready: set[str]) -> tuple[list[str], dict[str, str]]:
        orders.status.CopyFrom(address_status(address=orders, placement=placement, ready=ready))
        routes, held = address_routes(
            addresses=[orders], placements=placements_of([orders]), brokers=BROKERS
        )
        return [b.name for r in routes.values() for b in r.brokers], held

    assert routed(set()) == ([], {"orders": "waiting for broker: broker-0, broker-1"})
    assert routed({"broker-1"}) == (["broker-1"], {})
    assert routed({"broker-0", "broker-1"}) == (["broker-0", "broker-1"], {})
    # A draining broker still holds what it drains: it is never waited for.
    draining = address(
        "jobs",
        "queue",
        placed=(("broker-0", "Draining"), ("broker-1", "Active")),
        waiting=("broker-1",),
    )
    (route,) = config_for("r0", [draining]).addresses
    assert [(b.name, b.state) for b in route.brokers] == [("broker-0", "Draining")]


def test_a_running_route_is_kept_when_its_broker_is_said_to_lack_the_address_again() -> None:
    routing = SpaceRouting(space="shop")
    ready = address("orders", "queue", placed=(("broker-0", "Active"),))
    routes, held = address_routes(
        addresses=[ready], placements=placements_of([ready]), brokers=BROKERS
    )
    assert routing.update(routes=routes, held_back=held, routers=ROUTERS, now_ms=100)
    lacking = address("orders", "queue", placed=(("broker-0", "Active"),), waiting=("broker-0",))
    routes, held = address_routes(
        addresses=[lacking], placements=placements_of([lacking]), brokers=BROKERS
    )
    assert routes == {}
    assert not routing.update(routes=routes, held_back=held, routers=ROUTERS, now_ms=200)
    assert [b.name for b in routing.config("r0").addresses[0].brokers] == ["broker-0"]
    assert routing.held_back == {"orders": "waiting for broker: broker-0"}


def test_terminating_addresses_leave_the_configuration() -> None:
    gone = address("orders", "queue", placed=(("broker-0", "Active"),), phase="Terminating")
    assert [r.address for r in config_for("r0", [gone, ALL_TYPES[1]]).addresses] == ["news"]


def test_generation_moves_only_when_what_routers_see_changes() -> None:
    routing = SpaceRouting(space="shop")
    routes, held = address_routes(
        addresses=ALL_TYPES, placements=placements_of(ALL_TYPES), brokers=BROKERS
    )
    assert routing.update(routes=routes, held_back=held, routers=ROUTERS, now_ms=100)
    first = routing.generation
    assert first == 100
    assert not routing.update(routes=routes, held_back=held, routers=ROUTERS, now_ms=200)
    assert routing.generation == first
    # the router order in the directory does not matter
    assert not routing.update(routes=routes, held_back=held, routers=ROUTERS[::-1], now_ms=200)
    # a router joins: peers change, every router needs a new generation
    assert routing.update(routes=routes, held_back=held, routers=ROUTERS[:2], now_ms=50)
    assert routing.generation == first + 1  # increasing even when the clock says otherwise
    assert routing.config("r0").generation == routing.generation


def test_since_tracks_the_generation_of_each_address_route() -> None:
    routing = SpaceRouting(space="shop")
    routes, held = address_routes(
        addresses=ALL_TYPES[:2], placements=placements_of(ALL_TYPES), brokers=BROKERS
    )
    routing.update(routes=routes, held_back=held, routers=ROUTERS, now_ms=100)
    more, held = address_routes(
        addresses=ALL_TYPES[:3], placements=placements_of(ALL_TYPES), brokers=BROKERS
    )
    routing.update(routes=more, held_back=held, routers=ROUTERS, now_ms=300)
    assert routing.since == {"orders-rr": 100, "news": 100, "orders": 300}
    routing.update(routes=routes, held_back=held, routers=ROUTERS, now_ms=400)
    assert "orders" not in routing.since


def test_a_router_ahead_of_the_agent_lifts_the_generation_above_it() -> None:
    routing = SpaceRouting(space="shop")
    routing.update(routes={}, held_back={}, routers=ROUTERS, now_ms=100)
    assert routing.update(routes={}, held_back={}, routers=ROUTERS, floor=5000, now_ms=100)
    assert routing.generation == 5001


def test_next_generation_is_above_previous_and_clock() -> None:
    assert next_generation(10, now_ms=5) == 11
    assert next_generation(10, now_ms=50) == 50


def test_an_address_is_active_only_when_every_router_applied_it() -> None:
    addresses = [*ALL_TYPES[:3], address("jobs", "queue")]
    since = {"orders-rr": 100, "news": 100, "orders": 300}
    held = {"jobs": "waiting for a broker placement"}
    applied = {"r0": 300, "r1": 300, "r2": 100}
    phases = readiness(
        addresses=addresses, held_back=held, since=since, applied=applied, routers=ROUTERS
    )
    assert phases == {
        "orders-rr": Readiness("Active"),
        "news": Readiness("Active"),
        "orders": Readiness("Configuring", "waiting for router r2"),
        "jobs": Readiness("Configuring", "waiting for a broker placement"),
    }
    applied["r2"] = 400  # a newer generation includes it too
    phases = readiness(
        addresses=addresses, held_back=held, since=since, applied=applied, routers=ROUTERS
    )
    assert phases["orders"] == Readiness("Active")


def test_no_router_means_no_address_is_active() -> None:
    phases = readiness(
        addresses=ALL_TYPES[:1], held_back={}, since={"orders-rr": 1}, applied={}, routers=[]
    )
    assert phases == {"orders-rr": Readiness("Configuring", "no router of the space is running")}
    assert space_readiness(generation=1, applied={}, routers=[]) == Readiness(
        "Pending", "no router of the space is running"
    )
    assert space_readiness(generation=5, applied={"r0": 5, "r1": 4, "r2": 5}, routers=ROUTERS) == (
        Readiness("Configuring", "waiting for router r1")
    )


# ------------------------------------------------------- status, shared with the storage-controller


def test_direct_addresses_get_the_agents_phase_and_reason() -> None:
    calls = address("calls", "anycast")
    status = status_to_write(calls, Readiness("Configuring", "waiting for router r1"))
    assert status is not None
    assert (status.status.phase, list(status.status.messages)) == (
        "Configuring",
        ["waiting for router r1"],
    )
    assert status.status.observed_generation == 1
    calls.status.CopyFrom(status)
    assert status_to_write(calls, Readiness("Configuring", "waiting for router r1")) is None
    active = status_to_write(calls, Readiness("Active"))
    assert active is not None
    assert (active.status.phase, list(active.status.messages)) == ("Active", [])


def test_stored_addresses_keep_the_storage_controllers_verdict() -> None:
    quota = address("jobs", "queue", phase="Pending", messages=("quota exceeded",))
    assert (
        status_to_write(quota, Readiness("Configuring", "waiting for a broker placement")) is None
    )
    waiting = address(
        "orders",
        "queue",
        placed=(("broker-0", "Active"),),
        phase="Configuring",
        messages=("placed on broker broker-0",),
        waiting=("broker-0",),
    )
    assert status_to_write(waiting, Readiness("Active")) is None  # the broker lacks it yet
    assert status_to_write(waiting, Readiness("Configuring", "waiting for router r1")) is None
    ready = address(
        "orders",
        "queue",
        placed=(("broker-0", "Active"),),
        phase="Configuring",
        messages=(
            "waiting for a broker placement",
            "placed on broker broker-0",
            "broker ready: broker-0",
        ),
    )
    status = status_to_write(ready, Readiness("Active"))
    assert status is not None
    assert (status.status.phase, list(status.status.messages)) == (
        "Active",
        ["placed on broker broker-0", "broker ready: broker-0"],
    )
    assert [(b.broker, b.state) for b in status.brokers] == [("broker-0", "Active")]
    unplaced = address("fresh", "queue")
    first = status_to_write(unplaced, Readiness("Configuring", "waiting for a broker placement"))
    assert first is not None
    assert first.status.phase == "Configuring"


def test_agent_and_storage_controller_reach_a_fixed_point() -> None:
    """Each writes what it wants on top of the other's last write: they must stop writing."""
    from enmasse.storage_controller.placement import Placement
    from enmasse.storage_controller.statuses import address_status

    placement = Placement(space="shop", addresses={"orders": ("broker-0",)})
    orders = address("orders", "queue")
    writes = []
    for ready in (set(), set(), {"broker-0"}, {"broker-0"}, {"broker-0"}, {"broker-0"}):
        controller = address_status(address=orders, placement=placement, ready=ready)
        if controller != orders.status:
            orders.status.CopyFrom(controller)
            writes.append(("controller", controller.status.phase))
        agent = status_to_write(orders, Readiness("Active"))
        if agent is not None:
            orders.status.CopyFrom(agent)
            writes.append(("agent", agent.status.phase))
    assert writes == [
        ("controller", "Configuring"),  # placed, broker does not hold it yet
        ("controller", "Configuring"),  # broker ready
        ("agent", "Active"),
    ]
    assert list(orders.status.status.messages) == [
        "placed on broker broker-0",
        "broker ready: broker-0",
    ]


# ------------------------------------------------------- a lost router: phases tell the truth


def test_an_unreachable_router_holds_back_every_address_whatever_it_answered_before() -> None:
    addresses = ALL_TYPES[:3]
    since = {"orders-rr": 100, "news": 100, "orders": 300}
    applied = {"r0": 300, "r1": 300, "r2": 300}  # what each answered before r1 was lost
    phases = readiness(
        addresses=addresses,
        held_back={},
        since=since,
        applied=applied,
        routers=ROUTERS,
        unreachable={"r1"},
    )
    assert set(phases.values()) == {Readiness("Configuring", "waiting for router r1: unreachable")}
    applied["r2"] = 100  # one behind, one lost: both named, the lost one says so
    phases = readiness(
        addresses=addresses,
        held_back={},
        since=since,
        applied=applied,
        routers=ROUTERS,
        unreachable={"r1"},
    )
    assert phases["orders"] == Readiness("Configuring", "waiting for router r1: unreachable, r2")
    assert phases["news"] == Readiness("Configuring", "waiting for router r1: unreachable")
    assert space_readiness(
        generation=300, applied=applied, routers=ROUTERS, unreachable={"r1"}
    ) == Readiness("Configuring", "waiting for router r1: unreachable, r2")


def placed_queue(*, phase: str, messages: tuple[str, ...]) -> resources_pb2.Address:
    return address(
        "orders", "queue", placed=(("broker-0", "Active"),), phase=phase, messages=messages
    )


CONTROLLER_SAYS = ("placed on broker broker-0", "broker ready: broker-0")
LOST = Readiness("Configuring", "waiting for router r0: unreachable")


def test_a_stored_active_address_is_lowered_when_a_router_is_lost_and_raised_when_back() -> None:
    orders = placed_queue(phase="Active", messages=CONTROLLER_SAYS)
    lowered = status_to_write(orders, LOST)
    assert lowered is not None
    assert (lowered.status.phase, list(lowered.status.messages)) == (
        "Configuring",
        [*CONTROLLER_SAYS, "waiting for router r0: unreachable"],
    )
    assert [(b.broker, b.state) for b in lowered.brokers] == [("broker-0", "Active")]
    orders.status.CopyFrom(lowered)
    assert status_to_write(orders, LOST) is None  # said once
    # back, but behind: the reason follows what the agent knows now
    behind = status_to_write(orders, Readiness("Configuring", "waiting for router r0"))
    assert behind is not None
    assert list(behind.status.messages) == [*CONTROLLER_SAYS, "waiting for router r0"]
    orders.status.CopyFrom(behind)
    raised = status_to_write(orders, Readiness("Active"))
    assert raised is not None
    assert (raised.status.phase, list(raised.status.messages)) == ("Active", list(CONTROLLER_SAYS))


def test_the_storage_controllers_own_configuring_is_never_taken_over() -> None:
    # placed and ready, never Active yet: the controller's Configuring stays as it wrote it
    fresh = placed_queue(phase="Configuring", messages=CONTROLLER_SAYS)
    assert status_to_write(fresh, LOST) is None
    # a broker lacking the address, a quota: the controller's verdict, router lost or not
    waiting = address(
        "orders",
        "queue",
        placed=(("broker-0", "Active"),),
        phase="Active",
        messages=CONTROLLER_SAYS,
        waiting=("broker-0",),
    )
    assert status_to_write(waiting, LOST) is None
    pending = placed_queue(phase="Pending", messages=("quota exceeded",))
    assert status_to_write(pending, LOST) is None
    # a route held back for want of its broker: the controller says so, not the agent
    held = status_to_write(
        placed_queue(phase="Active", messages=CONTROLLER_SAYS),
        Readiness("Configuring", "waiting for broker: broker-0"),
    )
    assert held is None


def test_a_lost_router_and_the_storage_controller_reach_a_fixed_point() -> None:
    """Router lost, then back: each writes on top of the other's last write, and both stop."""
    from enmasse.storage_controller.placement import Placement
    from enmasse.storage_controller.statuses import address_status

    placement = Placement(space="shop", addresses={"orders": ("broker-0",)})
    orders = address("orders", "queue")
    writes = []
    rounds = [Readiness("Active")] * 3 + [LOST] * 3 + [Readiness("Active")] * 3
    for wanted in rounds:
        controller = address_status(address=orders, placement=placement, ready={"broker-0"})
        if controller != orders.status:
            orders.status.CopyFrom(controller)
            writes.append(("controller", controller.status.phase))
        agent = status_to_write(orders, wanted)
        if agent is not None:
            orders.status.CopyFrom(agent)
            writes.append(("agent", agent.status.phase))
    assert writes == [
        ("controller", "Configuring"),  # placed, broker ready
        ("agent", "Active"),
        ("agent", "Configuring"),  # router lost: once, and the controller leaves it
        ("agent", "Active"),  # back
    ]
    assert list(orders.status.status.messages) == list(CONTROLLER_SAYS)
