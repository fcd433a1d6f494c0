"""Where a broker can be reached: one small interface, so a cluster can swap the local answer.

In: (space, broker id). Out: a `BrokerEndpoint` (host, AMQP port for routers and drains, admin
port for BrokerAdmin), or None when the directory knows of no such broker. Whether the broker is
actually up is not the directory's business: the controller asks the broker itself (BrokerAdmin,
with a deadline) and treats no answer as "not running".

`LocalBrokerDirectory` answers from the GitOps output the controller renders (the ports in a
broker's `enmasse.io/local-*-port` annotations, see `workloads`), unless the local runtime has
written the broker's own ports file (`<var>/brokers/<space>/<id>/ports.json`, what
`enmasse-broker --ports-file` writes), which then wins: it says where the process really listens.
In Kubernetes a directory would answer `<broker-id>.<namespace>.svc` on the fixed ports.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from enmasse.storage_controller.workloads import GitOpsOutput

LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class BrokerEndpoint:
    host: str
    amqp_port: int
    admin_port: int

    @property
    def admin(self) -> str:
        return f"{self.host}:{self.admin_port}"


class BrokerDirectory(Protocol):
    def endpoint(self, space: str, broker_id: str) -> BrokerEndpoint | None: ...


class LocalBrokerDirectory:
    def __init__(self, *, output: GitOpsOutput, var_dir: Path | None = None) -> None:
        self.output = output
        self.var_dir = var_dir

    def endpoint(self, space: str, broker_id: str) -> BrokerEndpoint | None:
        written = self._ports_file(space, broker_id)
        if written is not None:
            return written
        workload = self.output.read_space(space).get(broker_id)
        if workload is None:
            return None
        return BrokerEndpoint(LOOPBACK, workload.ports.amqp, workload.ports.admin)

    def _ports_file(self, space: str, broker_id: str) -> BrokerEndpoint | None:
        if self.var_dir is None:
            return None
        path = self.var_dir / "brokers" / space / broker_id / "ports.json"
        try:
            ports = json.loads(path.read_text())
            return BrokerEndpoint(LOOPBACK, int(ports["amqp"]), int(ports["admin"]))
        except (OSError, ValueError, KeyError, TypeError):
            return None
