"""Router figures: anycast through one router and a two-router chain, beside the client ceiling;
a queue through router -> broker -> router beside the same queue on the broker directly; latency
at a fixed rate; memory per idle client connection; mesh convergence after a SIGKILL. Suite
`router-mesh-tls`: the two-router chain with the mesh in clear and over mutual TLS (both with the
space's secret), rounds alternating between two running pairs so the machine's load falls on both.

What flows in: the shared harness's clients (spawned processes on the engine's bulk runners) and
router / broker processes started here on free loopback ports in a temp dir (the same launchers
the tests use), each stopped by PID at the end. What flows out: tables (figures, never
assertions), with the ratios the router issue asks for computed in the same run, so that a loaded
machine moves numerator and denominator together.

`python -m bench router [--quick] [--record]`, `python -m bench router-mesh-tls [--quick]`.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from enmasse.amqp.engine import Connection, ConnectionHandler, Engine
from enmasse.common.certificates import CONTROL_PLANE, DATA_PLANE
from enmasse.v1 import router_pb2

from bench.harness import (
    LATENCY_COLUMNS,
    THROUGHPUT_COLUMNS,
    Context,
    Table,
    Throughput,
    _collect,
    _payload,
    _receiver_worker,
    _sender_worker,
    _summarize,
    ceiling_throughput,
    latency,
    latency_row,
    process_cpu_seconds,
    suite,
    throughput,
    throughput_row,
)
from tests.fixtures.broker import BrokerProcess
from tests.fixtures.certificates import issue
from tests.fixtures.router import RouterFleet

_SPAWN = multiprocessing.get_context("spawn")
PAIRS = [f"bench-{i}" for i in range(4)]


@contextlib.contextmanager
def _routers(count: int, **addresses: Any) -> Iterator[RouterFleet]:
    with tempfile.TemporaryDirectory(prefix="router-bench-") as workdir:
        fleet = RouterFleet(workdir=Path(workdir))
        try:
            for n in range(1, count + 1):
                fleet.start(f"r{n}")
            fleet.apply_all(fleet.mesh_config(generation=1, **addresses))
            if count > 1:
                fleet.wait_for_mesh()
            yield fleet
        finally:
            fleet.stop_all()


def _split_throughput(
    *, send_port: int, recv_port: int, address: str, messages: int, settled: bool
) -> Throughput:
    """One producer on one router, one consumer on another (the harness's clients)."""
    out, ready = _SPAWN.Queue(), _SPAWN.Event()
    receiver = _SPAWN.Process(
        target=_receiver_worker,
        args=(
            out,
            ready,
            {
                "host": "127.0.0.1",
                "port": recv_port,
                "address": address,
                "count": messages,
                "credit": 1000,
                "idle_stop": 2.0,
                "time_limit": 120.0,
            },
        ),
    )
    receiver.start()
    ready.wait(30)
    time.sleep(0.5)  # the consumer's advert crosses the mesh before the producer asks for credit
    sender = _SPAWN.Process(
        target=_sender_worker,
        args=(
            out,
            {
                "host": "127.0.0.1",
                "port": send_port,
                "address": address,
                "payload": _payload(100, stamp=False),
                "count": messages,
                "settled": settled,
                "time_limit": 120.0,
            },
        ),
    )
    sender.start()
    results = _collect(out, [receiver, sender], time_limit=120.0)
    return _summarize(results, producers=1, consumers=1, size=100, settled=settled)


def _ratio(numerator: Throughput, denominator: Throughput) -> float:
    return numerator.rate / denominator.rate if denominator.rate else 0.0


@suite("router", "anycast through one router and a 2-router chain, queue via router, memory")
def router_suite(ctx: Context) -> Iterator[Table]:
    messages = ctx.messages(200_000)
    addresses = {a: "anycast" for a in [*PAIRS, "latency", "chain"]}
    with _routers(2, addresses=addresses) as fleet:
        r1, r2 = fleet.routers["r1"], fleet.routers["r2"]
        table = Table("Router anycast, one router (producer -> r1 -> consumer)", THROUGHPUT_COLUMNS)
        ratios = Table("Router ratios (same run)", ["mode", "figure", "ratio", "target"])
        for settled in (False, True):
            ceiling = ceiling_throughput(messages=messages, settled=settled)
            one = throughput(
                host="127.0.0.1",
                port=r1.amqp_port,
                address="bench-0",
                messages=messages,
                settled=settled,
                peer_pid=r1.pid,
            )
            four = throughput(
                host="127.0.0.1",
                port=r1.amqp_port,
                address=PAIRS,
                messages=messages,
                producers=4,
                consumers=4,
                settled=settled,
                peer_pid=r1.pid,
            )
            chain = _split_throughput(
                send_port=r1.amqp_port,
                recv_port=r2.amqp_port,
                address="chain",
                messages=messages,
                settled=settled,
            )
            for result in (one, four):
                throughput_row(table, result)
            mode = one.mode
            ratios.add(mode, "client ceiling msgs/s", ceiling.rate, "-")
            ratios.add(mode, "router / direct client-to-client", _ratio(one, ceiling), ">= 0.3")
            ratios.add(mode, "2-router chain msgs/s", chain.rate, "-")
            ratios.add(mode, "2-router chain / one router", _ratio(chain, one), ">= 0.7")
            ratios.add(mode, "4 pairs / 1 pair", _ratio(four, one), ">= 1.0")
        yield table
        yield ratios
        lat = Table("Router anycast latency (one router)", LATENCY_COLUMNS)
        latency_row(
            lat,
            latency(
                host="127.0.0.1",
                port=r1.amqp_port,
                address="latency",
                rate=1000.0,
                seconds=ctx.seconds(5.0),
            ),
        )
        yield lat
    yield from _queue_tables(ctx)
    yield _idle_connections_table(ctx)
    yield _convergence_table()


def _queue_tables(ctx: Context) -> list[Table]:
    messages = ctx.messages(100_000)
    table = Table("Queue: broker directly vs router -> broker -> router", THROUGHPUT_COLUMNS)
    ratio = Table("Queue ratio (same run)", ["figure", "ratio", "target"])
    with tempfile.TemporaryDirectory(prefix="router-bench-broker-") as workdir:
        broker = BrokerProcess(workdir=Path(workdir) / "broker")
        broker.start()
        try:
            broker.ensure_queue("bench-queue", persistent=False)
            direct = throughput(
                host="127.0.0.1",
                port=broker.amqp_port,
                address="bench-queue",
                messages=messages,
                peer_pid=broker.pid,
            )
            waypoint = router_pb2.BrokerWaypoint(name="b1", host="127.0.0.1", port=broker.amqp_port)
            with _routers(
                1, addresses={"bench-queue": "queue"}, waypoints={"bench-queue": [waypoint]}
            ) as fleet:
                router = fleet.routers["r1"]
                via = throughput(
                    host="127.0.0.1",
                    port=router.amqp_port,
                    address="bench-queue",
                    messages=messages,
                    peer_pid=router.pid,
                )
            throughput_row(table, direct)
            throughput_row(table, via)
            ratio.add("via router / broker directly", _ratio(via, direct), ">= 0.8")
            table.notes.append(
                "Rows: the broker directly, then through the router (peer CPU: the router's)."
            )
        finally:
            broker.stop()
    return [table, ratio]


class _Idle(ConnectionHandler):
    def __init__(self, opened: list[int]) -> None:
        self.opened = opened

    def on_connection_open(self, conn: Connection) -> None:
        self.opened[0] += 1


def _hold_idle_connections(port: int, count: int, report: Any, release: Any) -> None:
    """In its own process: opens `count` AMQP connections and keeps them until released."""
    engine = Engine()
    opened = [0]
    thread = engine.run_in_thread(name="idle-clients")
    for start in range(0, count, 500):
        batch = min(500, count - start)
        engine.call_soon_threadsafe(
            lambda batch=batch: [
                engine.connect(host="127.0.0.1", port=port, handler=_Idle(opened))
                for _ in range(batch)
            ]
        )
        deadline = time.monotonic() + 30
        while opened[0] < start + batch and time.monotonic() < deadline:
            time.sleep(0.05)
    report.put(opened[0])
    release.wait(120)
    engine.stop()
    thread.join(10)


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def _idle_connections_table(ctx: Context) -> Table:
    count = 1000 if ctx.quick else 10_000
    table = Table(
        "Idle client connections on one router",
        ["connections", "opened", "router RSS before MiB", "after MiB", "kB per connection"],
    )
    with _routers(1, addresses={"idle": "anycast"}) as fleet:
        router = fleet.routers["r1"]
        before = _rss_kib(router.pid)
        report, release = _SPAWN.Queue(), _SPAWN.Event()
        holder = _SPAWN.Process(
            target=_hold_idle_connections, args=(router.amqp_port, count, report, release)
        )
        holder.start()
        try:
            opened = report.get(timeout=300)
            time.sleep(1.0)
            after = _rss_kib(router.pid)
        finally:
            release.set()
            holder.join(30)
            if holder.is_alive():
                holder.kill()
                holder.join(5)
        per = (after - before) * 1024 / 1000 / opened if opened else 0.0
        table.add(count, opened, before / 1024, after / 1024, per)
        table.notes.append("EnMasse's (Qpid Dispatch) router: about 60 kB per connection.")
    return table


def _convergence_table() -> Table:
    """Three routers; r1 is SIGKILLed; how long until r2 and r3 no longer reach it."""
    table = Table("Mesh convergence after SIGKILL of one of three routers", ["run", "ms"])
    for run in range(3):
        with _routers(3, addresses={"work": "anycast"}) as fleet:
            survivors = [fleet.routers["r2"], fleet.routers["r3"]]
            killed_at = time.monotonic()
            fleet.routers["r1"].kill()
            deadline = killed_at + 30
            while time.monotonic() < deadline:
                views = [set(r.stats().reachable_routers) for r in survivors]
                if all("r1" not in v for v in views):
                    break
                time.sleep(0.005)
            table.add(run + 1, (time.monotonic() - killed_at) * 1000)
    table.notes.append("Measured by polling RouterAdmin.GetStats every 5 ms (adds up to ~10 ms).")
    return table


@contextlib.contextmanager
def _mesh_pair(workdir: Path, *, tls: bool) -> Iterator[RouterFleet]:
    """r1 and r2 meshed with the space's secret; with tls, each with a certificate of one CA
    (`--tls-dir`: the mesh is mutual TLS, PLAIN and the secret inside it), as `enmasse up` runs
    them."""
    workdir.mkdir(parents=True)
    secret = workdir / "mesh-secret"
    secret.write_text("bench-secret\n")
    secret.chmod(0o600)
    pki = workdir.parent / "pki"
    fleet = RouterFleet(workdir=workdir)
    try:
        for router_id in ("r1", "r2"):
            args = [f"--mesh-secret-file={secret}"]
            admin = None
            if tls:
                own = issue(pki, ca="ca", name=router_id, role=DATA_PLANE)
                args += ["--tls-dir", str(own.directory)]
                admin = issue(pki, ca="ca", name="agent", role=CONTROL_PLANE)
            fleet.start(router_id, extra_args=tuple(args), admin_tls=admin)
        addresses = {f"mesh-{n}": "anycast" for n in range(64)}
        fleet.apply_all(fleet.mesh_config(generation=1, addresses=addresses))
        fleet.wait_for_mesh()
        yield fleet
    finally:
        fleet.stop_all()


def _across(fleet: RouterFleet, *, address: str, messages: int, settled: bool) -> tuple[Any, ...]:
    """Producer on r1, consumer on r2: (msgs/s, both routers' CPU µs per message, received)."""
    r1, r2 = fleet.routers["r1"], fleet.routers["r2"]
    cpu = process_cpu_seconds(r1.pid) + process_cpu_seconds(r2.pid)
    result = _split_throughput(
        send_port=r1.amqp_port,
        recv_port=r2.amqp_port,
        address=address,
        messages=messages,
        settled=settled,
    )
    cpu = process_cpu_seconds(r1.pid) + process_cpu_seconds(r2.pid) - cpu
    per_message = cpu * 1e6 / result.received if result.received else 0.0
    return result.rate, per_message, result.received, "; ".join(result.errors)


@suite("router-mesh-tls", "anycast across two meshed routers: the mesh in clear vs mutual TLS")
def mesh_tls_suite(ctx: Context) -> Iterator[Table]:
    messages = ctx.messages(100_000)
    rounds = 1 if ctx.quick else 3
    runs = Table(
        "Anycast producer -> r1 -> r2 -> consumer, 100 B: mesh in clear vs mutual TLS",
        ["mode", "mesh", "round", "msgs/s", "routers CPU µs/msg", "received", "errors"],
    )
    ratios = Table(
        "Mesh TLS / clear (medians of the rounds)", ["mode", "figure", "clear", "TLS", "ratio"]
    )
    address = iter(f"mesh-{n}" for n in range(64))
    with contextlib.ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="mesh-tls-")))
        clear = stack.enter_context(_mesh_pair(workdir / "clear", tls=False))
        secured = stack.enter_context(_mesh_pair(workdir / "tls", tls=True))
        for settled in (False, True):
            mode = "pre-settled" if settled else "acked"
            figures: dict[str, list[tuple[Any, ...]]] = {"clear": [], "TLS": []}
            for n in range(rounds):
                for mesh, fleet in (("clear", clear), ("TLS", secured)):
                    run = _across(fleet, address=next(address), messages=messages, settled=settled)
                    figures[mesh].append(run)
                    runs.add(mode, mesh, n + 1, *run)
            rate = {m: statistics.median(r[0] for r in f) for m, f in figures.items()}
            cpu = {m: statistics.median(r[1] for r in f) for m, f in figures.items()}
            ratio = rate["TLS"] / rate["clear"] if rate["clear"] else 0.0
            ratios.add(mode, "msgs/s", rate["clear"], rate["TLS"], f"{ratio:.2f}")
            cpu_ratio = cpu["TLS"] / cpu["clear"] if cpu["clear"] else 0.0
            ratios.add(mode, "routers CPU µs/msg", cpu["clear"], cpu["TLS"], f"{cpu_ratio:.2f}")
    runs.notes.append(
        "Both meshes log in with the space's secret; the TLS one also presents and verifies "
        "certificates of one CA (the listener side runs the engine's own TLS under its SASL, "
        "the dialling side proton's). Clients connect to the routers in clear: only the mesh "
        "link differs. Rounds alternate clear / TLS."
    )
    ratios.notes.append("Issue #15's target: TLS costs at most 25% (msgs/s ratio >= 0.75).")
    yield runs
    yield ratios


if __name__ == "__main__":
    import sys

    from bench.harness import main

    raise SystemExit(main(["router", *sys.argv[1:]]))
