"""`enmasse-mqtt-gateway`: wiring and start-up of one MQTT gateway, nothing else.

The AMQP engine runs on its own thread; the MQTT listener and every client session on asyncio
in the main thread. The bound port goes to the log, to stdout as `listening on <host>:<port>`
and, with --ports-file, into that JSON file as `{"mqtt": port}` (written whole, then renamed).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path

import structlog
from enmasse.amqp.engine import Engine
from enmasse.common.logging import configure_logging
from enmasse.common.serving import until_terminated
from enmasse.mqtt_gateway.gateway import Gateway
from enmasse.mqtt_gateway.persistence import NEVER, Sessions
from enmasse.mqtt_gateway.retained import RetainedStore
from enmasse.mqtt_gateway.session import RouterAddress
from enmasse.mqtt_gateway.store import Store
from enmasse.mqtt_gateway.wills import Wills

log = structlog.get_logger("enmasse.mqtt_gateway")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="enmasse-mqtt-gateway",
        description="MQTT 3.1.1 and 5.0 clients onto a standard space's routers, as AMQP",
    )
    parser.add_argument("--listen", default="127.0.0.1:1883", help="host:port for MQTT clients")
    parser.add_argument(
        "--router",
        default=os.environ.get("ENMASSE_ROUTER", "127.0.0.1:5672"),
        help="host:port of the space's router client port (AMQP)",
    )
    parser.add_argument(
        "--gateway-id", default=os.environ.get("ENMASSE_GATEWAY_ID", "mqtt-gateway")
    )
    parser.add_argument("--max-packet-size", type=int, default=1024 * 1024)
    parser.add_argument(
        "--max-keep-alive",
        type=int,
        default=0,
        help="seconds; an MQTT 5 client asking for longer (or none) is told this in the CONNACK",
    )
    parser.add_argument("--ports-file", default=None, help="write {'mqtt': port} to this file")
    parser.add_argument(
        "--max-session-expiry",
        type=int,
        default=NEVER,
        help="the longest, in seconds, a persistent session outlives its connection (an MQTT 3.1.1 "
        "session and an MQTT 5 one asking for more get this; default: no limit), after which the "
        "broker removes what the client left",
    )
    parser.add_argument(
        "--sessions-address",
        default=os.environ.get("ENMASSE_MQTT_SESSIONS") or None,
        help="a queue of the space for persistent sessions' records (persistence.py); "
        "without one no session outlives its connection",
    )
    parser.add_argument(
        "--store-user",
        default=os.environ.get("ENMASSE_MQTT_STORE_USER") or None,
        help="the gateway's own MessagingUser for its store queues (else ANONYMOUS)",
    )
    parser.add_argument(
        "--store-password-file", default=None, help="the file holding --store-user's password"
    )
    parser.add_argument(
        "--retained-address",
        default=os.environ.get("ENMASSE_MQTT_RETAINED") or None,
        help="a queue of the space that keeps retained messages (retained.py); "
        "without one no message is retained",
    )
    parser.add_argument(
        "--will-address",
        default=os.environ.get("ENMASSE_MQTT_WILLS") or None,
        help="a queue of the space that keeps wills (wills.py); without one no will is kept",
    )
    return parser.parse_args(argv)


async def serve(args: argparse.Namespace) -> None:
    router_host, _, router_port = args.router.rpartition(":")
    engine = Engine(container_id=args.gateway_id)
    thread = engine.run_in_thread(name="amqp-engine")
    store = Store(
        engine=engine,
        host=router_host or "127.0.0.1",
        port=int(router_port),
        container_id=f"{args.gateway_id}/store",
        user=args.store_user,
        password=_password(args.store_password_file),
    )
    retained = (
        RetainedStore(store, address=args.retained_address) if args.retained_address else None
    )
    wills = (
        Wills(store, retained=retained, gateway=args.gateway_id, address=args.will_address)
        if args.will_address
        else None
    )
    gateway = Gateway(
        engine=engine,
        retained=retained,
        wills=wills,
        router=RouterAddress(
            host=router_host or "127.0.0.1",
            port=int(router_port),
            max_packet_size=args.max_packet_size,
            max_keep_alive=args.max_keep_alive,
        ),
        sessions=Sessions(
            store=store, address=args.sessions_address, max_expiry=args.max_session_expiry
        )
        if args.sessions_address
        else None,
    )
    host, _, port = args.listen.rpartition(":")
    bound = await gateway.listen(host=host or "127.0.0.1", port=int(port or 0))
    log.info("serving", mqtt=bound, router=args.router)
    sys.stdout.write(f"listening on {host or '127.0.0.1'}:{bound}\n")
    sys.stdout.flush()
    if args.ports_file:
        _write_ports(Path(args.ports_file), {"mqtt": bound})
    will_service = asyncio.get_running_loop().create_task(wills.run()) if wills else None
    await until_terminated()
    log.info("stopping")
    await gateway.stop()
    if will_service is not None and wills is not None:
        will_service.cancel()
        await wills.stop()
    store.close()
    engine.stop()
    thread.join(5)


def _password(path: str | None) -> str | None:
    return Path(path).read_text().strip() if path else None


def _write_ports(path: Path, ports: dict[str, int]) -> None:
    # Written whole then renamed: a reader polling for the file never sees half of it.
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(ports))
    os.replace(partial, path)


def main(argv: list[str] | None = None) -> None:
    configure_logging(service="mqtt-gateway")
    asyncio.run(serve(parse_args(argv)))


if __name__ == "__main__":
    main()
