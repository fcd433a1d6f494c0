"""`enmasse dashboard`: the console's trace view, or the static dashboard `enmasse-analytics` wrote.

By default: the web console's trace view of the local installation. What flows in: the URL the
running console wrote when it bound (`<var>/run/console.url`: `enmasse up` starts
`enmasse-console --url-file` there) and whether there is a display. What flows out: the view's
URL, printed (so a script can read it), and opened in the desktop's browser when there is a
display and no `--no-browser`. A console that wrote no URL, or whose URL does not answer (stopped
since), is an error saying to run `enmasse up`: nothing is opened then.

With `--path` or `--serve`: the static dashboard file (default `<var>/analytics/dashboard.html`),
opened in the browser (one self-contained file, no server needed), or, with `--serve`, an HTTP
server on a loopback port serving the analytics folder until Ctrl-C, for a browser that cannot
open local files (a remote shell with a forwarded port). The URL is printed first either way.

Why "a display" is checked: on Linux without $DISPLAY or $WAYLAND_DISPLAY, `webbrowser` falls
back to a text browser in the same terminal (or nothing); a headless machine only prints.
"""

from __future__ import annotations

import functools
import http.server
import os
import sys
import urllib.request
import webbrowser
from collections.abc import Callable, Mapping
from pathlib import Path

from enmasse.cli.client import CliError
from enmasse.cli.local.var_dir import VarDir

DASHBOARD_FILE = "dashboard.html"
TRACE_VIEW = "/traces"
"""The console's trace view, below the console's URL."""
ANSWER_SECONDS = 5.0


def console_url(var: VarDir) -> str:
    """The running console's URL, as it wrote it once it listened, or a CliError."""
    try:
        url = var.console_url.read_text().strip()
    except FileNotFoundError:
        url = ""
    if not url:
        raise CliError(
            f"no console is running for {var.root}: `enmasse up` starts one "
            f"(it writes its URL to {var.console_url})"
        )
    try:  # its login page: answered without a token by a console that runs
        with urllib.request.urlopen(url + "/login", timeout=ANSWER_SECONDS):
            pass
    except OSError:  # refused, timed out, or not a console (urllib's errors are OSErrors)
        raise CliError(
            f"the console at {url} does not answer: run `enmasse up` ({var.console_url} "
            "is from a console that has stopped)"
        ) from None
    return url


def trace_view(var: VarDir) -> str:
    return console_url(var) + TRACE_VIEW


def has_display(environ: Mapping[str, str] = os.environ, platform: str = sys.platform) -> bool:
    """Whether a graphical browser can open here (macOS and Windows: always)."""
    if platform == "darwin" or platform.startswith("win"):
        return True
    return bool(environ.get("DISPLAY") or environ.get("WAYLAND_DISPLAY"))


def show(url: str, *, browser: bool) -> str:
    """Opens `url` in the desktop's browser when asked and there is a display; returns it."""
    if browser and has_display():
        webbrowser.open(url)
    return url


def locate(*, var_root: Path, path: str | None) -> Path:
    """The dashboard file to show, or a CliError saying how to make one."""
    target = Path(path).expanduser().resolve() if path else var_root / "analytics" / DASHBOARD_FILE
    if target.is_dir():
        target = target / DASHBOARD_FILE
    if not target.is_file():
        raise CliError(
            f"no dashboard at {target}: run `enmasse-analytics` first (it reads "
            f"{var_root / 'traces'} and writes {var_root / 'analytics'})"
        )
    return target


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    """Serves files without logging every request to stderr (the URL line must stay readable)."""

    def log_message(self, format: str, *args: object) -> None:
        return None


def make_server(dashboard: Path, *, port: int) -> http.server.ThreadingHTTPServer:
    """An HTTP server on 127.0.0.1:`port` (0 = a free one) for the dashboard's folder."""
    handler = functools.partial(_QuietHandler, directory=str(dashboard.parent))
    try:
        return http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
    except OSError as exc:
        raise CliError(f"cannot serve on 127.0.0.1:{port}: {exc.strerror}") from None


def serve(dashboard: Path, *, port: int, announce: Callable[[str], None]) -> None:
    server = make_server(dashboard, port=port)
    bound = server.server_address[1]
    announce(f"http://127.0.0.1:{bound}/{dashboard.name}")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
