"""`enmasse-console`: wiring and start-up of the web console, nothing else.

Reads the flags, binds the listening socket (so the URL is known, and written with --url-file,
before the first request), and serves the ASGI app (app.py) with uvicorn: plain HTTP, or HTTPS
with --tls-dir (tls.crt and tls.key there, as every holder's directory has them). The console
calls the config service at --config, verifying it against --ca-file (none: plaintext), with
the token of whoever is logged in: it needs no credential of its own for that. With --var-dir it
also shows live figures, asking the routers and brokers found there with the read-only
certificate of --operator-tls-dir (data_plane.py). The trace views read the analytics job's
tables from --analytics-dir (default: <var-dir>/analytics, where `enmasse-analytics` writes).
`enmasse up` starts it on loopback with both and writes nothing for it: the console writes
<var>/run/console.url itself.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import sys
from pathlib import Path

import uvicorn
from enmasse.common.certificates import TlsFiles
from enmasse.common.logging import configure_logging
from enmasse.console.admin_api import AdminApi, open_channel
from enmasse.console.app import create_app
from enmasse.console.data_plane import DataPlane
from enmasse.resources.discovery import LocalDirectory

SHUTDOWN_GRACE_SECONDS = 2


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="enmasse-console",
        description="The web console: address spaces, addresses and users, behind the admin API",
    )
    parser.add_argument("--listen", default="127.0.0.1:0", help="host:port to serve on")
    parser.add_argument("--config", required=True, help="host:port of the config service")
    parser.add_argument(
        "--ca-file",
        type=Path,
        default=None,
        help="CA certificate to verify the config service against (none: plaintext gRPC)",
    )
    parser.add_argument(
        "--tls-dir",
        type=Path,
        default=None,
        help="serve HTTPS with tls.crt and tls.key from this directory (none: plain HTTP)",
    )
    parser.add_argument(
        "--url-file", type=Path, default=None, help="write the console's URL here once bound"
    )
    parser.add_argument(
        "--var-dir",
        type=Path,
        default=None,
        help="the local runtime's var dir: live figures from its routers and brokers",
    )
    parser.add_argument(
        "--operator-tls-dir",
        type=Path,
        default=None,
        help="the read-only operator certificate to ask routers and brokers with",
    )
    parser.add_argument(
        "--analytics-dir",
        type=Path,
        default=None,
        help="the analytics job's tables for the trace views (default: <var-dir>/analytics)",
    )
    return parser.parse_args(argv)


def bind(listen: str) -> socket.socket:
    host, _, port = listen.rpartition(":")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host or "127.0.0.1", int(port)))
    sock.listen(128)  # connections wait in the backlog until uvicorn accepts
    return sock


def write_url_file(path: Path, url: str) -> None:
    partial = path.with_name(path.name + ".partial")
    partial.write_text(url + "\n")
    os.replace(partial, path)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    configure_logging(service="console")
    sock = bind(args.listen)
    host, port = sock.getsockname()[:2]
    scheme = "https" if args.tls_dir else "http"
    url = f"{scheme}://{'127.0.0.1' if host == '0.0.0.0' else host}:{port}"
    tls = TlsFiles(args.tls_dir) if args.tls_dir else None
    data_plane = None
    if args.var_dir is not None:
        operator = TlsFiles(args.operator_tls_dir) if args.operator_tls_dir else None
        data_plane = DataPlane(directory=LocalDirectory(args.var_dir), tls=operator)
    analytics = args.analytics_dir
    if analytics is None and args.var_dir is not None:
        analytics = args.var_dir / "analytics"
    app = create_app(
        open_api=lambda: AdminApi(open_channel(args.config, ca_file=args.ca_file)),
        data_plane=data_plane,
        analytics=analytics,
    )
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            log_config=None,
            access_log=False,
            # An open page holds its event stream forever: on SIGTERM, close it after a moment
            # rather than wait for the browser (supervisord and Kubernetes would SIGKILL).
            timeout_graceful_shutdown=SHUTDOWN_GRACE_SECONDS,
            ssl_certfile=str(tls.cert) if tls else None,
            ssl_keyfile=str(tls.key) if tls else None,
        )
    )
    if args.url_file:
        write_url_file(args.url_file, url)
    sys.stdout.write(f"listening on {url}\n")
    sys.stdout.flush()
    asyncio.run(server.serve(sockets=[sock]))


if __name__ == "__main__":
    main()
