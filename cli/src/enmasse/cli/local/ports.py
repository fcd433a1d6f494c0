"""The control plane's ports: picked free on 127.0.0.1 at the first `up`, kept from then on.

In: the var dir's ports file (<var>/ports.json), when an earlier `up` wrote one. Out: `Ports`,
one loopback port per control-plane listener (etcd's two, config, storage-controller,
router-agent, subscription, the web console), written back when anything changed. Kept so that
a restart, of one process or of the whole thing, keeps the addresses clients already know; a
port taken meanwhile by somebody else makes the whole set fresh. Routers and brokers are not
here: their ports are pinned in their rendered workloads.
"""

from __future__ import annotations

import json
import socket
from dataclasses import asdict, dataclass

from enmasse.cli.local.var_dir import VarDir
from enmasse.common.ports import unclaimed_port


@dataclass(frozen=True)
class Ports:
    etcd_client: int
    etcd_peer: int
    config: int
    storage_controller: int
    router_agent: int
    subscription: int
    console: int


def port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def read_ports(var: VarDir) -> Ports:
    """The ports the last `up` chose (ValueError, OSError when there are none)."""
    try:
        return Ports(**json.loads(var.ports_file.read_text()))
    except TypeError as exc:
        raise ValueError(f"{var.ports_file}: {exc}") from None


def choose_ports(var: VarDir, *, in_use: bool = False) -> Ports:
    """The ports of the last run when they are still free (or `in_use` by our own running
    programs), fresh ones otherwise; a port a newer version added gets a fresh one."""
    stored = _stored_ports(var)
    if not in_use and not all(port_is_free(p) for p in stored.values()):
        stored = {}
    chosen = dict(stored)
    for name in Ports.__dataclass_fields__:
        while name not in chosen:
            port = unclaimed_port()
            if port not in chosen.values():  # the kernel may hand out the same port twice
                chosen[name] = port
    ports = Ports(**chosen)
    if chosen != stored:
        var.ports_file.write_text(json.dumps(asdict(ports)))
    return ports


def _stored_ports(var: VarDir) -> dict[str, int]:
    try:
        data = json.loads(var.ports_file.read_text())
        return {k: int(v) for k, v in data.items() if k in Ports.__dataclass_fields__}
    except (OSError, ValueError, AttributeError, TypeError):
        return {}
