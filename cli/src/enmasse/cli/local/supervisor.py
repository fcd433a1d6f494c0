"""Talking to supervisord: start it, change its programs live, find what it left behind.

In: the var dir. Out: a supervisord daemon started on the rendered <var>/supervisord.conf
(`start_supervisord`), its XML-RPC API on the unix socket <var>/run/supervisor.sock
(`supervisor_proxy`, with supervisor's own transport), program groups added, replaced or removed
as the config files changed (`apply_config_changes`: `reloadConfig` says which groups were added,
changed or removed; added ones get `addProcessGroup`, removed ones `stopProcessGroup` +
`removeProcessGroup`, changed ones both), and the PIDs that are ours: supervisord's own (its pid
file, checked against its command line) and the programs a killed supervisord left running
(`orphans`).

Nothing here forks or reaps by hand: restarting a crashed process (BACKOFF, then FATAL after
`startretries`), logging and stopping are supervisord's job (DESIGN §5).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
import xmlrpc.client
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from enmasse.cli.client import CliError
from enmasse.cli.local.ports import choose_ports
from enmasse.cli.local.programs import (
    PROGRAMS,
    installed_program,
    program_commands,
    render_supervisord_conf,
)
from enmasse.cli.local.var_dir import VarDir
from supervisor.xmlrpc import SupervisorTransport


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


def supervisord_pid(var: VarDir) -> int | None:
    """The PID of this var dir's supervisord, when it runs (its pid file, and a command line
    that names this var dir's config: a reused PID is somebody else's)."""
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
    if supervisord_pid(var) is not None:
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


def wait_until(condition: Callable[[], bool], *, timeout: float, interval: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(interval)
    return condition()


def log_tail(path: Path, *, lines: int = 15) -> str:
    """The last lines of a program's log, indented, for an error message."""
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
            [installed_program("supervisord"), "-c", str(var.supervisord_conf)],
            stdin=subprocess.DEVNULL,
            stdout=err,
            stderr=err,
            cwd=var.root,
            check=False,
            timeout=30,
        )
    if done.returncode != 0 or not wait_until(lambda: supervisor_answers(var), timeout=15):
        raise CliError(f"supervisord did not start:\n{log_tail(start_log)}")


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
