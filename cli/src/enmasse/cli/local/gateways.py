"""The MQTT gateways of each standard space on this machine: their pinned ports and commands.

In: the var dir and a space's rendered routers (`enmasse.resources.rendered_routers`). Out: how
many gateway instances each standard space runs (`enmasse up --mqtt-gateways N`, kept in
<var>/mqtt-gateways; 1 until set), the MQTT port each instance keeps (chosen free once, kept in
<var>/gateways/<space>/<gateway id>/mqtt-port, so devices find it again after any restart; the
first instance is `mqtt-gateway`, the next `mqtt-gateway-2` and so on) and the command that runs
it: `enmasse-mqtt-gateway` in front of one of the space's routers (instance i in front of the
i-th router by id, round robin), writing its ports file where `LocalDirectory.gateways` finds
it, so the router-agent lists each instance as an `mqtt` endpoint of the space in its status.
An instance no longer wanted has its ports file removed, so it is listed no more. The runtime
(runtime.py) makes each one more supervised program beside the space's routers; like them, it
is started as a process, never imported.

Stores: each gateway keeps retained messages, wills and persistent sessions in the space's
store queues (`mqtt/retained`, `mqtt/wills`, `mqtt/sessions`, which the config service gives
every space whose plan serves MQTT: `enmasse.resources.mqtt_stores`) and logs in to its router
for them as the store identity (`$mqtt-store`), whose password is the installation's
<var>/run/mqtt-store-password (random, made once by `up` before the router-agent starts, mode
0600; the router-agent gets the same file and gives the identity to the routers of those
spaces). A space whose plan does not serve MQTT has neither: its gateway's stores answer
"unavailable" and it serves without retained messages, wills or persistent sessions.

A cluster renders no gateway yet: this is the local runtime's only (#17).
"""

from __future__ import annotations

import secrets
from pathlib import Path

from enmasse.cli.local.tokens import read_secret, write_secret
from enmasse.cli.local.var_dir import VarDir
from enmasse.common.ports import unclaimed_port
from enmasse.resources.contracts import (
    MQTT_STORE_USER,
    RETAINED_ADDRESS,
    SESSIONS_ADDRESS,
    WILL_ADDRESS,
)
from enmasse.resources.rendered_routers import RouterWorkload

GATEWAY_ID = "mqtt-gateway"
PORT_FILE = "mqtt-port"
INSTANCES_FILE = "mqtt-gateways"
MAX_INSTANCES = 16
STORE_PASSWORD_FILE = "mqtt-store-password"


def store_password_file(var: VarDir) -> Path:
    """<var>/run/mqtt-store-password: the store identity's password (router-agent, gateways)."""
    return var.run / STORE_PASSWORD_FILE


def ensure_store_password(var: VarDir) -> None:
    """A random store password unless there is one (kept: the router-agent and every gateway
    read the same file)."""
    if not read_secret(store_password_file(var)):
        write_secret(store_password_file(var), secrets.token_urlsafe(32))


def instances(var: VarDir) -> int:
    """How many gateway instances each standard space runs (1 until `set_instances`)."""
    try:
        return max(1, min(MAX_INSTANCES, int((var.root / INSTANCES_FILE).read_text())))
    except (OSError, ValueError):
        return 1


def set_instances(var: VarDir, count: int) -> None:
    """Keeps the number of gateway instances per standard space (1..MAX_INSTANCES)."""
    if not 1 <= count <= MAX_INSTANCES:
        raise ValueError(f"--mqtt-gateways must be 1..{MAX_INSTANCES}, not {count}")
    var.root.mkdir(parents=True, exist_ok=True)
    partial = var.root / f".{INSTANCES_FILE}.partial"
    partial.write_text(str(count))
    partial.replace(var.root / INSTANCES_FILE)


def gateway_ids(var: VarDir) -> list[str]:
    """The ids of a space's gateway instances: `mqtt-gateway`, `mqtt-gateway-2`, ..."""
    return [GATEWAY_ID] + [f"{GATEWAY_ID}-{n}" for n in range(2, instances(var) + 1)]


def retire_unwanted(var: VarDir, space: str) -> None:
    """Removes the ports file of each instance beyond the wanted number (its program is gone
    too), so the space's status no longer lists it; its pinned port stays for a later return."""
    wanted = set(gateway_ids(var))
    for ports in (var.root / "gateways" / space).glob("*/ports.json"):
        if ports.parent.name not in wanted:
            ports.unlink(missing_ok=True)


def gateway_dir(var: VarDir, space: str, gateway_id: str = GATEWAY_ID) -> Path:
    """Where a gateway of `space` runs and writes its ports file (`<var>/gateways/...`)."""
    return var.root / "gateways" / space / gateway_id


def pinned_port(var: VarDir, space: str, gateway_id: str = GATEWAY_ID) -> int | None:
    """The MQTT port a gateway of the space keeps; None before `ensure_pinned_port` chose one."""
    try:
        return int((gateway_dir(var, space, gateway_id) / PORT_FILE).read_text())
    except (OSError, ValueError):
        return None


def ensure_pinned_port(var: VarDir, space: str, gateway_id: str = GATEWAY_ID) -> int:
    """Chooses a gateway's MQTT port once (a free one) and keeps it."""
    port = pinned_port(var, space, gateway_id)
    if port is None:
        folder = gateway_dir(var, space, gateway_id)
        folder.mkdir(parents=True, exist_ok=True)
        port = unclaimed_port()
        partial = folder / f".{PORT_FILE}.partial"
        partial.write_text(str(port))
        partial.replace(folder / PORT_FILE)
    return port


def gateway_command(
    var: VarDir,
    *,
    space: str,
    router: RouterWorkload,
    port: int,
    executable: str,
    gateway_id: str = GATEWAY_ID,
) -> list[str]:
    """How the runtime starts a gateway of `space`, in front of `router`'s client port."""
    return [
        executable,
        f"--listen=127.0.0.1:{port}",
        f"--router=127.0.0.1:{router.ports.amqp}",
        f"--gateway-id={space}-{gateway_id}",
        f"--ports-file={gateway_dir(var, space, gateway_id) / 'ports.json'}",
        f"--store-user={MQTT_STORE_USER}",
        f"--store-password-file={store_password_file(var)}",
        f"--retained-address={RETAINED_ADDRESS}",
        f"--will-address={WILL_ADDRESS}",
        f"--sessions-address={SESSIONS_ADDRESS}",
    ]
