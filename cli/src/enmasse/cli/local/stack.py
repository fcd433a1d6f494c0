"""`enmasse up / down / status`: the whole system on one machine, brought up, listed, stopped.

In: the var dir. Out, for `up`: supervisord running the control plane (programs.py), the config
service healthy and its address in <var>/run/config.addr, which the other verbs read; for
`status`: one row per process supervisord runs (and supervisord itself) with state, PID and
uptime; for `down`: what was stopped, as (name, PID).

Idempotence: `up` finds a live supervisord through its socket and only (re)starts what is not
running; a supervisord an older `up` configured gets the current programs live
(`refresh_supervisord`), the unchanged ones untouched. `down` stops the runtime loop first (so
it starts nothing more), then the routers and brokers, and waits (bounded) until the
router-agent has taken their addresses out of Active, so that the phases etcd keeps until the
next `up` say what is true; then exactly the other processes supervisord reports plus
supervisord itself, by PID, and nothing else; programs a killed supervisord left behind
(`orphans`) are stopped too, and `up` refuses to start next to them. One `up` or `down` at a
time per var dir (a file lock).

Access: `up` makes the admin token before config first starts and each control-plane service's
token once config answers (`tokens.py`). Transport: before any program starts, `up` makes the
certificates in <var>/tls (`tls.py`), and asks config (health, tokens, phases) over TLS verified
against the published <var>/tls/ca.crt, with the admin token and no client certificate, as any
tenant does.

Progress: `up` and `down` say each step as it begins through their `step` callback (the CLI's
progress display, progress.py; silent by default).

Pure parts (the uptime text, `stopped_text`) are plain functions that tests call directly.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import time
import xmlrpc.client
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from enmasse.cli.client import (
    CliError,
    ConfigClient,
    local_ca_file,
    open_channel,
    resolve_token,
)
from enmasse.cli.local.gateways import ensure_store_password
from enmasse.cli.local.ports import read_ports
from enmasse.cli.local.programs import PROGRAMS
from enmasse.cli.local.supervisor import (
    ensure_programs_running,
    log_tail,
    orphans,
    pid_alive,
    refresh_supervisord,
    start_supervisord,
    supervisor_answers,
    supervisor_proxy,
    supervisord_pid,
    wait_until,
)
from enmasse.cli.local.tls import ensure_certificates
from enmasse.cli.local.tokens import ensure_admin_token, ensure_service_tokens
from enmasse.cli.local.var_dir import VarDir
from enmasse.resources.contracts import ACTIVE, STANDARD
from enmasse.resources.kinds import KINDS
from grpc_health.v1 import health_pb2, health_pb2_grpc

LIVE = ("STARTING", "RUNNING", "BACKOFF", "STOPPING")  # supervisord states of a process not done
WORKLOADS_STOP_TIMEOUT = 20.0
PHASES_RECORDED_TIMEOUT = 10.0


def config_address(var: VarDir) -> str:
    return f"127.0.0.1:{read_ports(var).config}"


def router_agent_address(var: VarDir) -> str:
    return f"127.0.0.1:{read_ports(var).router_agent}"


def config_healthy(address: str, *, ca_file: Path | None) -> bool:
    with open_channel(address, ca_file=ca_file) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=1.0)
        except grpc.RpcError:
            return False
    return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


def wait_config_healthy(var: VarDir, *, timeout: float = 60.0) -> str:
    address = config_address(var)
    proxy = supervisor_proxy(var)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if config_healthy(address, ca_file=local_ca_file(var.root)):
            var.config_addr.write_text(address + "\n")
            return address
        for info in proxy.supervisor.getAllProcessInfo():
            if info["statename"] == "FATAL":
                log = var.log / f"{info['name']}.log"
                raise CliError(
                    f"{info['name']} keeps crashing (FATAL); its log {log} ends:\n{log_tail(log)}"
                )
        time.sleep(0.2)
    raise CliError(
        f"the config service at {address} did not become healthy within {timeout:.0f} s; "
        f"see {var.log / 'config.log'}:\n{log_tail(var.log / 'config.log')}"
    )


@contextlib.contextmanager
def exclusive(var: VarDir) -> Iterator[None]:
    """One `up` or `down` at a time per var dir (two racing `up`s would start two copies)."""
    var.root.mkdir(parents=True, exist_ok=True)
    with (var.root / "lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


Step = Callable[[str], None]
"""Says what `up` or `down` does now (the CLI's progress display, progress.py)."""


def _silent(_text: str) -> None:
    return None


def up(var: VarDir, *, step: Step = _silent) -> tuple[str, bool]:
    """Starts what is not running; returns (config address, whether supervisord was started)."""
    with exclusive(var):
        return _up(var, step=step)


def _up(var: VarDir, *, step: Step) -> tuple[str, bool]:
    started = False
    ensure_admin_token(var)  # before config starts: its bootstrap admin token
    ensure_store_password(var)  # before the router-agent starts: the MQTT store identity's
    ensure_certificates(var)  # before anything starts: every port speaks mutual TLS
    if not supervisor_answers(var):
        if (pid := supervisord_pid(var)) is not None:
            raise CliError(
                f"supervisord (pid {pid}) runs for {var.root} but does not answer on "
                f"{var.socket}; stop it with `kill {pid}` and retry"
            )
        if left := orphans(var):
            raise CliError(
                f"{stopped_text(left)} of an earlier run still run without their supervisord: "
                "run `enmasse down` first"
            )
        step(f"starting supervisord and the control plane ({', '.join(PROGRAMS)})")
        start_supervisord(var)
        started = True
    else:
        step("supervisord runs: starting what is not running")
        refresh_supervisord(var)
        ensure_programs_running(var)
    step(f"waiting for the config service at {config_address(var)}")
    address = wait_config_healthy(var)
    step("making the control-plane services' tokens")
    ensure_service_tokens(var, address=address)
    # Healthy can come before supervisord's `startsecs` are over: wait for RUNNING, so that
    # `status` right after `up` says so.
    step("waiting until every program runs")
    wait_until(lambda: all_running(var), timeout=10)
    return address, started


def all_running(var: VarDir) -> bool:
    infos = supervisor_proxy(var).supervisor.getAllProcessInfo()
    return all(info["statename"] == "RUNNING" for info in infos)


@dataclass(frozen=True)
class ProcessRow:
    name: str
    state: str
    pid: int
    uptime: str


def uptime_text(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}"


def _process_age(pid: int) -> float:
    """Seconds since `pid` started, from /proc (clock ticks since boot)."""
    try:
        ticks = int(Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()[19])
        boot = next(
            float(line.split()[1])
            for line in Path("/proc/stat").read_text().splitlines()
            if line.startswith("btime ")
        )
    except (OSError, ValueError, IndexError, StopIteration):
        return 0.0
    return time.time() - (boot + ticks / os.sysconf("SC_CLK_TCK"))


def processes(var: VarDir) -> list[ProcessRow]:
    rows = []
    supervisord = supervisord_pid(var)
    if supervisord is not None:
        uptime = uptime_text(_process_age(supervisord))
        rows.append(ProcessRow("supervisord", "RUNNING", supervisord, uptime))
    infos = supervisor_proxy(var).supervisor.getAllProcessInfo()
    # The control plane in start order, then routers and brokers by name.
    order = {name: i for i, name in enumerate(PROGRAMS)}
    infos.sort(key=lambda info: (order.get(info["name"], len(order)), info["name"]))
    for info in infos:
        running = info["statename"] == "RUNNING"
        uptime = uptime_text(info["now"] - info["start"]) if running else "-"
        rows.append(ProcessRow(info["name"], info["statename"], int(info["pid"]), uptime))
    return rows


def _kill_if_still_alive(pid: int, *, after: float) -> None:
    if not wait_until(lambda: not pid_alive(pid), timeout=after):
        os.kill(pid, signal.SIGKILL)


def down(var: VarDir, *, step: Step = _silent) -> list[tuple[str, int]]:
    """Stops every program and supervisord; returns what was stopped as (name, pid)."""
    if not var.root.is_dir():
        return []
    with exclusive(var):
        return _down(var, step=step)


def _down(var: VarDir, *, step: Step) -> list[tuple[str, int]]:
    supervisord = supervisord_pid(var)
    stopped: list[tuple[str, int]] = []
    for name, pid in orphans(var):
        step(f"stopping {name} (pid {pid}), left without its supervisord")
        os.kill(pid, signal.SIGTERM)
        _kill_if_still_alive(pid, after=10)
        stopped.append((name, pid))
    if supervisor_answers(var):
        proxy = supervisor_proxy(var)
        children = [
            (info["name"], int(info["pid"]))
            for info in proxy.supervisor.getAllProcessInfo()
            if info["pid"]
        ]
        step("stopping the runtime loop")
        with contextlib.suppress(xmlrpc.client.Fault):  # first: it would add routers/brokers
            proxy.supervisor.stopProcess("runtime", True)
        _stop_workloads_first(var, proxy, step=step)
        step("stopping the control plane")
        proxy.supervisor.stopAllProcesses(True)
        with contextlib.suppress(OSError, xmlrpc.client.Error):
            proxy.supervisor.shutdown()
        stopped.extend(children)
        # Belt and braces: a child that outlived supervisord is still ours, by its PID.
        for _name, pid in children:
            _kill_if_still_alive(pid, after=10)
    if supervisord is not None:
        step(f"stopping supervisord (pid {supervisord})")
        if not supervisor_answers(var) and pid_alive(supervisord):
            os.kill(supervisord, signal.SIGTERM)
        if not wait_until(lambda: not pid_alive(supervisord), timeout=15):
            os.kill(supervisord, signal.SIGKILL)
        stopped.append(("supervisord", supervisord))
    var.config_addr.unlink(missing_ok=True)
    var.socket.unlink(missing_ok=True)
    var.pidfile.unlink(missing_ok=True)  # left behind when supervisord was killed
    return stopped


def _stop_workloads_first(var: VarDir, proxy: Any, *, step: Step) -> None:
    """Routers and brokers stop before the control plane, which sees them go: the router-agent
    takes their addresses out of Active, so the store that outlives `down` holds no phase the
    next `up` would find untrue. Bounded; a router-agent that is not running is not waited for."""
    infos = proxy.supervisor.getAllProcessInfo()
    workloads = [i["name"] for i in infos if i["name"] not in PROGRAMS and i["statename"] in LIVE]
    if not workloads:
        return
    step(f"stopping routers and brokers ({', '.join(sorted(workloads))})")
    for name in workloads:
        with contextlib.suppress(xmlrpc.client.Fault):  # stopped meanwhile
            proxy.supervisor.stopProcess(name, False)

    def stopped() -> bool:
        live = {i["name"] for i in proxy.supervisor.getAllProcessInfo() if i["statename"] in LIVE}
        return not live.intersection(workloads) and "STOPPING" not in live

    wait_until(stopped, timeout=WORKLOADS_STOP_TIMEOUT)
    agent = {i["name"]: i["statename"] for i in infos}.get("router-agent")
    if agent == "RUNNING":
        step("waiting until the router-agent takes their addresses out of Active")
        # A list that failed (None: a slow or busy config service) is no answer: keep waiting,
        # or the next `up` finds Active phases no router runs.
        wait_until(lambda: routed_addresses_active(var) == [], timeout=PHASES_RECORDED_TIMEOUT)


def routed_addresses_active(var: VarDir) -> list[str] | None:
    """The addresses of standard spaces the store still says are Active (`space/name`); None
    when the config service did not answer in time."""
    try:
        token = resolve_token(option=None, var_dir=var.root)
        with ConfigClient(
            server=config_address(var), timeout=5.0, token=token, ca_file=local_ca_file(var.root)
        ) as client:
            spaces = [
                w.address_space.metadata.name
                for w in client.list(KINDS["AddressSpace"])
                if w.address_space.spec.type == STANDARD
            ]
            return [
                f"{space}/{w.address.metadata.name}"
                for space in spaces
                for w in client.list(KINDS["Address"], space=space)
                if w.address.status.status.phase == ACTIVE
            ]
    except (CliError, OSError, ValueError):
        return None


def running(var: VarDir) -> bool:
    return supervisor_answers(var)


def stopped_text(stopped: Sequence[tuple[str, int]]) -> str:
    return ", ".join(f"{name} (pid {pid})" for name, pid in stopped)
