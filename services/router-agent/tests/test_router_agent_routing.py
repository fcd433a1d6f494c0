"""The pure routing of the router-agent: routes, per-router configs, generations and readiness."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from enmasse.router_agent.directory import (
    DirectoryError,
    FileRouterDirectory,
    parse_brokers,
    parse_routers,
    write_endpoints,
)
from enmasse.router_agent.routing import (
    BrokerEndpoint,
    Readiness,
    RouterEndpoint,
    SpaceRouting,
    address_routes,
    next_generation,
    placements_of,
    readiness,
    router_config,
    space_readiness,
)
from enmasse.v1 import resources_pb2

ROUTERS = [
    RouterEndpoint("r0", "127.0.0.1", admin_port=1000, amqp_port=1001, inter_router_port=1002),
    RouterEndpoint("r1", "127.0.0.1", admin_port=2000, amqp_port=2001, inter_router_port=2002),
    RouterEndpoint("r2", "127.0.0.1", admin_port=3000, amqp_port=3001, inter_router_port=3002),
]
BROKERS = {
    "broker-0": BrokerEndpoint("broker-0", "127.0.0.1", amqp_port=5000),
    "broker-1": BrokerEndpoint("broker-1", "127.0.0.1", amqp_port=5100),
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
) -> resources_pb2.Address:
    return resources_pb2.Address(
        metadata=resources_pb2.Metadata(name=name, space="shop", generation=1),
        spec=resources_pb2.AddressSpec(
            address=amqp or name, type=kind, plan=f"standard-small-{kind}", topic=topic
        ),
        status=resources_pb2.AddressStatus(
            status=resources_pb2.Status(phase=phase, messages=messages),
            brokers=[resources_pb2.BrokerPlacement(broker=b, state=s) for b, s in placed],
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
        "jobs": "waiting for broker broker-9 to run",
    }


def test_a_placement_of_an_unknown_and_a_known_broker_routes_to_the_known_one() -> None:
    queue = address("orders", "queue", placed=(("broker-9", "Active"), ("broker-1", "Active")))
    (route,) = config_for("r0", [queue]).addresses
    assert [b.name for b in route.brokers] == ["broker-1"]


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


# ---------------------------------------------------------------- the directory files


def test_endpoint_files_parse_and_bad_ones_are_refused_precisely() -> None:
    routers = parse_routers(
        {
            "shop": [
                {
                    "router_id": "r0",
                    "host": "127.0.0.1",
                    "admin_port": 1,
                    "amqp_port": 2,
                    "inter_router_port": 3,
                }
            ]
        }
    )
    assert routers["shop"][0].admin == "127.0.0.1:1"
    brokers = parse_brokers({"shop": [{"name": "broker-0", "amqp_port": 9}]})
    assert brokers["shop"]["broker-0"].amqp_port == 9
    with pytest.raises(DirectoryError, match=r"needs 'inter_router_port' in 1\.\.65535"):
        parse_routers({"shop": [{"router_id": "r0", "admin_port": 1, "amqp_port": 2}]})
    with pytest.raises(DirectoryError, match="space 'shop' must map to a list of objects"):
        parse_brokers({"shop": {"name": "broker-0"}})


def test_a_torn_endpoints_file_keeps_the_last_good_content(tmp_path: Path) -> None:
    path = tmp_path / "routers.json"
    entry = {
        "router_id": "r0",
        "host": "127.0.0.1",
        "admin_port": 1,
        "amqp_port": 2,
        "inter_router_port": 3,
    }
    write_endpoints(path, {"shop": [entry]})
    directory = FileRouterDirectory(path)
    assert directory.refresh()
    assert [r.router_id for r in directory.routers("shop")] == ["r0"]
    path.write_text(json.dumps({"shop": [entry]})[:20])
    assert not directory.refresh()
    assert [r.router_id for r in directory.routers("shop")] == ["r0"]
    path.unlink()
    assert directory.refresh()
    assert directory.routers("shop") == []
