"""`enmasse up --demo`, `status`, `send` / `receive`, crashes, `up` again, `down`: all real.

Everything runs under a var dir of the test's own: supervisord, etcd, the control plane, the
runtime's reconcile loop, and the demo space's router and broker started from the GitOps output.
The test stops what `up` started through `enmasse down`, then checks that every PID it saw is
gone (and, should an assertion fail first, stops them through the same code, by PID).
"""

from __future__ import annotations

import json
import os
import signal
import socket
from pathlib import Path

import pytest
from enmasse.cli.local.ports import read_ports
from enmasse.cli.local.programs import PROGRAMS
from enmasse.cli.local.supervisor import apply_config_changes, pid_alive, supervisor_proxy
from enmasse.cli.local.var_dir import VarDir

from tests.fixtures.local_runtime import enmasse, logs, stop_and_check, supervised, wait_until

pytestmark = pytest.mark.slow

CONTROL_PLANE = [
    "etcd",
    "config",
    "storage-controller",
    "router-agent",
    "subscription",
    "runtime",
    "console",
]
DEMO_WORKLOADS = ["demo-router-0", "demo-broker-0", "demo-mqtt-gateway", "jms-broker-0"]
# The demo space's plan lets no one in without a user: the CLI logs in as the examples' user.
LOGIN = ("--user", "app", "--password", "demo-password")


def processes(status_out: str) -> dict[str, tuple[str, int]]:
    """PROCESS -> (STATE, PID) from the first table of `enmasse status`."""
    block = status_out.split("\n\n", 1)[0].splitlines()
    assert block[0].split() == ["PROCESS", "STATE", "PID", "UPTIME"]
    return {name: (state, int(pid)) for name, state, pid, _up in (r.split() for r in block[1:])}


