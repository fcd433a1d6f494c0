"""`enmasse-config`: wiring and start-up of the config service, nothing else.

Reads the flags, connects the store to etcd, stores the default plans on an empty store, serves the
ConfigService (with health and reflection), with --manifests-dir also the GitOps sync of that
directory (`enmasse.config.gitops_follow`), and reports the bound port: in the log, on stdout as
`listening on <host>:<port>` and, with --port-file, in that file (written atomically), so that
tests and `enmasse up` can start it on port 0 and read the port back.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

import structlog
from enmasse.common.logging import configure_logging
from enmasse.common.serving import start_server, until_terminated, write_port_file
from enmasse.common.tracing import configure_service_tracing
from enmasse.config.gitops_follow import follow_tree
from enmasse.config.health import follow_store_health
from enmasse.config.servicer import ConfigServicer
from enmasse.config.store import DEFAULT_PREFIX, Store, StoreUnavailable
from enmasse.resources.gitops_sync import DEFAULT_MANAGER, owned_spaces_of
from enmasse.v1 import config_pb2_grpc

log = structlog.get_logger("enmasse.config")
SERVICE_NAME = "enmasse.v1.ConfigService"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="enmasse-config", description="ConfigService: the sole owner of the etcd address store"
    )
    parser.add_argument("--listen", default="127.0.0.1:0", help="host:port to serve on")
    parser.add_argument("--etcd", default="127.0.0.1:2379", help="etcd endpoints host:port[,..]")
    parser.add_argument("--prefix", default=DEFAULT_PREFIX, help="etcd key prefix of this store")
    parser.add_argument("--port-file", default=None, help="write the bound port to this file")
    parser.add_argument(
        "--no-default-plans", action="store_true", help="do not store the default plans"
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
    return parser.parse_args(argv)


async def serve(args: argparse.Namespace) -> None:
    host, _, port = args.listen.rpartition(":")
    store = Store(endpoints=args.etcd.split(","), prefix=args.prefix)
    servicer = ConfigServicer(store)
    if not args.no_default_plans:
        await _seed(servicer)
    running = await start_server(
        registrations=[
            (config_pb2_grpc.add_ConfigServiceServicer_to_server, servicer, SERVICE_NAME)
        ],
        host=host or "127.0.0.1",
        port=int(port or 0),
    )
    log.info("serving", port=running.port, etcd=args.etcd, prefix=args.prefix)
    sys.stdout.write(f"listening on {host}:{running.port}\n")
    sys.stdout.flush()
    if args.port_file:
        write_port_file(args.port_file, running.port)
    health = asyncio.create_task(follow_store_health(store, running, service=SERVICE_NAME))
    sync = _start_sync(args, servicer) if args.manifests_dir else None
    await until_terminated()
    log.info("stopping")
    health.cancel()
    if sync is not None:
        sync.cancel()
    await running.stop(grace=2.0)
    await servicer.close()
    await store.close()


async def _seed(servicer: ConfigServicer) -> None:
    # etcd may still be starting beside us (enmasse up starts both): wait for it, boundedly.
    for _attempt in range(60):
        try:
            stored = await servicer.seed_default_plans()
            if stored:
                log.info("stored the default plans", count=stored)
            return
        except StoreUnavailable as error:
            log.warning("etcd not reachable yet", error=str(error))
            await asyncio.sleep(0.5)
    raise SystemExit("etcd stayed unreachable for 30 s")


def _start_sync(args: argparse.Namespace, servicer: ConfigServicer) -> asyncio.Task[None]:
    root: Path = args.manifests_dir
    status_path: Path = args.sync_status or root.parent / "sync-status.json"

    async def owned_spaces(manager: str) -> set[str]:
        catalog = await servicer.cache.at_least(await servicer.store.guard_revision())
        return owned_spaces_of(catalog.objects(), manager=manager)

    log.info("gitops sync on", manifests_dir=str(root), status=str(status_path))
    return asyncio.create_task(
        follow_tree(
            root,
            apply=servicer.apply,
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
