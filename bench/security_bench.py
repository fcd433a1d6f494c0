"""Security figures (issue 15): what a login costs, what TLS costs, and how soon a rule change
takes a right away; our router beside RabbitMQ 3.10, both driven by the same clients.

What flows in: nothing but the options. The suite makes a throwaway CA and a server certificate
for each system (`enmasse.common.certificates`, as `enmasse up` makes them), then runs the
systems one at a time (two cores; an idle Erlang VM's schedulers still spin):
- one router as the router tests start it: `enmasse-router --client-auth required` with an amqps
  listener; its users (scrypt hash, SCRAM keys, rules) and the plan's login policy (ANONYMOUS and
  PLAIN without TLS allowed, as the `development` plan allows them, so that every mechanism can
  be measured on both ports) pushed over RouterAdmin.ApplyConfig, as the router-agent pushes them;
- a RabbitMQ node (`bench.peers.rabbitmq`: the Debian package's AMQP 1.0 plugin) with an ssl
  listener on the same CA; if it cannot run here, its rows say "skipped" and why;
- the whole local runtime (`enmasse up`) for the rule change through the control plane.
Every process is stopped by PID at the end of its part.

What flows out: tables, never assertions.
1. Connection set-up: python-qpid-proton (its Cyrus SASL and OpenSSL) opens, logs in and closes
   connections one after another, in one process and in several at once, per mechanism
   (ANONYMOUS, PLAIN, SCRAM-SHA-256) and transport (plain, TLS). Set-up = connect() until the
   peer's open arrived (TCP, TLS handshake, SASL, AMQP open); connections/s = connections opened
   / (first connect -> last transport closed). What a port offers is read from its
   sasl-mechanisms frame first: a mechanism it does not offer is reported "not offered", never
   tried with something else in its place.
2. Throughput, TLS off and on: the harness's bulk clients (the engine's, pipelined with credit,
   as `router_bench` drives them) through anycast addresses of the router and through RabbitMQ
   queues, the same sizes and counts both ways, logged in with PLAIN; then TLS / plain beside the
   issue's target (TLS costs at most 25% of throughput), with the peer's CPU per message.
3. Rule change -> live link: a receiver attached under a `recv` rule; the rule removed; the time
   until the link is detached with amqp:unauthorized-access. Two paths: a RouterConfig pushed to
   the router (what the router-agent does; the figure is the router's), and the whole control
   plane (ConfigService.UpdateMessagingUser -> router-agent -> router, under `enmasse up`).

`python -m bench security [--quick] [--record]`; `python -m bench security-tls` runs part 2 for
our router alone.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import multiprocessing
import socket
import ssl
import statistics
import struct
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from enmasse.amqp import sasl
from enmasse.amqp.client import AmqpError, Client, Receiver
from enmasse.amqp.engine import Condition, Tls
from enmasse.common.certificates import (
    BROKER,
    DATA_PLANE,
    Holder,
    TlsFiles,
    ensure_authority,
    ensure_certificate,
)
from enmasse.common.passwords import hash_password, scram_credentials
from enmasse.v1 import config_pb2, config_pb2_grpc, resources_pb2, router_pb2
from proton import Event, SSLDomain
from proton.handlers import MessagingHandler
from proton.reactor import Container

from bench.harness import Context, Table, Throughput, suite, throughput
from bench.peers.rabbitmq import PASSWORD as RABBIT_PASSWORD
from bench.peers.rabbitmq import USER as RABBIT_USER
from bench.peers.rabbitmq import RabbitMQNode, RabbitMQUnavailable, rabbitmq
from bench.provisioning_bench import address, admin_channel, local_runtime, router_port
from tests.fixtures.router import RouterFleet, RouterProcess

_SPAWN = multiprocessing.get_context("spawn")
HOST = "127.0.0.1"
SERVER_NAME = "localhost"  # what the certificates name and the clients check
MECHANISMS = ("ANONYMOUS", "PLAIN", "SCRAM-SHA-256")
ROUTER = "EnMasse router"
RABBITMQ = "RabbitMQ 3.10"
BENCH_USER, BENCH_PASSWORD = "bench", "bench-password"
WATCHER, WATCHER_PASSWORD = "watcher", "watcher-password"
RULED = "ruled"  # the address whose recv rule comes and goes
PAIRS = [f"secure-{i}" for i in range(4)]
RPC_TIMEOUT = 30.0


# (producers = consumers, pre-settled, body bytes)
THROUGHPUT_RUNS = (
    (1, False, 100),
    (1, True, 100),
    (4, False, 100),
    (1, False, 1024),
    (1, False, 4096),
)


@dataclass(frozen=True)
class Scale:
    """How much of everything: the full run, --quick, and the smoke test's tiny one."""

    connections: int  # per set-up row with one opener
    openers: int  # processes opening at once, for the concurrent rows
    per_opener: int  # connections each of them opens
    messages: int  # per throughput run
    repeats: int  # of each throughput run, plain and TLS alternating; the median is shown
    throughput_runs: tuple[tuple[int, bool, int], ...]
    rule_changes: int  # pushed to the router
    runtime_rule_changes: int  # through `enmasse up`; 0: the runtime is not started
    peer: bool  # RabbitMQ beside us

    @classmethod
    def of(cls, ctx: Context) -> Scale:
        return QUICK if ctx.quick else FULL


