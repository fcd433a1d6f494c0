"""Where the routers and brokers of each address space listen: one question, asked one way.

In: an address space's name (and a broker's id). Out: `RouterEndpoint`s (a router's admin port
for the router-agent's pushes, its AMQP listener for clients, its inter-router listener for the
mesh) and `BrokerEndpoint`s (a broker's AMQP listener, which routers and drains connect to, and
its admin port for BrokerAdmin). The control plane (router-agent, storage-controller,
subscription) asks a `Directory`. The protocol says what is asked, never how the answer is found:
this machine's runtime answers from files, a cluster would answer from DNS
(`<pod>.<service>.<namespace>.svc` on the manifests' fixed ports), and a caller never knows which.
Whether a process is actually up is not the directory's business either: the caller asks the
process itself, with a deadline.

Two ways of asking, because the callers need both:
- a whole space, `routers(space)` / `brokers(space)`, as of the last `refresh()`: the
  router-agent computes every router's configuration of one pass from one consistent picture,
  and `refresh` tells it whether anything moved;
- one broker, now: `broker(space, id)`. The storage-controller and the subscription service
  connect to that broker right away, and a broker restarted on other ports must be found at once.

`LocalDirectory` is this machine's: the ports files the processes write themselves once they
listen (`enmasse-router --ports-file`, `enmasse-broker --ports-file`), each replaced whole
(`write_ports` does it the same way, for tests and tools), laid out by space and id:

    <var>/routers/<space>/<router-id>/ports.json   {"amqp": 41002, "inter_router": 41003,
                                                     "admin": 41001, "amqps": 41004}
    <var>/brokers/<space>/<broker-id>/ports.json   {"amqp": 42001, "admin": 42002, ...}
    <var>/gateways/<space>/<gateway-id>/ports.json {"mqtt": 43001}

`amqps` is there when the process listens for clients over TLS too (every router `enmasse up`
starts, a brokered space's broker): `client_endpoints` turns what was found into the endpoints a
space's status shows, `amqp` and beside it `amqps`, and a standard space's MQTT gateways
(`enmasse-mqtt-gateway --ports-file`) as `mqtt`.

Everything listens on loopback. The whole-space view rereads a file only when it changed (mtime
and size); a file that is half-written or malformed is skipped (logged once) and its last good
reading kept, because a router must not lose its mesh over a torn write; a file that is gone is
a process the runtime removed. The one-broker answer reads the broker's file on every call and is
None while the file is missing, torn or malformed: "not running", as far as the directory knows
(the storage-controller then falls back on the ports its rendered manifest pins).

`follow_ports_files` is how a reader learns that the picture moved without rereading it on a
timer: it waits on inotify (watchfiles) under the three trees and calls back once per burst of
ports files written or removed; the journals and logs beside them never wake it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

import structlog
from enmasse.resources.contracts import AMQP, AMQPS, MQTT
from enmasse.v1 import resources_pb2
from watchfiles import Change, awatch

log = structlog.get_logger(__name__)
LOOPBACK = "127.0.0.1"
PORTS_FILE = "ports.json"
Endpoint = TypeVar("Endpoint")


@dataclass(frozen=True)
class RouterEndpoint:
    """One router of a space: where it serves clients, its mesh peers and its admin API."""

    router_id: str
    host: str
    admin_port: int
    amqp_port: int
    inter_router_port: int
    amqps_port: int | None = None  # its clients' TLS port, when it has one

    @property
    def admin(self) -> str:
        return f"{self.host}:{self.admin_port}"

    @property
    def amqp(self) -> str:
        return f"{self.host}:{self.amqp_port}"


@dataclass(frozen=True)
class BrokerEndpoint:
    """One broker of a space: its AMQP listener (routers, drains) and its admin API."""

    name: str
    host: str
    amqp_port: int
    admin_port: int
    amqps_port: int | None = None  # a brokered space's broker: its clients' TLS port

    @property
    def admin(self) -> str:
        return f"{self.host}:{self.admin_port}"


@dataclass(frozen=True)
class GatewayEndpoint:
    """One MQTT gateway of a standard space: where MQTT devices connect."""

    name: str
    host: str
    mqtt_port: int


def client_endpoints(
    found: Iterable[RouterEndpoint | BrokerEndpoint | GatewayEndpoint],
) -> list[resources_pb2.Endpoint]:
    """A space's `status.endpoints` for the routers (or the broker) its clients connect to: each
    one's `amqp`, then its `amqps` when it listens for TLS too; an MQTT gateway's `mqtt`."""
    endpoints = []
    for endpoint in found:
        if isinstance(endpoint, GatewayEndpoint):
            endpoints.append(
                resources_pb2.Endpoint(name=MQTT, host=endpoint.host, port=endpoint.mqtt_port)
            )
            continue
        endpoints.append(
            resources_pb2.Endpoint(name=AMQP, host=endpoint.host, port=endpoint.amqp_port)
        )
        if endpoint.amqps_port is not None:
            endpoints.append(
                resources_pb2.Endpoint(name=AMQPS, host=endpoint.host, port=endpoint.amqps_port)
            )
    return endpoints


class Directory(Protocol):
    """Which routers and brokers of an address space exist, and where they listen."""

    def refresh(self) -> bool:
        """Brings the whole-space answers up to date; True when any of them changed."""
        ...

    def routers(self, space: str) -> list[RouterEndpoint]:
        """The routers of `space` as of the last refresh, by router id."""
        ...

    def brokers(self, space: str) -> dict[str, BrokerEndpoint]:
        """The brokers of `space` as of the last refresh, by broker id."""
        ...

    def broker(self, space: str, name: str) -> BrokerEndpoint | None:
        """Where broker `name` of `space` listens now; None while the directory knows of none."""
        ...

    def gateways(self, space: str) -> list[GatewayEndpoint]:
        """The MQTT gateways of `space` as of the last refresh, by gateway id."""
        ...


class DirectoryError(ValueError):
    """A ports file that does not say what the layout above says."""


def router_of(router_id: str, ports: Any) -> RouterEndpoint:
    """A router from what its ports file says (`DirectoryError` when that is not enough)."""
    return RouterEndpoint(
        router_id=router_id,
        host=LOOPBACK,
        admin_port=_port(ports, "admin", router_id),
        amqp_port=_port(ports, "amqp", router_id),
        inter_router_port=_port(ports, "inter_router", router_id),
        amqps_port=_optional_port(ports, "amqps", router_id),
    )


def broker_of(broker_id: str, ports: Any) -> BrokerEndpoint:
    """A broker from what its ports file says (`DirectoryError` when that is not enough)."""
    return BrokerEndpoint(
        name=broker_id,
        host=LOOPBACK,
        amqp_port=_port(ports, "amqp", broker_id),
        admin_port=_port(ports, "admin", broker_id),
        amqps_port=_optional_port(ports, "amqps", broker_id),
    )


def gateway_of(gateway_id: str, ports: Any) -> GatewayEndpoint:
    """An MQTT gateway from what its ports file says (`DirectoryError` when that is not enough)."""
    return GatewayEndpoint(name=gateway_id, host=LOOPBACK, mqtt_port=_port(ports, MQTT, gateway_id))


def _optional_port(ports: Any, key: str, owner: str) -> int | None:
    return _port(ports, key, owner) if isinstance(ports, dict) and key in ports else None


def _port(ports: Any, key: str, owner: str) -> int:
    value = ports.get(key) if isinstance(ports, dict) else None
    if not isinstance(value, int) or not 0 < value < 65536:
        raise DirectoryError(f"{owner}: ports file needs '{key}' in 1..65535, got {ports!r:.120}")
    return value


class LocalDirectory:
    """This machine's routers and brokers, from the ports files under the runtime's var dir
    (`<var>/routers`, `<var>/brokers`, unless given elsewhere)."""

    def __init__(
        self, var: Path, *, routers: Path | None = None, brokers: Path | None = None
    ) -> None:
        self._routers = _PortsTree(routers or var / "routers")
        self._brokers = _PortsTree(brokers or var / "brokers")
        self._gateways = _PortsTree(var / "gateways")
        self._refused_routers: set[str] = set()
        self._refused_brokers: set[str] = set()
        self._refused_gateways: set[str] = set()

    @property
    def roots(self) -> tuple[Path, ...]:
        """The trees its ports files are under (what `follow_ports_files` watches)."""
        return (self._routers.root, self._brokers.root, self._gateways.root)

    def refresh(self) -> bool:
        routers_moved = self._routers.refresh()
        brokers_moved = self._brokers.refresh()
        gateways_moved = self._gateways.refresh()
        return routers_moved or brokers_moved or gateways_moved

    def gateways(self, space: str) -> list[GatewayEndpoint]:
        return _parsed(self._gateways.of_space(space), gateway_of, self._refused_gateways)

    def routers(self, space: str) -> list[RouterEndpoint]:
        return _parsed(self._routers.of_space(space), router_of, self._refused_routers)

    def brokers(self, space: str) -> dict[str, BrokerEndpoint]:
        found = _parsed(self._brokers.of_space(space), broker_of, self._refused_brokers)
        return {b.name: b for b in found}

    def broker(self, space: str, name: str) -> BrokerEndpoint | None:
        path = self._brokers.root / space / name / PORTS_FILE
        try:
            return broker_of(name, json.loads(path.read_text()))
        except (OSError, ValueError):  # not running yet, or its file is being replaced
            return None


class _PortsTree:
    """`<root>/<space>/<id>/ports.json`, re-read file by file only when one changed."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._stamps: dict[tuple[str, str], tuple[int, int]] = {}
        self.ports: dict[tuple[str, str], dict[str, Any]] = {}

    def refresh(self) -> bool:
        seen: dict[tuple[str, str], tuple[int, int]] = {}
        changed = False
        for path in sorted(self.root.glob(f"*/*/{PORTS_FILE}")):
            key = (path.parent.parent.name, path.parent.name)
            try:
                stat = path.stat()
            except FileNotFoundError:
                continue
            seen[key] = (stat.st_mtime_ns, stat.st_size)
            if self._stamps.get(key) == seen[key]:
                continue
            try:
                self.ports[key] = json.loads(path.read_text())
                changed = True
            except (OSError, ValueError) as error:
                log.warning(
                    "ports file unreadable; keeping the last one", path=str(path), error=str(error)
                )
                seen[key] = (0, 0)  # read it again next time
        for gone in [key for key in self.ports if key not in seen]:
            del self.ports[gone]
            changed = True
        self._stamps = seen
        return changed

    def of_space(self, space: str) -> dict[str, dict[str, Any]]:
        return {ident: ports for (s, ident), ports in sorted(self.ports.items()) if s == space}


def _parsed(
    entries: Mapping[str, Any], parse: Callable[[str, Any], Endpoint], refused: set[str]
) -> list[Endpoint]:
    found = []
    for ident, ports in entries.items():
        try:
            found.append(parse(ident, ports))
        except DirectoryError as error:
            if str(error) not in refused:  # once per bad file, not once per pass
                refused.add(str(error))
                log.warning("ports file refused", error=str(error))
    return found


def write_ports(path: Path, ports: Mapping[str, int]) -> None:
    """Writes a ports file whole (temp file + rename), as the processes do; for tests and tools."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(json.dumps(dict(ports)))
    os.replace(partial, path)


async def follow_ports_files(roots: Sequence[Path], on_change: Callable[[], None]) -> None:
    """Calls `on_change` each time ports files under `roots` are written or removed (once per
    burst), until cancelled. The roots are made if missing: a tree nobody wrote yet is watched."""
    for root in roots:
        root.mkdir(parents=True, exist_ok=True)
    async for _changes in awatch(*roots, watch_filter=_is_ports_file, debounce=100):
        on_change()


def _is_ports_file(_change: Change, path: str) -> bool:
    return path.endswith(f"/{PORTS_FILE}")
