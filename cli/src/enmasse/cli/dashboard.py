"""`enmasse dashboard`: show the tracing dashboard that `enmasse-analytics` wrote.

What flows in: the dashboard file (default `<var>/analytics/dashboard.html`) and whether to serve
it. What flows out: the page opened in the desktop's browser (it is one self-contained file, so no
server is needed), or, with `--serve`, an HTTP server on a loopback port serving the analytics
folder until Ctrl-C, for a browser that cannot open local files (a remote shell with a forwarded
port). The URL is printed first either way, so a script can read it.
"""

from __future__ import annotations

import functools
import http.server
import webbrowser
from collections.abc import Callable
from pathlib import Path

from enmasse.cli.client import CliError

DASHBOARD_FILE = "dashboard.html"


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


def open_in_browser(dashboard: Path) -> str:
    url = dashboard.as_uri()
    webbrowser.open(url)
    return url


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
