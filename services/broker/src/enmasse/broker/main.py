"""`enmasse-broker`: wiring and start-up only.

Reads flags (and the optional --config YAML of queues and topics), recovers the data directory
(catalog, then journal), opens the AMQP listener on the shared engine and the BrokerAdmin gRPC
server on a thread of its own (and with --metrics-port, Prometheus metrics: `metrics.py`),
writes the bound ports to --ports-file (JSON, written atomically: tests and `enmasse up` read it),
and runs the engine loop on the main thread until SIGTERM/SIGINT.

A standard space's broker is rendered with --routers-only: with its certificate (--tls-dir) its
AMQP port speaks mutual TLS and takes only peers whose client certificate the same CA signed (the
space's routers, a broker draining into it); a plain or anonymous client never reaches a queue
behind the routers' back (`Settings.router_tls`).

A brokered space's broker is rendered with --client-auth required: its AMQP port (and with
--tls-cert/--tls-key an amqps port, --amqps-port, `amqps` in the ports file) is its clients', who
log in as the space's users with what the storage-controller pushes (SetClientAccess, held in
memory only: until the first push nobody gets in; `clients.py`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import tempfile
import threading
from pathlib import Path

import structlog
from enmasse.amqp.engine import Engine, Tls, settle_gc_for_message_loop
from enmasse.broker.admin import BrokerAdmin
from enmasse.broker.broker import AddressError, Broker
from enmasse.broker.config import Settings, load_addresses
from enmasse.broker.drain import Drain
from enmasse.broker.handler import Endpoint
from enmasse.broker.metrics import BrokerMetrics
from enmasse.broker.queue import Queue
from enmasse.common.certificates import BROKER, CONTROL_PLANE, OPERATOR, tls_dir_files
from enmasse.common.logging import configure_logging
from enmasse.common.metrics import METRICS_PORT, serve_metrics
from enmasse.common.serving import start_server
from enmasse.common.tracing import configure_service_tracing
from enmasse.v1 import broker_pb2_grpc
from prometheus_client import REGISTRY

log = structlog.get_logger("enmasse.broker")

PREPARE_DRAIN = "/enmasse.v1.BrokerAdmin/PrepareDrain"
LIST_ADDRESSES = "/enmasse.v1.BrokerAdmin/ListAddresses"  # changes nothing: the operator may
CLIENT_AUTH = ("anonymous", "required")


def parse_settings(argv: list[str] | None) -> Settings:
    p = argparse.ArgumentParser(prog="enmasse-broker", description="EnMasse-py broker")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=5672, help="AMQP port (0: a free one)")
    p.add_argument("--admin-port", type=int, default=0, help="BrokerAdmin gRPC port (0: free)")
    p.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help=f"Prometheus metrics port (0: free; {METRICS_PORT} in a cluster); none: no metrics",
    )
    p.add_argument("--data-dir", type=Path, default=None, help="journal + catalog (none: memory)")
    p.add_argument("--config", type=Path, default=None, help="YAML of queues and topics")
    p.add_argument(
        "--max-message-size",
        type=int,
        default=Settings.max_message_size,
        help="bytes of one message; a larger delivery is rejected (its link goes on)",
    )
    p.add_argument("--memory-limit", type=int, default=Settings.memory_limit_bytes)
    p.add_argument("--segment-bytes", type=int, default=Settings.segment_bytes)
    p.add_argument("--credit-window", type=int, default=Settings.credit_window)
    p.add_argument("--idle-timeout", type=float, default=30.0, help="seconds; 0: none")
    p.add_argument("--reap-interval", type=float, default=Settings.reap_interval)
    p.add_argument("--ports-file", type=Path, default=None)
    p.add_argument(
        "--tls-dir",
        default=None,
        help="BrokerAdmin mTLS: tls.crt, tls.key, ca.crt (default $ENMASSE_TLS_DIR; none: plain)",
    )
    p.add_argument(
        "--routers-only",
        action="store_true",
        help="a standard space's broker: the AMQP port takes only its routers, over mutual TLS "
        "with --tls-dir (a client certificate its CA signed is required)",
    )
    _client_arguments(p)
    args = p.parse_args(argv)
    if args.routers_only and args.client_auth == "required":
        p.error("--routers-only and --client-auth required: a broker serves routers or clients")
    if (args.tls_cert is None) != (args.tls_key is None):
        p.error("--tls-cert and --tls-key go together")
    queues, topics = load_addresses(args.config) if args.config else ({}, {})
    return Settings(
        host=args.host,
        port=args.port,
        admin_port=args.admin_port,
        metrics_port=args.metrics_port,
        data_dir=args.data_dir,
        max_message_size=args.max_message_size,
        memory_limit_bytes=args.memory_limit,
        segment_bytes=args.segment_bytes,
        credit_window=args.credit_window,
        idle_timeout=args.idle_timeout,
        reap_interval=args.reap_interval,
        ports_file=args.ports_file,
        tls=tls_dir_files(args.tls_dir),
        routers_only=args.routers_only,
        client_endpoint=args.client_auth == "required",
        client_tls=Tls(cert_file=args.tls_cert, key_file=args.tls_key) if args.tls_cert else None,
        amqps_port=args.amqps_port,
        queues=queues,
        topics=topics,
    )


def _client_arguments(p: argparse.ArgumentParser) -> None:
    """The options of a brokered space's broker, whose AMQP port is its clients' own."""
    p.add_argument(
        "--client-auth",
        choices=CLIENT_AUTH,
        default="anonymous",
        help="required: a brokered space's broker; clients log in as the space's users, as "
        "the storage-controller pushes them (nobody before); anonymous (default): no check",
    )
    p.add_argument("--tls-cert", default=None, help="amqps certificate (PEM), with --tls-key")
    p.add_argument("--tls-key", default=None, help="amqps private key (PEM)")
    p.add_argument("--amqps-port", type=int, default=5671, help="amqps port (0: a free one)")


def start_admin(*, settings: Settings, servicer: BrokerAdmin) -> int:
    """Runs the gRPC server on its own asyncio loop in a daemon thread; returns its port."""
    ready: list[int] = []
    started = threading.Event()

    async def serve() -> None:
        running = await start_server(
            registrations=[
                (
                    broker_pb2_grpc.add_BrokerAdminServicer_to_server,
                    servicer,
                    "enmasse.v1.BrokerAdmin",
                )
            ],
            host=settings.host,
            port=settings.admin_port,
            tls=settings.tls,
            caller_roles=(CONTROL_PLANE,),
            # A draining broker asks its target to prepare: the one call a broker may make.
            method_roles={
                PREPARE_DRAIN: (CONTROL_PLANE, BROKER),
                LIST_ADDRESSES: (CONTROL_PLANE, OPERATOR),  # `enmasse status`
            },
        )
        ready.append(running.port)
        started.set()
        await running.server.wait_for_termination()

    def run() -> None:
        try:
            asyncio.run(serve())
        finally:
            started.set()

    threading.Thread(target=run, name="broker-admin", daemon=True).start()
    started.wait()
    if not ready:
        raise OSError(f"could not start BrokerAdmin on {settings.host}:{settings.admin_port}")
    return ready[0]


def write_ports(path: Path, ports: dict[str, int]) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".ports")
    with os.fdopen(fd, "w") as f:
        json.dump(ports, f)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> None:
    configure_logging(service="broker")
    configure_service_tracing(service="broker")
    try:
        settings = parse_settings(argv)
    except (OSError, ValueError) as exc:
        log.error("bad configuration", error=str(exc))
        sys.exit(2)
    broker = Broker(
        data_dir=settings.data_dir,
        memory_limit_bytes=settings.memory_limit_bytes,
        segment_bytes=settings.segment_bytes,
    )
    recovered = broker.start()
    try:
        for name, plan in settings.queues.items():
            broker.ensure_queue(name, plan)
        for name, plan in settings.topics.items():
            broker.ensure_topic(name, plan)
    except AddressError as exc:
        log.error("bad configuration", error=str(exc))
        sys.exit(2)
    engine = Engine(container_id=f"enmasse-broker-{os.getpid()}")
    endpoint = Endpoint(engine=engine, broker=broker, settings=settings)
    port = endpoint.listen()
    if settings.routers_only and settings.router_tls is None:
        log.warning("AMQP port for routers without TLS: anyone who reaches it gets in")
    ports = {"amqp": port}
    if settings.client_tls is not None:
        ports["amqps"] = endpoint.listen_amqps(settings.client_tls)

    def start_drain(host: str, target_port: int, queues: list[Queue], token: str) -> Drain:
        return Drain.start(
            engine=engine,
            broker=broker,
            host=host,
            port=target_port,
            queues=queues,
            token=token,
            after_change=endpoint.schedule_commit,
            tls=settings.router_tls,  # a standard space's target takes routers and brokers only
        )

    servicer = BrokerAdmin(
        broker=broker,
        engine=engine,
        start_drain=start_drain,
        tls=settings.tls,
        clients=endpoint.clients,
    )
    ports["admin"] = start_admin(settings=settings, servicer=servicer)
    if settings.metrics_port is not None:
        REGISTRY.register(BrokerMetrics(engine=engine, broker=broker))
        ports["metrics"] = serve_metrics(host=settings.host, port=settings.metrics_port)
    if settings.ports_file is not None:
        write_ports(settings.ports_file, {**ports, "pid": os.getpid()})
    log.info(
        "broker started",
        **{f"{name}_port": number for name, number in ports.items()},
        client_endpoint=settings.client_endpoint,
        recovered=recovered.count,
        corrupt_segments=recovered.corrupt_segments,
    )
    signal.signal(signal.SIGTERM, lambda *_: engine.stop())
    signal.signal(signal.SIGINT, lambda *_: engine.stop())
    settle_gc_for_message_loop()
    engine.run()
    endpoint.stop()
    try:
        broker.close()
    except OSError as exc:
        log.error("journal not closed cleanly; recovery will replay it", error=str(exc))
        sys.exit(1)
    log.info("broker stopped")


if __name__ == "__main__":
    main()
