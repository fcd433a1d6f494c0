"""Broker suite: queue throughput and latency through `enmasse-broker`, beside RabbitMQ and the
client's own ceiling, all driven by the same client processes. Figures, never assertions.

What flows in: `python -m bench broker [--quick] [--record]` (or `python -m bench.broker_bench`).
What flows out: three tables: the client ceiling (client to client, no broker: a broker figure
near it is limited by the clients, not by itself), queue throughput for both brokers, latency for
both brokers.

What is measured: acked end to end (each producer waits for every outcome; each consumer accepts
every message), one queue per producer/consumer pair, 1/1 and 4/4, bodies of 100 B, 1 KiB and
64 KiB, non-durable and durable. Durable means header `durable` on a persistent queue: our broker
fsyncs it (group commit) before it settles the producer's delivery; RabbitMQ persists it (a
durable queue declared by the 3.10 AMQP 1.0 plugin on attach). Latency: 1,000 msgs/s for 5 s,
100 B, 1/1, not durable.

How it runs: our broker is a real `enmasse-broker` process (tests/fixtures/broker.py) with a data
dir in a temp dir; RabbitMQ is `bench/peers/rabbitmq.py`'s throwaway node; both on free loopback
ports and stopped by PID. Producers and consumers are the harness's spawned processes. The
harness's `throughput` sends non-durable payloads; for durable rows this suite swaps the payload
builder for the duration of the call (`_durable_payloads`).
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from enmasse.amqp import codec

from bench import harness
from bench.harness import Context, Table, ceiling_throughput, latency_row, suite, throughput
from tests.fixtures.broker import BrokerProcess

SIZES = (100, 1024, 65536)
MESSAGES = {100: 100_000, 1024: 50_000, 65536: 5_000}
COLUMNS = [
    "broker",
    "pairs",
    "size B",
    "durable",
    "received",
    "msgs/s",
    "client CPU µs/msg",
    "broker CPU µs/msg",
    "errors",
]


@contextlib.contextmanager
def _durable_payloads(durable: bool) -> Iterator[None]:
    """Makes the harness's senders send messages with header durable=true, for one call."""
    if not durable:
        yield
        return
    original = harness._payload
    harness._payload = lambda size, *, stamp: codec.encode_message(b"x" * size, durable=True)
    try:
        yield
    finally:
        harness._payload = original


@contextlib.contextmanager
def enmasse_broker() -> Iterator[BrokerProcess]:
    with tempfile.TemporaryDirectory(prefix="bench-broker-") as tmp:
        broker = BrokerProcess(workdir=Path(tmp), args=["--memory-limit=2000000000"])
        broker.start()
        try:
            broker.ensure_queue("bench-latency", persistent=False)
            yield broker
        finally:
            broker.stop()


def _rows(
    ctx: Context,
    table: Table,
    name: str,
    *,
    host: str,
    port: int,
    pid: int,
    queues: Callable[[str, bool], list[str]],
    login: dict[str, str],
) -> None:
    """One row per case; every case gets fresh queues, so nothing left by one pollutes another."""
    sizes = (100,) if ctx.quick else SIZES
    for pairs in (1, 4):
        for size in sizes:
            for durable in (False, True):
                addresses = queues(f"{pairs}x{size}{'d' if durable else 'n'}", durable)
                with _durable_payloads(durable):
                    result = throughput(
                        host=host,
                        port=port,
                        address=addresses[:pairs],
                        messages=ctx.messages(MESSAGES[size] * (2 if pairs > 1 else 1)),
                        size=size,
                        producers=pairs,
                        consumers=pairs,
                        credit=1000 if size <= 1024 else 100,
                        peer_pid=pid,
                        **login,  # type: ignore[arg-type]
                    )
                table.add(
                    name,
                    f"{pairs}/{pairs}",
                    size,
                    "yes" if durable else "no",
                    f"{result.received}/{result.sent}",
                    result.rate,
                    result.client_cpu_us,
                    "-" if result.peer_cpu_us is None else result.peer_cpu_us,
                    "; ".join(result.errors) or "-",
                )


@suite("broker", "queues through enmasse-broker beside RabbitMQ 3.10, durable and not")
def broker_suite(ctx: Context) -> Iterator[Table]:
    from bench.peers.rabbitmq import PASSWORD, USER, RabbitMQUnavailable, rabbitmq

    ceiling = Table("Client ceiling: engine client to client, no broker", COLUMNS)
    result = ceiling_throughput(messages=ctx.messages(200_000))
    ceiling.add(
        "(none)", "1/1", 100, "no", f"{result.received}/{result.sent}", result.rate,
        result.client_cpu_us, "-", "; ".join(result.errors) or "-",
    )  # fmt: skip
    yield ceiling

    table = Table("Queue throughput, acked, one queue per pair", COLUMNS)
    latencies = Table(
        "Queue latency, 1/1, 100 B, not durable", ["broker", *harness.LATENCY_COLUMNS]
    )
    with enmasse_broker() as broker:

        def ours(case: str, durable: bool) -> list[str]:
            names = [f"bench-{case}-{i}" for i in range(4)]
            for queue in names:
                broker.ensure_queue(queue, persistent=durable)
            return names

        _rows(
            ctx, table, "enmasse", host="127.0.0.1", port=broker.amqp_port, pid=broker.pid,
            queues=ours, login={},
        )  # fmt: skip
        _latency(ctx, latencies, "enmasse", port=broker.amqp_port, address="bench-latency")
    try:
        with rabbitmq() as node:
            login = {"user": USER, "password": PASSWORD}
            _rows(
                ctx, table, "rabbitmq 3.10", host=node.host, port=node.port, pid=node.pid,
                queues=lambda case, _durable: [f"/queue/bench-{case}-{i}" for i in range(4)],
                login=login,
            )  # fmt: skip
            _latency(
                ctx, latencies, "rabbitmq 3.10", port=node.port, address="/queue/bench-latency",
                **login,
            )  # fmt: skip
    except RabbitMQUnavailable as exc:
        table.notes.append(f"RabbitMQ not measured: {exc}")
    yield table
    yield latencies


def _latency(
    ctx: Context, table: Table, name: str, *, port: int, address: str, **login: str
) -> None:
    result = harness.latency(
        host="127.0.0.1",
        port=port,
        address=address,
        rate=1000.0,
        seconds=ctx.seconds(5.0),
        **login,  # type: ignore[arg-type]
    )
    row = Table("", harness.LATENCY_COLUMNS)
    latency_row(row, result)
    table.add(name, *row.rows[0])


def main() -> int:
    import sys

    return harness.main(["broker", *sys.argv[1:]])


if __name__ == "__main__":
    raise SystemExit(main())
