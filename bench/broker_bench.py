"""Broker benchmark: figures, not assertions, side by side with RabbitMQ and the client's ceiling.

Starts `enmasse-broker` (a real process, as deployed) and, when the Debian `rabbitmq-server` is
installed, a RabbitMQ 3.10 node with the `rabbitmq_amqp1_0` plugin, both on free loopback ports in
a temp dir, and drives both with the SAME client harness (`enmasse.common.amqp.client` bulk
runners on the shared engine, one OS process per producer and per consumer, so the GIL is not
shared). It stops every process it started by PID.

Measured, per broker:
- queue throughput, acked end to end (producer waits for each outcome; consumer accepts each):
  1 producer / 1 consumer and 4 / 4, bodies of 100 B, 1 KiB and 64 KiB, durable (header
  `durable`, a persistent queue: fsync'd before the producer's accept) and not. msgs/s = messages
  received / (last receive - first send);
- latency at 1,000 msg/s (1/1, 100 B, not durable): p50 / p99 of receive time - send time (both
  stamped with the machine's monotonic clock);
- client ceiling: the same sender into the same receiver with no broker between (client to
  client), so a figure near it says "the client is the bottleneck", not "the broker is this fast".

Run: `.venv/bin/python -m bench.broker_bench [--quick] [--no-rabbitmq] [--scale 1.0]`.
The machine's cores are shared with whatever else runs (and 4/4 puts 9 processes on 2 cores):
read the figures as orders of magnitude.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import multiprocessing
import os
import shutil
import signal
import socket
import statistics
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from enmasse.common.amqp import codec
from enmasse.common.amqp.client import (
    BulkResult,
    run_receiver,
    run_sender,
    serve_receiver,
    stamped_payload,
)

from tests.fixtures.broker import BrokerProcess

RABBITMQ_SERVER = "/usr/lib/rabbitmq/bin/rabbitmq-server"
SIZES = (100, 1024, 65536)
TIME_LIMIT = 120.0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Target:
    """A broker under test: where to connect and how it names a queue."""

    name: str
    port: int
    prefix: str  # RabbitMQ's AMQP 1.0 plugin names queues /queue/<name>
    ensure: object  # callable(name, durable) creating the queue, or None when attach creates it

    def address(self, queue: str) -> str:
        return f"{self.prefix}{queue}"


class RabbitMQ:
    """A throwaway RabbitMQ node: own node name, ports, epmd, data and config in a temp dir."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.epmd_port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @staticmethod
    def available() -> bool:
        return Path(RABBITMQ_SERVER).exists()

    def start(self, timeout: float = 60.0) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "enabled_plugins").write_text("[rabbitmq_amqp1_0].\n")
        (self.workdir / "rabbitmq.conf").write_text(
            f"loopback_users = none\nlisteners.tcp.default = 127.0.0.1:{self.port}\n"
        )
        env = {
            **os.environ,
            "HOME": str(self.workdir),
            "RABBITMQ_NODENAME": f"bench{os.getpid()}@localhost",
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(free_port()),
            "ERL_EPMD_PORT": str(self.epmd_port),
            "ERL_EPMD_ADDRESS": "127.0.0.1",
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}",
            "RABBITMQ_MNESIA_BASE": str(self.workdir / "mnesia"),
            "RABBITMQ_LOG_BASE": str(self.workdir / "log"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.workdir / "enabled_plugins"),
            "RABBITMQ_CONFIG_FILE": str(self.workdir / "rabbitmq"),
        }
        with open(self.workdir / "server.log", "ab") as log:
            self.process = subprocess.Popen(
                [RABBITMQ_SERVER],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"rabbitmq-server exited; see {self.workdir / 'server.log'}")
            if "Starting broker... completed" in (self.workdir / "server.log").read_text():
                return
            time.sleep(0.2)
        self.stop()
        raise TimeoutError("rabbitmq-server did not start in time")

    def stop(self) -> None:
        """Stops the node's process group (the script, beam, its helpers) and its own epmd."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(5)
        epmd = shutil.which("epmd") or "/usr/lib/erlang/erts-13.1.5/bin/epmd"
        subprocess.run(
            [epmd, "-port", str(self.epmd_port), "-kill"], capture_output=True, check=False
        )


def throughput(
    pool: concurrent.futures.Executor,
    target: Target,
    *,
    queue: str,
    pairs: int,
    size: int,
    durable: bool,
    count: int,
) -> float:
    """Acked msgs/s with `pairs` producers and `pairs` consumers on one queue."""
    if callable(target.ensure):
        target.ensure(queue, durable)
    address = target.address(queue)
    per_pair = count // pairs
    payload = codec.encode_message(b"x" * size, durable=durable)
    credit = 1000 if size <= 1024 else 100
    receivers = [
        pool.submit(
            run_receiver,
            "127.0.0.1",
            target.port,
            address=address,
            count=per_pair,
            credit=credit,
            time_limit=TIME_LIMIT,
        )
        for _ in range(pairs)
    ]
    time.sleep(1.0)  # consumers attached (RabbitMQ declares the queue on attach)
    senders = [
        pool.submit(
            run_sender,
            "127.0.0.1",
            target.port,
            address=address,
            payload=payload,
            # Competing consumers: a consumer that reached its count still accepts what was
            # already on its way, so the others would starve; a credit window of slack each.
            count=per_pair + (credit if pairs > 1 else 0),
            time_limit=TIME_LIMIT,
        )
        for _ in range(pairs)
    ]
    sent = [f.result() for f in senders]
    got = [f.result() for f in receivers]
    errors = [r.error for r in (*sent, *got) if r.error]
    if errors:
        return _failed(errors)
    received = sum(r.received for r in got)
    elapsed = max(r.finished for r in got) - min(r.started for r in sent)
    return received / elapsed


def latency(
    pool: concurrent.futures.Executor, target: Target, *, queue: str, seconds: float
) -> tuple[float, float]:
    """p50, p99 in ms at 1,000 msg/s, 1/1, 100 B, not durable."""
    if callable(target.ensure):
        target.ensure(queue, False)
    address = target.address(queue)
    count = int(1000 * seconds)
    receiver = pool.submit(
        run_receiver,
        "127.0.0.1",
        target.port,
        address=address,
        count=count,
        stamp=True,
        time_limit=TIME_LIMIT,
    )
    time.sleep(1.0)
    sender = pool.submit(
        run_sender,
        "127.0.0.1",
        target.port,
        address=address,
        payload=stamped_payload(100),
        count=count,
        rate=1000,
        stamp=True,
        time_limit=TIME_LIMIT,
    )
    sender.result()
    got: BulkResult = receiver.result()
    if got.error or not got.latencies_ns:
        _failed([got.error or "no messages"])
        return float("nan"), float("nan")
    ms = sorted(v / 1e6 for v in got.latencies_ns[count // 10 :])  # skip warm-up
    return statistics.median(ms), ms[int(len(ms) * 0.99) - 1]


def client_ceiling(pool: concurrent.futures.Executor, *, size: int, count: int) -> float:
    """Client to client, no broker: the most the harness itself can push and take."""
    manager_port: list[int] = []
    ready = threading.Event()
    result: list[BulkResult] = []

    def serve() -> None:
        result.append(
            serve_receiver(
                count=count,
                on_port=lambda p: (manager_port.append(p), ready.set()),
                time_limit=TIME_LIMIT,
            )
        )

    # The receiving side runs here (a thread of this process), the sender in a process of its own.
    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    ready.wait(10)
    payload = codec.encode_message(b"x" * size)
    sent = pool.submit(
        run_sender,
        "127.0.0.1",
        manager_port[0],
        address="ceiling",
        payload=payload,
        count=count,
        time_limit=TIME_LIMIT,
    ).result()
    thread.join(TIME_LIMIT)
    got = result[0] if result else BulkResult(error="no result")
    if got.error or sent.error:
        return _failed([e for e in (got.error, sent.error) if e])
    return got.received / (got.finished - sent.started)


def _failed(errors: list[str]) -> float:
    print(f"    run failed: {errors[0]}", flush=True)
    return float("nan")


def enmasse_target(process: BrokerProcess) -> Target:
    def ensure(name: str, durable: bool) -> None:
        process.ensure_queue(name, persistent=durable)

    return Target(name="enmasse", port=process.amqp_port, prefix="", ensure=ensure)


def counts(scale: float, size: int) -> int:
    base = {100: 50_000, 1024: 40_000, 65536: 4_000}[size]
    return max(100, int(base * scale))


def run_suite(args: argparse.Namespace, workdir: Path) -> list[list[str]]:
    ctx = multiprocessing.get_context("spawn")
    rows: list[list[str]] = []
    with concurrent.futures.ProcessPoolExecutor(max_workers=9, mp_context=ctx) as pool:
        ceiling = client_ceiling(pool, size=100, count=counts(args.scale, 100) * 2)
        rows.append(["client ceiling (no broker)", "1/1 100 B acked", f"{ceiling:,.0f}", "", ""])
        print(rows[-1], flush=True)
        targets: list[tuple[Target, object]] = []
        ours = BrokerProcess(workdir=workdir / "enmasse", args=["--memory-limit=2000000000"])
        ours.start()
        targets.append((enmasse_target(ours), ours))
        rabbit = None
        if args.rabbitmq and RabbitMQ.available():
            rabbit = RabbitMQ(workdir / "rabbitmq")
            rabbit.start()
            targets.append((Target("rabbitmq", rabbit.port, "/queue/", None), rabbit))
        try:
            pairs_list = (1,) if args.quick else (1, 4)
            sizes = (100,) if args.quick else SIZES
            cases = [(p, s, d) for p in pairs_list for s in sizes for d in (False, True)]
            run = 0
            for target, _ in targets:
                for pairs, size, durable in cases:
                    run += 1
                    rate = throughput(
                        pool,
                        target,
                        queue=f"bench-{run}",
                        pairs=pairs,
                        size=size,
                        durable=durable,
                        count=counts(args.scale, size),
                    )
                    kind = "durable" if durable else "non-durable"
                    rows.append([target.name, f"{pairs}/{pairs} {size} B {kind}", f"{rate:,.0f}"])
                    rows[-1] += ["", ""]
                    print(rows[-1], flush=True)
                run += 1
                p50, p99 = latency(pool, target, queue=f"bench-{run}", seconds=args.latency_seconds)
                rows.append(
                    [target.name, "latency @1,000 msg/s 100 B", "", f"{p50:.2f}", f"{p99:.2f}"]
                )
                print(rows[-1], flush=True)
        finally:
            ours.stop()
            if rabbit is not None:
                rabbit.stop()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1/1 and 100 B only")
    parser.add_argument("--no-rabbitmq", dest="rabbitmq", action="store_false")
    parser.add_argument("--scale", type=float, default=1.0, help="message counts x this")
    parser.add_argument("--latency-seconds", type=float, default=5.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="broker-bench-") as tmp:
        rows = run_suite(args, Path(tmp))
    print()
    print("| broker | case | msgs/s | p50 ms | p99 ms |")
    print("| --- | --- | ---: | ---: | ---: |")
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
