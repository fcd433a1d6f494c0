"""`enmasse-config`: wiring and start-up of the config service, nothing else.

Reads the flags, connects the store to etcd, stores the default plans on an empty store, serves the
ConfigService (with health and reflection), with --manifests-dir also the GitOps sync of that
directory (`enmasse.config.gitops_follow`), and reports the bound port: in the log, on stdout as
`listening on <host>:<port>` and, with --port-file, in that file (written atomically), so that
tests and `enmasse up` can start it on port 0 and read the port back.

Access: with --auth (or --bootstrap-token-file, which implies it) every call must carry a token
(`enmasse.config.gate`); the bootstrap file's token is stored as the admin token `admin` when the
store holds no usable admin token, so a fresh store is never open. Without either, the port is
open: every caller may do everything, and the start says so loudly. The in-process GitOps sync
always applies as its own identity, role `gitops`, whatever the mode.

Transport: with --tls-dir the port speaks TLS only, with config's certificate, but asks callers
for none: a call's credential is its token, and a tenant holds a token and the CA certificate,
nothing else (`enmasse.common.serving`, `require_client_certificate`).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import structlog
from enmasse.common.certificates import add_tls_dir_argument, tls_dir_files
from enmasse.common.logging import configure_logging
from enmasse.common.metrics import add_metrics_port_flag, serve_service_metrics
from enmasse.common.serving import start_server, until_terminated, write_port_file
from enmasse.common.tracing import configure_service_tracing
from enmasse.config.access import GITOPS, Identity
from enmasse.config.audit import OK, AuditEvent
from enmasse.config.gitops_follow import follow_tree
from enmasse.config.health import follow_store_health
from enmasse.config.servicer import ConfigServicer
from enmasse.config.store import DEFAULT_PREFIX, Store, StoreUnavailable
from enmasse.config.tokens import bootstrap_admin
from enmasse.config.writes import Refused
from enmasse.resources.gitops_sync import DEFAULT_MANAGER, owned_spaces_of
from enmasse.v1 import config_pb2, config_pb2_grpc

log = structlog.get_logger("enmasse.config")
SERVICE_NAME = "enmasse.v1.ConfigService"
T = TypeVar("T")
SYNC_IDENTITY = Identity(name="gitops-sync", role=GITOPS)
"""Who the in-process GitOps sync (--manifests-dir) applies as: never more than a sync needs."""
AUDIT_FLUSH_EVERY = 10.0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="enmasse-config", description="ConfigService: the sole owner of the etcd address store"
    )
    parser.add_argument("--listen", default="127.0.0.1:0", help="host:port to serve on")
    add_metrics_port_flag(parser)
    parser.add_argument("--etcd", default="127.0.0.1:2379", help="etcd endpoints host:port[,..]")
    parser.add_argument("--prefix", default=DEFAULT_PREFIX, help="etcd key prefix of this store")
    parser.add_argument("--port-file", default=None, help="write the bound port to this file")
    parser.add_argument(
        "--no-default-plans", action="store_true", help="do not store the default plans"
    )
    parser.add_argument(
        "--auth",
        action="store_true",
        help="every call must carry a token (without it or --bootstrap-token-file: port open)",
    )
    parser.add_argument(
        "--bootstrap-token-file",
        type=Path,
        default=None,
        help="store this file's token as the admin token when there is none (implies --auth)",
    )
    parser.add_argument(
        "--manifests-dir",
        type=Path,
        default=None,
        help="GitOps sync mode: apply DIR/<space>/*.yaml with prune, per space (gitops_follow.py)",
    )
    parser.add_argument(
        "--sync-interval", type=float, default=5.0, help="seconds between checks of the dir"
    )
    parser.add_argument(
        "--sync-manager", default=DEFAULT_MANAGER, help="the manager the sync applies as"
    )
    parser.add_argument(
        "--sync-status",
        type=Path,
        default=None,
        help="where the sync writes its status JSON (default: <manifests-dir>/../sync-status.json)",
    )
    add_tls_dir_argument(parser)
    parser.add_argument(
        "--etcd-tls-dir",
        default=None,
        help="etcd client mTLS: this service's etcd certificate and etcd's CA (none: plaintext)",
    )
    return parser.parse_args(argv)


async def serve(args: argparse.Namespace) -> None:
    host, _, port = args.listen.rpartition(":")
    store = Store(
        endpoints=args.etcd.split(","),
        prefix=args.prefix,
        tls=tls_dir_files(args.etcd_tls_dir),
    )
    auth = bool(args.auth or args.bootstrap_token_file)
    servicer = ConfigServicer(store, auth=auth)
    seeded = 0 if args.no_default_plans else await _until_store_answers(servicer.seed_default_plans)
    if seeded:
        log.info("stored the default plans", count=seeded)
    await _until_store_answers(servicer.create_space_queues)
    if args.bootstrap_token_file:
        secret = _read_bootstrap(args.bootstrap_token_file)
        await _until_store_answers(lambda: bootstrap_admin(store, secret=secret, now=time.time()))
    if not auth:
        log.warning(
            "AUTH IS OFF: the ConfigService port is open, anyone who reaches it may read and "
            "change everything; start with --auth or --bootstrap-token-file"
        )
    running = await start_server(
        registrations=[
            (config_pb2_grpc.add_ConfigServiceServicer_to_server, servicer, SERVICE_NAME)
        ],
        host=host or "127.0.0.1",
        port=int(port or 0),
        tls=tls_dir_files(args.tls_dir),
        require_client_certificate=False,  # callers are known by their tokens
    )
    log.info("serving", port=running.port, etcd=args.etcd, prefix=args.prefix)
    sys.stdout.write(f"listening on {host}:{running.port}\n")
    sys.stdout.flush()
    if args.port_file:
        write_port_file(args.port_file, running.port)
    metrics_port = serve_service_metrics(listen=args.listen, port=args.metrics_port)
    if metrics_port is not None:
        log.info("metrics served", port=metrics_port)
    health = asyncio.create_task(follow_store_health(store, running, service=SERVICE_NAME))
    flush = asyncio.create_task(_flush_audit(servicer))
    sync = _start_sync(args, servicer) if args.manifests_dir else None
    await until_terminated()
    log.info("stopping")
    health.cancel()
    flush.cancel()
    if sync is not None:
        sync.cancel()
    await running.stop(grace=2.0)
    await servicer.close()
    await store.close()


async def _until_store_answers(step: Callable[[], Awaitable[T]]) -> T:
    # etcd may still be starting beside us (enmasse up starts both): wait for it, boundedly.
    for _attempt in range(60):
        try:
            return await step()
        except StoreUnavailable as error:
            log.warning("etcd not reachable yet", error=str(error))
            await asyncio.sleep(0.5)
    raise SystemExit("etcd stayed unreachable for 30 s")


def _read_bootstrap(path: Path) -> str:
    try:
        secret = path.read_text().strip()
    except OSError as error:
        raise SystemExit(f"cannot read the bootstrap token file {path}: {error}") from None
    if not secret:
        raise SystemExit(f"the bootstrap token file {path} is empty")
    return secret


async def _flush_audit(servicer: ConfigServicer) -> None:
    """Says every so often how many audit events the rate limit held back."""
    while True:
        await asyncio.sleep(AUDIT_FLUSH_EVERY)
        servicer.gate.audit.flush()


def _start_sync(args: argparse.Namespace, servicer: ConfigServicer) -> asyncio.Task[None]:
    root: Path = args.manifests_dir
    status_path: Path = args.sync_status or root.parent / "sync-status.json"

    async def owned_spaces(manager: str) -> set[str]:
        catalog = await servicer.cache.at_least(await servicer.store.guard_revision())
        return owned_spaces_of(catalog.objects(), manager=manager)

    async def apply(request: config_pb2.ApplyRequest) -> config_pb2.ApplyResponse:
        outcome = OK
        try:
            return await servicer.apply(request, identity=SYNC_IDENTITY)
        except Refused as refused:
            outcome = refused.code.name
            raise
        except Exception as error:
            outcome = type(error).__name__
            raise
        finally:
            servicer.gate.audit.record(
                AuditEvent(
                    who=SYNC_IDENTITY.name,
                    role=SYNC_IDENTITY.role,
                    rpc="Apply",
                    kind="",
                    space=request.space,
                    name=request.manager,
                    outcome=outcome,
                )
            )

    log.info("gitops sync on", manifests_dir=str(root), status=str(status_path))
    return asyncio.create_task(
        follow_tree(
            root,
            apply=apply,
            owned_spaces=owned_spaces,
            status_path=status_path,
            interval=args.sync_interval,
            manager=args.sync_manager,
        ),
        name="gitops-sync",
    )


def main(argv: list[str] | None = None) -> None:
    configure_logging(service="config")
    configure_service_tracing(service="config")
    asyncio.run(serve(parse_args(argv)))


if __name__ == "__main__":
    main()