FULL = Scale(
    connections=300,
    openers=4,
    per_opener=100,
    messages=100_000,
    repeats=3,
    throughput_runs=THROUGHPUT_RUNS,
    rule_changes=20,
    runtime_rule_changes=10,
    peer=True,
)
QUICK = Scale(
    connections=60,
    openers=4,
    per_opener=20,
    messages=10_000,
    repeats=1,
    throughput_runs=THROUGHPUT_RUNS,
    rule_changes=5,
    runtime_rule_changes=3,
    peer=True,
)
TINY = Scale(
    connections=3,
    openers=2,
    per_opener=2,
    messages=200,
    repeats=1,
    throughput_runs=((1, True, 100), (4, False, 1024)),  # both modes, pairs and a bigger body
    rule_changes=2,
    runtime_rule_changes=0,
    peer=False,
)


def percentile(values: list[float], fraction: float) -> float:
    """Nearest rank: of 100 samples, p99 is the 99th smallest, not the largest."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


# --- what is measured ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Endpoint:
    """One system's client ports and the login its users have."""

    system: str
    plain_port: int
    tls_port: int  # 0: no TLS listener
    ca_file: str
    user: str
    password: str
    peer_pid: int | None

    def port(self, *, tls: bool) -> int:
        return self.tls_port if tls else self.plain_port


def certificates(directory: Path) -> tuple[TlsFiles, TlsFiles]:
    """A throwaway CA and server certificates for the router and for RabbitMQ, signed by it."""
    authority = ensure_authority(directory / "ca", name="security-bench-ca")
    router = ensure_certificate(
        directory / "router", Holder(name="r1", role=DATA_PLANE), authority=authority
    )
    broker = ensure_certificate(
        directory / "rabbitmq", Holder(name="rabbitmq", role=BROKER), authority=authority
    )
    return router, broker


# --- the router ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class RouterUsers:
    """The router's MessagingUsers as the router-agent renders them (hash and SCRAM keys made
    once: a hash costs tens of milliseconds), and the RouterConfig of any generation."""

    bench: router_pb2.RouterUser
    watcher_hash: str
    watcher_keys: tuple[resources_pb2.ScramCredential, ...]

    @classmethod
    def make(cls) -> RouterUsers:
        bench = router_pb2.RouterUser(
            username=BENCH_USER,
            password_hash=hash_password(BENCH_PASSWORD),
            scram_credentials=scram_credentials(BENCH_PASSWORD),
            authorization=[router_pb2.RouterRule(addresses=["#"], operations=["send", "recv"])],
        )
        return cls(
            bench=bench,
            watcher_hash=hash_password(WATCHER_PASSWORD),
            watcher_keys=tuple(scram_credentials(WATCHER_PASSWORD)),
        )

    def config(self, generation: int, *, watcher_receives: bool) -> router_pb2.RouterConfig:
        operations = ["send", "recv"] if watcher_receives else ["send"]
        watcher = router_pb2.RouterUser(
            username=WATCHER,
            password_hash=self.watcher_hash,
            scram_credentials=self.watcher_keys,
            authorization=[router_pb2.RouterRule(addresses=[RULED], operations=operations)],
        )
        return router_pb2.RouterConfig(
            generation=generation,
            space="security-bench",
            addresses=[router_pb2.AddressRoute(address=a, type="anycast") for a in [*PAIRS, RULED]],
            users=[self.bench, watcher],
            allow_anonymous=True,
            allow_plain_without_tls=True,
        )


