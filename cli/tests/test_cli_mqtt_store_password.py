"""The MQTT store identity's password on this machine (`cli/.../local/gateways.py`): made once by
`up` (random, mode 0600 in a 0700 directory), kept across runs, and handed to the router-agent
(which gives the identity to the routers) and to every gateway (which logs in with it), both
by the same file."""

from __future__ import annotations

import stat
from pathlib import Path

from enmasse.cli.local import gateways
from enmasse.cli.local.ports import Ports
from enmasse.cli.local.programs import program_commands
from enmasse.cli.local.var_dir import VarDir


def test_the_password_is_made_once_readable_by_its_owner_alone(tmp_path: Path) -> None:
    var = VarDir(tmp_path)
    gateways.ensure_store_password(var)
    path = gateways.store_password_file(var)
    assert path == tmp_path / "run" / "mqtt-store-password"
    first = path.read_text()
    assert len(first.strip()) >= 32
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    gateways.ensure_store_password(var)
    assert path.read_text() == first  # kept: the routers know it by then


def test_the_router_agent_is_given_the_same_file(tmp_path: Path) -> None:
    var = VarDir(tmp_path)
    ports = Ports(
        etcd_client=2379,
        etcd_peer=2380,
        config=5680,
        storage_controller=5681,
        router_agent=5682,
        subscription=5683,
        console=5684,
    )
    agent = program_commands(var=var, ports=ports)["router-agent"]
    assert f"--mqtt-store-password-file={tmp_path}/run/mqtt-store-password" in agent
