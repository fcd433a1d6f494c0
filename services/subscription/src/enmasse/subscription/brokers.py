"""Where the brokers of each address space listen: the runtime's `<var>/run/brokers.json`.

In: the file the runtime writes (JSON, replaced whole with a rename), the same format the
router-agent reads:

    {"<space>": [{"name": "broker-0", "host": "127.0.0.1", "amqp_port": 42001,
                  "admin_port": 42002}, ...], ...}

Out: `BrokerEndpoint`s by space and name. The file is re-read only when it changed; one that is
torn or malformed keeps the last good content (and is logged), because a subscriber must not be
refused over a half-written file.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class BrokerEndpoint:
    name: str
    host: str
    amqp_port: int
    admin_port: int

    @property
    def admin(self) -> str:
        return f"{self.host}:{self.admin_port}"


def parse_brokers(document: Any) -> dict[str, dict[str, BrokerEndpoint]]:
    """ValueError naming the culprit when the document does not follow the format."""
    if not isinstance(document, dict):
        raise ValueError("brokers: expected an object of space -> list of brokers")
    found: dict[str, dict[str, BrokerEndpoint]] = {}
    for space, entries in document.items():
        if not isinstance(entries, list):
            raise ValueError(f"brokers: space '{space}' must map to a list")
        found[space] = {}
        for entry in entries:
            try:
                endpoint = BrokerEndpoint(
                    name=str(entry["name"]),
                    host=str(entry.get("host", "127.0.0.1")),
                    amqp_port=int(entry["amqp_port"]),
                    admin_port=int(entry["admin_port"]),
                )
            except (KeyError, TypeError, ValueError, AttributeError):
                raise ValueError(
                    f"brokers: space '{space}': entry {entry!r} needs name, amqp_port, admin_port"
                ) from None
            found[space][endpoint.name] = endpoint
    return found


class FileBrokerDirectory:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._stamp: tuple[int, int] | None = None
        self._brokers: dict[str, dict[str, BrokerEndpoint]] = {}

    def broker(self, space: str, name: str) -> BrokerEndpoint | None:
        self._refresh()
        return self._brokers.get(space, {}).get(name)

    def _refresh(self) -> None:
        try:
            stat = self.path.stat()
        except FileNotFoundError:
            self._stamp, self._brokers = None, {}
            return
        stamp = (stat.st_mtime_ns, stat.st_size)
        if stamp == self._stamp:
            return
        try:
            self._brokers = parse_brokers(json.loads(self.path.read_text()))
        except (OSError, ValueError) as error:
            log.warning("broker endpoints unreadable; keeping the last ones", error=str(error))
            return
        self._stamp = stamp
