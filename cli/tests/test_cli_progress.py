"""What `apply`, `gitops sync`, `up` and `down` show while they work: through a real terminal
(a pty: rich's live display, each finished step left as `✓ step (1.2 s)`) and through pipes
(plain `verb: step` lines on stderr for `up`/`down`, nothing beyond the result lines for
`apply`/`gitops sync`), and `--quiet` (no live display on a terminal either).

`apply` and `gitops sync` run against a real `enmasse-config` over a real etcd; the one `up`
test runs the whole local stack (no address spaces, so it is as quick as `up` gets) and stops it
through `enmasse down`, checking every PID it saw is gone.
"""

from __future__ import annotations

import os
import pty
import re
import select
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from enmasse.cli.local.programs import PROGRAMS

from tests.fixtures.config_service import ConfigProcess
from tests.fixtures.etcd import EtcdProcess
from tests.fixtures.local_runtime import enmasse as enmasse_in
from tests.fixtures.local_runtime import logs, stop_and_check, supervised

ENMASSE = Path(sys.executable).parent / "enmasse"
COLOUR = re.compile(r"\x1b\[[0-9;]*m|\x1b\][^\x07]*\x07")
CURSOR = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")  # erase line, cursor up, hide cursor: a redraw
CONTROL_PLANE = ", ".join(PROGRAMS)


def clean_env() -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("ENMASSE_SERVER", "ENMASSE_VAR", "ENMASSE_TOKEN", "ENMASSE_CA_FILE")
    }
    env.update({"TERM": "xterm-256color", "COLUMNS": "160", "LINES": "50"})
    env.pop("NO_COLOR", None)
    return env


def on_a_terminal(*args: str, timeout: float = 240) -> tuple[int, str]:
    """`enmasse ARGS` with stdin, stdout and stderr on one pty, as in a terminal window:
    (exit code, everything it drew, ANSI sequences and all)."""
    controller, terminal = pty.openpty()
    process = subprocess.Popen(
        [str(ENMASSE), *args],
        stdin=terminal,
        stdout=terminal,
        stderr=terminal,
        env=clean_env(),
        close_fds=True,
    )
    os.close(terminal)
    drawn = bytearray()
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([controller], [], [], 0.2)
            if ready:
                try:
                    chunk = os.read(controller, 65536)
                except OSError:  # EIO: the program closed the terminal (it exited)
                    break
                if not chunk:
                    break
                drawn.extend(chunk)
            elif process.poll() is not None:
                break
        code = process.wait(timeout=max(deadline - time.monotonic(), 1))
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)
        os.close(controller)
    return code, drawn.decode(errors="replace")


def plain(drawn: str) -> list[str]:
    """The lines drawn, roughly: colours out, each redraw (a cursor sequence) and carriage
    return as a line break, blank lines dropped."""
    text = CURSOR.sub("\n", COLOUR.sub("", drawn)).replace("\r\n", "\n").replace("\r", "\n")
    return [line.rstrip() for line in text.split("\n") if line.strip()]


def piped(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(ENMASSE), *args],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
        env=clean_env(),
    )


@pytest.fixture
def config(
    etcd: EtcdProcess, etcd_prefix: str, config_process_factory: Callable[..., ConfigProcess]
) -> ConfigProcess:
    return config_process_factory(etcd_endpoint=etcd.endpoint, prefix=etcd_prefix)


def many_addresses(folder: Path, *, count: int) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    docs = [
        "apiVersion: enmasse.io/v1\nkind: AddressSpace\nmetadata: {name: bulk}\n"
        "spec: {type: standard, plan: standard-small}\n"
    ]
    docs += [
        f"apiVersion: enmasse.io/v1\nkind: Address\nmetadata: {{name: q{n:02d}, space: bulk}}\n"
        "spec: {address: q%02d, type: queue, plan: standard-small-queue}\n" % n
        for n in range(count)
    ]
    (folder / "bulk.yaml").write_text("---\n".join(docs))
    return folder


def test_apply_of_many_manifests_on_a_terminal_in_a_pipe_and_quiet(
    config: ConfigProcess, tmp_path: Path
) -> None:
    folder = many_addresses(tmp_path / "bulk", count=20)
    server = ("--server", config.target, "--var-dir", str(tmp_path / "var"))

    code, drawn = on_a_terminal(*server, "apply", "-f", str(folder))
    assert code == 0, drawn
    shown = plain(drawn)
    assert "addressspace/bulk created" in shown
    assert "address/q19 created" in shown
    done = [line for line in shown if line.startswith("✓ applying 21 manifests (")]
    assert len(done) == 1, shown
    assert "\x1b[" in drawn  # rich drew: colours and cursor movements

    # Through pipes: the result lines on stdout, nothing on stderr.
    again = piped(*server, "apply", "-f", str(folder))
    assert again.returncode == 0
    assert again.stderr == ""
    assert again.stdout.splitlines()[:2] == ["addressspace/bulk unchanged", "address/q00 unchanged"]

    # --quiet on a terminal: no live display, no tick; only the result lines.
    code, drawn = on_a_terminal(*server, "apply", "-f", str(folder), "--quiet")
    assert code == 0
    shown = plain(drawn)
    assert not any(line.startswith("✓") for line in shown), shown
    assert shown[0] == "addressspace/bulk unchanged"
    assert len(shown) == 21  # one line per manifest
    assert "\x1b[" not in drawn

    # A refused apply on a terminal: the step is marked failed, the error is the usual one.
    (folder / "bad.yaml").write_text(
        "apiVersion: enmasse.io/v1\nkind: Address\nmetadata: {name: x, space: bulk}\n"
        "spec: {address: x, type: queue, plan: no-such-plan}\n"
    )
    code, drawn = on_a_terminal(*server, "apply", "-f", str(folder))
    shown = plain(drawn)
    assert code == 1
    assert any(line.startswith("✗ applying 22 manifests (") for line in shown), shown
    assert any(line.startswith("error: ") for line in shown), shown