def port_open(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def forget_the_subscription_program(var: VarDir) -> None:
    ports = json.loads(var.ports_file.read_text())
    del ports["subscription"]
    var.ports_file.write_text(json.dumps(ports))
    conf = var.supervisord_conf.read_text()
    start, end = conf.index("[program:subscription]"), conf.index("[program:runtime]")
    var.supervisord_conf.write_text(conf[:start] + conf[end:])
    apply_config_changes(supervisor_proxy(var), ours=lambda n: n in PROGRAMS)


def words(text: str) -> list[list[str]]:
    return [line.split() for line in text.splitlines()]


def test_up_demo_sends_on_each_type_then_status_send_receive_crash_up_again_down(
    tmp_path: Path,
) -> None:
    var = tmp_path / "var"
    seen: set[int] = set()
    try:
        up = enmasse(var, "up", "--demo")
        assert up.returncode == 0, up.stdout + up.stderr + logs(var)
        address = (var / "run" / "config.addr").read_text().strip()
        lines = up.stdout.splitlines()
        assert lines[0] == f"enmasse started: config service at {address} (state in {var})"
        assert "address/prices-audit created" in lines
        assert lines[-5:] == [
            "queue         orders         sent 1, received 1  ok",
            "topic         prices         sent 1, received 1  ok",
            "subscription  prices-audit   sent 1, received 1  ok",
            "anycast       rpc            sent 1, received 1  ok",
            "multicast     events         sent 1, received 1  ok",
        ]
        demo_port = next(
            int(w[2].rsplit(":", 1)[1]) for w in words(up.stdout) if w[:2] == ["demo:", "amqp"]
        )
        assert f"demo: amqp 127.0.0.1:{demo_port}" in lines
        # Every client endpoint offers amqps beside amqp: the routers and the brokered broker.
        demo_tls = next(
            int(w[2].rsplit(":", 1)[1]) for w in words(up.stdout) if w[:2] == ["demo:", "amqps"]
        )
        assert any(w[:2] == ["jms:", "amqps"] for w in words(up.stdout)), up.stdout

        status = enmasse(var, "status")
        assert status.returncode == 0, status.stdout + status.stderr
        before = processes(status.stdout)
        seen.update(pid for _state, pid in before.values())
        assert list(before) == ["supervisord", *CONTROL_PLANE, *sorted(DEMO_WORKLOADS)]
        assert all(state == "RUNNING" for state, _pid in before.values())
        assert ["demo", "orders", "orders", "queue", "standard-small-queue", "Active"] in words(
            status.stdout
        )
        # each space's dead-letter queue, which the examples never declare, is there and Active
        assert ["demo", "dlq", "DLQ", "queue", "standard-small-queue", "Active"] in words(
            status.stdout
        )
        assert ["jms", "dlq", "DLQ", "queue", "brokered-queue", "Active"] in words(status.stdout)

        sent = enmasse(var, "send", *LOGIN, "orders", "--body", "one", "--count", "2")
        assert (sent.returncode, sent.stdout) == (
            0,
            "sent 2 messages to queue 'orders' (accepted)\n",
        )
        anonymous = enmasse(var, "send", "orders")
        assert anonymous.returncode == 1
        assert "amqp:unauthorized-access" in anonymous.stderr, anonymous.stderr
        got = enmasse(var, "receive", *LOGIN, "orders", "--count", "2")
        assert (got.returncode, got.stdout) == (0, "one\none\n")
        empty = enmasse(var, "receive", *LOGIN, "orders", "--timeout", "1")
        assert (empty.returncode, empty.stderr) == (1, "error: no message within 1 s on 'orders'\n")
        unknown = enmasse(var, "send", *LOGIN, "nosuch")
        assert (unknown.returncode, unknown.stderr) == (
            1,
            "error: 'nosuch': attach refused: amqp:not-found: "
            "no address 'nosuch' in space 'demo'\n",
        )
        # A durable subscription keeps what the topic published while its reader was away.
        first = enmasse(
            var, "receive", *LOGIN, "prices", "--durable-subscription", "kept", "--timeout", "1"
        )
        assert first.stderr == "error: no message within 1 s on 'prices'\n"
        for body in ("away-1", "away-2"):
            assert (
                enmasse(var, "send", *LOGIN, "prices", "--body", body, "--durable").returncode == 0
            )
        kept = enmasse(
            var, "receive", *LOGIN, "prices", "--durable-subscription", "kept", "-n", "2"
        )
        assert (kept.returncode, kept.stdout) == (0, "away-1\naway-2\n")
        by_url = enmasse(var, "send", *LOGIN, "events", "--url", f"amqp://127.0.0.1:{demo_port}")
        assert by_url.stdout == "sent 1 message to 'events' (accepted)\n"
        over_tls = f"amqps://127.0.0.1:{demo_tls}"  # verified against var/tls/ca.crt
        by_tls = enmasse(var, "send", *LOGIN, "events", "--url", over_tls)
        assert by_tls.stdout == "sent 1 message to 'events' (accepted)\n", by_tls.stderr

        # A crashed router and a crashed control-plane service come back (supervisord).
        os.kill(before["demo-router-0"][1], signal.SIGKILL)
        os.kill(before["router-agent"][1], signal.SIGKILL)

        def back() -> bool:
            now = supervised(var)
            return all(
                now[n][0] == "RUNNING" and now[n][1] != before[n][1]
                for n in ("demo-router-0", "router-agent")
            )

        assert wait_until(back, timeout=60), logs(var)
        again = enmasse(var, "up")
        assert again.returncode == 0, again.stderr
        assert again.stdout.splitlines()[0] == (
            f"enmasse already running: config service at {address} (state in {var})"
        )
        after = processes(enmasse(var, "status").stdout)
        seen.update(pid for _state, pid in after.values())
        for name in ("etcd", "config", "supervisord", "demo-broker-0"):  # no second copy
            assert after[name] == before[name]
        # The restarted router is on the same port, and carries messages again.
        assert wait_until(
            lambda: enmasse(var, "send", *LOGIN, "orders", "--body", "back").returncode == 0,
            timeout=60,
        ), logs(var)
        assert enmasse(var, "receive", *LOGIN, "orders").stdout == "back\n"

        ports = read_ports(VarDir(var))
        down = enmasse(var, "down")
        assert down.returncode == 0, down.stderr
        stopped = down.stdout.removeprefix("stopped: ").strip().split(", ")
        assert sorted(stopped) == sorted(f"{n} (pid {pid})" for n, (_s, pid) in after.items())
        assert not any(pid_alive(pid) for pid in seen)
        assert not any(
            port_open(p) for p in (ports.etcd_client, ports.config, ports.router_agent, demo_port)
        )
        gone = enmasse(var, "status")
        assert (gone.returncode, gone.stderr) == (
            1,
            f"error: enmasse is not running (no supervisord for {var})\n",
        )
    finally:
        assert stop_and_check(var, seen) == []


def test_a_killed_supervisord_leaves_orphans_that_down_stops(tmp_path: Path) -> None:
    var = tmp_path / "var"
    seen: set[int] = set()
    try:
        assert enmasse(var, "up").returncode == 0, logs(var)
        before = processes(enmasse(var, "status").stdout)
        seen.update(pid for _state, pid in before.values())
        os.kill(before["supervisord"][1], signal.SIGKILL)
        assert wait_until(lambda: not pid_alive(before["supervisord"][1]), timeout=10)

        orphans = ", ".join(f"{n} (pid {before[n][1]})" for n in sorted(CONTROL_PLANE))
        refused = enmasse(var, "up")
        assert (refused.returncode, refused.stdout) == (1, "")
        assert refused.stderr == (
            f"error: {orphans} of an earlier run still run without their supervisord: "
            "run `enmasse down` first\n"
        )
        down = enmasse(var, "down")
        assert down.stdout == f"stopped: {orphans}\n"
        assert not any(pid_alive(before[n][1]) for n in CONTROL_PLANE)

        # The var dir is usable again: same data, a fresh supervisord.
        up = enmasse(var, "up")
        assert up.returncode == 0, up.stderr + logs(var)
        assert up.stdout.startswith("enmasse started: ")
        seen.update(pid for _state, pid in supervised(var).values())

        # A supervisord an older `up` configured (no subscription program, no port for it)
        # gets the missing program from `up`, live; the others keep running.
        forget_the_subscription_program(VarDir(var))
        assert "subscription" not in supervised(var)
        running = supervised(var)
        again = enmasse(var, "up")
        assert again.returncode == 0, again.stderr + logs(var)
        now = supervised(var)
        seen.update(pid for _state, pid in now.values())
        assert now["subscription"][0] == "RUNNING"
        assert {n: now[n] for n in running} == running
    finally:
        assert stop_and_check(var, seen) == []
