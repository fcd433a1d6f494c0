"""Large messages: 100 MiB messages to a durable queue and back, in MB/s, with each process's
peak resident memory, through router -> broker -> router, on the broker directly, and on
RabbitMQ 3.10 in the same run.

What flows in: a broker and a router started here on free loopback ports in a temp dir (the
launchers the tests use; the router with the limits a standard space's plan gives it by default,
100 MiB), and RabbitMQ's throwaway node (`bench/peers/rabbitmq.py`). What flows out: one table,
figures never assertions. Each row: `count` durable messages of 100 MiB (headers included),
one at a time (the next sent once the last arrived and its outcome came back), one producer and
one consumer (two engine clients, each on its own engine thread in this process, credit 1 on the
consumer); MB/s = bytes received / (last outcome - first send); peak RSS is the peer's VmHWM
from /proc at the end, its start-up included (RabbitMQ's: the Erlang VM's), and beside it that
peak as a multiple of the message.

`python -m bench large-messages [--quick]` (--quick: 2 messages a row, else 5).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from enmasse.amqp import codec
from enmasse.amqp.client import Client
from enmasse.amqp.engine import Outcome
from enmasse.resources.contracts import DEFAULT_MAX_MESSAGE_SIZE
from enmasse.v1 import router_pb2

from bench.harness import Context, Table, suite
from tests.fixtures.broker import BrokerProcess
from tests.fixtures.router import RouterFleet

MIB = 1 << 20
COLUMNS = ["path", "messages", "MB/s", "s/message", "peak RSS (MiB)", "peak / message", "errors"]
ADDRESS = "bench-large"


def peak_rss(pid: int | None) -> int:
    """The process's peak resident set (VmHWM) in bytes; 0 if it cannot be read."""
    if not pid:
        return 0
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def large_payload() -> bytes:
    """A durable message of as near 100 MiB as the default limit takes, headers included."""
    payload = codec.encode_message(os.urandom(DEFAULT_MAX_MESSAGE_SIZE - 64), durable=True)
    assert len(payload) <= DEFAULT_MAX_MESSAGE_SIZE
    return payload


def round_trips(
    *, port: int, address: str, payload: bytes, count: int, login: dict[str, Any]
) -> tuple[float, list[str]]:
    """Sends `count` copies one at a time (the next once the last is received and its outcome
    back), each received and accepted: (seconds first send to last outcome, errors). One message
    at a time, so the peer's peak memory is what one large message costs it."""
    errors: list[str] = []
    body_size = len(codec.read_body(payload))
    with (
        Client("127.0.0.1", port, timeout=300, **login) as consuming,
        Client("127.0.0.1", port, timeout=300, **login) as producing,
    ):
        receiver = consuming.receiver(address, credit=1)
        sender = producing.sender(address)
        started = time.monotonic()
        for _ in range(count):
            sent = sender.send_async(payload)
            delivery = receiver.receive(300)
            receiver.accept(delivery)
            received = len(codec.read_body(delivery.payload))  # a peer may add annotations
            if received != body_size:
                errors.append(f"a body of {received} bytes received, {body_size} sent")
            outcome = sent.result(300)
            if outcome.outcome is not Outcome.ACCEPTED:
                errors.append(f"{outcome.outcome.name}: {outcome.error}")
        took = time.monotonic() - started
    return took, errors


def add_row(
    table: Table,
    path: str,
    *,
    count: int,
    size: int,
    took: float,
    pid: int | None,
    errors: list[str],
) -> None:
    peak = peak_rss(pid)
    table.add(
        path,
        count,
        count * size / took / 1e6,
        took / count,
        peak / MIB if peak else "-",
        f"{peak / size:.1f}x" if peak else "-",
        "; ".join(errors) or "-",
    )


@contextlib.contextmanager
def enmasse_broker(workdir: Path) -> Iterator[BrokerProcess]:
    broker = BrokerProcess(workdir=workdir / "broker")
    broker.start()
    try:
        broker.ensure_queue(ADDRESS, persistent=True)
        yield broker
    finally:
        broker.stop()


@contextlib.contextmanager
def router_before(workdir: Path, broker: BrokerProcess) -> Iterator[RouterFleet]:
    (workdir / "routers").mkdir(parents=True, exist_ok=True)
    fleet = RouterFleet(workdir=workdir / "routers")
    try:
        fleet.start("r1")
        waypoint = router_pb2.BrokerWaypoint(name="b1", host="127.0.0.1", port=broker.amqp_port)
        limits = router_pb2.RouterLimits(max_message_size=DEFAULT_MAX_MESSAGE_SIZE)
        fleet.apply_all(
            fleet.mesh_config(
                generation=1,
                addresses={ADDRESS: "queue"},
                waypoints={ADDRESS: [waypoint]},
                limits=limits,
            )
        )
        yield fleet
    finally:
        fleet.stop_all()


@suite("large-messages", "100 MiB durable messages through router and broker: MB/s, peak RSS")
def large_messages_suite(ctx: Context) -> Iterator[Table]:
    from bench.peers.rabbitmq import PASSWORD, USER, RabbitMQUnavailable, rabbitmq

    count = 2 if ctx.quick else 5
    payload = large_payload()
    size = len(payload)
    title = f"{size:,} B durable messages to a queue and back, 1 producer / 1 consumer"
    table = Table(title, COLUMNS)
    with tempfile.TemporaryDirectory(prefix="bench-large-") as tmp:
        with enmasse_broker(Path(tmp) / "via") as broker, router_before(Path(tmp), broker) as fleet:
            router = fleet.routers["r1"]
            took, errors = round_trips(
                port=router.amqp_port, address=ADDRESS, payload=payload, count=count, login={}
            )
            add_row(table, "router -> broker -> router: broker", count=count, size=size,
                    took=took, pid=broker.pid, errors=errors)  # fmt: skip
            add_row(table, "router -> broker -> router: router", count=count, size=size,
                    took=took, pid=router.pid, errors=[])  # fmt: skip
        with enmasse_broker(Path(tmp) / "direct") as broker:
            took, errors = round_trips(
                port=broker.amqp_port, address=ADDRESS, payload=payload, count=count, login={}
            )
            add_row(table, "enmasse broker directly", count=count, size=size, took=took,
                    pid=broker.pid, errors=errors)  # fmt: skip
    try:
        with rabbitmq() as node:
            took, errors = round_trips(
                port=node.port,
                address=f"/queue/{ADDRESS}",
                payload=payload,
                count=count,
                login={"user": USER, "password": PASSWORD},
            )
            add_row(table, "rabbitmq 3.10 directly", count=count, size=size, took=took,
                    pid=node.pid, errors=errors)  # fmt: skip
    except RabbitMQUnavailable as exc:
        table.notes.append(f"RabbitMQ not measured: {exc}")
    table.notes.append(
        "Peak RSS: the process's VmHWM at the end (start-up included); MB/s: 10^6 bytes/s."
    )
    yield table
