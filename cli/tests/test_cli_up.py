"""`enmasse up --demo`, `status`, a crash, `up` again, `down`: real supervisord, etcd and config.

Everything runs under a var dir of the test's own; the test stops what `up` started through
`enmasse down` and, should an assertion fail first, through the same code by PID.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from enmasse.cli import local

ENMASSE = Path(sys.executable).parent / "enmasse"

pytestmark = pytest.mark.slow


def enmasse(var: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("ENMASSE_SERVER", "ENMASSE_VAR")}
    return subprocess.run(
        [str(ENMASSE), "--var-dir", str(var), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=env,
    )


def processes(status_out: str) -> dict[str, tuple[str, int]]:
    """PROCESS -> (STATE, PID) from the first table of `enmasse status`."""
    block = status_out.split("\n\n", 1)[0].splitlines()
    assert block[0].split() == ["PROCESS", "STATE", "PID", "UPTIME"]
    return {name: (state, int(pid)) for name, state, pid, _up in (r.split() for r in block[1:])}


def words(text: str) -> list[list[str]]:
    return [line.split() for line in text.splitlines()]


def port_open(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def wait_until(condition: object, *, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():  # type: ignore[operator]
            return True
        time.sleep(0.2)
    return False


def logs(var: Path) -> str:
    return "\n".join(f"--- {p.name}\n{p.read_text()[-2000:]}" for p in (var / "log").glob("*.log"))


def test_up_demo_status_crash_up_again_down(tmp_path: Path) -> None:
    var = tmp_path / "var"
    try:
        up = enmasse(var, "up", "--demo")
        assert up.returncode == 0, up.stderr + logs(var)
        address = (var / "run" / "config.addr").read_text().strip()
        lines = up.stdout.splitlines()
        assert lines[0] == f"enmasse started: config service at {address} (state in {var})"
        assert lines[1:11] == [
            "addressspace/demo created",
            "address/orders created",
            "address/prices created",
            "address/prices-audit created",
            "address/rpc created",
            "address/events created",
            "messaginguser/app created",
            "addressspace/jms created",
            "address/invoices created",
            "address/notifications created",
        ]
        assert ["demo", "standard", "standard-small", "-"] in words(up.stdout)
        assert ["jms", "invoices", "invoices", "queue", "brokered-queue", "-"] in words(up.stdout)

        status = enmasse(var, "status")
        assert status.returncode == 0, status.stderr
        before = processes(status.stdout)
        assert sorted(before) == ["config", "etcd", "supervisord"]
        assert all(state == "RUNNING" for state, _pid in before.values())
        assert ["demo", "orders", "orders", "queue", "standard-small-queue", "-"] in words(
            status.stdout
        )

        # A crashed config service comes back (supervisord), at the same address.
        os.kill(before["config"][1], signal.SIGKILL)
        assert wait_until(lambda: local.config_healthy(address), timeout=60), logs(var)
        again = enmasse(var, "up")
        assert (
            again.stdout
            == f"enmasse already running: config service at {address} (state in {var})\n"
        )
        after = processes(enmasse(var, "status").stdout)
        assert after["config"][1] != before["config"][1]
        # ... and `up` started no second copy of anything.
        assert after["etcd"] == before["etcd"]
        assert after["supervisord"] == before["supervisord"]
        got = enmasse(var, "get", "addresses", "--space", "jms")
        assert words(got.stdout)[1:] == [
            ["jms", "invoices", "invoices", "queue", "brokered-queue", "-"],
            ["jms", "notifications", "notifications", "topic", "brokered-topic", "-"],
        ]

        ports = local.read_ports(local.VarDir(var))
        down = enmasse(var, "down")
        assert down.stdout == (
            f"stopped: config (pid {after['config'][1]}), etcd (pid {after['etcd'][1]}), "
            f"supervisord (pid {after['supervisord'][1]})\n"
        )
        assert not any(local.pid_alive(pid) for _state, pid in after.values())
        assert not any(port_open(p) for p in (ports.etcd_client, ports.etcd_peer, ports.config))
        assert not (var / "run" / "config.addr").exists()
        gone = enmasse(var, "status")
        assert (gone.returncode, gone.stderr) == (
            1,
            f"error: enmasse is not running (no supervisord for {var})\n",
        )
    finally:
        local.down(local.VarDir(var))  # by PID, whatever is left, should an assertion fail


def test_a_killed_supervisord_leaves_orphans_that_down_stops(tmp_path: Path) -> None:
    var = tmp_path / "var"
    try:
        assert enmasse(var, "up").returncode == 0, logs(var)
        before = processes(enmasse(var, "status").stdout)
        os.kill(before["supervisord"][1], signal.SIGKILL)
        assert wait_until(lambda: not local.pid_alive(before["supervisord"][1]), timeout=10)

        refused = enmasse(var, "up")
        assert (refused.returncode, refused.stdout) == (1, "")
        assert refused.stderr == (
            f"error: config (pid {before['config'][1]}), etcd (pid {before['etcd'][1]}) of an "
            "earlier run still run without their supervisord: run `enmasse down` first\n"
        )
        down = enmasse(var, "down")
        assert down.stdout == (
            f"stopped: config (pid {before['config'][1]}), etcd (pid {before['etcd'][1]})\n"
        )
        assert not local.pid_alive(before["config"][1])
        assert not local.pid_alive(before["etcd"][1])

        # The var dir is usable again: same data, a fresh supervisord.
        up = enmasse(var, "up")
        assert up.returncode == 0, up.stderr + logs(var)
        assert up.stdout.startswith("enmasse started: ")
    finally:
        local.down(local.VarDir(var))
