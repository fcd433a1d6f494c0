"""The local `Directory` over real ports files in a temp dir: what each kind of file gives.

The layout is the runtime's (`<var>/routers/<space>/<id>/ports.json`, `<var>/brokers/...`); files
are written whole the way the processes write them (`write_ports`), or torn / malformed by hand
to stand for a write caught halfway or a file that says too little.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from enmasse.resources.discovery import (
    BrokerEndpoint,
    Directory,
    DirectoryError,
    GatewayEndpoint,
    LocalDirectory,
    broker_of,
    client_endpoints,
    router_of,
    write_ports,
)

ROUTER_PORTS = {"amqp": 2, "inter_router": 3, "admin": 1}


def test_ports_files_parse_and_bad_ones_are_refused_precisely() -> None:
    router = router_of("r0", {"amqp": 2, "inter_router": 3, "admin": 1})
    assert (router.admin, router.amqp, router.inter_router_port) == (
        "127.0.0.1:1",
        "127.0.0.1:2",
        3,
    )
    assert broker_of("broker-0", {"amqp": 9, "admin": 8, "pid": 77}).amqp_port == 9
    with pytest.raises(DirectoryError, match=r"r0: ports file needs 'inter_router' in 1\.\.65535"):
        router_of("r0", {"amqp": 2, "admin": 1})
    with pytest.raises(DirectoryError, match="broker-0: ports file needs 'admin'"):
        broker_of("broker-0", {"amqp": 9, "admin": 0})


def test_an_amqps_port_is_read_when_there_and_shown_beside_amqp() -> None:
    """A process that listens for TLS too says `amqps`; a space's status lists each one's amqp
    and then its amqps endpoint, and only amqp for one without."""
    secure = router_of("r0", {**ROUTER_PORTS, "amqps": 4})
    plain = router_of("r1", {"amqp": 12, "inter_router": 13, "admin": 11})
    assert (secure.amqps_port, plain.amqps_port) == (4, None)
    assert broker_of("broker-0", {"amqp": 9, "admin": 8, "amqps": 7}).amqps_port == 7
    with pytest.raises(DirectoryError, match=r"r0: ports file needs 'amqps' in 1\.\.65535"):
        router_of("r0", {**ROUTER_PORTS, "amqps": 0})
    shown = [(e.name, e.host, e.port) for e in client_endpoints([secure, plain])]
    assert shown == [
        ("amqp", "127.0.0.1", 2),
        ("amqps", "127.0.0.1", 4),
        ("amqp", "127.0.0.1", 12),
    ]


def test_a_spaces_mqtt_gateways_are_found_and_shown_as_mqtt_endpoints(tmp_path: Path) -> None:
    directory = LocalDirectory(tmp_path)
    router = router_of("r0", ROUTER_PORTS)
    write_ports(tmp_path / "gateways/shop/mqtt-gateway/ports.json", {"mqtt": 1883})
    write_ports(tmp_path / "gateways/lab/mqtt-gateway/ports.json", {"mqtt": 0})  # refused
    assert directory.refresh()
    gateways = directory.gateways("shop")
    assert gateways == [GatewayEndpoint(name="mqtt-gateway", host="127.0.0.1", mqtt_port=1883)]
    assert directory.gateways("lab") == []
    shown = [(e.name, e.port) for e in client_endpoints([router, *gateways])]
    assert shown == [("amqp", 2), ("mqtt", 1883)]


def test_the_ports_tree_follows_processes_by_space(tmp_path: Path) -> None:
    routers = LocalDirectory(tmp_path)
    brokers = LocalDirectory(tmp_path)
    assert not routers.refresh()
    assert routers.routers("shop") == []
    write_ports(tmp_path / "routers/shop/r1/ports.json", {"amqp": 2, "inter_router": 3, "admin": 1})
    write_ports(tmp_path / "routers/shop/r0/ports.json", {"amqp": 5, "inter_router": 6, "admin": 4})
    write_ports(tmp_path / "routers/lab/r0/ports.json", {"amqp": 8, "inter_router": 9, "admin": 7})
    write_ports(tmp_path / "brokers/shop/broker-0/ports.json", {"amqp": 11, "admin": 12})
    assert routers.refresh()
    assert brokers.refresh()
    assert [(r.router_id, r.amqp_port) for r in routers.routers("shop")] == [("r0", 5), ("r1", 2)]
    assert [r.amqp_port for r in routers.routers("lab")] == [8]
    assert brokers.brokers("shop")["broker-0"].admin == "127.0.0.1:12"
    assert not routers.refresh()  # nothing changed
    # a restarted router rewrites its file with a new admin port
    write_ports(
        tmp_path / "routers/shop/r1/ports.json", {"amqp": 2, "inter_router": 3, "admin": 99}
    )
    assert routers.refresh()
    assert [r.admin_port for r in routers.routers("shop")] == [4, 99]
    # torn: the last good reading stays; gone: the router is gone
    (tmp_path / "routers/shop/r1/ports.json").write_text('{"amqp": 2, "inter')
    routers.refresh()
    assert [r.admin_port for r in routers.routers("shop")] == [4, 99]
    (tmp_path / "routers/shop/r1/ports.json").unlink()
    assert routers.refresh()
    assert [r.router_id for r in routers.routers("shop")] == ["r0"]


def test_the_whole_space_view_answers_as_of_the_last_refresh(tmp_path: Path) -> None:
    directory: Directory = LocalDirectory(tmp_path)
    write_ports(tmp_path / "brokers/shop/broker-0/ports.json", {"amqp": 11, "admin": 12})
    assert directory.brokers("shop") == {}  # not refreshed yet
    assert directory.refresh()
    assert directory.brokers("shop") == {
        "broker-0": BrokerEndpoint("broker-0", "127.0.0.1", amqp_port=11, admin_port=12)
    }
    assert directory.brokers("lab") == {}
    assert directory.routers("shop") == []


def test_a_file_first_seen_half_written_is_skipped_until_it_is_whole(tmp_path: Path) -> None:
    directory = LocalDirectory(tmp_path)
    path = tmp_path / "brokers/shop/broker-0/ports.json"
    path.parent.mkdir(parents=True)
    path.write_text('{"amqp": 11, "ad')
    assert not directory.refresh()  # nothing readable yet, so nothing moved
    assert directory.brokers("shop") == {}
    write_ports(path, {"amqp": 11, "admin": 12})
    assert directory.refresh()
    assert list(directory.brokers("shop")) == ["broker-0"]


def test_a_file_that_says_too_little_is_left_out_and_the_others_kept(tmp_path: Path) -> None:
    directory = LocalDirectory(tmp_path)
    write_ports(tmp_path / "routers/shop/r0/ports.json", ROUTER_PORTS)
    write_ports(tmp_path / "routers/shop/r1/ports.json", {"amqp": 5, "admin": 4})
    write_ports(tmp_path / "brokers/shop/broker-0/ports.json", {"amqp": 11, "admin": 0})
    write_ports(tmp_path / "brokers/shop/broker-1/ports.json", {"amqp": 21, "admin": 22})
    (tmp_path / "brokers/shop/broker-2").mkdir()
    (tmp_path / "brokers/shop/broker-2/ports.json").write_text("[11, 12]")
    assert directory.refresh()
    assert [r.router_id for r in directory.routers("shop")] == ["r0"]
    assert list(directory.brokers("shop")) == ["broker-1"]
    assert [r.router_id for r in directory.routers("shop")] == ["r0"]  # asked again: the same


def test_one_broker_is_read_at_each_look_up(tmp_path: Path) -> None:
    directory = LocalDirectory(tmp_path)
    path = tmp_path / "brokers/shop/broker-0/ports.json"
    assert directory.broker("shop", "broker-0") is None  # missing: not running yet
    path.parent.mkdir(parents=True)
    path.write_text('{"amqp": 11, "ad')
    assert directory.broker("shop", "broker-0") is None  # half-written
    path.write_text('{"amqp": 11}')
    assert directory.broker("shop", "broker-0") is None  # says too little
    write_ports(path, {"amqp": 11, "admin": 12, "pid": 77})
    assert directory.broker("shop", "broker-0") == BrokerEndpoint(
        "broker-0", "127.0.0.1", amqp_port=11, admin_port=12
    )
    # restarted on other ports: found at once, no refresh needed
    write_ports(path, {"amqp": 31, "admin": 32})
    found = directory.broker("shop", "broker-0")
    assert found is not None
    assert (found.amqp_port, found.admin) == (31, "127.0.0.1:32")
    # a torn rewrite is "not running" for this answer (the whole-space view keeps the last one)
    path.write_text('{"amqp": 3')
    assert directory.broker("shop", "broker-0") is None
    path.unlink()
    assert directory.broker("shop", "broker-0") is None
    assert directory.broker("lab", "broker-0") is None


def test_the_roots_can_be_named_apart_from_the_var_dir(tmp_path: Path) -> None:
    directory = LocalDirectory(tmp_path / "var", routers=tmp_path / "r", brokers=tmp_path / "b")
    write_ports(tmp_path / "r/shop/r0/ports.json", ROUTER_PORTS)
    write_ports(tmp_path / "b/shop/broker-0/ports.json", {"amqp": 11, "admin": 12})
    write_ports(tmp_path / "var/brokers/shop/broker-9/ports.json", {"amqp": 13, "admin": 14})
    assert directory.refresh()
    assert [r.router_id for r in directory.routers("shop")] == ["r0"]
    assert list(directory.brokers("shop")) == ["broker-0"]
    assert directory.broker("shop", "broker-0") is not None
    assert directory.broker("shop", "broker-9") is None
