"""Where the brokers of each address space listen: the ports files they write themselves.

In: `<var>/brokers/<space>/<broker-id>/ports.json`, which `enmasse-broker --ports-file` writes once
it listens (`{"amqp": 42001, "admin": 42002, ...}`, replaced whole): the layout the
storage-controller renders into its local broker commands and the router-agent reads too.
Out: the `BrokerEndpoint` of one broker, or None while it has no (readable) ports file.

Read on every look-up: one small file, and a restarted broker (new ports) is found at once. In a
cluster the same answer would come from the broker's Service.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class BrokerEndpoint:
    name: str
    host: str
    amqp_port: int
    admin_port: int

    @property
    def admin(self) -> str:
        return f"{self.host}:{self.admin_port}"


class PortsTreeBrokers:
    def __init__(self, root: Path) -> None:
        self.root = root

    def broker(self, space: str, name: str) -> BrokerEndpoint | None:
        try:
            ports = json.loads((self.root / space / name / "ports.json").read_text())
            return BrokerEndpoint(name, LOOPBACK, int(ports["amqp"]), int(ports["admin"]))
        except (OSError, ValueError, KeyError, TypeError):
            return None  # not running yet, or its file is being replaced: "not running"