@contextlib.contextmanager
def secured_router(files: TlsFiles, users: RouterUsers) -> Iterator[tuple[RouterProcess, int]]:
    """One router checking logins on its plain and its amqps port; yields it and the amqps port."""
    with tempfile.TemporaryDirectory(prefix="security-bench-router-") as workdir:
        fleet = RouterFleet(workdir=Path(workdir))
        try:
            router = fleet.start(
                "r1",
                extra_args=(
                    "--client-auth=required",
                    f"--tls-cert={files.cert}",
                    f"--tls-key={files.key}",
                    "--amqps-port=0",
                ),
            )
            router.apply(users.config(1, watcher_receives=True))
            ports = json.loads((Path(workdir) / "r1.ports.json").read_text())
            yield router, int(ports["amqps"])
        finally:
            fleet.stop_all()


# --- 1. connection set-up -----------------------------------------------------------------------


def offered_mechanisms(port: int, *, ca_file: str | None) -> tuple[str, ...]:
    """The mechanisms a port offers, read from its sasl-mechanisms frame (TLS first with a CA)."""
    with socket.create_connection((HOST, port), timeout=10) as raw:
        sock: socket.socket = raw
        if ca_file:
            context = ssl.create_default_context(cafile=ca_file)
            sock = context.wrap_socket(raw, server_hostname=SERVER_NAME)
        sock.sendall(sasl.SASL_HEADER)
        if _read_exactly(sock, 8) != sasl.SASL_HEADER:
            return ()
        size = struct.unpack(">I", _read_exactly(sock, 4))[0]
        frame = struct.pack(">I", size) + _read_exactly(sock, size - 4)
        body = frame[frame[4] * 4 :]  # the data offset counts 4-byte words
        code, fields = sasl.parse_frame(body)
        return sasl.symbols_of(fields[0]) if code == 0x40 and fields else ()


def _read_exactly(sock: socket.socket, count: int) -> bytes:
    data = b""
    while len(data) < count:
        chunk = sock.recv(count - len(data))
        if not chunk:
            raise ConnectionError(f"peer closed after {len(data)} of {count} bytes")
        data += chunk
    return data


class _Opener(MessagingHandler):
    """Opens `count` connections one after another on one proton Container: connect, wait for
    the peer's open, close, and once the transport is closed the next. Bounded by count and by
    `time_limit`; a refused connection is an error and the next one goes on."""

    def __init__(self, *, url: str, options: dict[str, Any], count: int, time_limit: float) -> None:
        super().__init__(prefetch=0, auto_accept=False, auto_settle=False)
        self.url, self.options, self.count = url, options, count
        self.deadline = time.monotonic() + time_limit
        self.setup_seconds: list[float] = []
        self.errors: list[str] = []
        self.started = self.finished = 0.0
        self._opening = 0.0
        self._settled_attempt = True
        self._container: Container | None = None

    def on_start(self, event: Event) -> None:
        self._container = event.container
        self.started = time.monotonic()
        self._next()

    def _next(self) -> None:
        assert self._container is not None
        attempts = len(self.setup_seconds) + len(self.errors)
        if attempts >= self.count or time.monotonic() > self.deadline:
            self.finished = time.monotonic()
            if attempts < self.count:
                self.errors.append(f"time limit: {self.count - attempts} not attempted")
            self._container.stop()
            return
        self._settled_attempt = False
        self._opening = time.monotonic()
        self._container.connect(self.url, reconnect=False, **self.options)

    def on_connection_opened(self, event: Event) -> None:
        if not self._settled_attempt:
            self.setup_seconds.append(time.monotonic() - self._opening)
            self._settled_attempt = True
        if event.connection is not None:
            event.connection.close()

    def on_transport_error(self, event: Event) -> None:
        if not self._settled_attempt:
            transport = event.transport
            self.errors.append(str(transport.condition if transport else "transport error"))
            self._settled_attempt = True

    def on_transport_closed(self, event: Event) -> None:
        if not self._settled_attempt:  # closed without an open or an error: count it
            self.errors.append("transport closed before the open")
            self._settled_attempt = True
        self._next()


