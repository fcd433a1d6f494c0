"""Rendered brokers: what a broker file in the GitOps output says, and how one runs locally.

In: the files the storage-controller renders, `<gitops-dir>/workloads/<space>/<broker-id>.yaml`
(a Service and a StatefulSet of one replica, with a PVC template for its journal). Out: a
`BrokerWorkload` per file (`read_broker`; None for a file that is somebody else's), every space's
brokers (`GitOpsOutput.read_all`), and the command line the local runtime starts a broker with
(`local_broker_command`). The storage-controller renders and writes these files (its placement
is made of the `Broker`s named here); `enmasse up` reads them: the contract sits here, between
the two, so that neither imports the other.

The contract with the local runtime and anyone else reading the output (StatefulSet metadata):
- labels `app.kubernetes.io/component: broker`, `app.kubernetes.io/managed-by:
  enmasse-storage-controller`, `enmasse.io/space: <space>`, `enmasse.io/broker: <broker-id>`;
- annotation `enmasse.io/broker-kind`: `pooled` or `dedicated`; `enmasse.io/owner`: the address
  a dedicated broker serves; `enmasse.io/state`: `Active` or `Draining` (a Draining broker still
  runs: it is handing its messages over; its file disappears once that is done);
- annotations `enmasse.io/local-amqp-port` and `enmasse.io/local-admin-port`: the loopback ports
  the local runtime must start it on. `local_broker_command` gives the exact command line
  (`enmasse-broker --host=127.0.0.1 --port=.. --admin-port=.. --data-dir=.. --ports-file=..`);
- annotation `enmasse.io/serves`: `routers` (a standard space's broker: started with
  `--routers-only`, its AMQP port takes only the space's routers, over mutual TLS with the
  certificates of the broker's --tls-dir) or `clients` (a brokered space's broker: its AMQP port is
  the space's client endpoint, started with `--client-auth=required`: clients log in as the
  space's users, which the storage-controller pushes). A file without it is read as `routers`:
  closed by default;
- annotation `enmasse.io/local-amqps-port`, on a broker that serves clients only: the loopback
  port of its amqps listener, which the local runtime opens with the broker's own certificate
  (`local_broker_command`'s `endpoint_tls`; in a cluster the Certificate rendered beside it).

`GitOpsOutput.write_space` (the storage-controller's) writes only files whose text changed and
deletes the files of brokers that are gone, touching only files with its managed-by label, so
router workloads or people's files in the same directory are left alone.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from enmasse.common.certificates import TlsFiles
from enmasse.resources.contracts import ACTIVE
from enmasse.resources.workload_files import (
    ANNOTATION_ADMIN_PORT,
    ANNOTATION_AMQP_PORT,
    ANNOTATION_AMQPS_PORT,
    LABEL_SPACE,
    WORKLOADS,
    WorkloadError,
    local_amqps_arguments,
    managed_statefulset,
    optional_port,
    owned_files,
    sync_files,
)

MANAGER = "enmasse-storage-controller"
LABEL_BROKER = "enmasse.io/broker"
ANNOTATION_KIND = "enmasse.io/broker-kind"
ANNOTATION_OWNER = "enmasse.io/owner"
ANNOTATION_STATE = "enmasse.io/state"
ANNOTATION_SERVES = "enmasse.io/serves"
SERVES_ROUTERS = "routers"
SERVES_CLIENTS = "clients"
CLIENT_AUTH = "required"  # a brokered space's broker: logins checked against the pushed users


@dataclass(frozen=True)
class Broker:
    """One broker of a space: pooled (shared by small addresses) or owned by one address."""

    id: str
    pooled: bool
    owner: str = ""
    state: str = ACTIVE


@dataclass(frozen=True)
class LocalPorts:
    amqp: int
    admin: int
    amqps: int | None = None  # a broker that serves clients: its amqps port


@dataclass(frozen=True)
class BrokerWorkload:
    """What a rendered file says about one broker."""

    space: str
    broker: Broker
    ports: LocalPorts
    routers_only: bool = True  # a standard space's broker (`enmasse.io/serves: routers`)


def read_broker(text: str) -> BrokerWorkload | None:
    """The broker a file describes; None for a file that is not one of ours."""
    metadata = managed_statefulset(text, manager=MANAGER)
    return None if metadata is None else _workload(metadata, metadata.get("labels") or {})


def _workload(metadata: dict[str, Any], labels: dict[str, str]) -> BrokerWorkload:
    annotations = metadata.get("annotations") or {}
    try:
        broker = Broker(
            id=labels[LABEL_BROKER],
            pooled=annotations[ANNOTATION_KIND] == "pooled",
            owner=annotations.get(ANNOTATION_OWNER, ""),
            state=annotations.get(ANNOTATION_STATE, ACTIVE),
        )
        ports = LocalPorts(
            amqp=int(annotations[ANNOTATION_AMQP_PORT]),
            admin=int(annotations[ANNOTATION_ADMIN_PORT]),
            amqps=optional_port(annotations.get(ANNOTATION_AMQPS_PORT)),
        )
        return BrokerWorkload(
            space=labels[LABEL_SPACE],
            broker=broker,
            ports=ports,
            routers_only=annotations.get(ANNOTATION_SERVES) != SERVES_CLIENTS,
        )
    except (KeyError, ValueError) as error:
        raise WorkloadError(f"broker workload lacks a readable {error}") from error


def local_broker_command(
    workload: BrokerWorkload,
    *,
    var_dir: Path,
    executable: str | None = None,
    endpoint_tls: TlsFiles | None = None,
) -> list[str]:
    """How the local runtime starts a rendered broker: its ports, its own data directory under
    <var>/brokers/<space>/<id>, a ports file the BrokerDirectory reads back, and --routers-only
    for a standard space's broker (the runtime gives it its certificate: $ENMASSE_TLS_DIR), or
    --client-auth=required for a brokered space's (its clients log in as the space's users),
    with its amqps listener when given `endpoint_tls`, its own amqps certificate."""
    base = var_dir / "brokers" / workload.space / workload.broker.id
    program = executable or str(Path(sys.executable).parent / "enmasse-broker")
    amqps = workload.ports.amqps
    return [
        program,
        "--host=127.0.0.1",
        f"--port={workload.ports.amqp}",
        f"--admin-port={workload.ports.admin}",
        f"--data-dir={base / 'data'}",
        f"--ports-file={base / 'ports.json'}",
        *(["--routers-only"] if workload.routers_only else [f"--client-auth={CLIENT_AUTH}"]),
        *([] if workload.routers_only else local_amqps_arguments(endpoint_tls, port=amqps)),
    ]


class GitOpsOutput:
    """The GitOps output directory: `<root>/workloads/<space>/<broker-id>.yaml`."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.workloads = self.root / WORKLOADS

    def space_dir(self, space: str) -> Path:
        return self.workloads / space

    def spaces(self) -> list[str]:
        if not self.workloads.is_dir():
            return []
        return sorted(p.name for p in self.workloads.iterdir() if p.is_dir())

    def read_space(self, space: str) -> dict[str, BrokerWorkload]:
        """The brokers rendered for a space, by id (files that are not ours are skipped)."""
        return {w.broker.id: w for _, w in self._ours(space)}

    def read_all(self) -> dict[str, dict[str, BrokerWorkload]]:
        return {space: self.read_space(space) for space in self.spaces()}

    def write_space(self, space: str, texts: Mapping[str, str]) -> list[str]:
        """Makes the space's broker files exactly `texts` (broker id -> YAML); returns the
        ids whose files were written or deleted."""
        owned = [(w.broker.id, path) for path, w in self._ours(space)]
        return sync_files(self.space_dir(space), texts=texts, owned=owned)

    def _ours(self, space: str) -> list[tuple[Path, BrokerWorkload]]:
        return owned_files(self.space_dir(space), read=read_broker)
