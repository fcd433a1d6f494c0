"""`enmasse up / down / status`: the whole system on one machine, under supervisord.

What runs: a real etcd (/usr/bin/etcd, data under <var>/etcd), the config service, the
storage-controller, the router-agent and the subscription service (the latter three rendering
and reading the GitOps output in <var>/gitops), and `runtime`: the loop (workloads.py) that turns
the router and broker workloads rendered there into more programs, added and removed live. Each
is a `[program:x]` of one supervisord whose config this module renders into
<var>/supervisord.conf (routers and brokers: one file each in <var>/supervisor.d/, included).
supervisord restarts a crashed process (with its own back-off: BACKOFF, then FATAL after
`startretries`), keeps logs under <var>/log/ (traces go to <var>/traces: every program gets
ENMASSE_VAR), and is driven over its XML-RPC API on a unix socket (<var>/run/supervisor.sock)
with supervisor's own transport. Nothing here forks or reaps by hand: that is supervisord's job
(DESIGN §5).

Ports: picked free on 127.0.0.1 at the first `up` and kept in <var>/ports.json, so that a restart
(of one process or of the whole thing) keeps the addresses clients already know. The config
service's address goes to <var>/run/config.addr, which the other verbs read.

Idempotence: `up` finds a live supervisord through its socket and only (re)starts what is not
running; a supervisord an older `up` configured gets the current programs live
(`refresh_supervisord`), the unchanged ones untouched. `down` stops the runtime loop first (so
it starts nothing more), then exactly the processes supervisord reports plus supervisord itself,
by PID, and nothing else.

Pure parts (paths, the rendered config, uptime text) are plain functions that tests call directly.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import xmlrpc.client
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import grpc
from enmasse.cli.client import CliError
from grpc_health.v1 import health_pb2, health_pb2_grpc
from supervisor.xmlrpc import SupervisorTransport

ETCD_BINARY = "/usr/bin/etcd"
# The control plane, in start order: what `up` starts and waits for. Routers and brokers are not
# here: the `runtime` program adds and removes them as the GitOps output says (workloads.py).
PROGRAMS = ("etcd", "config", "storage-controller", "router-agent", "subscription", "runtime")


@dataclass(frozen=True)
class VarDir:
    """Where one local installation keeps its state, logs and sockets."""

    root: Path

    @classmethod
    def choose(cls, option: str | None) -> VarDir:
        raw = option or os.environ.get("ENMASSE_VAR") or "var"
        return cls(Path(raw).expanduser().resolve())

    @property
    def run(self) -> Path:
        return self.root / "run"

    @property
    def log(self) -> Path:
        return self.root / "log"

    @property
    def etcd_data(self) -> Path:
        return self.root / "etcd"

    @property
    def supervisord_conf(self) -> Path:
        return self.root / "supervisord.conf"

    @property
    def ports_file(self) -> Path:
        return self.root / "ports.json"

    @property
    def socket(self) -> Path:
        return self.run / "supervisor.sock"

    @property
    def pidfile(self) -> Path:
        return self.run / "supervisord.pid"

    @property
    def config_addr(self) -> Path:
        return self.run / "config.addr"

    @property
    def config_port_file(self) -> Path:
        return self.run / "config.port"

    @property
    def gitops(self) -> Path:
        """The GitOps output: storage-controller and router-agent render workloads here."""
        return self.root / "gitops"

    @property
    def programs_dir(self) -> Path:
        """One `[program:x]` file per router and broker, included by supervisord.conf."""
        return self.root / "supervisor.d"


@dataclass(frozen=True)
class Ports:
    etcd_client: int
    etcd_peer: int
    config: int
    storage_controller: int
    router_agent: int
    subscription: int


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


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
            port = free_port()
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


def _bin(name: str) -> str:
    beside = Path(sys.executable).parent / name
    if beside.exists():
        return str(beside)
    found = shutil.which(name)
    if found is None:
        raise CliError(f"cannot find the `{name}` program (run `uv sync`)")
    return found


def program_commands(*, var: VarDir, ports: Ports) -> dict[str, list[str]]:
    peer = f"http://127.0.0.1:{ports.etcd_peer}"
    client = f"http://127.0.0.1:{ports.etcd_client}"
    config = f"127.0.0.1:{ports.config}"
    return {
        "etcd": [
            ETCD_BINARY,
            "--name=enmasse",
            f"--data-dir={var.etcd_data}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=enmasse={peer}",
            # config commits a whole Apply batch as one transaction: etcd's defaults (128 ops,
            # 1.5 MiB) would refuse a space of a few hundred addresses.
            "--max-txn-ops=20000",
            "--max-request-bytes=33554432",
        ],
        "config": [
            _bin("enmasse-config"),
            f"--listen=127.0.0.1:{ports.config}",
            f"--port-file={var.config_port_file}",
            f"--etcd=127.0.0.1:{ports.etcd_client}",
        ],
        "storage-controller": [
            _bin("enmasse-storage-controller"),
            f"--listen=127.0.0.1:{ports.storage_controller}",
            f"--config={config}",
            f"--gitops-dir={var.gitops}",
            f"--var-dir={var.root}",
        ],
        "router-agent": [
            _bin("enmasse-router-agent"),
            f"--listen=127.0.0.1:{ports.router_agent}",
            f"--config={config}",
            f"--var={var.root}",
            f"--gitops-dir={var.gitops}",
        ],
        "subscription": [
            _bin("enmasse-subscription"),
            f"--listen=127.0.0.1:{ports.subscription}",
            f"--config={config}",
            f"--var={var.root}",
        ],
        # Rendered router and broker workloads -> supervisor programs, for as long as we run.
        "runtime": [_bin("enmasse"), f"--var-dir={var.root}", "runtime", "reconcile"],
    }


def _ini(value: object) -> str:
    return str(value).replace("%", "%%")  # supervisord expands %(name)s in values


def program_section(*, name: str, command: Sequence[str], var: VarDir, priority: int) -> str:
    """One `[program:x]`: restarted on crash with supervisord's back-off (1 s, 2 s, ...; FATAL
    after 10 tries), stopped with its whole process group, logging to <var>/log/<name>.log."""
    return (
        f"[program:{name}]\n"
        f"command = {_ini(' '.join(command))}\n"
        f"priority = {priority}\n"
        "autostart = true\n"
        "autorestart = true\n"
        "startsecs = 1\n"
        "startretries = 10\n"
        "stopsignal = TERM\n"
        "stopwaitsecs = 10\n"
        "stopasgroup = true\n"
        "killasgroup = true\n"
        "redirect_stderr = true\n"
        f"stdout_logfile = {_ini(var.log / (name + '.log'))}\n"
        "stdout_logfile_maxbytes = 10MB\n"
        "stdout_logfile_backups = 2\n"
        f'environment = PYTHONUNBUFFERED="1",ENMASSE_VAR="{_ini(var.root)}"\n'
    )


def render_supervisord_conf(*, var: VarDir, commands: dict[str, list[str]]) -> str:
    sections = [
        f"[unix_http_server]\nfile = {_ini(var.socket)}\nchmod = 0700\n",
        "[supervisord]\n"
        f"logfile = {_ini(var.log / 'supervisord.log')}\n"
        f"pidfile = {_ini(var.pidfile)}\n"
        f"childlogdir = {_ini(var.log)}\n"
        f"directory = {_ini(var.root)}\n"
        "identifier = enmasse\n"
        "nodaemon = false\n",
        "[rpcinterface:supervisor]\n"
        "supervisor.rpcinterface_factory = supervisor.rpcinterface:make_main_rpcinterface\n",
        f"[supervisorctl]\nserverurl = unix://{_ini(var.socket)}\n",
        # Routers and brokers: added and removed live by the runtime (reloadConfig + add/remove).
        f"[include]\nfiles = {_ini(var.programs_dir)}/*.conf\n",
    ]
    for priority, (name, command) in enumerate(commands.items(), start=1):
        section = program_section(name=name, command=command, var=var, priority=priority * 10)
        sections.append(section)
    return "\n".join(sections)


# ---------------------------------------------------------------- talking to supervisord


def supervisor_proxy(var: VarDir) -> Any:
    transport = SupervisorTransport(None, None, f"unix://{var.socket}")
    return xmlrpc.client.ServerProxy("http://127.0.0.1", transport=transport)


def supervisor_answers(var: VarDir) -> bool:
    if not var.socket.exists():
        return False
    try:
        state = supervisor_proxy(var).supervisor.getState()
    except (OSError, xmlrpc.client.Error):
        return False
    return bool(state.get("statename") == "RUNNING")


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie is dead for our purposes (its parent has not reaped it yet).
    with contextlib.suppress(OSError):
        if Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].startswith("Z"):
            return False
    return True


def _supervisord_pid(var: VarDir) -> int | None:
    with contextlib.suppress(OSError, ValueError):
        pid = int(var.pidfile.read_text().strip())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
        if str(var.supervisord_conf).encode() in cmdline:
            return pid
    return None


def _stat_fields(pid: int) -> list[str]:
    # After "pid (comm) ": state, ppid, pgrp, session, ...; comm may hold spaces and parentheses.
    return Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()


def orphans(var: VarDir) -> list[tuple[str, int]]:
    """Programs of this var dir whose supervisord died (SIGKILL, OOM) and left them running.

    They are ours twice over: they sit in the session the dead supervisord led (it daemonized
    with setsid) and their command lines name this var dir's paths (every program's does)."""
    try:
        leader = int(var.pidfile.read_text().strip())
    except (OSError, ValueError):
        return []
    if _supervisord_pid(var) is not None:
        return []  # supervisord lives: its children are not orphans
    found: list[tuple[str, int]] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        try:
            if int(_stat_fields(pid)[3]) != leader:
                continue
            args = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
        if any(str(var.root) in arg for arg in args):
            found.append((_program_word(args), pid))
    return sorted(found)


def _program_word(args: Sequence[str]) -> str:
    """`config` for `python .venv/bin/enmasse-config ...`: the program, not python; `runtime`
    for the bare `enmasse` (only `runtime reconcile` runs as a program)."""
    names = [Path(arg).name for arg in args if arg and not arg.startswith("-")]
    script = next((n for n in names if n.startswith(("enmasse", "etcd"))), "")
    if script == "enmasse":
        return "runtime"
    return script.removeprefix("enmasse-") or (names[0] if names else "?")


def _wait(condition: Callable[[], bool], *, timeout: float, interval: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(interval)
    return condition()


def _log_tail(path: Path, *, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return f"(no log at {path})"
    return "\n".join(f"  | {line}" for line in text)


def start_supervisord(var: VarDir) -> None:
    for directory in (var.root, var.run, var.log, var.etcd_data, var.gitops, var.programs_dir):
        directory.mkdir(parents=True, exist_ok=True)
    var.socket.unlink(missing_ok=True)  # stale from a killed supervisord: nobody answers it
    ports = choose_ports(var)
    conf = render_supervisord_conf(var=var, commands=program_commands(var=var, ports=ports))
    var.supervisord_conf.write_text(conf)
    start_log = var.log / "supervisord.start.log"
    with start_log.open("wb") as err:
        # supervisord daemonizes: this returns once the daemon has forked off.
        done = subprocess.run(
            [_bin("supervisord"), "-c", str(var.supervisord_conf)],
            stdin=subprocess.DEVNULL,
            stdout=err,
            stderr=err,
            cwd=var.root,
            check=False,
            timeout=30,
        )
    if done.returncode != 0 or not _wait(lambda: supervisor_answers(var), timeout=15):
        raise CliError(f"supervisord did not start:\n{_log_tail(start_log)}")


def apply_config_changes(proxy: Any, *, ours: Callable[[str], bool]) -> dict[str, list[str]]:
    """Has supervisord re-read its config files and adds, replaces or removes the process
    groups that changed and that `ours` claims (the control plane here, routers and brokers
    in the runtime's loop: each leaves the other's differences for the other to apply)."""
    added, changed, removed = proxy.supervisor.reloadConfig()[0]
    names = [n for n in (*added, *changed, *removed) if ours(n)]
    for name in names:
        if name in changed or name in removed:
            with contextlib.suppress(xmlrpc.client.Fault):  # already stopped
                proxy.supervisor.stopProcessGroup(name, True)
            proxy.supervisor.removeProcessGroup(name)
        if name in changed or name in added:
            proxy.supervisor.addProcessGroup(name)  # autostart: supervisord starts it
    return {
        "started": sorted(n for n in names if n in added),
        "restarted": sorted(n for n in names if n in changed),
        "stopped": sorted(n for n in names if n in removed),
    }


def refresh_supervisord(var: VarDir) -> None:
    """A running supervisord whose config an older `up` wrote (programs missing, other
    commands) gets the current one, live; the programs whose commands did not change keep
    running untouched."""
    for directory in (var.gitops, var.programs_dir):
        directory.mkdir(parents=True, exist_ok=True)
    ports = choose_ports(var, in_use=True)
    conf = render_supervisord_conf(var=var, commands=program_commands(var=var, ports=ports))
    with contextlib.suppress(OSError):
        if var.supervisord_conf.read_text() == conf:
            return
    var.supervisord_conf.write_text(conf)
    apply_config_changes(supervisor_proxy(var), ours=lambda name: name in PROGRAMS)


def ensure_programs_running(var: VarDir) -> None:
    proxy = supervisor_proxy(var)
    for info in proxy.supervisor.getAllProcessInfo():
        if info["statename"] in ("STOPPED", "EXITED", "FATAL"):
            with contextlib.suppress(xmlrpc.client.Fault):  # ALREADY_STARTED: a race, fine
                proxy.supervisor.startProcess(info["name"], False)


def config_address(var: VarDir) -> str:
    return f"127.0.0.1:{read_ports(var).config}"


def config_healthy(address: str) -> bool:
    with grpc.insecure_channel(address) as channel:
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
        if config_healthy(address):
            var.config_addr.write_text(address + "\n")
            return address
        for info in proxy.supervisor.getAllProcessInfo():
            if info["statename"] == "FATAL":
                log = var.log / f"{info['name']}.log"
                raise CliError(
                    f"{info['name']} keeps crashing (FATAL); its log {log} ends:\n{_log_tail(log)}"
                )
        time.sleep(0.2)
    raise CliError(
        f"the config service at {address} did not become healthy within {timeout:.0f} s; "
        f"see {var.log / 'config.log'}:\n{_log_tail(var.log / 'config.log')}"
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


def up(var: VarDir) -> tuple[str, bool]:
    """Starts what is not running; returns (config address, whether supervisord was started)."""
    with exclusive(var):
        return _up(var)


def _up(var: VarDir) -> tuple[str, bool]:
    started = False
    if not supervisor_answers(var):
        if (pid := _supervisord_pid(var)) is not None:
            raise CliError(
                f"supervisord (pid {pid}) runs for {var.root} but does not answer on "
                f"{var.socket}; stop it with `kill {pid}` and retry"
            )
        if left := orphans(var):
            raise CliError(
                f"{stopped_text(left)} of an earlier run still run without their supervisord: "
                "run `enmasse down` first"
            )
        start_supervisord(var)
        started = True
    else:
        refresh_supervisord(var)
        ensure_programs_running(var)
    address = wait_config_healthy(var)
    # Healthy can come before supervisord's `startsecs` are over: wait for RUNNING, so that
    # `status` right after `up` says so.
    _wait(lambda: all_running(var), timeout=10)
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
    supervisord = _supervisord_pid(var)
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
    if not _wait(lambda: not pid_alive(pid), timeout=after):
        os.kill(pid, signal.SIGKILL)


def down(var: VarDir) -> list[tuple[str, int]]:
    """Stops every program and supervisord; returns what was stopped as (name, pid)."""
    if not var.root.is_dir():
        return []
    with exclusive(var):
        return _down(var)


def _down(var: VarDir) -> list[tuple[str, int]]:
    supervisord = _supervisord_pid(var)
    stopped: list[tuple[str, int]] = []
    for name, pid in orphans(var):
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
        with contextlib.suppress(xmlrpc.client.Fault):  # first: it would add routers/brokers
            proxy.supervisor.stopProcess("runtime", True)
        proxy.supervisor.stopAllProcesses(True)
        with contextlib.suppress(OSError, xmlrpc.client.Error):
            proxy.supervisor.shutdown()
        stopped.extend(children)
        # Belt and braces: a child that outlived supervisord is still ours, by its PID.
        for _name, pid in children:
            _kill_if_still_alive(pid, after=10)
    if supervisord is not None:
        if not supervisor_answers(var) and pid_alive(supervisord):
            os.kill(supervisord, signal.SIGTERM)
        if not _wait(lambda: not pid_alive(supervisord), timeout=15):
            os.kill(supervisord, signal.SIGKILL)
        stopped.append(("supervisord", supervisord))
    var.config_addr.unlink(missing_ok=True)
    var.socket.unlink(missing_ok=True)
    var.pidfile.unlink(missing_ok=True)  # left behind when supervisord was killed
    return stopped


def running(var: VarDir) -> bool:
    return supervisor_answers(var)


def stopped_text(stopped: Sequence[tuple[str, int]]) -> str:
    return ", ".join(f"{name} (pid {pid})" for name, pid in stopped)
