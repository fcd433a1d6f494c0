"""Where the routers and brokers of each address space run: the directories the agent reads.

In: the ports files the processes write themselves when they listen (`enmasse-router
--ports-file`, `enmasse-broker --ports-file`), laid out by space and id under the runtime's var
dir. Out: per space, the `RouterEndpoint`s the agent configures and the `BrokerEndpoint`s the
routes point at.

    <var>/routers/<space>/<router-id>/ports.json   {"amqp": 41002, "inter_router": 41003,
                                                     "admin": 41001}
    <var>/brokers/<space>/<broker-id>/ports.json   {"amqp": 42001, "admin": 42002, ...}

The broker layout is the one the storage-controller renders into its local broker commands (and
reads back in its own directory); routers follow the same pattern. Everything listens on
127.0.0.1 locally.

Why files behind an interface: in a cluster the same answers come from Services / EndpointSlices
(StatefulSet pods with stable names); locally the process that listens knows its ports best, and
a restarted process (new admin port) rewrites its file, which the agent notices. The agent only
needs `routers(space)` / `brokers(space)`, so either fits behind the two protocols. A file that
is half-written or malformed is skipped (and logged once) and the last good reading of it kept,
because a router must not lose its mesh over a torn write; a file that is gone is a process the
runtime removed.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import structlog
from enmasse.router_agent.routing import BrokerEndpoint, RouterEndpoint

log = structlog.get_logger(__name__)
LOOPBACK = "127.0.0.1"
PORTS_FILE = "ports.json"


class RouterDirectory(Protocol):
    def refresh(self) -> bool: ...

    def routers(self, space: str) -> list[RouterEndpoint]: ...


class BrokerDirectory(Protocol):
    def refresh(self) -> bool: ...

    def brokers(self, space: str) -> dict[str, BrokerEndpoint]: ...


class DirectoryError(ValueError):
    """A ports file that does not say what the layout above says."""


def router_of(router_id: str, ports: Any) -> RouterEndpoint:
    return RouterEndpoint(
        router_id=router_id,
        host=LOOPBACK,
        admin_port=_port(ports, "admin", router_id),
        amqp_port=_port(ports, "amqp", router_id),
        inter_router_port=_port(ports, "inter_router", router_id),
    )


def broker_of(broker_id: str, ports: Any) -> BrokerEndpoint:
    return BrokerEndpoint(
        name=broker_id,
        host=LOOPBACK,
        amqp_port=_port(ports, "amqp", broker_id),
        admin_port=_port(ports, "admin", broker_id),
    )


def _port(ports: Any, key: str, owner: str) -> int:
    value = ports.get(key) if isinstance(ports, dict) else None
    if not isinstance(value, int) or not 0 < value < 65536:
        raise DirectoryError(f"{owner}: ports file needs '{key}' in 1..65535, got {ports!r:.120}")
    return value


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


class PortsTreeRouters:
    def __init__(self, root: Path) -> None:
        self._tree = _PortsTree(root)
        self._refused: set[str] = set()

    def refresh(self) -> bool:
        return self._tree.refresh()

    def routers(self, space: str) -> list[RouterEndpoint]:
        return _parsed(self._tree.of_space(space), router_of, self._refused)


class PortsTreeBrokers:
    def __init__(self, root: Path) -> None:
        self._tree = _PortsTree(root)
        self._refused: set[str] = set()

    def refresh(self) -> bool:
        return self._tree.refresh()

    def brokers(self, space: str) -> dict[str, BrokerEndpoint]:
        found = _parsed(self._tree.of_space(space), broker_of, self._refused)
        return {b.name: b for b in found}


def _parsed(entries: Mapping[str, Any], parse: Any, refused: set[str]) -> list[Any]:
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
