"""The benchmark harness: suites register by name, measure with real client processes, print
tables, and optionally append them to bench/RESULTS.md. Figures, never assertions.

What flows in: the suites asked for on the command line (`python -m bench client rabbitmq`),
options (--quick, --record). What flows out: one table per measurement set, printed, and with
--record a markdown block (with the exact command and the machine's load) appended to RESULTS.md.

How a measurement runs: every producer and every consumer is its own process (spawned, so each
has its own interpreter and GIL, like real clients), built on the engine's bulk clients
(`enmasse.amqp.client.run_sender` / `run_receiver` / `serve_receiver`). Consumers attach
first and say so; then producers start. Throughput = messages received / (last arrival - first
send), read on time.monotonic(), which every process on the machine shares. Each process also
reports its CPU time, so a table shows client CPU per message beside the rate: on a shared
2-core machine the rate swings with whatever else runs, the CPU cost much less.

Why suites are plain functions: a broker or router engineer adds a module `bench/<name>.py` with

    from bench.harness import Context, Table, suite, throughput, latency

    @suite("broker", "queue through one broker process")
    def broker_suite(ctx: Context) -> Iterator[Table]:
        with my_broker() as (host, port):
            yield throughput_table(ctx, "broker queue", host=host, port=port, address="q")

and `python -m bench broker` finds it (every module in bench/ and bench/peers/ is imported).
"""

from __future__ import annotations

import importlib
import multiprocessing
import os
import pkgutil
import shlex
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from enmasse.amqp import client as amqp_client
from enmasse.amqp import codec
from enmasse.amqp.engine import Tls, settle_gc_for_message_loop

BENCH_DIR = Path(__file__).resolve().parent
RESULTS = BENCH_DIR / "RESULTS.md"
_SPAWN = multiprocessing.get_context("spawn")


# --- registry ----------------------------------------------------------------------------------


