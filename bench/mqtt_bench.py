"""MQTT suite: publish -> subscribe through our MQTT gateway in front of a router, beside
mosquitto, with the same paho-mqtt (MQTT 5) client code for both. Figures, never assertions.

What flows in: `python -m bench mqtt [--quick] [--record]`. What flows out: one table, a row per
system, QoS and measurement (throughput or latency), and notes (what each figure means; why a
system is missing).

What is measured, for QoS 0 and QoS 1, 100 B payloads, one publisher and one subscriber (each its
own spawned process: own interpreter, own GIL, like real devices):
- **throughput**: the publisher publishes N messages (`--quick` N/10) as fast as the client lets
  it, at most WINDOW unfinished at a time (paho's `max_inflight_messages_set` for QoS 1, and the
  publisher's own count of what paho has not yet written or had acknowledged, so neither QoS
  piles up an unbounded queue in the client). `msgs/s` = messages received / (last arrival -
  first arrival), at the subscriber. `received` < `messages` is what the server dropped for a
  subscriber slower than the publisher, each system as shipped: the router's multicast fan-out
  keeps at most 1,000 copies per consumer (oldest dropped; the PUBACK already came from the
  router), mosquitto at most `max_queued_messages` (default 1,000) QoS 1 messages per client,
  QoS 0 ones without a bound.
- **latency**: the publisher paces RATE msgs/s for SECONDS s (`--quick` a fifth), writing
  `time.monotonic_ns()` into the payload's first 8 bytes; the subscriber subtracts at arrival
  (one clock: CLOCK_MONOTONIC is shared by every process on the machine); p50 / p99 in ms.

Systems: (a) `enmasse-mqtt-gateway` -> `enmasse-router`, the topic a multicast address, the
devices logging in as a user the router knows (the gateway passes the login on); (b) mosquitto
(Debian `mosquitto`), started by this suite on a free port from a generated config in a temp dir
(`listener PORT 127.0.0.1`, `allow_anonymous true`, no persistence), stopped by its PID. When
`mosquitto` is not installed its row says so and ours is measured alone.

Every wait is bounded: a subscriber stops at its expected count or after IDLE_STOP s with nothing
new; a run as a whole after TIME_LIMIT s.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
from enmasse.common.passwords import hash_password, scram_credentials
from enmasse.v1 import router_pb2
from paho.mqtt.enums import CallbackAPIVersion

from bench.harness import Context, Table, suite
from tests.fixtures.etcd import free_port
from tests.fixtures.router import RouterFleet

TOPIC = "bench/mqtt"
USER, PASSWORD = "bench", "bench-secret"
PAYLOAD = 100
WINDOW = 100  # publishes unfinished at once
RATE, SECONDS = 1000, 5.0  # the paced latency run
IDLE_STOP = 5.0
TIME_LIMIT = 120.0
START_TIMEOUT = 30.0
ENMASSE, MOSQUITTO = "enmasse-mqtt-gateway + router", "mosquitto"
COLUMNS = ["system", "QoS", "run", "messages", "received", "msgs/s", "p50 ms", "p99 ms", "errors"]
_SPAWN = multiprocessing.get_context("spawn")


@dataclass(frozen=True)
class Endpoint:
    """Where the devices connect, and as whom (None: anonymous)."""

    system: str
    port: int
    user: str | None
    password: str | None


# --- the devices (each runs in its own spawned process) -----------------------------------------


def _device(endpoint: Endpoint, name: str) -> mqtt.Client:
    client = mqtt.Client(
        CallbackAPIVersion.VERSION2,
        client_id=f"bench-{name}-{os.getpid()}",
        protocol=mqtt.MQTTv5,
    )
    if endpoint.user is not None:
        client.username_pw_set(endpoint.user, endpoint.password)
    return client


def _connect(client: mqtt.Client, port: int) -> None:
    connected = threading.Event()
    reasons: list[int] = []

    def on_connect(_c: Any, _u: Any, _flags: Any, reason: Any, _props: Any) -> None:
        reasons.append(reason.value)
        connected.set()

    client.on_connect = on_connect
    client.connect("127.0.0.1", port, keepalive=60)
    client.loop_start()
    if not connected.wait(START_TIMEOUT) or reasons[0] != 0:
        raise RuntimeError(f"CONNACK {reasons or 'never came'}")


def _subscriber(endpoint: Endpoint, qos: int, expected: int, stamped: bool, out: Any) -> None:
    """Subscribes, says "ready", receives until `expected` or idle; reports what it saw."""
    client = _device(endpoint, "sub")
    received = [0]
    first, last = [0], [0]
    delays: list[int] = []
    done, subscribed = threading.Event(), threading.Event()

    def on_message(_c: Any, _u: Any, message: mqtt.MQTTMessage) -> None:
        now = time.monotonic_ns()
        if not received[0]:
            first[0] = now
        received[0] += 1
        last[0] = now
        if stamped:
            delays.append(now - int.from_bytes(message.payload[:8], "big"))
        if received[0] >= expected:
            done.set()

    client.on_message = on_message
    client.on_subscribe = lambda *_args: subscribed.set()
    try:
        _connect(client, endpoint.port)
        client.subscribe(TOPIC, qos=qos)
        if not subscribed.wait(START_TIMEOUT):
            raise RuntimeError("no SUBACK")
        out.put(("ready", None))
        seen, deadline = -1, time.monotonic() + TIME_LIMIT
        while not done.wait(IDLE_STOP) and received[0] != seen and time.monotonic() < deadline:
            seen = received[0]
        client.disconnect()
        client.loop_stop()
        out.put(
            ("sub", {"received": received[0], "first": first[0], "last": last[0], "delays": delays})
        )
    except Exception as error:
        out.put(("sub", {"error": str(error)}))


def _publisher(endpoint: Endpoint, qos: int, messages: int, rate: float, out: Any) -> None:
    """Publishes `messages`, at most WINDOW unfinished; paced at `rate` msgs/s if rate > 0
    (then each payload starts with its send time)."""
    client = _device(endpoint, "pub")
    client.max_inflight_messages_set(WINDOW)
    finished = [0]
    window = threading.Condition()

    def on_publish(*_args: Any) -> None:  # QoS 0: written to the socket; QoS 1: PUBACK
        with window:
            finished[0] += 1
            window.notify()

    client.on_publish = on_publish
    filler = b"x" * (PAYLOAD - 8)
    try:
        _connect(client, endpoint.port)
        start = time.monotonic()
        for sent in range(messages):
            if rate:
                pause = start + sent / rate - time.monotonic()
                if pause > 0:
                    time.sleep(pause)
            with window:
                if not window.wait_for(_below(finished, sent - WINDOW), IDLE_STOP):
                    raise RuntimeError(f"{WINDOW} publishes unfinished for {IDLE_STOP} s")
            client.publish(TOPIC, time.monotonic_ns().to_bytes(8, "big") + filler, qos=qos)
        with window:
            all_finished = window.wait_for(_below(finished, messages - 1), IDLE_STOP)
        client.disconnect()
        client.loop_stop()
        if not all_finished:
            raise RuntimeError(f"{messages - finished[0]} publishes unfinished after {IDLE_STOP} s")
        out.put(("pub", {"finished": finished[0]}))
    except Exception as error:
        out.put(("pub", {"error": str(error)}))


def _below(finished: list[int], mark: int) -> Any:
    """A wait_for predicate: more than `mark` publishes finished."""
    return lambda: finished[0] > mark


# --- one run ------------------------------------------------------------------------------------


@dataclass
class Run:
    messages: int
    received: int
    msgs_per_s: float
    p50_ms: float | None
    p99_ms: float | None
    error: str


def _percentile(samples: list[int], pct: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(len(ordered) * pct / 100))] / 1e6


def measure(endpoint: Endpoint, *, qos: int, messages: int, rate: float = 0) -> Run:
    """One publisher, one subscriber (spawned, the subscriber first); `rate` > 0 is a paced
    latency run."""
    out = _SPAWN.Queue()
    sub = _SPAWN.Process(target=_subscriber, args=(endpoint, qos, messages, rate > 0, out))
    sub.start()
    reports: dict[str, dict[str, Any]] = {}
    pub = None
    try:
        kind, _ = out.get(timeout=START_TIMEOUT * 2)
        if kind == "sub":  # failed before "ready"
            reports["sub"] = _
        else:
            pub = _SPAWN.Process(target=_publisher, args=(endpoint, qos, messages, rate, out))
            pub.start()
            while len(reports) < 2:
                kind, report = out.get(timeout=TIME_LIMIT + 2 * IDLE_STOP + START_TIMEOUT)
                reports[kind] = report
    finally:
        for process in (p for p in (pub, sub) if p is not None):
            process.join(10)
            if process.is_alive():
                process.kill()
                process.join(5)
    errors = [f"{k}: {r['error']}" for k, r in sorted(reports.items()) if "error" in r]
    result = reports.get("sub", {})
    received = result.get("received", 0)
    span = (result.get("last", 0) - result.get("first", 0)) / 1e9
    delays = result.get("delays", [])
    return Run(
        messages=messages,
        received=received,
        msgs_per_s=received / span if span > 0 else 0.0,
        p50_ms=_percentile(delays, 50) if delays else None,
        p99_ms=_percentile(delays, 99) if delays else None,
        error="; ".join(errors) or "-",
    )


# --- the systems --------------------------------------------------------------------------------


def _router_config() -> router_pb2.RouterConfig:
    return router_pb2.RouterConfig(
        generation=1,
        space="bench",
        addresses=[router_pb2.AddressRoute(address=TOPIC, type="multicast")],
        users=[
            router_pb2.RouterUser(
                username=USER,
                password_hash=hash_password(PASSWORD),
                scram_credentials=scram_credentials(PASSWORD),
                authorization=[router_pb2.RouterRule(addresses=["#"], operations=["send", "recv"])],
            )
        ],
    )


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)


@contextlib.contextmanager
def enmasse_gateway() -> Iterator[Endpoint]:
    """A router with TOPIC as a multicast address, and a gateway in front of it."""
    with tempfile.TemporaryDirectory(prefix="bench-mqtt-") as tmp:
        workdir = Path(tmp)
        fleet = RouterFleet(workdir=workdir)
        gateway = None
        try:
            router = fleet.start("r1", extra_args=("--client-auth=optional",))
            router.apply(_router_config())
            ports_file = workdir / "gateway.ports.json"
            with (workdir / "gateway.log").open("ab") as log:
                gateway = subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "enmasse.mqtt_gateway.main",
                        "--listen=127.0.0.1:0",
                        f"--router=127.0.0.1:{router.amqp_port}",
                        f"--ports-file={ports_file}",
                    ],
                    stdout=log,
                    stderr=log,
                    cwd=workdir,
                )
            _wait_for(lambda: ports_file.exists(), gateway, "enmasse-mqtt-gateway")
            port = json.loads(ports_file.read_text())["mqtt"]
            yield Endpoint(system=ENMASSE, port=port, user=USER, password=PASSWORD)
        finally:
            if gateway is not None:
                _stop(gateway)
            fleet.stop_all()


@contextlib.contextmanager
def mosquitto_broker(executable: str) -> Iterator[Endpoint]:
    """mosquitto on a free port from a generated config; stopped by its PID."""
    with tempfile.TemporaryDirectory(prefix="bench-mosquitto-") as tmp:
        port = free_port()
        config = Path(tmp) / "mosquitto.conf"
        config.write_text(
            f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\nlog_dest stderr\n"
        )
        with (Path(tmp) / "mosquitto.log").open("ab") as log:
            process = subprocess.Popen(
                [executable, "-c", str(config)], stdout=log, stderr=log, cwd=tmp
            )
        try:
            _wait_for(lambda: _accepts(port), process, "mosquitto")
            yield Endpoint(system=MOSQUITTO, port=port, user=None, password=None)
        finally:
            _stop(process)


def mosquitto_executable() -> str | None:
    """Debian installs it in /usr/sbin, which a non-root PATH may leave out."""
    return shutil.which("mosquitto") or shutil.which("/usr/sbin/mosquitto")


def _accepts(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
        return True
    return False


def _wait_for(ready: Any, process: subprocess.Popen[bytes], name: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while not ready():
        if process.poll() is not None:
            raise RuntimeError(f"{name} exited with {process.returncode}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{name} did not start within {START_TIMEOUT} s")
        time.sleep(0.05)


# --- the table ----------------------------------------------------------------------------------


def system_rows(table: Table, endpoint: Endpoint, *, messages: int, seconds: float) -> None:
    """Four rows for one system: throughput and paced latency, at QoS 0 then QoS 1."""
    for qos in (0, 1):
        run = measure(endpoint, qos=qos, messages=messages)
        table.add(
            endpoint.system,
            qos,
            "throughput",
            run.messages,
            run.received,
            run.msgs_per_s,
            "-",
            "-",
            run.error,
        )
        paced = measure(endpoint, qos=qos, messages=int(RATE * seconds), rate=RATE)
        table.add(
            endpoint.system,
            qos,
            f"latency at {RATE:,} msgs/s",
            paced.messages,
            paced.received,
            paced.msgs_per_s,
            paced.p50_ms if paced.p50_ms is not None else "-",
            paced.p99_ms if paced.p99_ms is not None else "-",
            paced.error,
        )


def mosquitto_rows(table: Table, executable: str | None, *, messages: int, seconds: float) -> None:
    """mosquitto's four rows, or one row and a note saying it is not installed."""
    if executable is None:
        table.add(MOSQUITTO, "-", "-", "-", "-", "-", "-", "-", "not installed")
        table.notes.append(
            f"{MOSQUITTO} not installed (Debian package `mosquitto`): ours measured alone."
        )
        return
    with mosquitto_broker(executable) as endpoint:
        system_rows(table, endpoint, messages=messages, seconds=seconds)


