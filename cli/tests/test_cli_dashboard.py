"""`enmasse dashboard` without a running console: the exact error and exit code, nothing opened.

The console that runs (`enmasse up`'s) is tested with the browser tests
(tests/test_e2e_console_connections.py: `enmasse dashboard --no-browser` prints its trace view's
URL). Here: no console ever started in the var dir, a URL left by a console that has stopped
(its port closed), and when a browser may be opened at all (a display).
"""

from __future__ import annotations

import socket
from pathlib import Path

from click.testing import CliRunner
from enmasse.cli import dashboard
from enmasse.cli.main import cli


def _dashboard(var: Path, *args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, ["--var-dir", str(var), "dashboard", *args])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.stdout, result.stderr


def test_with_nothing_running_it_says_to_run_enmasse_up(tmp_path: Path) -> None:
    var = tmp_path.resolve()
    assert _dashboard(var, "--no-browser") == (
        1,
        "",
        f"error: no console is running for {var}: `enmasse up` starts one "
        f"(it writes its URL to {var}/run/console.url)\n",
    )


def test_a_console_that_has_stopped_does_not_answer(tmp_path: Path) -> None:
    var = tmp_path.resolve()
    with socket.socket() as probe:  # a port nobody listens on once closed
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    (var / "run").mkdir()
    (var / "run" / "console.url").write_text(f"http://127.0.0.1:{port}\n")
    assert _dashboard(var) == (
        1,
        "",
        f"error: the console at http://127.0.0.1:{port} does not answer: run `enmasse up` "
        f"({var}/run/console.url is from a console that has stopped)\n",
    )


def test_a_browser_is_opened_only_where_there_is_a_display() -> None:
    assert not dashboard.has_display({}, "linux")
    assert dashboard.has_display({"DISPLAY": ":0"}, "linux")
    assert dashboard.has_display({"WAYLAND_DISPLAY": "wayland-0"}, "linux")
    assert dashboard.has_display({}, "darwin")
    assert dashboard.has_display({}, "win32")
