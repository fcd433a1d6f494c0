"""Clients on the engine: blocking ones for tests and tools, bulk ones for benches.

What flows in: host/port of an AMQP peer (router, broker, another client), addresses, payloads
(encoded once with `codec.encode_message`). What flows out: outcomes of sends, received deliveries,
and for the bulk runners a `BulkResult` with counts and timings.

Why it is built so: the blocking `Client` runs its own `Engine` on a daemon thread and hands every
call over with `call_soon_threadsafe`, so a test reads like a script (`sender.send(...)` returns
the outcome, `receiver.receive()` returns the next delivery) while the protocol work stays on the
engine thread. That hand-over costs a thread switch per call, which is fine for tests but would
cap a benchmark; so the bulk runners (`run_sender`, `run_receiver`, `serve_receiver`) do the
whole load on the engine thread itself, keep the link's credit full, and only report at the end.
A receive-side latency probe reads the send time that `run_sender(stamp=True)` writes into each
message's first body bytes (a monotonic clock shared by every process on the machine).
"""

from __future__ import annotations

import queue
import struct
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Protocol

from enmasse.amqp import codec
from enmasse.amqp.engine import (
    Condition,
    Connection,
    ConnectionHandler,
    Delivery,
    Engine,
    Link,
    Outcome,
    Terminus,
    Tls,
)
from enmasse.amqp.engine.endpoints import EngineSide


class AmqpError(Exception):
    """The peer said no (refused attach, closed link or connection): carries its condition."""

    def __init__(self, condition: Condition | None, *, what: str = "") -> None:
        self.condition = condition
        text = str(condition) if condition is not None else "closed by the peer"
        super().__init__(f"{what}: {text}" if what else text)


class _ClientHandler(ConnectionHandler):
    """Routes engine events to the Sender/Receiver objects kept in each link's context."""

    def __init__(self) -> None:
        self.opened: Future[Connection] = Future()
        self.closed: Future[Condition | None] = Future()

    def on_connection_open(self, conn: Connection) -> None:
        if not self.opened.done():
            self.opened.set_result(conn)

    def on_connection_close(self, conn: Connection, error: Condition | None) -> None:
        if not self.opened.done():
            self.opened.set_exception(AmqpError(error, what="connection refused"))
        if not self.closed.done():
            self.closed.set_result(error)

    def on_link_open(self, link: Link) -> None:
        link.context._opened(link)

    def on_link_detach(self, link: Link, *, closed: bool, error: Condition | None) -> None:
        link.context._detached(error)

    def on_link_credit(self, link: Link) -> None:
        link.context._pump()

    def on_message(self, link: Link, delivery: Delivery) -> None:
        link.context._arrived(delivery)

    def on_outcome(self, link: Link, delivery: Delivery, outcome: Outcome) -> None:
        future: Future[Delivery] = delivery.context
        if not future.done():
            future.set_result(delivery)