def _proton_options(mechanism: str, *, user: str, password: str, tls: bool) -> dict[str, Any]:
    options: dict[str, Any] = {
        "sasl_enabled": True,
        "allowed_mechs": mechanism,
        "allow_insecure_mechs": True,  # PLAIN without TLS where the port offers it
        "virtual_host": SERVER_NAME,
    }
    if tls:
        options["sni"] = SERVER_NAME
    if mechanism != "ANONYMOUS":
        options |= {"user": user, "password": password}
    return options


def _opener_worker(out: Any, ready: Any, go: Any, spec: dict[str, Any]) -> None:
    """In its own process: waits for `go`, then opens spec["count"] connections in a row."""
    ca_file = spec.pop("ca_file")
    options = dict(spec.pop("options"))
    if ca_file:
        domain = SSLDomain(SSLDomain.MODE_CLIENT)
        domain.set_trusted_ca_db(ca_file)
        domain.set_peer_authentication(SSLDomain.VERIFY_PEER_NAME)
        options["ssl_domain"] = domain
    opener = _Opener(options=options, **spec)
    container = Container(opener)
    ready.set()
    go.wait(60)
    container.run()
    out.put((opener.setup_seconds, opener.errors, opener.started, opener.finished))


@dataclass
class SetUp:
    attempted: int
    setup_seconds: list[float]
    first_seconds: float
    seconds: float
    errors: list[str]

    @property
    def rate(self) -> float:
        return len(self.setup_seconds) / self.seconds if self.seconds > 0 else 0.0


def connection_setup(
    endpoint: Endpoint, *, mechanism: str, tls: bool, openers: int, per_opener: int
) -> SetUp:
    """`openers` processes at once, each opening, logging in and closing `per_opener` connections
    one after another with python-qpid-proton."""
    scheme = "amqps" if tls else "amqp"
    spec = {
        "url": f"{scheme}://{HOST}:{endpoint.port(tls=tls)}",
        "options": _proton_options(
            mechanism, user=endpoint.user, password=endpoint.password, tls=tls
        ),
        "ca_file": endpoint.ca_file if tls else None,
        "count": per_opener,
        "time_limit": 120.0,
    }
    out, go = _SPAWN.Queue(), _SPAWN.Event()
    ready = [_SPAWN.Event() for _ in range(openers)]
    procs = [
        _SPAWN.Process(target=_opener_worker, args=(out, ready[i], go, dict(spec)))
        for i in range(openers)
    ]
    for proc in procs:
        proc.start()
    for event in ready:
        event.wait(60)
    go.set()
    reports = []
    for _ in procs:
        try:
            reports.append(out.get(timeout=180))
        except Exception:  # an opener died without reporting
            break
    _join(procs)
    setups = [s for seconds, _e, _s, _f in reports for s in seconds]
    counted = Counter(e for _s, errs, _st, _f in reports for e in errs)
    errors = [f"{n} x {e}" if n > 1 else e for e, n in sorted(counted.items())]
    if len(reports) < openers:
        errors.append(f"{openers - len(reports)} opener process(es) did not report")
    first = min(reports, key=lambda r: r[2]) if reports else None
    return SetUp(
        attempted=openers * per_opener,
        setup_seconds=setups,
        first_seconds=first[0][0] if first and first[0] else 0.0,
        seconds=max((r[3] for r in reports), default=0.0)
        - min((r[2] for r in reports), default=0.0),
        errors=errors,
    )


def _join(procs: list[Any]) -> None:
    for proc in procs:
        proc.join(timeout=30)
        if proc.is_alive():
            proc.kill()
            proc.join(5)


SETUP_COLUMNS = [
    "system",
    "transport",
    "mechanism",
    "openers",
    "connections",
    "opened",
    "p50 ms",
    "p99 ms",
    "first ms",
    "connections/s",
    "errors",
]


