"""The MQTT gateway of each standard space on this machine: its pinned port and its command.

In: the var dir and a space's rendered routers (`enmasse.resources.rendered_routers`). Out: the
MQTT port the space's gateway keeps (chosen free once, kept in
<var>/gateways/<space>/mqtt-gateway/mqtt-port, so devices find it again after any restart) and
the command that runs it: `enmasse-mqtt-gateway` in front of the space's first router (by id),
writing its ports file where `LocalDirectory.gateways` finds it, so the router-agent lists the
space's `mqtt` endpoint in its status. The runtime (runtime.py) makes it one more supervised
program beside the space's routers; like them, it is started as a process, never imported.

A cluster renders no gateway yet: this is the local runtime's only (#17).
"""

from __future__ import annotations

from pathlib import Path

from enmasse.cli.local.var_dir import VarDir
from enmasse.common.ports import unclaimed_port
from enmasse.resources.rendered_routers import RouterWorkload

GATEWAY_ID = "mqtt-gateway"
PORT_FILE = "mqtt-port"


def gateway_dir(var: VarDir, space: str) -> Path:
    """Where the gateway of `space` runs and writes its ports file (`<var>/gateways/...`)."""
    return var.root / "gateways" / space / GATEWAY_ID


def pinned_port(var: VarDir, space: str) -> int | None:
    """The MQTT port the space's gateway keeps; None before `ensure_pinned_port` chose one."""
    try:
        return int((gateway_dir(var, space) / PORT_FILE).read_text())
    except (OSError, ValueError):
        return None


def ensure_pinned_port(var: VarDir, space: str) -> int:
    """Chooses the space's MQTT port once (a free one) and keeps it."""
    port = pinned_port(var, space)
    if port is None:
        folder = gateway_dir(var, space)
        folder.mkdir(parents=True, exist_ok=True)
        port = unclaimed_port()
        partial = folder / f".{PORT_FILE}.partial"
        partial.write_text(str(port))
        partial.replace(folder / PORT_FILE)
    return port


def gateway_command(
    var: VarDir, *, space: str, router: RouterWorkload, port: int, executable: str
) -> list[str]:
    """How the runtime starts the gateway of `space`, in front of `router`'s client port."""
    return [
        executable,
        f"--listen=127.0.0.1:{port}",
        f"--router=127.0.0.1:{router.ports.amqp}",
        f"--gateway-id={space}-{GATEWAY_ID}",
        f"--ports-file={gateway_dir(var, space) / 'ports.json'}",
    ]