def git(*args: str, cwd: Path) -> None:
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def test_gitops_sync_once_on_a_terminal_shows_pull_and_apply(
    config: ConfigProcess, tmp_path: Path
) -> None:
    repo = tmp_path / "repo"
    many_addresses(repo / "tenants" / "bulk", count=3)
    git("init", "--quiet", "--initial-branch=main", cwd=repo)
    git("-c", "user.email=t@example.com", "-c", "user.name=t", "add", ".", cwd=repo)
    git("-c", "user.email=t@example.com", "-c", "user.name=t", "commit", "-qm", "one", cwd=repo)
    args = (
        "--server",
        config.target,
        "--var-dir",
        str(tmp_path / "var"),
        "gitops",
        "sync",
        "--repo",
        str(repo),
        "--path",
        "tenants",
        "--once",
    )
    code, drawn = on_a_terminal(*args)
    assert code == 0, drawn
    shown = plain(drawn)
    assert any(line.startswith(f"✓ pulling {repo} (main) (") for line in shown), shown
    assert any(line.startswith("✓ applying tenants at ") for line in shown), shown
    assert any(line.startswith("synced ") for line in shown), shown

    again = piped(*args)
    assert again.returncode == 0
    assert again.stderr == ""
    assert again.stdout.startswith("synced ")


@pytest.mark.slow
def test_up_and_down_say_each_step_plain_in_a_pipe_and_live_on_a_terminal(
    tmp_path: Path,
) -> None:
    var = tmp_path / "var"
    seen: set[int] = set()
    try:
        up = enmasse_in(var, "up")
        assert up.returncode == 0, up.stderr + logs(var)
        seen.update(pid for _state, pid in supervised(var).values())
        address = (var / "run" / "config.addr").read_text().strip()
        assert up.stderr.splitlines() == [
            f"up: starting supervisord and the control plane ({CONTROL_PLANE})",
            f"up: waiting for the config service at {address}",
            "up: making the control-plane services' tokens",
            "up: waiting until every program runs",
            "up: no address spaces yet: nothing to wait for",
        ]
        said = up.stdout.splitlines()
        assert said[:4] == [
            f"enmasse started: config service at {address} (state in {var})",
            f"config service: {address} (TLS, CA {var / 'tls' / 'ca.crt'})",
            f"admin token: {var / 'run' / 'admin-token'} (the CLI's by default; "
            "$ENMASSE_TOKEN elsewhere)",
            f"logs: {var / 'log'} (enmasse logs COMPONENT)",
        ]
        # and the web console's URL when it listened in time (it writes run/console.url then)
        console = var / "run" / "console.url"
        if said[4:]:
            assert said[4:] == [f"console: {console.read_text().strip()}"], said

        # Again, on a terminal: the live display, each step ticked off with its time.
        code, drawn = on_a_terminal("--var-dir", str(var), "up")
        assert code == 0, drawn
        shown = plain(drawn)
        for step in (
            "supervisord runs: starting what is not running",
            f"waiting for the config service at {address}",
            "waiting until every program runs",
        ):
            assert any(re.fullmatch(rf"✓ {re.escape(step)} \(\d+\.\d s\)", s) for s in shown), (
                step,
                shown,
            )
        assert f"enmasse already running: config service at {address} (state in {var})" in shown
        assert f"logs: {var / 'log'} (enmasse logs COMPONENT)" in shown

        # `logs` reads what supervisord wrote for the config program.
        config_log = enmasse_in(var, "logs", "config", "--tail", "3")
        assert config_log.returncode == 0, config_log.stderr
        assert len(config_log.stdout.splitlines()) == 3

        supervisord = supervised(var)
        seen.update(pid for _state, pid in supervisord.values())
        down = enmasse_in(var, "down")
        assert down.returncode == 0, down.stderr
        lines = down.stderr.splitlines()
        assert lines[:2] == ["down: stopping the runtime loop", "down: stopping the control plane"]
        assert re.fullmatch(r"down: stopping supervisord \(pid \d+\)", lines[2]), lines
        assert len(lines) == 3
        assert down.stdout.startswith("stopped: ")
    finally:
        assert stop_and_check(var, seen) == []