def setup_rows(table: Table, endpoint: Endpoint, scale: Scale) -> None:
    """Every mechanism on both transports, one opener then several; "not offered" rows for a
    mechanism the port does not offer (and one "no TLS listener" row for a system without)."""
    for tls in (False, True):
        transport = "TLS" if tls else "plain"
        if tls and not endpoint.tls_port:
            table.add(endpoint.system, transport, *["-"] * 8, "no TLS listener")
            continue
        offered = offered_mechanisms(
            endpoint.port(tls=tls), ca_file=endpoint.ca_file if tls else None
        )
        table.notes.append(f"{endpoint.system}, {transport} port offers: {' '.join(offered)}.")
        for mechanism in MECHANISMS:
            if mechanism not in offered:
                table.add(endpoint.system, transport, mechanism, *["-"] * 7, "not offered")
                continue
            for openers, per_opener in ((1, scale.connections), (scale.openers, scale.per_opener)):
                result = connection_setup(
                    endpoint, mechanism=mechanism, tls=tls, openers=openers, per_opener=per_opener
                )
                ms = [s * 1000 for s in result.setup_seconds]
                table.add(
                    endpoint.system,
                    transport,
                    mechanism,
                    openers,
                    result.attempted,
                    len(ms),
                    round(statistics.median(ms), 2) if ms else "-",
                    round(percentile(ms, 0.99), 2) if ms else "-",
                    round(result.first_seconds * 1000, 2),
                    round(result.rate, 1),
                    "; ".join(result.errors) or "-",
                )


# --- 2. throughput with TLS off and on ----------------------------------------------------------


THROUGHPUT_COLUMNS = [
    "system",
    "transport",
    "pairs",
    "mode",
    "size B",
    "messages",
    "received",
    "msgs/s",
    "client CPU µs/msg",
    "peer CPU µs/msg",
    "every run msgs/s",
    "errors",
]
RATIO_COLUMNS = [
    "system",
    "pairs",
    "mode",
    "size B",
    "plain msgs/s",
    "TLS msgs/s",
    "TLS / plain",
    "peer CPU µs/msg plain",
    "peer CPU µs/msg TLS",
    "target",
]