def mqtt_table(*, messages: int, seconds: float, with_mosquitto: bool = True) -> Table:
    """Ours, then mosquitto (if installed and asked for), at both QoS."""
    table = Table(f"MQTT publish -> subscribe, {PAYLOAD} B, 1 publisher / 1 subscriber", COLUMNS)
    with enmasse_gateway() as endpoint:
        system_rows(table, endpoint, messages=messages, seconds=seconds)
    if with_mosquitto:
        mosquitto_rows(table, mosquitto_executable(), messages=messages, seconds=seconds)
    else:
        table.notes.append(f"{MOSQUITTO} skipped: not asked for in this run.")
    table.notes.append(
        "received < messages: dropped for a subscriber slower than the publisher (router "
        "multicast: 1,000 copies per consumer; mosquitto: max_queued_messages 1,000 at QoS 1). "
        f"paho-mqtt MQTT 5 clients, each its own process; at most {WINDOW} publishes unfinished. "
        "throughput msgs/s = received / (last - first arrival) at the subscriber; latency: "
        f"paced at {RATE:,} msgs/s, send time in the payload, p50/p99 of arrival - send."
    )
    return table


@suite("mqtt", "MQTT QoS 0/1 through enmasse-mqtt-gateway + router beside mosquitto")
def mqtt_suite(ctx: Context) -> Iterator[Table]:
    yield mqtt_table(messages=ctx.messages(20_000), seconds=ctx.seconds(SECONDS))
