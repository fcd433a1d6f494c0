"""`enmasse-router-agent`: wiring and start-up of the router-agent, nothing else.

Reads the flags, builds the local `Directory` over the ports files the processes write
(`<var>/routers/<space>/<id>/ports.json`, `<var>/brokers/<space>/<id>/ports.json`),
starts the agent loop against the config service (rendering router workloads into --gitops-dir
when given: as many per space as its plan says, or --routers-per-space) and serves RouterAgent
(with health and reflection). With --gitops-repo (or $ENMASSE_GITOPS_REPO) the output directory
is a git working copy of that remote, and every render that changed files is committed and
pushed with the reason (`enmasse.resources.gitops_writeback`, as the storage-controller does),
credentials from --git-credentials when its files are there. With --mqtt-store-password-file the
routers of each space whose plan serves MQTT get the gateway's store identity
(`enmasse.resources.mqtt_stores`). The bound port goes to the log,
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
from enmasse.resources.discovery import LocalDirectory, follow_ports_files
from enmasse.resources.gitops_writeback import Credentials, WorkloadRepository
from enmasse.resources.mqtt_stores import store_identity
from enmasse.router_agent.agent import RouterAgent
from enmasse.router_agent.elasticity import DOWN_AFTER, UP_AFTER
from enmasse.router_agent.servicer import SERVICE_NAME, RouterAgentServicer
from enmasse.router_agent.workloads import RouterWorkloads
from enmasse.v1 import router_agent_pb2_grpc, router_pb2

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
    parser.add_argument(
        "--tick",
        type=float,
        default=5.0,
        help="seconds between passes when nothing wakes the agent (store changes, routers' "
        "connections and ports files do, at once)",
    )
    parser.add_argument(
        "--gitops-dir",
        default=None,
        help="render each standard space's router workloads to <dir>/workloads/<space>/",
    )
    parser.add_argument(
        "--routers-per-space",
        type=int,
        default=None,
        help="routers in each mesh, whatever the plans say (for tests and local runs; "
        "default: each space's plan, its min_routers and at least one)",
    )
    parser.add_argument(
        "--gitops-repo",
        default=os.environ.get("ENMASSE_GITOPS_REPO", ""),
        help="git remote to commit and push the router workloads to ($ENMASSE_GITOPS_REPO; "
        "needs --gitops-dir, which becomes its working copy)",
    )
    parser.add_argument("--gitops-branch", default="main", help="branch of --gitops-repo")
    parser.add_argument(
        "--git-credentials",
        type=Path,
        default=Path("/etc/enmasse/gitops"),
        help="directory with username and password files (used when both are there)",
    )
    parser.add_argument(
        "--mqtt-store-password-file",
        default=os.environ.get("ENMASSE_MQTT_STORE_PASSWORD_FILE") or None,
        help="the password of the MQTT gateway's store identity (the routers of each space whose "
        "plan serves MQTT let it use the store queues; none: no store identity)",
    )
    parser.add_argument(
        "--scale-up-after",
        type=float,
        default=UP_AFTER,
        help="seconds a space's load must need more routers before one more starts (plans with "
        "connectionsPerRouter or deliveriesPerRouter; elasticity.py)",
    )
    parser.add_argument(
        "--scale-down-after",
        type=float,
        default=DOWN_AFTER,
        help="seconds a space's load must fit on one router fewer before one stops",
    )
    add_tls_dir_argument(parser)
    args = parser.parse_args(argv)
    if args.gitops_repo and not args.gitops_dir:
        parser.error("--gitops-repo needs --gitops-dir: the working copy the routers render to")
    if args.routers_per_space is not None and args.routers_per_space < 1:
        parser.error("--routers-per-space: a space needs at least one router")
    return args


async def serve(args: argparse.Namespace) -> None:
    var = Path(args.var)
    tls = tls_dir_files(args.tls_dir)
    directory = LocalDirectory(
        var,
        routers=Path(args.routers_dir) if args.routers_dir else None,
        brokers=Path(args.brokers_dir) if args.brokers_dir else None,
    )
    agent = RouterAgent(
        config_target=args.config,
        token=token_file_source(args.token_file),
        tls=tls,
        directory=directory,
        tick=args.tick,
        workloads=RouterWorkloads(Path(args.gitops_dir)) if args.gitops_dir else None,
        routers_per_space=args.routers_per_space,
        writeback=await _prepared_writeback(args),
        mqtt_store=_mqtt_store(args.mqtt_store_password_file),
        scale_up_after=args.scale_up_after,
        scale_down_after=args.scale_down_after,
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
    # A router or broker written or gone wakes a pass at once; the tick is only the safety net.
    following = asyncio.create_task(
        follow_ports_files(directory.roots, agent.wake), name="ports-files"
    )
    writing = (
        asyncio.create_task(agent.writeback.run(), name="gitops-writeback")
        if agent.writeback is not None
        else None
    )
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
    following.cancel()
    await agent.stop()
    if writing is not None:
        writing.cancel()


def _mqtt_store(path: str | None) -> router_pb2.RouterUser | None:
    """The store identity from its password file, hashed once (its salts stay for the run)."""
    if not path:
        return None
    password = Path(path).read_text().strip()
    if not password:
        raise SystemExit(f"--mqtt-store-password-file {path} is empty")
    return store_identity(password)


async def _prepared_writeback(args: argparse.Namespace) -> WorkloadRepository | None:
    """The write-back's working copy, made before the agent reads the output: it restores the
    routers rendered before (their ports) into an empty one."""
    if not args.gitops_repo:
        return None
    repository = WorkloadRepository(
        Path(args.gitops_dir),
        remote=args.gitops_repo,
        author="enmasse-router-agent",
        branch=args.gitops_branch,
        credentials=Credentials.from_dir(args.git_credentials),
    )
    await asyncio.to_thread(repository.prepare)
    return repository


def main(argv: list[str] | None = None) -> None:
    configure_logging(service="router-agent")
    args = parse_args(argv)
    configure_service_tracing(service="router-agent", var_dir=args.var)
    asyncio.run(serve(args))


if __name__ == "__main__":
    main()
