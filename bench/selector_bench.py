"""Selector suite: a queue where 1 message in 10 is 'red', drained by consumers with JMS selectors
(`apache.org:selector-filter:string`) on `enmasse-broker`, beside a plain consumer on the same
queue, and what RabbitMQ's AMQP 1.0 plugin does with the same filter. Figures, never assertions.

What flows in: `python -m bench selector [--quick] [--record]`. What flows out: one table (a row
per consumer of each scenario) and notes: RabbitMQ's answer to a selector, and what each figure
means.

What is measured: a queue pre-filled (not timed) with N messages of a 100 B body (`--quick`
N/10), application property `colour` 'red' for every tenth message and 'blue' for the rest,
non-durable, on a non-persistent queue (the selector's cost, not the journal's). Then the
consumers attach (each its own spawned process, on the engine: credit 1,000 kept full, every
message accepted), all attached with no credit; once every one has attached they are given
credit at one instant ("go"), so none starts draining before the other is there. Scenarios,
each on a fresh queue:
- plain consumer (no selector): takes all N, the reference;
- one consumer selecting `colour = 'red'`: takes the N/10 red ones; the 9N/10 blue stay queued
  (the "left in queue" column, read from the broker's admin API afterwards);
- two consumers at once, `colour = 'red'` and `colour <> 'red'`: between them they empty the
  queue.
`msgs/s` = messages that consumer received / (its last arrival - go); `drain ms` = (last arrival -
go): the time to drain all its matches. `wrong colour`: messages whose body says the selector
should not have let them through (red and blue bodies differ; the consumer checks the tail of
each payload, which costs a compare, not a decode). `consumer CPU µs/msg`: that consumer
process's CPU from go to its end, per message it received. `broker CPU µs/msg`: the broker's CPU
from go to the last consumer's report, per message the scenario delivered (the same on both
rows of a pair). Consumers stop at their expected count, or after 5 s with nothing new.

RabbitMQ 3.10: a probe first (python-qpid-proton's `Selector` receiver option, as Qpid's examples
use it) on a queue holding 20 messages, 2 red: is the attach refused, is the filter echoed in the
plugin's attach (AMQP 1.0 §3.5.3: a filter the source does not apply is left out), which colours
arrive. If it honours the selector the scenarios run there too; if not, its row says "no
equivalent" and only the plain consumer runs, as a reference.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from enmasse.amqp import codec
from enmasse.amqp.client import Client
from enmasse.amqp.engine import (
    Condition,
    Connection,
    ConnectionHandler,
    Delivery,
    Engine,
    Link,
    Outcome,
    Terminus,
    settle_gc_for_message_loop,
)
from enmasse.amqp.selector import SELECTOR_FILTER_KEY, SELECTOR_FILTER_SYMBOL
from proton import Described, Message, Timeout, symbol
from proton.reactor import Selector
from proton.utils import BlockingConnection

from bench.harness import Context, Table, process_cpu_seconds, suite
from bench.peers.rabbitmq import PASSWORD, USER, RabbitMQUnavailable, rabbitmq
from tests.fixtures.broker import BrokerProcess

RED, NOT_RED = "colour = 'red'", "colour <> 'red'"
RED_BODY, BLUE_BODY = b"R" * 100, b"B" * 100
CREDIT = 1000
IDLE_STOP = 5.0  # a consumer that got nothing new for this long stops (a selector starving it)
ENMASSE, RABBITMQ = "enmasse-broker", "RabbitMQ 3.10"
COLUMNS = [
    "system",
    "scenario",
    "consumer",
    "expected",
    "received",
    "wrong colour",
    "msgs/s",
    "drain ms",
    "left in queue",
    "consumer CPU µs/msg",
    "broker CPU µs/msg",
    "errors",
]
_SPAWN = multiprocessing.get_context("spawn")


@dataclass
class Drained:
    """What one consumer process reports: counts and times (time.monotonic, shared by all)."""

    received: int = 0
    wrong: int = 0
    last: float = 0.0
    cpu: float = 0.0
    error: str = ""


@dataclass(frozen=True)
class Endpoint:
    """Where a scenario runs: a peer's AMQP port, its login, its process (for its CPU), how its
    queues are named and made, and how deep one is ("-" unless it is our broker, whose admin
    API makes the queue and tells its depth)."""

    system: str
    host: str
    port: int
    pid: int | None
    user: str | None = None
    password: str | None = None
    queue_prefix: str = ""
    broker: BrokerProcess | None = None

    def make_queue(self, name: str) -> str:
        if self.broker is not None:
            self.broker.ensure_queue(name, persistent=False)
        return self.queue_prefix + name  # RabbitMQ's plugin declares `/queue/<name>` on attach

    def depth(self, name: str) -> int | str:
        if self.broker is None:
            return "-"
        return int(self.broker.addresses()[name].depth)


def is_red(index: int) -> bool:
    return index % 10 == 0


def fill(endpoint: Endpoint, address: str, *, messages: int) -> list[str]:
    """Sends `messages` (every tenth red), each unsettled, and waits for every outcome: errors."""
    red = codec.encode_message(RED_BODY, application_properties={"colour": "red"})
    blue = codec.encode_message(BLUE_BODY, application_properties={"colour": "blue"})
    with Client(
        endpoint.host, endpoint.port, timeout=60, user=endpoint.user, password=endpoint.password
    ) as client:
        sender = client.sender(address)
        sent = [sender.send_async(red if is_red(i) else blue) for i in range(messages)]
        outcomes = [future.result(300).outcome for future in sent]
    refused = sum(outcome is not Outcome.ACCEPTED for outcome in outcomes)
    return [f"{refused} of {messages} not accepted while filling"] if refused else []


class _Draining(ConnectionHandler):
    """One consumer: attaches with no credit, is given its credit on go, accepts what comes, and
    stops at `expected` messages or after IDLE_STOP with nothing new."""

    def __init__(
        self, *, address: str, selector: str | None, expected: int, done: threading.Event
    ) -> None:
        self.address, self.selector, self.expected, self.done = address, selector, expected, done
        self.wanted_tail = BLUE_BODY[-16:] if selector == NOT_RED else RED_BODY[-16:]
        self.result = Drained()
        self.attached = threading.Event()
        self.link: Link | None = None
        self.unflowed = 0
        self.seen = 0  # nothing at all within IDLE_STOP of go counts as idle too

    def on_connection_open(self, conn: Connection) -> None:
        source = None
        if self.selector is not None:
            selector = Described(symbol(SELECTOR_FILTER_SYMBOL), self.selector)
            source = Terminus(address=self.address, filter={SELECTOR_FILTER_KEY: selector})
        self.link = conn.open_receiver(self.address, source=source, credit=0)

    def on_link_open(self, link: Link) -> None:
        self.attached.set()

    def go(self) -> None:
        """Engine thread: the credit, and the idle watch."""
        if self.link is not None:
            self.link.flow(CREDIT)
            self.link.connection.engine.call_later(IDLE_STOP, self._check_idle)

    def _check_idle(self) -> None:
        if self.done.is_set() or self.link is None:
            return
        if self.result.received == self.seen:
            self.result.error = f"nothing new for {IDLE_STOP:.0f} s"
            self.done.set()
            return
        self.seen = self.result.received
        self.link.connection.engine.call_later(IDLE_STOP, self._check_idle)

    def on_message(self, link: Link, delivery: Delivery) -> None:
        result = self.result
        result.received += 1
        result.last = time.monotonic()
        if self.selector is not None and not delivery.payload.endswith(self.wanted_tail):
            result.wrong += 1
        delivery.settle()
        self.unflowed += 1
        if self.unflowed * 2 >= CREDIT:  # one flow frame per half window
            link.flow(self.unflowed)
            self.unflowed = 0
        if result.received >= self.expected:
            self.done.set()

    def on_link_detach(self, link: Link, *, closed: bool, error: Condition | None) -> None:
        if error is not None and not self.done.is_set():
            self.result.error = f"detached: {error}"
            self.done.set()

    def on_connection_close(self, conn: Connection, error: Condition | None) -> None:
        if not self.done.is_set():
            self.result.error = f"connection closed: {error}"
            self.done.set()


def _consumer_worker(out: Any, ready: Any, go: Any, kwargs: dict[str, Any]) -> None:
    """A spawned process: attach, say so, wait for go, drain, report a Drained."""
    settle_gc_for_message_loop()
    started_cpu = time.process_time()
    done = threading.Event()
    handler = _Draining(
        address=kwargs["address"],
        selector=kwargs["selector"],
        expected=kwargs["expected"],
        done=done,
    )
    engine = Engine()
    engine.connect(
        host=kwargs["host"],
        port=kwargs["port"],
        handler=handler,
        user=kwargs["user"],
        password=kwargs["password"],
    )
    thread = engine.run_in_thread(name="selector-consumer")
    if handler.attached.wait(30):
        ready.set()
        if go.wait(60):
            started_cpu = time.process_time()  # the drain's CPU, not the interpreter's start
            engine.call_soon_threadsafe(handler.go)
            done.wait(kwargs["time_limit"])
    handler.result.cpu = time.process_time() - started_cpu
    if not done.is_set():
        handler.result.error = handler.result.error or "did not attach or finish in time"
    engine.shutdown(timeout=5)
    thread.join(5)
    out.put((kwargs["selector"], handler.result))


def drain(
    endpoint: Endpoint,
    address: str,
    *,
    consumers: Sequence[tuple[str | None, int]],
    time_limit: float = 300.0,
) -> tuple[float, list[Drained], float]:
    """Consumers (selector, expected count) in their own processes, given credit at one instant:
    (go, what each reported in the order given, the peer's CPU seconds from go to the end)."""
    out, go = _SPAWN.Queue(), _SPAWN.Event()
    ready = [_SPAWN.Event() for _ in consumers]
    procs = [
        _SPAWN.Process(
            target=_consumer_worker,
            args=(
                out,
                ready[i],
                go,
                {
                    "host": endpoint.host,
                    "port": endpoint.port,
                    "user": endpoint.user,
                    "password": endpoint.password,
                    "address": address,
                    "selector": selector,
                    "expected": expected,
                    "time_limit": time_limit,
                },
            ),
        )
        for i, (selector, expected) in enumerate(consumers)
    ]
    for proc in procs:
        proc.start()
    attached = all(event.wait(60) for event in ready)
    cpu_before = process_cpu_seconds(endpoint.pid) if endpoint.pid else 0.0
    started = time.monotonic()
    go.set()
    reports: dict[str | None, Drained] = {}
    with contextlib.suppress(Exception):  # a process that died without reporting: counted below
        for _ in procs:
            selector, result = out.get(timeout=time_limit + 60)
            reports[selector] = result
    cpu = (process_cpu_seconds(endpoint.pid) - cpu_before) if endpoint.pid else 0.0
    for proc in procs:
        proc.join(10)
        if proc.is_alive():
            proc.kill()
            proc.join(5)
    missing = "did not attach" if not attached else "did not report"
    results = [reports.get(selector) or Drained(error=missing) for selector, _ in consumers]
    return started, results, cpu


SCENARIOS: list[tuple[str, list[tuple[str | None, float]]]] = [
    ("plain consumer (reference)", [(None, 1.0)]),
    ("1 selector consumer", [(RED, 0.1)]),
    ("2 selector consumers at once", [(RED, 0.1), (NOT_RED, 0.9)]),
]


def scenario_rows(
    table: Table, endpoint: Endpoint, *, messages: int, scenarios: Sequence[int] | None = None
) -> None:
    """Runs the scenarios (all, or those numbered) on fresh queues, a row per consumer."""
    for number, (scenario, shares) in enumerate(SCENARIOS):
        if scenarios is not None and number not in scenarios:
            continue
        name = f"selector-{number}-{time.monotonic_ns()}"
        address = endpoint.make_queue(name)
        errors = fill(endpoint, address, messages=messages)
        consumers = [(selector, round(messages * share)) for selector, share in shares]
        started, results, cpu = drain(endpoint, address, consumers=consumers)
        delivered = sum(r.received for r in results)
        left = endpoint.depth(name)
        for (selector, expected), result in zip(consumers, results, strict=True):
            took = result.last - started if result.last else 0.0
            table.add(
                endpoint.system,
                scenario,
                selector or "no selector",
                expected,
                result.received,
                "-" if selector is None else result.wrong,
                result.received / took if took > 0 else 0.0,
                took * 1000,
                left,
                result.cpu / result.received * 1e6 if result.received else "-",
                cpu / delivered * 1e6 if delivered and endpoint.pid else "-",
                "; ".join([*errors, *([result.error] if result.error else [])]) or "-",
            )


def _echoed(link: Any) -> Any:
    """The filter in the peer's attach (proton Data), as a Python object; None when absent."""
    data = link.remote_source.filter
    data.rewind()
    return data.get_object() if data.next() is not None else None


def probe_rabbitmq(host: str, port: int) -> tuple[bool, str]:
    """A selector receiver on a queue of 20 messages, 2 red: (honoured, what happened)."""
    conn = BlockingConnection(
        f"{host}:{port}",
        timeout=10,
        user=USER,
        password=PASSWORD,
        allowed_mechs="PLAIN",
        allow_insecure_mechs=True,
    )
    try:
        sender = conn.create_sender("/queue/selector-probe")
        for i in range(20):
            colour = "red" if is_red(i) else "blue"
            sender.send(Message(body=f"m{i}", properties={"colour": colour}))
        try:
            receiver = conn.create_receiver(
                "/queue/selector-probe", credit=30, options=Selector(RED)
            )
        except Exception as err:  # LinkDetached and kin: the attach was refused
            condition = getattr(getattr(err, "link", None), "remote_condition", None)
            return False, f"attach refused: {condition or err}"
        echoed = _echoed(receiver.link)
        colours: list[str] = []
        with contextlib.suppress(Timeout):
            while len(colours) < 25:
                message = receiver.receive(timeout=2)
                receiver.accept()
                properties: dict[str, Any] = message.properties or {}
                colours.append(str(properties.get("colour")))
    finally:
        conn.close()
    reds = colours.count("red")
    honoured = reds == 2 and len(colours) == 2
    told = f"filter echoed in its attach: {echoed}" if echoed else "filter not echoed in its attach"
    return honoured, (
        f"attach accepted, {told}; delivered {len(colours)} messages "
        f"({reds} red, {len(colours) - reds} not red) of 20 (2 red)"
    )


@contextlib.contextmanager
def enmasse_broker() -> Iterator[BrokerProcess]:
    with tempfile.TemporaryDirectory(prefix="bench-selector-") as tmp:
        broker = BrokerProcess(workdir=Path(tmp), args=["--memory-limit=2000000000"])
        broker.start()
        try:
            yield broker
        finally:
            broker.stop()


def selector_table(*, messages: int, with_rabbitmq: bool) -> Table:
    """The whole suite at a given scale; RabbitMQ only when asked (the tests leave it out)."""
    table = Table(
        f"selector queue, {messages:,} messages of 100 B, 1 in 10 'red', non-durable", COLUMNS
    )
    with enmasse_broker() as broker:
        endpoint = Endpoint(
            system=ENMASSE,
            host="127.0.0.1",
            port=broker.amqp_port,
            pid=broker.pid,
            broker=broker,
        )
        scenario_rows(table, endpoint, messages=messages)
    if with_rabbitmq:
        rabbitmq_rows(table, messages=messages)
    else:
        table.notes.append(f"{RABBITMQ} skipped: not asked for in this run.")
    table.notes.append(
        "msgs/s and drain ms: from the instant every consumer of the scenario is attached and "
        "given credit to its last arrival; broker CPU: the peer's CPU over the same span per "
        "message the scenario delivered."
    )
    return table


def rabbitmq_rows(table: Table, *, messages: int) -> None:
    if not shutil.which("rabbitmq-server"):
        table.notes.append(f"{RABBITMQ} skipped: rabbitmq-server is not installed.")
        return
    try:
        with rabbitmq() as node:
            honoured, answer = probe_rabbitmq(node.host, node.port)
            endpoint = Endpoint(
                system=RABBITMQ,
                host=node.host,
                port=node.port,
                pid=node.pid,
                user=USER,
                password=PASSWORD,
                queue_prefix="/queue/",
            )
            table.notes.append(
                f"{RABBITMQ} (AMQP 1.0 plugin) to a receiver with `{SELECTOR_FILTER_SYMBOL}` "
                f'"{RED}": {answer}.'
            )
            scenario_rows(table, endpoint, messages=messages, scenarios=None if honoured else [0])
            if not honoured:
                table.add(
                    RABBITMQ, "selector consumers", RED, *["-"] * 8,
                    "no equivalent: the plugin ignores the selector filter (see below)",
                )  # fmt: skip
    except RabbitMQUnavailable as err:
        table.notes.append(f"{RABBITMQ} skipped: {err}")


@suite("selector", "JMS selector consumers on a queue (1 in 10 matching) vs a plain consumer")
def selector_suite(ctx: Context) -> Iterator[Table]:
    yield selector_table(messages=ctx.messages(100_000), with_rabbitmq=True)
