"""`enmasse-config`: wiring and start-up of the config service, nothing else.

Reads the flags, connects the store to etcd, stores the default plans on an empty store, serves the
ConfigService (with health and reflection) and reports the bound port: in the log, on stdout as
`listening on <host>:<port>` and, with --port-file, in that file (written atomically), so that
tests and `enmasse up` can start it on port 0 and read the port back.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys

import structlog
from enmasse.common.logging import configure_logging
from enmasse.common.serving import start_server
from enmasse.config.health import follow_store_health
from enmasse.config.servicer import ConfigServicer
from enmasse.config.store import DEFAULT_PREFIX, Store, StoreUnavailable
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
        _write_port_file(args.port_file, running.port)
    health = asyncio.create_task(follow_store_health(store, running, service=SERVICE_NAME))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    log.info("stopping")
    health.cancel()
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


def _write_port_file(path: str, port: int) -> None:
    partial = f"{path}.partial"
    with open(partial, "w") as file:
        file.write(f"{port}\n")
    os.replace(partial, path)


def main(argv: list[str] | None = None) -> None:
    configure_logging(service="config")
    asyncio.run(serve(parse_args(argv)))


if __name__ == "__main__":
    main()
