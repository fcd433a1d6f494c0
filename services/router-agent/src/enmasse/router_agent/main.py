"""`enmasse-router-agent`: wiring and start-up of the router-agent, nothing else.

Reads the flags, builds the local `Directory` over the ports files the processes write
(`<var>/routers/<space>/<id>/ports.json`, `<var>/brokers/<space>/<id>/ports.json`),
starts the agent loop against the config service (rendering router workloads into --gitops-dir
when given) and serves RouterAgent (with health and reflection). The bound port goes to the log,
to stdout as `listening on <host>:<port>` and, with --port-file, into that file.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path

import structlog
from enmasse.common.certificates import add_tls_dir_argument, tls_dir_files
from enmasse.common.credentials import token_file_source
from enmasse.common.logging import configure_logging
from enmasse.common.metrics import add_metrics_port_flag, serve_service_metrics
from enmasse.common.serving import start_server, until_terminated, write_port_file
from enmasse.common.tracing import configure_service_tracing
from enmasse.resources.discovery import LocalDirectory
from enmasse.router_agent.agent import RouterAgent
from enmasse.router_agent.servicer import SERVICE_NAME, RouterAgentServicer
from enmasse.router_agent.workloads import RouterWorkloads
from enmasse.v1 import router_agent_pb2_grpc

log = structlog.get_logger("enmasse.router_agent")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="enmasse-router-agent",
        description="Computes each router's configuration and pushes it with a generation",
    )
    parser.add_argument("--listen", default="127.0.0.1:0", help="host:port to serve on")
    add_metrics_port_flag(parser)
    parser.add_argument("--config", required=True, help="host:port of the config service")
    parser.add_argument(
        "--token-file",
        default=None,
        help="the file holding this service's config token (else $ENMASSE_TOKEN_FILE; none: "
        "calls go without one, for a config service run without --auth)",
    )
    parser.add_argument(
        "--var",
        default=os.environ.get("ENMASSE_VAR", "var"),
        help="the runtime's var dir (ports files under it)",
    )
    parser.add_argument("--routers-dir", default=None, help="default: <var>/routers")
    parser.add_argument("--brokers-dir", default=None, help="default: <var>/brokers")
    parser.add_argument("--port-file", default=None, help="write the bound port to this file")
    parser.add_argument("--tick", type=float, default=0.5, help="seconds between passes")
    parser.add_argument(
        "--gitops-dir",
        default=None,
        help="render each standard space's router workloads to <dir>/workloads/<space>/",
    )
    parser.add_argument("--routers-per-space", type=int, default=1, help="routers in each mesh")
    add_tls_dir_argument(parser)
    return parser.parse_args(argv)


async def serve(args: argparse.Namespace) -> None:
    var = Path(args.var)
    tls = tls_dir_files(args.tls_dir)
    agent = RouterAgent(
        config_target=args.config,
        token=token_file_source(args.token_file),
        tls=tls,
        directory=LocalDirectory(
            var,
            routers=Path(args.routers_dir) if args.routers_dir else None,
            brokers=Path(args.brokers_dir) if args.brokers_dir else None,
        ),
        tick=args.tick,
        workloads=(
            RouterWorkloads(Path(args.gitops_dir), routers_per_space=args.routers_per_space)
            if args.gitops_dir
            else None
        ),
    )
    host, _, port = args.listen.rpartition(":")
    running = await start_server(
        registrations=[
            (
                router_agent_pb2_grpc.add_RouterAgentServicer_to_server,
                RouterAgentServicer(agent),
                SERVICE_NAME,
            )
        ],
        host=host or "127.0.0.1",
        port=int(port or 0),
        tls=tls,
    )
    agent.start()
    log.info("serving", port=running.port, config=args.config)
    sys.stdout.write(f"listening on {host or '127.0.0.1'}:{running.port}\n")
    sys.stdout.flush()
    if args.port_file:
        write_port_file(args.port_file, running.port)
    metrics_port = serve_service_metrics(listen=args.listen, port=args.metrics_port)
    if metrics_port is not None:
        log.info("metrics served", port=metrics_port)
    await until_terminated()
    log.info("stopping")
    await running.stop(grace=1.0)
    await agent.stop()


def main(argv: list[str] | None = None) -> None:
    configure_logging(service="router-agent")
    args = parse_args(argv)
    configure_service_tracing(service="router-agent", var_dir=args.var)
    asyncio.run(serve(args))


if __name__ == "__main__":
    main()