@dataclass
class Context:
    """What a suite gets: options, and helpers that scale message counts for --quick runs."""

    quick: bool = False
    record: bool = False
    command: str = ""

    def messages(self, full: int) -> int:
        return max(1000, full // 10) if self.quick else full

    def seconds(self, full: float) -> float:
        return max(1.0, full / 5) if self.quick else full


@dataclass
class Table:
    title: str
    columns: list[str]
    rows: list[list[Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, *row: Any) -> None:
        self.rows.append(list(row))

    def markdown(self) -> str:
        def cell(value: Any) -> str:
            if isinstance(value, float):
                return f"{value:,.1f}" if value < 100 else f"{value:,.0f}"
            if isinstance(value, int):
                return f"{value:,}"
            return str(value)

        lines = [f"**{self.title}**", ""]
        lines.append("| " + " | ".join(self.columns) + " |")
        lines.append("|" + "|".join("---" for _ in self.columns) + "|")
        lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in self.rows]
        lines += [f"\n{note}" for note in self.notes]
        return "\n".join(lines)


SuiteFn = Callable[[Context], Iterable[Table]]


@dataclass
class Suite:
    name: str
    description: str
    run: SuiteFn


SUITES: dict[str, Suite] = {}


def suite(name: str, description: str = "") -> Callable[[SuiteFn], SuiteFn]:
    """Registers a suite: a function (Context) -> Tables, run by `python -m bench name`."""

    def register(fn: SuiteFn) -> SuiteFn:
        SUITES[name] = Suite(
            name=name, description=description or (fn.__doc__ or "").strip(), run=fn
        )
        return fn

    return register


def discover() -> list[str]:
    """Imports every module of bench/ and bench/peers/ so that their @suite decorators run.

    Returns what could not be imported (module: error): one broken module must not hide the rest.
    """
    broken = []
    for package, path in (("bench", BENCH_DIR), ("bench.peers", BENCH_DIR / "peers")):
        for module in pkgutil.iter_modules([str(path)]):
            if module.name in ("harness", "__main__") or module.ispkg:
                continue
            try:
                importlib.import_module(f"{package}.{module.name}")
            except Exception as err:
                broken.append(f"{package}.{module.name}: {err}")
    return broken


# --- measurements ------------------------------------------------------------------------------


@dataclass
class Throughput:
    producers: int
    consumers: int
    size: int
    settled: bool
    sent: int
    received: int
    accepted: int
    seconds: float
    client_cpu_us: float  # CPU of all client processes per message received
    errors: list[str]
    peer_cpu_us: float | None = None  # CPU of the peer process (peer_pid) per message received

    @property
    def rate(self) -> float:
        return self.received / self.seconds if self.seconds > 0 else 0.0

    @property
    def mode(self) -> str:
        return "pre-settled" if self.settled else "acked"


@dataclass
class Latency:
    rate: float
    size: int
    received: int
    sent: int
    p50_ms: float
    p99_ms: float
    max_ms: float
    errors: list[str]


def _sender_worker(out: Any, kwargs: dict[str, Any]) -> None:
    settle_gc_for_message_loop()
    started_cpu = time.process_time()
    result = amqp_client.run_sender(**kwargs)
    out.put(("send", result, time.process_time() - started_cpu))


def _receiver_worker(
    out: Any, ready: Any, kwargs: dict[str, Any], shared: Any = None, total: int = 0
) -> None:
    settle_gc_for_message_loop()
    started_cpu = time.process_time()
    if shared is not None:
        reported = 0

        def progress(received: int) -> bool:
            nonlocal reported
            with shared.get_lock():
                shared.value += received - reported
                reported = received
                return bool(shared.value >= total)

        kwargs = kwargs | {"progress": progress}
    result = amqp_client.run_receiver(ready=ready, **kwargs)
    out.put(("recv", result, time.process_time() - started_cpu))


def _serving_worker(out: Any, ports: Any, kwargs: dict[str, Any]) -> None:
    settle_gc_for_message_loop()
    started_cpu = time.process_time()
    result = amqp_client.serve_receiver(on_port=ports.put, **kwargs)
    out.put(("recv", result, time.process_time() - started_cpu))


def _collect(out: Any, procs: Sequence[Any], *, time_limit: float) -> list[tuple[str, Any, float]]:
    results = []
    deadline = time.monotonic() + time_limit + 30
    for _ in procs:
        remaining = max(1.0, deadline - time.monotonic())
        try:
            results.append(out.get(timeout=remaining))
        except Exception:  # a worker died without reporting: its share counts as lost
            break
    for proc in procs:
        proc.join(timeout=10)
        if proc.is_alive():
            proc.kill()
            proc.join(5)
    return results


def _payload(size: int, *, stamp: bool) -> bytes:
    return amqp_client.stamped_payload(size) if stamp else codec.encode_message(b"x" * size)


def throughput(
    *,
    host: str,
    port: int,
    address: str | Sequence[str],
    messages: int,
    size: int = 100,
    producers: int = 1,
    consumers: int = 1,
    settled: bool = False,
    credit: int = 1000,
    time_limit: float = 120.0,
    user: str | None = None,
    password: str | None = None,
    peer_pid: int | None = None,
    tls: Tls | None = None,
    hostname: str | None = None,
) -> Throughput:
    """N messages through a peer (broker, router, RabbitMQ) from producer to consumer processes.

    `address` may be one address (every producer and consumer uses it) or one per pair
    (address[i % len] for producer i and consumer i). Consumers stop when all of them together
    received `messages` (a shared counter), or after 10 s with nothing new (loss). peer_pid:
    the peer's process, whose CPU per message is reported too (from /proc: any process will do).
    tls (hostname: the name its certificate is checked against): every client speaks amqps.
    """
    addresses = [address] if isinstance(address, str) else list(address)
    out, ready = _SPAWN.Queue(), [_SPAWN.Event() for _ in range(consumers)]
    shared = _SPAWN.Value("q", 0)
    per_producer = [messages // producers + (i < messages % producers) for i in range(producers)]
    common = {"host": host, "port": port, "time_limit": time_limit}
    if user is not None:
        common |= {"user": user, "password": password}
    if tls is not None:
        common |= {"tls": tls, "hostname": hostname}
    receivers = [
        _SPAWN.Process(
            target=_receiver_worker,
            args=(
                out,
                ready[i],
                common
                | {
                    "address": addresses[i % len(addresses)],
                    "count": messages,
                    "credit": credit,
                    "idle_stop": 10.0,
                },
                shared,
                messages,
            ),
        )
        for i in range(consumers)
    ]
    for proc in receivers:
        proc.start()
    for event in ready:
        event.wait(30)
    payload = _payload(size, stamp=False)
    senders = [
        _SPAWN.Process(
            target=_sender_worker,
            args=(
                out,
                common
                | {
                    "address": addresses[i % len(addresses)],
                    "payload": payload,
                    "count": per_producer[i],
                    "settled": settled,
                },
            ),
        )
        for i in range(producers)
    ]
    peer_cpu_before = process_cpu_seconds(peer_pid) if peer_pid else 0.0
    for proc in senders:
        proc.start()
    results = _collect(out, [*receivers, *senders], time_limit=time_limit)
    summary = _summarize(
        results, producers=producers, consumers=consumers, size=size, settled=settled
    )
    if peer_pid and summary.received:
        # Includes the consumers' wind-down, during which an idle peer burns next to nothing.
        used = process_cpu_seconds(peer_pid) - peer_cpu_before
        summary.peer_cpu_us = used / summary.received * 1e6
    return summary


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process (all its threads) has used so far, from /proc."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    ticks = int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15 of stat)
    return ticks / os.sysconf("SC_CLK_TCK")


def ceiling_throughput(
    *,
    messages: int,
    size: int = 100,
    pairs: int = 1,
    settled: bool = False,
    credit: int = 1000,
    time_limit: float = 120.0,
) -> Throughput:
    """Client to client, no peer between: each receiver process listens, its sender dials it."""
    out = _SPAWN.Queue()
    per_pair = messages // pairs
    receivers, senders = [], []
    for _ in range(pairs):
        ports = _SPAWN.Queue()
        proc = _SPAWN.Process(
            target=_serving_worker,
            args=(out, ports, {"count": per_pair, "credit": credit, "time_limit": time_limit}),
        )
        proc.start()
        receivers.append((proc, ports))
    payload = _payload(size, stamp=False)
    for _proc, ports in receivers:
        port = ports.get(timeout=30)
        sender = _SPAWN.Process(
            target=_sender_worker,
            args=(
                out,
                {
                    "host": "127.0.0.1",
                    "port": port,
                    "address": "ceiling",
                    "payload": payload,
                    "count": per_pair,
                    "settled": settled,
                    "time_limit": time_limit,
                },
            ),
        )
        senders.append(sender)
    for sender in senders:
        sender.start()
    results = _collect(out, [p for p, _ in receivers] + senders, time_limit=time_limit)
    return _summarize(results, producers=pairs, consumers=pairs, size=size, settled=settled)


def _summarize(
    results: list[tuple[str, Any, float]],
    *,
    producers: int,
    consumers: int,
    size: int,
    settled: bool,
) -> Throughput:
    sends = [r for kind, r, _ in results if kind == "send"]
    recvs = [r for kind, r, _ in results if kind == "recv"]
    received = sum(r.received for r in recvs)
    first = min((r.started for r in sends if r.started), default=0.0)
    last = max((r.finished for r in recvs if r.received), default=first)
    cpu = sum(c for _, _, c in results)
    errors = sorted({r.error for _, r, _ in results if r.error})
    if len(results) < producers + consumers:
        errors.append(f"{producers + consumers - len(results)} client process(es) did not report")
    return Throughput(
        producers=producers,
        consumers=consumers,
        size=size,
        settled=settled,
        sent=sum(r.sent for r in sends),
        received=received,
        accepted=sum(r.accepted for r in sends),
        seconds=max(last - first, 1e-9),
        client_cpu_us=cpu / received * 1e6 if received else 0.0,
        errors=errors,
    )


def latency(
    *,
    host: str | None = None,
    port: int | None = None,
    address: str = "latency",
    rate: float = 1000.0,
    seconds: float = 5.0,
    size: int = 100,
    settled: bool = False,
    time_limit: float = 60.0,
    user: str | None = None,
    password: str | None = None,
) -> Latency:
    """One producer at a fixed rate, one consumer; send-to-arrival percentiles.

    host/port None: client to client (the consumer listens, the producer dials it).
    """
    count = int(rate * seconds)
    out = _SPAWN.Queue()
    payload = _payload(size, stamp=True)
    send_args: dict[str, Any] = {
        "address": address,
        "payload": payload,
        "count": count,
        "settled": settled,
        "rate": rate,
        "stamp": True,
        "time_limit": time_limit,
    }
    if user is not None:
        send_args |= {"user": user, "password": password}
    if host is None or port is None:
        ports = _SPAWN.Queue()
        receiver = _SPAWN.Process(
            target=_serving_worker,
            args=(out, ports, {"count": count, "stamp": True, "time_limit": time_limit}),
        )
        receiver.start()
        send_args |= {"host": "127.0.0.1", "port": ports.get(timeout=30)}
    else:
        ready = _SPAWN.Event()
        recv_args = {
            "host": host,
            "port": port,
            "address": address,
            "count": count,
            "stamp": True,
            "time_limit": time_limit,
            "idle_stop": 10.0,
        }
        if user is not None:
            recv_args |= {"user": user, "password": password}
        receiver = _SPAWN.Process(target=_receiver_worker, args=(out, ready, recv_args))
        receiver.start()
        ready.wait(30)
        send_args |= {"host": host, "port": port}
    sender = _SPAWN.Process(target=_sender_worker, args=(out, send_args))
    sender.start()
    results = _collect(out, [receiver, sender], time_limit=time_limit)
    recv = next((r for kind, r, _ in results if kind == "recv"), None)
    send = next((r for kind, r, _ in results if kind == "send"), None)
    samples = sorted(recv.latencies_ns) if recv else []
    errors = sorted({r.error for _, r, _ in results if r.error})
    return Latency(
        rate=rate,
        size=size,
        received=len(samples),
        sent=send.sent if send else 0,
        p50_ms=_percentile(samples, 50) / 1e6,
        p99_ms=_percentile(samples, 99) / 1e6,
        max_ms=(samples[-1] / 1e6) if samples else 0.0,
        errors=errors,
    )


def _percentile(samples: Sequence[int], pct: float) -> float:
    if not samples:
        return 0.0
    if len(samples) == 1:
        return float(samples[0])
    return float(statistics.quantiles(samples, n=100, method="inclusive")[int(pct) - 1])


# --- standard tables ---------------------------------------------------------------------------

THROUGHPUT_COLUMNS = [
    "producers/consumers",
    "size B",
    "mode",
    "messages",
    "received",
    "msgs/s",
    "client CPU µs/msg",
    "peer CPU µs/msg",
    "errors",
]


def throughput_row(table: Table, result: Throughput) -> None:
    table.add(
        f"{result.producers}/{result.consumers}",
        result.size,
        result.mode,
        result.sent,
        result.received,
        result.rate,
        result.client_cpu_us,
        "-" if result.peer_cpu_us is None else result.peer_cpu_us,
        "; ".join(result.errors) or "-",
    )


LATENCY_COLUMNS = ["rate msgs/s", "size B", "received", "p50 ms", "p99 ms", "max ms", "errors"]


def latency_row(table: Table, result: Latency) -> None:
    table.add(
        result.rate,
        result.size,
        f"{result.received}/{result.sent}",
        result.p50_ms,
        result.p99_ms,
        result.max_ms,
        "; ".join(result.errors) or "-",
    )


def throughput_table(
    ctx: Context,
    title: str,
    *,
    host: str,
    port: int,
    address: str | Sequence[str] | Callable[[int], str | Sequence[str]],
    messages: int = 200_000,
    size: int = 100,
    user: str | None = None,
    password: str | None = None,
    peer_pid: int | None = None,
) -> Table:
    """The standard set through one peer: 1/1 and 4/4, acked and pre-settled.

    `address` may be a function of the run's number (0..3) for peers that keep what a run
    leaves behind (queues): fresh addresses per run keep the runs apart.
    """
    table = Table(title, THROUGHPUT_COLUMNS)
    runs = [(p, c, settled) for p, c in ((1, 1), (4, 4)) for settled in (False, True)]
    for run, (producers, consumers, settled) in enumerate(runs):
        result = throughput(
            host=host,
            port=port,
            address=address(run) if callable(address) else address,
            messages=ctx.messages(messages),
            size=size,
            producers=producers,
            consumers=consumers,
            settled=settled,
            user=user,
            password=password,
            peer_pid=peer_pid,
        )
        throughput_row(table, result)
    return table


def latency_table(
    ctx: Context,
    title: str,
    *,
    host: str | None,
    port: int | None,
    address: str = "latency",
    rate: float = 1000.0,
    user: str | None = None,
    password: str | None = None,
) -> Table:
    table = Table(title, LATENCY_COLUMNS)
    result = latency(
        host=host,
        port=port,
        address=address,
        rate=rate,
        seconds=ctx.seconds(5.0),
        user=user,
        password=password,
    )
    latency_row(table, result)
    return table


# --- the client ceiling ------------------------------------------------------------------------


@suite("client", "client to client directly: the ceiling every other figure sits under")
def client_ceiling(ctx: Context) -> Iterator[Table]:
    table = Table("Engine client to client (no peer between)", THROUGHPUT_COLUMNS)
    for pairs in (1, 4):
        for settled in (False, True):
            result = ceiling_throughput(
                messages=ctx.messages(200_000 * pairs), pairs=pairs, settled=settled
            )
            throughput_row(table, result)
    # Larger bodies, as the broker suites use them: fewer messages, same bytes budget or so.
    for size, messages in ((1024, 100_000), (65536, 5_000)):
        result = ceiling_throughput(messages=ctx.messages(messages), size=size, pairs=1)
        throughput_row(table, result)
    yield table
    yield latency_table(ctx, "Engine client to client latency", host=None, port=None)


# --- running -----------------------------------------------------------------------------------


def machine_note() -> str:
    load = os.getloadavg()
    return (
        f"{os.cpu_count()} cores, load average {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f} "
        f"at start, Python {sys.version.split()[0]}"
    )


def run(
    names: Sequence[str], *, quick: bool, record: bool, command: str, results: Path = RESULTS
) -> int:
    from rich.console import Console
    from rich.table import Table as RichTable

    console = Console(width=max(Console().width, 150))
    ctx = Context(quick=quick, record=record, command=command)
    unknown = [n for n in names if n not in SUITES]
    if unknown:
        known = ", ".join(sorted(SUITES))
        console.print(f"unknown suite(s): {', '.join(unknown)}; known: {known}")
        return 2
    for name in names:
        started = datetime.now(UTC)
        note = machine_note()
        console.rule(f"{name}: {SUITES[name].description}")
        tables = []
        for table in SUITES[name].run(ctx):
            shown = RichTable(title=table.title)
            for column in table.columns:
                shown.add_column(column)
            for line in table.markdown().splitlines()[4:]:
                if line.startswith("|"):
                    shown.add_row(*[c.strip() for c in line.strip("|").split("|")])
            console.print(shown)
            for extra in table.notes:
                console.print(extra)
            tables.append(table)
        if record:
            _append_results(results, name, tables, started=started, note=note, command=command)
    return 0


def _append_results(
    path: Path,
    name: str,
    tables: Sequence[Table],
    *,
    started: datetime,
    note: str,
    command: str,
) -> None:
    block = [
        f"### {name} ({started:%Y-%m-%d %H:%M} UTC)",
        "",
        f"Command: `{command}`; {note}.",
        "",
        *[t.markdown() + "\n" for t in tables],
    ]
    with path.open("a") as results:
        results.write("\n" + "\n".join(block) + "\n")


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    broken = discover()
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    parser.add_argument("suites", nargs="*", help="suites to run (default: client)")
    parser.add_argument("--list", action="store_true", help="list the registered suites")
    parser.add_argument("--quick", action="store_true", help="a tenth of the messages")
    parser.add_argument("--record", action="store_true", help="append the tables to RESULTS.md")
    parser.add_argument(
        "--results", type=Path, default=RESULTS, help="the file --record appends to"
    )
    args = parser.parse_args(argv)
    for problem in broken:
        sys.stderr.write(f"bench module not loaded: {problem}\n")
    if args.list:
        for registered in SUITES.values():
            sys.stdout.write(f"{registered.name:12} {registered.description}\n")
        return 0
    command = "python -m bench " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    return run(
        args.suites or ["client"],
        quick=args.quick,
        record=args.record,
        command=command,
        results=args.results,
    )