class Client:
    """One blocking AMQP connection on its own engine thread. Use as a context manager."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        container_id: str | None = None,
        user: str | None = None,
        password: str | None = None,
        timeout: float = 10.0,
        properties: dict[str, Any] | None = None,
        desired_capabilities: tuple[str, ...] = (),
        tls: Tls | None = None,
        hostname: str | None = None,
        mechanisms: tuple[str, ...] | None = None,
    ) -> None:
        """mechanisms: log in with the engine's own SASL client, taking the first of these the
        peer offers (`sasl.CLIENT_MECHANISMS`: SCRAM-SHA-512, SCRAM-SHA-256, then PLAIN); None:
        proton's SASL, PLAIN with a user, else ANONYMOUS."""
        self.timeout = timeout
        self.engine = Engine(container_id=container_id)
        self._handler = _ClientHandler()
        self._thread = self.engine.run_in_thread(name="amqp-client")
        self.connection: Connection = self._call(
            lambda: self.engine.connect(
                host=host,
                port=port,
                handler=self._handler,
                user=user,
                password=password,
                properties=properties,
                desired_capabilities=desired_capabilities,
                tls=tls,
                hostname=hostname,
                mechanisms=mechanisms,
            )
        )
        try:
            self._handler.opened.result(timeout)
        except BaseException:
            self._stop_engine()
            raise

    def _call(self, fn: Callable[[], Any]) -> Any:
        """Runs fn on the engine thread and returns its result."""
        return self.engine.submit(fn).result(self.timeout)

    def call(self, fn: Callable[[], Any]) -> Any:
        """Runs fn on the client's engine thread (e.g. to touch self.connection) and returns."""
        return self._call(fn)

    def sender(
        self, address: str | None, *, settled: bool = False, name: str | None = None
    ) -> Sender:
        """Attaches a sending link; raises AmqpError if the peer refuses."""
        sender = Sender(self, settled=settled)
        self._call(
            lambda: sender._bind(self.connection.open_sender(address, name=name, settled=settled))
        )
        sender._wait_open()
        return sender

    def receiver(
        self,
        address: str | None,
        *,
        credit: int = 100,
        source: Terminus | None = None,
        name: str | None = None,
    ) -> Receiver:
        """Attaches a receiving link with a prefetch window of `credit`; AmqpError if refused."""
        receiver = Receiver(self, credit=credit)
        self._call(
            lambda: receiver._bind(
                self.connection.open_receiver(address, name=name, source=source, credit=credit)
            )
        )
        receiver._wait_open()
        return receiver

    @property
    def closed_with(self) -> Future[Condition | None]:
        """Resolves with the close condition when the connection ends (None when clean)."""
        return self._handler.closed

    def close(self) -> None:
        """Closes the connection cleanly, then stops the engine thread."""
        if self.engine._running:
            try:
                self._call(self.connection.close)
                self._handler.closed.result(self.timeout)
            except Exception:  # already gone: nothing to close politely
                pass
        self._stop_engine()

    def _stop_engine(self) -> None:
        self.engine.stop()
        self._thread.join(self.timeout)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Endpoint:
    """What Sender and Receiver share: the link, and the futures of its attach and detach."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.link: Link | None = None
        self.open_future: Future[Link] = Future()
        self.detached: Future[Condition | None] = Future()

    def _bind(self, link: Link) -> None:
        self.link = link
        link.context = self

    def _opened(self, link: Link) -> None:
        if not self.open_future.done():
            self.open_future.set_result(link)

    def _detached(self, error: Condition | None) -> None:
        if not self.open_future.done():
            self.open_future.set_exception(AmqpError(error, what="attach refused"))
        if not self.detached.done():
            self.detached.set_result(error)

    def _wait_open(self) -> None:
        self.open_future.result(self.client.timeout)

    @property
    def address(self) -> str | None:
        return self.link.address if self.link is not None else None

    def close(self) -> None:
        link = self.link
        if link is not None and not self.detached.done():
            self.client._call(link.close)
            self.detached.result(self.client.timeout)

    def detach(self) -> None:
        link = self.link
        if link is not None and not self.detached.done():
            self.client._call(link.detach)
            self.detached.result(self.client.timeout)


class Sender(_Endpoint):
    """Blocking sends: send() waits for the outcome (or, pre-settled, for the bytes to leave)."""

    def __init__(self, client: Client, *, settled: bool) -> None:
        super().__init__(client)
        self.settled = settled
        self._waiting: deque[tuple[bytes, Future[Delivery]]] = deque()

    def send_async(self, payload: bytes) -> Future[Delivery]:
        """Queues one message; the future resolves with the settled Delivery (delivery.outcome)."""
        future: Future[Delivery] = Future()

        def queue_it() -> None:
            if self.detached.done():  # gone (its connection too, maybe): it would wait forever
                future.set_exception(AmqpError(self.detached.result(), what="link detached"))
                return
            self._waiting.append((payload, future))
            self._pump()

        self.client.engine.call_soon_threadsafe(queue_it)
        return future

    def send(self, payload: bytes, *, timeout: float | None = None) -> Delivery:
        """Sends one message, returns its Delivery once settled; AmqpError if the link ends."""
        future = self.send_async(payload)
        return future.result(timeout or self.client.timeout)

    def _pump(self) -> None:
        link = self.link
        if link is None or not link.is_open:
            return
        while self._waiting and link.credit > 0:
            payload, future = self._waiting.popleft()
            delivery = link.send(payload, settled=self.settled, context=future)
            if self.settled:
                future.set_result(delivery)

    def _detached(self, error: Condition | None) -> None:
        super()._detached(error)
        failure = AmqpError(error, what="link detached")
        for _payload, future in self._waiting:
            future.set_exception(failure)
        self._waiting.clear()
        if self.link is not None:
            for delivery in self.link.unsettled:
                if not delivery.context.done():
                    delivery.context.set_exception(failure)


class Receiver(_Endpoint):
    """Blocking receives with a prefetch window; settle what you take with accept()/settle()."""

    def __init__(self, client: Client, *, credit: int) -> None:
        super().__init__(client)
        self.credit = credit
        self._inbox: queue.Queue[Delivery | None] = queue.Queue()

    def _arrived(self, delivery: Delivery) -> None:
        self._inbox.put(delivery)
        if self.link is not None and self.credit:
            self.link.flow(1)

    def _detached(self, error: Condition | None) -> None:
        super()._detached(error)
        self._inbox.put(None)

    def receive(self, timeout: float | None = None) -> Delivery:
        """The next delivery; TimeoutError if none comes in time, AmqpError if the link ended."""
        try:
            delivery = self._inbox.get(
                timeout=timeout if timeout is not None else self.client.timeout
            )
        except queue.Empty:
            raise TimeoutError(f"no message on {self.address!r} within the timeout") from None
        if delivery is None:
            self._inbox.put(None)  # stay ended for later calls
            raise AmqpError(self.detached.result(0), what="link detached")
        return delivery

    def flow(self, credit: int) -> None:
        """Grants more credit (for receivers opened with credit=0 that manage it themselves)."""
        link = self.link
        if link is not None:
            self.client._call(lambda: link.flow(credit))

    def settle(self, delivery: Delivery, outcome: Outcome = Outcome.ACCEPTED, **how: Any) -> None:
        """Settles on the engine thread. Returns when the disposition is queued, not when the peer
        has processed it: AMQP does not acknowledge dispositions, so a test that then asks the
        peer (e.g. a broker's counters over gRPC) must wait for the effect, not assume it."""
        self.client._call(lambda: delivery.settle(outcome, **how))

    def accept(self, delivery: Delivery) -> None:
        self.settle(delivery, Outcome.ACCEPTED)


# --- bulk runners: a whole load on the engine thread, for benches --------------------------------

_STAMP = struct.Struct("<q")


class _Settable(Protocol):
    """threading.Event or multiprocessing.Event: anything with set()."""

    def set(self) -> None: ...


@dataclass
class BulkResult:
    """What a bulk run saw. Times are time.monotonic() seconds."""

    sent: int = 0
    received: int = 0
    accepted: int = 0
    other_outcomes: int = 0
    started: float = 0.0
    finished: float = 0.0
    latencies_ns: list[int] = field(default_factory=list)
    error: str | None = None

    @property
    def seconds(self) -> float:
        return max(self.finished - self.started, 1e-9)


def stamped_payload(size: int) -> bytes:
    """A data-section message whose body starts with 8 bytes reserved for a send timestamp."""
    return codec.encode_message(b"\0" * max(size, _STAMP.size))


def _stamp_offset(payload: bytes) -> int:
    return len(payload) - len(codec.read_body(payload))


class _BulkSend(ConnectionHandler):
    def __init__(
        self,
        *,
        address: str,
        payload: bytes,
        count: int,
        settled: bool,
        rate: float | None,
        stamp: bool,
        deadline: float,
        done: threading.Event,
    ) -> None:
        self.address = address
        self.count = count
        self.settled = settled
        self.rate = rate
        self.deadline = deadline
        self.done = done
        self.result = BulkResult()
        self.link: Link | None = None
        self.buffer = bytearray(payload)
        self.stamp_at = _stamp_offset(payload) if stamp else -1
        self.payload = payload
        self.engine: EngineSide | None = None  # the connection's, once it opens

    def on_connection_open(self, conn: Connection) -> None:
        self.engine = conn.engine
        self.link = conn.open_sender(self.address, settled=self.settled)
        self.result.started = time.monotonic()
        conn.engine.call_later(max(0.0, self.deadline - time.monotonic()), self._give_up)
        if self.rate:
            self._paced()

    def on_link_credit(self, link: Link) -> None:
        if not self.rate:
            self._send(link.credit)

    def _send(self, budget: int) -> None:
        link = self.link
        result = self.result
        if link is None or not link.is_open:
            return
        n = min(budget, link.credit, self.count - result.sent)
        send = link.send
        settled = self.settled
        at = self.stamp_at
        for _ in range(n):
            if at >= 0:
                _STAMP.pack_into(self.buffer, at, time.monotonic_ns())
                payload = bytes(self.buffer)
            else:
                payload = self.payload
            send(payload, settled=settled)
        result.sent += n
        if settled and result.sent >= self.count:
            # Pre-settled: done once the bytes are out; the receiver counts what arrived.
            self._finish_when_flushed(link)

    def _paced(self) -> None:
        assert self.engine is not None
        assert self.rate
        started = self.result.started
        due = int((time.monotonic() - started) * self.rate) + 1
        self._send(due - self.result.sent)
        if self.result.sent < self.count and not self.done.is_set():
            self.engine.call_later(0.001, self._paced)

    def _finish_when_flushed(self, link: Link) -> None:
        if link.queued and link.is_open:
            assert self.engine is not None
            self.engine.call_later(0.001, lambda: self._finish_when_flushed(link))
            return
        self._finish()

    def on_outcome(self, link: Link, delivery: Delivery, outcome: Outcome) -> None:
        result = self.result
        if outcome == Outcome.ACCEPTED:
            result.accepted += 1
        else:
            result.other_outcomes += 1
        if result.accepted + result.other_outcomes >= self.count:
            self._finish()

    def on_link_detach(self, link: Link, *, closed: bool, error: Condition | None) -> None:
        if error is not None and not self.done.is_set():
            self.result.error = str(error)
        self._finish()

    def on_connection_close(self, conn: Connection, error: Condition | None) -> None:
        if error is not None and self.result.error is None and not self.done.is_set():
            self.result.error = str(error)
        self._finish()

    def _give_up(self) -> None:
        if not self.done.is_set():
            self.result.error = self.result.error or "time limit reached"
            self._finish()

    def _finish(self) -> None:
        if not self.done.is_set():
            self.result.finished = time.monotonic()
            self.done.set()


class _BulkReceive(ConnectionHandler):
    def __init__(
        self,
        *,
        address: str | None,
        count: int,
        credit: int,
        stamp: bool,
        deadline: float,
        done: threading.Event,
        ready: _Settable | None = None,
        idle_stop: float | None = None,
        progress: Callable[[int], bool] | None = None,
    ) -> None:
        self.address = address
        self.progress = progress
        self.count = count
        self.credit = credit
        self.stamp = stamp
        self.stamp_at = -1
        self.deadline = deadline
        self.done = done
        self.ready = ready
        self.idle_stop = idle_stop
        self.result = BulkResult()
        self.unflowed = 0
        self.last_seen = -1
        self.engine: EngineSide | None = None  # the connection's, once it opens

    def on_connection_open(self, conn: Connection) -> None:
        self.engine = conn.engine
        if not conn.incoming:
            conn.open_receiver(self.address, credit=self.credit)
        conn.engine.call_later(max(0.0, self.deadline - time.monotonic()), self._give_up)
        if self.idle_stop:
            conn.engine.call_later(self.idle_stop, self._check_idle)
        if self.progress is not None:
            conn.engine.call_later(0.05, self._report_progress)

    def on_link_open(self, link: Link) -> None:
        if self.ready is not None:
            self.ready.set()

    def on_link_detach(self, link: Link, *, closed: bool, error: Condition | None) -> None:
        if error is not None and not self.done.is_set():
            self.result.error = str(error)
            self._give_up()

    def _report_progress(self) -> None:
        """Competing consumers share one total: each reports its count, any may learn it is over."""
        if self.done.is_set() or self.engine is None or self.progress is None:
            return
        if self.progress(self.result.received):
            self.done.set()
            return
        self.engine.call_later(0.05, self._report_progress)

    def _check_idle(self) -> None:
        """Competing consumers cannot know their share: stop once nothing came for a while."""
        if self.done.is_set() or self.engine is None or self.idle_stop is None:
            return
        received = self.result.received
        if received and received == self.last_seen:
            self.done.set()
            return
        self.last_seen = received
        self.engine.call_later(self.idle_stop, self._check_idle)

    def on_link_attach(self, link: Link) -> None:
        # Client-to-client mode: the peer's sender attaches to us and we take everything.
        link.accept()
        if link.is_receiver:
            link.flow(self.credit)

    def on_message(self, link: Link, delivery: Delivery) -> None:
        result = self.result
        if not result.received:
            result.started = time.monotonic()
        result.received += 1
        result.finished = time.monotonic()
        if self.stamp:
            payload = delivery.payload
            if self.stamp_at < 0:
                self.stamp_at = _stamp_offset(payload)
            sent_ns = _STAMP.unpack_from(payload, self.stamp_at)[0]
            result.latencies_ns.append(time.monotonic_ns() - sent_ns)
        delivery.settle()
        self.unflowed += 1
        if self.unflowed * 2 >= self.credit:
            # Credit in batches: one flow frame per half window instead of one per message.
            link.flow(self.unflowed)
            self.unflowed = 0
        if result.received >= self.count:
            self.done.set()

    def on_connection_close(self, conn: Connection, error: Condition | None) -> None:
        if error is not None and not self.done.is_set():
            self.result.error = str(error)

    def _give_up(self) -> None:
        if not self.done.is_set():
            self.result.error = self.result.error or "time limit reached"
            self.done.set()


def _run(engine: Engine, done: threading.Event, limit: float) -> None:
    """Runs the engine until done, then closes its connections politely before stopping: a peer
    that sees a reset instead of a close may drop pre-settled messages still in its buffers, or
    dispositions we sent last."""
    thread = engine.run_in_thread(name="amqp-bulk")
    done.wait(limit + 5)
    engine.shutdown(timeout=5)
    thread.join(5)


def run_sender(
    host: str,
    port: int,
    *,
    address: str,
    payload: bytes,
    count: int,
    settled: bool = False,
    rate: float | None = None,
    stamp: bool = False,
    time_limit: float = 60.0,
    user: str | None = None,
    password: str | None = None,
    tls: Tls | None = None,
    hostname: str | None = None,
) -> BulkResult:
    """Sends `count` copies of payload as fast as credit allows (or at `rate` msgs/s); blocks.

    Acked: finished when every outcome came back. Pre-settled: when the last byte left.
    stamp=True writes time.monotonic_ns() into the body's first 8 bytes (see stamped_payload).
    tls (and hostname, the name the server's certificate is checked against): an amqps peer.
    """
    done = threading.Event()
    handler = _BulkSend(
        address=address,
        payload=payload,
        count=count,
        settled=settled,
        rate=rate,
        stamp=stamp,
        deadline=time.monotonic() + time_limit,
        done=done,
    )
    engine = Engine()
    engine.connect(
        host=host,
        port=port,
        handler=handler,
        user=user,
        password=password,
        tls=tls,
        hostname=hostname,
    )
    _run(engine, done, time_limit)
    return handler.result


def run_receiver(
    host: str,
    port: int,
    *,
    address: str,
    count: int,
    credit: int = 1000,
    stamp: bool = False,
    time_limit: float = 60.0,
    ready: _Settable | None = None,
    idle_stop: float | None = None,
    user: str | None = None,
    password: str | None = None,
    progress: Callable[[int], bool] | None = None,
    tls: Tls | None = None,
    hostname: str | None = None,
) -> BulkResult:
    """Receives and accepts up to `count` messages from address on host:port; blocks until done.

    ready.set() is called once the link is attached. progress(received) is called every 50 ms
    and ends the run by returning True (consumers sharing one total). idle_stop (seconds): also
    stop when nothing
    arrived for that long (competing consumers); result.finished is the last arrival either way.
    tls, hostname: as for run_sender.
    """
    done = threading.Event()
    handler = _BulkReceive(
        address=address,
        count=count,
        credit=credit,
        stamp=stamp,
        deadline=time.monotonic() + time_limit,
        done=done,
        ready=ready,
        idle_stop=idle_stop,
        progress=progress,
    )
    engine = Engine()
    engine.connect(
        host=host,
        port=port,
        handler=handler,
        user=user,
        password=password,
        tls=tls,
        hostname=hostname,
    )
    _run(engine, done, time_limit)
    return handler.result


def serve_receiver(
    *,
    count: int,
    on_port: Callable[[int], None],
    credit: int = 1000,
    stamp: bool = False,
    time_limit: float = 60.0,
    host: str = "127.0.0.1",
) -> BulkResult:
    """Client-to-client ceiling: listens, accepts any sender, takes `count` messages; blocks.

    on_port(port) is called once the listener is bound (to hand the port to the sending process).
    """
    done = threading.Event()
    deadline = time.monotonic() + time_limit
    handler = _BulkReceive(
        address=None, count=count, credit=credit, stamp=stamp, deadline=deadline, done=done
    )
    engine = Engine()
    port = engine.listen(host=host, port=0, handler_factory=lambda: handler)
    on_port(port)
    _run(engine, done, time_limit)
    return handler.result
