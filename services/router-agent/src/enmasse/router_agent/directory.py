"""Where the routers and brokers of each address space run: the directories the agent reads.

In: endpoint files the runtime writes (locally `enmasse up`, under `<var>/run/`). Out: per space,
the `RouterEndpoint`s and `BrokerEndpoint`s the agent configures and the routes point at.

The files (JSON, written whole by their owner, replaced atomically with a rename):

    <var>/run/routers.json
    {"<space>": [{"router_id": "r0", "host": "127.0.0.1", "admin_port": 41001,
                  "amqp_port": 41002, "inter_router_port": 41003}, ...], ...}

    <var>/run/brokers.json
    {"<space>": [{"name": "broker-0", "host": "127.0.0.1", "amqp_port": 42001,
                  "admin_port": 42002}, ...], ...}

Why files behind an interface: in a cluster the same answers come from Kubernetes Services
(StatefulSet pods with stable names); locally the runtime that starts the processes knows their
ports. The agent only needs `routers(space)` / `brokers(space)`, so either fits behind the two
protocols. A file that is missing, half-written or malformed reads as "no change": the last good
content is kept and the problem is logged once, because a router must not lose its mesh over a
torn write.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import structlog
from enmasse.router_agent.routing import BrokerEndpoint, RouterEndpoint

log = structlog.get_logger(__name__)


class RouterDirectory(Protocol):
    def refresh(self) -> bool: ...

    def spaces(self) -> list[str]: ...

    def routers(self, space: str) -> list[RouterEndpoint]: ...


class BrokerDirectory(Protocol):
    def refresh(self) -> bool: ...

    def brokers(self, space: str) -> dict[str, BrokerEndpoint]: ...


class DirectoryError(ValueError):
    """An endpoints file that does not say what the format above says."""


def parse_routers(document: Any) -> dict[str, list[RouterEndpoint]]:
    found: dict[str, list[RouterEndpoint]] = {}
    for space, entries in _spaces(document, "routers"):
        found[space] = [
            RouterEndpoint(
                router_id=_text(entry, "router_id", space),
                host=_text(entry, "host", space, default="127.0.0.1"),
                admin_port=_port(entry, "admin_port", space),
                amqp_port=_port(entry, "amqp_port", space),
                inter_router_port=_port(entry, "inter_router_port", space),
            )
            for entry in entries
        ]
    return found


def parse_brokers(document: Any) -> dict[str, dict[str, BrokerEndpoint]]:
    found: dict[str, dict[str, BrokerEndpoint]] = {}
    for space, entries in _spaces(document, "brokers"):
        brokers = [
            BrokerEndpoint(
                name=_text(entry, "name", space),
                host=_text(entry, "host", space, default="127.0.0.1"),
                amqp_port=_port(entry, "amqp_port", space),
                admin_port=_port(entry, "admin_port", space, required=False),
            )
            for entry in entries
        ]
        found[space] = {b.name: b for b in brokers}
    return found


def _spaces(document: Any, what: str) -> list[tuple[str, list[Mapping[str, Any]]]]:
    if not isinstance(document, dict):
        raise DirectoryError(f"{what}: expected an object of space -> list, got {document!r:.80}")
    out = []
    for space, entries in document.items():
        if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
            raise DirectoryError(f"{what}: space '{space}' must map to a list of objects")
        out.append((str(space), entries))
    return out


def _text(entry: Mapping[str, Any], key: str, space: str, *, default: str | None = None) -> str:
    value = entry.get(key, default)
    if not isinstance(value, str) or not value:
        raise DirectoryError(f"space '{space}': entry {dict(entry)} needs a non-empty '{key}'")
    return value


def _port(entry: Mapping[str, Any], key: str, space: str, *, required: bool = True) -> int:
    value = entry.get(key, None if required else 0)
    if not isinstance(value, int) or not (0 <= value < 65536) or (required and value == 0):
        raise DirectoryError(f"space '{space}': entry {dict(entry)} needs '{key}' in 1..65535")
    return value


class _JsonFile:
    """A JSON file re-read only when it changed (mtime and size), keeping the last good parse."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stamp: tuple[int, int] | None = None
        self.document: Any = {}

    def read(self) -> tuple[Any, bool]:
        """(the document, whether it changed since the last read)."""
        try:
            stat = self.path.stat()
        except FileNotFoundError:
            changed = self._stamp is not None
            self._stamp, self.document = None, {}
            return self.document, changed
        stamp = (stat.st_mtime_ns, stat.st_size)
        if stamp == self._stamp:
            return self.document, False
        try:
            document = json.loads(self.path.read_text())
        except (OSError, ValueError) as error:
            log.warning(
                "endpoints file unreadable; keeping the last one",
                path=str(self.path),
                error=str(error),
            )
            return self.document, False
        self._stamp, self.document = stamp, document
        return document, True


class FileRouterDirectory:
    def __init__(self, path: Path) -> None:
        self._file = _JsonFile(path)
        self._routers: dict[str, list[RouterEndpoint]] = {}

    def refresh(self) -> bool:
        document, changed = self._file.read()
        if changed:
            try:
                self._routers = parse_routers(document)
            except DirectoryError as error:
                log.warning("router endpoints refused; keeping the last ones", error=str(error))
                return False
        return changed

    def spaces(self) -> list[str]:
        return sorted(self._routers)

    def routers(self, space: str) -> list[RouterEndpoint]:
        return list(self._routers.get(space, []))


class FileBrokerDirectory:
    def __init__(self, path: Path) -> None:
        self._file = _JsonFile(path)
        self._brokers: dict[str, dict[str, BrokerEndpoint]] = {}

    def refresh(self) -> bool:
        document, changed = self._file.read()
        if changed:
            try:
                self._brokers = parse_brokers(document)
            except DirectoryError as error:
                log.warning("broker endpoints refused; keeping the last ones", error=str(error))
                return False
        return changed

    def brokers(self, space: str) -> dict[str, BrokerEndpoint]:
        return dict(self._brokers.get(space, {}))


def write_endpoints(path: Path, document: Mapping[str, Any]) -> None:
    """Writes an endpoints file whole (temp file + rename), as the runtime and tests must."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(path.suffix + ".partial")
    partial.write_text(json.dumps(document, indent=1, sort_keys=True))
    partial.replace(path)
