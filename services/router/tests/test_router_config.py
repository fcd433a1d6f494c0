"""The configuration model: validation with precise errors, the generation rule, round trip."""

from __future__ import annotations

import pytest
from enmasse.router.config import (
    BrokerState,
    ConfigError,
    Distribution,
    RouterConfig,
    StaleGeneration,
    config_from_proto,
    config_to_proto,
    decide_apply,
)
from enmasse.v1 import router_pb2


def _config(**kwargs: object) -> router_pb2.RouterConfig:
    base: dict[str, object] = {
        "generation": 3,
        "space": "shop",
        "addresses": [
            router_pb2.AddressRoute(address="calls", type="anycast"),
            router_pb2.AddressRoute(address="news", type="multicast"),
            router_pb2.AddressRoute(
                address="orders",
                type="queue",
                brokers=[
                    router_pb2.BrokerWaypoint(name="b1", host="127.0.0.1", port=5701),
                    router_pb2.BrokerWaypoint(
                        name="b2", host="127.0.0.1", port=5702, state="Draining"
                    ),
                ],
            ),
        ],
        "peers": [
            router_pb2.MeshPeer(router_id="r1", host="127.0.0.1", port=6001),
            router_pb2.MeshPeer(router_id="r3", host="127.0.0.1", port=6003, cost=5),
        ],
    }
    base.update(kwargs)
    return router_pb2.RouterConfig(**base)  # type: ignore[arg-type]


def test_valid_config_reads_into_routes_and_peers() -> None:
    config = config_from_proto(_config(), router_id="r2")
    assert config.route("calls").distribution is Distribution.ANYCAST  # type: ignore[union-attr]
    orders = config.route("orders")
    assert orders is not None
    assert orders.distribution.is_waypoint
    assert [w.broker for w in orders.active_waypoints] == ["b1"]
    assert orders.waypoints[1].state is BrokerState.DRAINING
    assert config.route("nope") is None
    assert [p.cost for p in config.peers] == [1, 5]
    assert [p.router_id for p in config.peers_to_dial(router_id="r2")] == ["r1"]
    assert set(config.brokers()) == {"b1", "b2"}


def test_round_trip_through_proto_is_lossless() -> None:
    config = config_from_proto(_config(), router_id="r2")
    assert config_from_proto(config_to_proto(config), router_id="r2") == config


@pytest.mark.parametrize(
    ("addresses", "error"),
    [
        (
            [router_pb2.AddressRoute(address="x", type="fanout")],
            "address 'x' has unknown type 'fanout' (expected one of anycast, multicast, queue, "
            "topic, subscription)",
        ),
        (
            [router_pb2.AddressRoute(address="q", type="queue")],
            "address 'q' of type queue needs at least one broker",
        ),
        (
            [
                router_pb2.AddressRoute(
                    address="a",
                    type="anycast",
                    brokers=[router_pb2.BrokerWaypoint(name="b", host="h", port=1)],
                )
            ],
            "address 'a' of type anycast is direct and takes no brokers",
        ),
        (
            [
                router_pb2.AddressRoute(
                    address="q",
                    type="queue",
                    brokers=[router_pb2.BrokerWaypoint(name="b", host="h", port=1, state="Gone")],
                )
            ],
            "address 'q': broker 'b' has unknown state 'Gone' (expected Active or Draining)",
        ),
        (
            [
                router_pb2.AddressRoute(address="a", type="anycast"),
                router_pb2.AddressRoute(address="a", type="multicast"),
            ],
            "address 'a' is configured twice",
        ),
        (
            [
                router_pb2.AddressRoute(
                    address="s",
                    type="subscription",
                    brokers=[router_pb2.BrokerWaypoint(name="b", host="h", port=1)],
                )
            ],
            "subscription 's' needs a topic",
        ),
    ],
)
def test_bad_addresses_are_refused_with_the_culprit_named(
    addresses: list[router_pb2.AddressRoute], error: str
) -> None:
    with pytest.raises(ConfigError) as raised:
        config_from_proto(_config(addresses=addresses), router_id="r2")
    assert str(raised.value) == error


def test_bad_generation_and_peers_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"^generation must be > 0, got 0$"):
        config_from_proto(_config(generation=0), router_id="r2")
    twice = [router_pb2.MeshPeer(router_id="r1", host="h", port=1)] * 2
    with pytest.raises(ConfigError, match=r"^mesh peer 'r1' is listed twice$"):
        config_from_proto(_config(peers=twice), router_id="r2")


def test_generation_rule_same_is_noop_older_is_refused() -> None:
    running = RouterConfig(generation=5)
    assert decide_apply(running=running, pushed_generation=6) is True
    assert decide_apply(running=running, pushed_generation=5) is False
    with pytest.raises(StaleGeneration) as raised:
        decide_apply(running=running, pushed_generation=4)
    assert str(raised.value) == "generation 4 is older than the running generation 5"
