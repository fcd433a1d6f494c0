"""`enmasse logs COMPONENT [--space S] [--tail N] [-f]`: a program's log without knowing where.

In: the var dir of `enmasse up`, whose supervisord writes each program's output to
`<var>/log/<program>.log` (rotated to `.log.1`, `.log.2`), and the component the user names:
a program (`config`, `router-agent`, `demo-router-0`), or a role (`router`, `broker`,
`mqtt-gateway`) that means every program of that role, in every space or in `--space S`.
Out: the last `--tail` lines of each file (prefixed `[program]` when there are several), then
with `-f` every new line as it is written, until Ctrl-C; a `CliError` listing the components
there are when the name matches none.

Following is a bounded poll of the files' sizes (no inotify dependency); a file that shrinks was
rotated by supervisord and is read again from its start.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from enmasse.cli.client import CliError

LOG_SUFFIX = ".log"
ROLES = ("router", "broker", "mqtt-gateway")
FOLLOW_INTERVAL = 0.2


@dataclass(frozen=True)
class LogFile:
    program: str
    path: Path


def programs(log_dir: Path) -> list[str]:
    """Every program with a log under `log_dir`, sorted."""
    if not log_dir.is_dir():
        return []
    return sorted(p.name.removesuffix(LOG_SUFFIX) for p in log_dir.glob(f"*{LOG_SUFFIX}"))


def _role_of(program: str) -> tuple[str, str] | None:
    """`demo-router-0` -> ("demo", "router"); None for a control-plane program."""
    for role in ROLES:
        marker = f"-{role}"
        at = program.find(marker)
        rest = program[at + len(marker) :] if at > 0 else None
        if rest is not None and (rest == "" or rest.startswith("-")):
            return program[:at], role
    return None


def select(log_dir: Path, *, component: str, space: str = "") -> list[LogFile]:
    """The log files `component` names (within `space` when given); CliError when none."""
    known = programs(log_dir)
    if not known:
        raise CliError(f"no logs in {log_dir}: has `enmasse up` run with this --var-dir?")
    if component in known and not space:
        return [LogFile(component, log_dir / f"{component}{LOG_SUFFIX}")]
    chosen = []
    for program in known:
        role = _role_of(program)
        if role is None or (space and role[0] != space):
            continue
        if component in (program, role[1]):
            chosen.append(program)
    if not chosen:
        where = f" in space '{space}'" if space else ""
        raise CliError(
            f"no component '{component}'{where}: expected one of {', '.join(known)} "
            f"(or a role: {', '.join(ROLES)}, with --space SPACE)"
        )
    return [LogFile(p, log_dir / f"{p}{LOG_SUFFIX}") for p in chosen]


def tail(path: Path, *, lines: int) -> list[str]:
    """The last `lines` lines of a file (all of them when `lines` < 0)."""
    with path.open(errors="replace") as text:
        if lines < 0:
            return [line.rstrip("\n") for line in text]
        return [line.rstrip("\n") for line in deque(text, maxlen=lines)]


def _prefix(file: LogFile, several: bool) -> str:
    return f"[{file.program}] " if several else ""


def show(files: Sequence[LogFile], *, lines: int) -> Iterator[str]:
    several = len(files) > 1
    for file in files:
        for line in tail(file.path, lines=lines):
            yield _prefix(file, several) + line


def follow(
    files: Sequence[LogFile],
    *,
    stop: Callable[[], bool] = lambda: False,
    sleep: Callable[[float], None] = time.sleep,
) -> Iterator[str]:
    """Every line written to the files from now on, until `stop()` says so."""
    several = len(files) > 1
    offsets = {f.path: f.path.stat().st_size if f.path.exists() else 0 for f in files}
    partial = {f.path: "" for f in files}
    while not stop():
        for file in files:
            size = file.path.stat().st_size if file.path.exists() else 0
            if size < offsets[file.path]:  # rotated: the new file from its start
                offsets[file.path], partial[file.path] = 0, ""
            if size == offsets[file.path]:
                continue
            with file.path.open("rb") as raw:
                raw.seek(offsets[file.path])
                chunk = raw.read(size - offsets[file.path])
            offsets[file.path] = size
            text = partial[file.path] + chunk.decode(errors="replace")
            *complete, partial[file.path] = text.split("\n")
            for line in complete:
                yield _prefix(file, several) + line
        sleep(FOLLOW_INTERVAL)