@dataclass
class Runs:
    """The repeats of one measurement; figures are the median run's (by rate)."""

    runs: list[Throughput] = field(default_factory=list)

    @property
    def median(self) -> Throughput:
        ordered = sorted(self.runs, key=lambda r: r.rate)
        return ordered[(len(ordered) - 1) // 2]

    @property
    def errors(self) -> list[str]:
        return sorted({e for r in self.runs for e in r.errors})


def tls_throughputs(
    endpoint: Endpoint, scale: Scale, *, addresses: Callable[[int], list[str]]
) -> list[tuple[Runs, Runs]]:
    """(plain, TLS) per entry of scale.throughput_runs, each measured scale.repeats times, plain
    and TLS alternating (a load that comes and goes on a shared machine hits both alike);
    `addresses(n)`: the addresses of the n-th measurement (one per pair)."""
    measured = []
    count = 0
    for clients, settled, size in scale.throughput_runs:
        plain, secured = Runs(), Runs()
        for _ in range(scale.repeats):
            for tls, runs in ((False, plain), (True, secured)):
                runs.runs.append(
                    throughput(
                        host=HOST,
                        port=endpoint.port(tls=tls),
                        address=addresses(count),
                        messages=scale.messages,
                        size=size,
                        producers=clients,
                        consumers=clients,
                        settled=settled,
                        user=endpoint.user,
                        password=endpoint.password,
                        peer_pid=endpoint.peer_pid,
                        tls=Tls(ca_file=endpoint.ca_file, verify_hostname=True) if tls else None,
                        hostname=SERVER_NAME if tls else None,
                    )
                )
                count += 1
        measured.append((plain, secured))
    return measured


def _cpu(result: Throughput) -> float | str:
    return round(result.peer_cpu_us, 1) if result.peer_cpu_us is not None else "-"


def throughput_rows(
    table: Table, ratios: Table, system: str, measured: list[tuple[Runs, Runs]]
) -> None:
    for plain, secured in measured:
        for transport, runs in (("plain", plain), ("TLS", secured)):
            result = runs.median
            table.add(
                system,
                transport,
                result.producers,
                result.mode,
                result.size,
                result.sent,
                result.received,
                round(result.rate),
                round(result.client_cpu_us, 1),
                _cpu(result),
                " / ".join(f"{r.rate:,.0f}" for r in runs.runs),
                "; ".join(runs.errors) or "-",
            )
        low, high = plain.median, secured.median
        ratios.add(
            system,
            low.producers,
            low.mode,
            low.size,
            round(low.rate),
            round(high.rate),
            f"{high.rate / low.rate:.2f}" if low.rate else "-",
            _cpu(low),
            _cpu(high),
            ">= 0.75" if system == ROUTER else "-",
        )


# --- 3. rule change -> live link ----------------------------------------------------------------


@dataclass
class RuleChange:
    path: str
    seconds: list[float] = field(default_factory=list)  # change made -> link detached
    call_seconds: list[float] = field(default_factory=list)  # the change's own call
    conditions: list[Condition | None] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def expected_condition() -> Condition:
    return Condition("amqp:unauthorized-access", f"user '{WATCHER}' may not recv from '{RULED}'")


def _detach_after(
    receiver: Receiver, change: Callable[[], object], result: RuleChange, *, limit: float
) -> None:
    """Makes the change and notes how long until `receiver` is detached, and with what."""
    detached_at: list[float] = []
    receiver.detached.add_done_callback(lambda _done: detached_at.append(time.monotonic()))
    started = time.monotonic()
    change()
    result.call_seconds.append(time.monotonic() - started)
    try:
        condition = receiver.detached.result(limit)
    except TimeoutError:
        result.errors.append(f"not detached within {limit:.0f} s")
        return
    result.seconds.append(detached_at[0] - started)
    result.conditions.append(condition)


def rule_change_by_push(router: RouterProcess, users: RouterUsers, *, runs: int) -> RuleChange:
    """The watcher's recv rule removed by a RouterConfig pushed to the router, `runs` times (the
    rule given back and the receiver attached anew in between), on one logged-in connection."""
    result = RuleChange("RouterConfig pushed to the router (RouterAdmin.ApplyConfig)")
    generation = router.stats().generation
    with Client(
        HOST,
        router.amqp_port,
        user=WATCHER,
        password=WATCHER_PASSWORD,
        mechanisms=("SCRAM-SHA-256",),
        timeout=10,
    ) as client:
        for _ in range(runs):
            generation += 1
            router.apply(users.config(generation, watcher_receives=True))
            receiver = client.receiver(RULED, credit=10)
            generation += 1
            taken = users.config(generation, watcher_receives=False)
            _detach_after(receiver, functools.partial(router.apply, taken), result, limit=10)
    return result


def rule_change_through_control_plane(*, runs: int) -> RuleChange:
    """Under `enmasse up` (always taken down again): `runs` rule changes made through the config
    service. A runtime that does not come up or serve the space within its bounds ends the part
    with an error in its row, not the suite: the other tables stand."""
    result = RuleChange("UpdateMessagingUser -> router-agent -> router (`enmasse up`)")
    try:
        with (
            tempfile.TemporaryDirectory(prefix="security-bench-") as tmp,
            local_runtime(Path(tmp) / "var") as target,
            admin_channel(Path(tmp) / "var", target) as channel,
        ):
            _rule_changes_through(config_pb2_grpc.ConfigServiceStub(channel), result, runs=runs)
    except (TimeoutError, RuntimeError, OSError, grpc.RpcError, AmqpError) as error:
        result.errors.append(f"{type(error).__name__}: {str(error).splitlines()[0][:300]}")
    return result


def _rule_changes_through(
    stub: config_pb2_grpc.ConfigServiceStub, result: RuleChange, *, runs: int
) -> None:
    """A space, an anycast address and the watcher (send and recv on it), created through the
    config service; then `runs` times the recv rule removed with UpdateMessagingUser and given
    back (the receiver attached again once the router lets it, retried every 20 ms)."""
    space = "secure"
    stub.CreateAddressSpace(
        resources_pb2.AddressSpace(
            metadata={"name": space}, spec={"type": "standard", "plan": "standard-small"}
        ),
        timeout=RPC_TIMEOUT,
    )
    stub.CreateAddress(
        address(space=space, name=RULED, kind="anycast", plan="standard-anycast"),
        timeout=RPC_TIMEOUT,
    )
    stub.CreateMessagingUser(
        resources_pb2.MessagingUser(
            metadata={"name": WATCHER, "space": space},
            spec={
                "username": WATCHER,
                "password": WATCHER_PASSWORD,
                "authorization": [{"addresses": [RULED], "operations": ["send", "recv"]}],
            },
        ),
        timeout=RPC_TIMEOUT,
    )
    port = router_port(stub, space, limit=180)
    with _logged_in_watcher(port, limit=120) as client:
        for _ in range(runs):
            receiver = _attach_when_allowed(client, limit=60)
            _detach_after(
                receiver,
                lambda: _set_watcher_operations(stub, space, ["send"]),
                result,
                limit=30,
            )
            _set_watcher_operations(stub, space, ["send", "recv"])


@contextlib.contextmanager
def _logged_in_watcher(port: int, *, limit: float) -> Iterator[Client]:
    """The watcher's connection, retried until the router-agent has pushed the user (bounded)."""
    deadline = time.monotonic() + limit
    while True:
        try:
            client = Client(
                HOST,
                port,
                user=WATCHER,
                password=WATCHER_PASSWORD,
                mechanisms=("SCRAM-SHA-256",),
                timeout=10,
            )
            break
        except (AmqpError, TimeoutError, OSError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    with client:
        yield client


def _attach_when_allowed(client: Client, *, limit: float) -> Receiver:
    deadline = time.monotonic() + limit
    while True:
        try:
            return client.receiver(RULED, credit=10)
        except (AmqpError, TimeoutError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def _set_watcher_operations(
    stub: config_pb2_grpc.ConfigServiceStub, space: str, operations: list[str]
) -> None:
    user = stub.GetMessagingUser(config_pb2.ObjectRef(name=WATCHER, space=space), timeout=30)
    del user.spec.authorization[:]
    user.spec.authorization.add(addresses=[RULED], operations=operations)
    stub.UpdateMessagingUser(user, timeout=RPC_TIMEOUT)


RULE_COLUMNS = [
    "path",
    "runs",
    "detached (unauthorized-access)",
    "p50 ms",
    "max ms",
    "the change's call p50 ms",
    "errors",
]


def rule_change_row(table: Table, result: RuleChange, *, runs: int) -> None:
    ms = [s * 1000 for s in result.seconds]
    right = sum(1 for c in result.conditions if c == expected_condition())
    wrong = sorted({str(c) for c in result.conditions if c != expected_condition()})
    calls = [s * 1000 for s in result.call_seconds]
    table.add(
        result.path,
        runs,
        right,
        round(statistics.median(ms), 1) if ms else "-",
        round(max(ms), 1) if ms else "-",
        round(statistics.median(calls), 1) if calls else "-",
        "; ".join([*result.errors, *(f"detached with {w}" for w in wrong)]) or "-",
    )


# --- the suite -----------------------------------------------------------------------------------


@dataclass
class Tables:
    setup: Table = field(default_factory=lambda: Table("Connection set-up", SETUP_COLUMNS))
    throughput: Table = field(
        default_factory=lambda: Table("Throughput, TLS off and on", THROUGHPUT_COLUMNS)
    )
    ratios: Table = field(default_factory=lambda: Table("What TLS costs (same run)", RATIO_COLUMNS))
    rules: Table = field(
        default_factory=lambda: Table("Rule change -> live link detached", RULE_COLUMNS)
    )

    def all(self) -> list[Table]:
        return [self.setup, self.throughput, self.ratios, self.rules]


def _router_endpoint(router: RouterProcess, amqps_port: int, files: TlsFiles) -> Endpoint:
    return Endpoint(
        system=ROUTER,
        plain_port=router.amqp_port,
        tls_port=amqps_port,
        ca_file=str(files.ca),
        user=BENCH_USER,
        password=BENCH_PASSWORD,
        peer_pid=router.pid,
    )


def _router_part(tables: Tables, scale: Scale, files: TlsFiles) -> None:
    users = RouterUsers.make()
    with secured_router(files, users) as (router, amqps_port):
        endpoint = _router_endpoint(router, amqps_port, files)
        setup_rows(tables.setup, endpoint, scale)
        measured = tls_throughputs(endpoint, scale, addresses=lambda _n: PAIRS)
        throughput_rows(tables.throughput, tables.ratios, ROUTER, measured)
        pushed = rule_change_by_push(router, users, runs=scale.rule_changes)
        rule_change_row(tables.rules, pushed, runs=scale.rule_changes)


def _peer_part(tables: Tables, scale: Scale, files: TlsFiles) -> None:
    if not scale.peer:
        _peer_skipped(tables, "not asked for in this run")
        return
    try:
        with rabbitmq(tls=files) as node:
            _measure_rabbitmq(tables, scale, node, files)
    except RabbitMQUnavailable as why:
        _peer_skipped(tables, str(why))


def _measure_rabbitmq(tables: Tables, scale: Scale, node: RabbitMQNode, files: TlsFiles) -> None:
    endpoint = Endpoint(
        system=RABBITMQ,
        plain_port=node.port,
        tls_port=node.tls_port,
        ca_file=str(files.ca),
        user=RABBIT_USER,
        password=RABBIT_PASSWORD,
        peer_pid=node.pid,
    )
    setup_rows(tables.setup, endpoint, scale)
    # RabbitMQ keeps queues and what a run left in them: fresh queues for every run.
    measured = tls_throughputs(
        endpoint,
        scale,
        addresses=lambda n: [f"/queue/security-{n}-{i}" for i in range(4)],
    )
    throughput_rows(tables.throughput, tables.ratios, RABBITMQ, measured)


def _peer_skipped(tables: Tables, why: str) -> None:
    for table in (tables.setup, tables.throughput, tables.ratios):
        table.notes.append(f"{RABBITMQ} skipped: {why}")


def security_tables(scale: Scale) -> list[Table]:
    """Runs every part at `scale`; the router first, then RabbitMQ, then `enmasse up`."""
    tables = Tables()
    with tempfile.TemporaryDirectory(prefix="security-bench-tls-") as tmp:
        router_files, broker_files = certificates(Path(tmp))
        _router_part(tables, scale, router_files)
        _peer_part(tables, scale, broker_files)
    if scale.runtime_rule_changes:
        through = rule_change_through_control_plane(runs=scale.runtime_rule_changes)
        rule_change_row(tables.rules, through, runs=scale.runtime_rule_changes)
    else:
        tables.rules.notes.append("The path through `enmasse up` was not asked for in this run.")
    tables.setup.notes.append(
        "Client: python-qpid-proton (Cyrus SASL, OpenSSL), one Container per opener process; "
        "TLS verifies the server's certificate and name. Router: `--client-auth required`, "
        "the plan allowing ANONYMOUS and PLAIN without TLS; a PLAIN login's first check is an "
        "scrypt hash, later ones of the same password are remembered (first ms)."
    )
    _throughput_notes(tables, scale)
    return tables.all()


def _throughput_notes(tables: Tables, scale: Scale) -> None:
    tables.throughput.notes.append(
        f"Each row is the median of {scale.repeats} run(s) by msgs/s (plain and TLS runs "
        "alternating); every run's msgs/s beside it."
    )
    tables.ratios.notes.append(
        "Issue 15's target: TLS costs at most 25% of throughput (TLS / plain >= 0.75), from the "
        "median runs. "
        "Clients log in with PLAIN on both ports; the router does the server's TLS in Python's "
        "ssl module (memory BIO) under its own SASL, the clients with proton's OpenSSL."
    )


def tls_cost_tables(scale: Scale) -> list[Table]:
    """Part 2 alone, for our router: throughput with TLS off and on, nothing else (no set-up
    rows, no RabbitMQ, no `enmasse up`): the short way to see what client-port TLS costs."""
    tables = Tables()
    with tempfile.TemporaryDirectory(prefix="security-bench-tls-") as tmp:
        router_files, _ = certificates(Path(tmp))
        with secured_router(router_files, RouterUsers.make()) as (router, amqps_port):
            endpoint = _router_endpoint(router, amqps_port, router_files)
            measured = tls_throughputs(endpoint, scale, addresses=lambda _n: PAIRS)
            throughput_rows(tables.throughput, tables.ratios, ROUTER, measured)
    _throughput_notes(tables, scale)
    return [tables.throughput, tables.ratios]


@suite("security", "connection set-up per mechanism, TLS on/off throughput, rule change -> link")
def security_suite(ctx: Context) -> Iterator[Table]:
    yield from security_tables(Scale.of(ctx))


@suite("security-tls", "the router client port's throughput, TLS off and on (security, part 2)")
def security_tls_suite(ctx: Context) -> Iterator[Table]:
    yield from tls_cost_tables(Scale.of(ctx))


if __name__ == "__main__":
    import sys

    from bench.harness import main

    raise SystemExit(main(["security", *sys.argv[1:]]))
