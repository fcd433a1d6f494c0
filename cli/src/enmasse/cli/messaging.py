"""`enmasse send` / `receive` / `peek`, and the demo round of `enmasse up --demo`.

In: an address space's router endpoints (its AddressSpace status lists one per router, or --url,
a comma-separated list of `amqp://` or, over TLS, `amqps://` URLs, whose certificates are
verified, names included, against --ca-file), an AMQP
address, counts, a body. Out: lines for people ("sent 1 message to queue 'orders' (accepted)",
the bodies received, "queue  orders  sent 1, received 1  ok") and `CliError`s with the router's
own words when it says no (amqp:not-found for an address that does not exist) or "no message
within 5 s".

Built on the blocking `Client` of enmasse.amqp: one connection per verb, closed at the end.
`send` and `receive` go on through the next endpoint when theirs is lost (failover.py: a
router killed or leaving the space); `peek` and the demo use the first.
Routers let no one in without a user unless the space plan says so, so a verb logs in as a
MessagingUser (`Login`, `--user`): with SCRAM-SHA-512 or -256 when the router offers them, else
PLAIN (which a router offers only over TLS unless the plan allows it); the demo round logs in as
the user the examples declare for the demo space (`demo_login`). Without a login the client comes
in anonymously, which only a plan that allows it lets through.
An anycast producer's outcome is the consumer's acceptance, so the demo sends asynchronously and
settles on the receiving side before it waits for that outcome (one thread does both).
`send` paces itself to `--rate` (`Pace`) and carries application properties; `peek` browses a
queue with the `copy` distribution mode (the broker keeps what it shows; the router passes the
mode on to the broker's link). Every loop is bounded by a count and a deadline.
"""

from __future__ import annotations

import contextlib
import functools
import time
import uuid
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from enmasse.amqp import codec, message_trace, sasl
from enmasse.amqp.client import AmqpError, Client, Receiver
from enmasse.amqp.wire import Outcome, Terminus, Tls
from enmasse.cli.client import CliError
from enmasse.cli.failover import Failover, NoEndpointAnswered, lost
from enmasse.common import tracing
from enmasse.resources.contracts import (
    AMQP,
    ANYCAST,
    MULTICAST,
    PENDING,
    QUEUE,
    STORED_TYPES,
    SUBSCRIPTION,
    TOPIC,
)
from enmasse.resources.dead_letters import SPACE_MANAGER
from enmasse.v1 import resources_pb2
from opentelemetry import trace

# The most messages a receive lets the router hand it before it has taken them: what a lost
# connection hands back to the broker, not the whole count.
RECEIVE_WINDOW = 100
# The order the demo goes through: a topic's message also lands in its durable subscription.
DEMO_ORDER = (QUEUE, TOPIC, SUBSCRIPTION, ANYCAST, MULTICAST)


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int
    tls: Tls | None = None  # amqps: the server's certificate verified, its name too

    def __str__(self) -> str:
        return f"amqps://{self.host}:{self.port}" if self.tls else f"{self.host}:{self.port}"


AMQPS_SCHEME = "amqps://"


def parse_url(url: str, *, ca_file: Path | None = None) -> Endpoint:
    """`amqp://host:port`, `host:port`, or `amqps://host:port` (TLS, the server verified against
    `ca_file`, which it then needs); CliError for anything else."""
    secure = url.startswith(AMQPS_SCHEME)
    rest = url.removeprefix(AMQPS_SCHEME).removeprefix("amqp://").rstrip("/")
    host, _, port = rest.rpartition(":")
    if not host or not port.isdigit():
        raise CliError(f"--url {url!r}: expected amqp://HOST:PORT, amqps://HOST:PORT or HOST:PORT")
    if not secure:
        return Endpoint(host=host, port=int(port))
    if ca_file is None:
        raise CliError(
            f"--url {url!r}: amqps needs the CA its certificate chains to: give --ca-file "
            "(`enmasse up`'s is <var-dir>/tls/ca.crt)"
        )
    return Endpoint(host=host, port=int(port), tls=Tls(ca_file=str(ca_file), verify_hostname=True))


def parse_urls(urls: str, *, ca_file: Path | None = None) -> list[Endpoint]:
    """`--url` as a comma-separated list (each as `parse_url` reads it): the endpoints a verb
    fails over across, in order."""
    return [parse_url(url.strip(), ca_file=ca_file) for url in urls.split(",") if url.strip()]


def space_endpoint(space: resources_pb2.AddressSpace) -> Endpoint:
    """The space's first amqp endpoint (see `space_endpoints`)."""
    return space_endpoints(space)[0]


def space_endpoints(space: resources_pb2.AddressSpace) -> list[Endpoint]:
    """The space's amqp endpoints, one per router in its status's order (a brokered space's is
    its broker): what send and receive fail over across. CliError while it has none."""
    endpoints = [
        Endpoint(host=endpoint.host or "127.0.0.1", port=endpoint.port)
        for endpoint in space.status.endpoints
        if endpoint.name == AMQP and endpoint.port
    ]
    if endpoints:
        return endpoints
    phase = space.status.status.phase or PENDING
    raise CliError(
        f"address space '{space.metadata.name}' has no amqp endpoint yet (phase {phase}); "
        "wait until it is Active, or give --url"
    )


def body_text(payload: bytes) -> str:
    body = codec.read_body(payload)
    if isinstance(body, bytes | bytearray):
        return bytes(body).decode(errors="replace")
    return "" if body is None else str(body)


@dataclass(frozen=True)
class Login:
    """Who a verb logs in as: a MessagingUser of the space and its password."""

    user: str
    password: str = field(repr=False)


def demo_login(users: Iterable[resources_pb2.MessagingUser], *, space: str) -> Login | None:
    """The first user the examples declare for `space` with a password (a manifest carries it in
    clear; the store keeps only its hash and SCRAM keys); None when they declare none."""
    for user in users:
        if user.metadata.space == space and user.spec.username and user.spec.password:
            return Login(user=user.spec.username, password=user.spec.password)
    return None


def _connect(
    endpoint: Endpoint,
    *,
    timeout: float,
    container_id: str | None = None,
    login: Login | None = None,
) -> Client:
    try:
        return _open_client(endpoint, timeout=timeout, container_id=container_id, login=login)
    except (OSError, AmqpError, FutureTimeout) as error:
        raise CliError(f"cannot connect to {endpoint}: {error or 'timed out'}") from None


def _open_client(
    endpoint: Endpoint,
    *,
    timeout: float,
    container_id: str | None = None,
    login: Login | None = None,
) -> Client:
    return Client(
        endpoint.host,
        endpoint.port,
        timeout=timeout,
        container_id=container_id,
        user=login.user if login is not None else None,
        password=login.password if login is not None else None,
        mechanisms=_mechanisms(login, tls=endpoint.tls is not None),
        tls=endpoint.tls,
    )


def _mechanisms(login: Login | None, *, tls: bool) -> tuple[str, ...] | None:
    """The engine's own SASL (SCRAM first) for a login; over TLS for ANONYMOUS too, since its
    TLS (Python's) checks an address like 127.0.0.1 against the certificate, where proton's
    checks host names only. None: proton's ANONYMOUS over plain AMQP."""
    if login is not None:
        return sasl.CLIENT_MECHANISMS
    return (sasl.ANONYMOUS,) if tls else None


def outcome_summary(outcomes: Sequence[Outcome]) -> str:
    """`accepted`, or `2 accepted, 1 rejected`."""
    counts = Counter(o.name.lower() for o in outcomes)
    if len(counts) == 1:
        return next(iter(counts))
    return ", ".join(f"{n} {word}" for word, n in sorted(counts.items()))


def sent_line(*, count: int, kind: str, address: str, outcomes: Sequence[Outcome]) -> str:
    noun = "message" if count == 1 else "messages"
    what = f"{kind} '{address}'" if kind else f"'{address}'"
    return f"sent {count} {noun} to {what} ({outcome_summary(outcomes)})"


def _failover(
    endpoints: Sequence[Endpoint],
    *,
    timeout: float,
    container_id: str | None = None,
    login: Login | None = None,
) -> Failover[Endpoint]:
    """The verb's endpoints, connected to one by one as `_connect` does, until `timeout`."""
    return Failover(
        endpoints,
        connect=functools.partial(
            _open_client, timeout=timeout, container_id=container_id, login=login
        ),
        deadline=time.monotonic() + timeout,
    )


def _connected(failover: Failover[Endpoint]) -> Client:
    try:
        return failover.connect()
    except NoEndpointAnswered as none:
        raise CliError(str(none)) from None


def send(
    endpoints: Sequence[Endpoint],
    *,
    address: str,
    bodies: Sequence[str],
    durable: bool = False,
    ttl: int | None = None,
    application_properties: Mapping[str, Any] | None = None,
    rate: float | None = None,
    timeout: float = 5.0,
    trace_space: str | None = None,
    login: Login | None = None,
) -> list[Outcome]:
    """Sends one message per body, each settled before the next, at most `rate` a second;
    their outcomes. With `trace_space`, each message is a trace of its own (`amqp.send`,
    traceparent inside, beside the application properties). When the connection is lost, the
    message in flight goes again through the next endpoint (failover.py: at least once)."""
    tracer = _tracer(trace_space)
    failover = _failover(endpoints, timeout=timeout, login=login)
    client = _connected(failover)
    pace = Pace(rate)
    try:
        sender = client.sender(address)
        outcomes = []
        for body in bodies:
            span = None
            properties = dict(application_properties or {})
            if tracer is not None:
                span, traced = message_trace.start_send(
                    tracer=tracer, address=address, space=trace_space, client_id="enmasse-cli"
                )
                properties.update(traced)
            payload = codec.encode_message(
                body, durable=durable, ttl=ttl, application_properties=properties or None
            )
            pace.wait()
            while True:
                try:
                    delivery = sender.send(payload, timeout=timeout)
                    break
                except AmqpError:
                    if not lost(client):
                        raise
                    client = _reconnected(failover, client)
                    sender = client.sender(address)
            outcomes.append(delivery.outcome or Outcome.NONE)
            if span is not None:
                message_trace.end_send(span, delivery.outcome)
        return outcomes
    except AmqpError as error:
        raise CliError(f"'{address}': {error}") from None
    except (TimeoutError, FutureTimeout):
        raise CliError(
            f"'{address}': could not send within {timeout:g} s "
            "(no credit: an anycast address needs a receiver)"
        ) from None
    finally:
        client.close()
        _flush_traces(tracer)


def _reconnected(failover: Failover[Endpoint], client: Client) -> Client:
    lost_at = failover.current
    try:
        return failover.reconnect(client)
    except NoEndpointAnswered as none:
        raise CliError(f"connection to {lost_at} lost, and then {none}") from None


class Pace:
    """At most `rate` sends a second (None: as fast as outcomes come back), on a schedule
    that does not drift: the n-th send waits until n / rate seconds after the first."""

    def __init__(self, rate: float | None) -> None:
        self._interval = 1.0 / rate if rate else 0.0
        self._start: float | None = None
        self._sent = 0

    def wait(self) -> None:
        now = time.monotonic()
        if self._start is None:
            self._start = now
        due = self._start + self._sent * self._interval
        if due > now:
            time.sleep(due - now)
        self._sent += 1


def _tracer(space: str | None) -> trace.Tracer | None:
    """The CLI's tracer when --trace was given (spans under $ENMASSE_VAR/traces), else None."""
    if space is None:
        return None
    tracing.configure_service_tracing(service="cli", space=space)
    return trace.get_tracer("enmasse.cli")


def _flush_traces(tracer: trace.Tracer | None) -> None:
    configured = tracing.current()
    if tracer is not None and configured is not None:
        configured.flush()


def _durable_source(address: str) -> Terminus:
    return Terminus(address=address, durable=2, expiry_policy="never")


def receive(
    endpoints: Sequence[Endpoint],
    *,
    address: str,
    count: int,
    timeout: float = 5.0,
    subscription: str | None = None,
    trace_space: str | None = None,
    login: Login | None = None,
) -> list[bytes]:
    """Up to `count` messages (their encoded bytes) within `timeout` seconds in all, each
    accepted; CliError when none came. With `subscription`, a durable subscription of that
    name (container and link). When the connection is lost, what is left of `count` is taken
    through the next endpoint (failover.py)."""
    tracer = _tracer(trace_space)
    deadline = time.monotonic() + timeout
    failover = _failover(endpoints, timeout=timeout, container_id=subscription, login=login)
    client = _connected(failover)
    payloads: list[bytes] = []
    try:
        while True:
            try:
                receiver = client.receiver(
                    address,
                    credit=min(count - len(payloads), RECEIVE_WINDOW),
                    name=subscription,
                    source=_durable_source(address) if subscription else None,
                )
                payloads.extend(
                    taken(
                        receiver,
                        count=count - len(payloads),
                        timeout=max(deadline - time.monotonic(), 0.0),
                        tracer=tracer,
                        space=trace_space,
                    )
                )
                break
            except AmqpError:
                if not lost(client):
                    raise
                client = _reconnected(failover, client)
        if subscription:
            receiver.detach()  # away, not gone: the subscription keeps collecting
    except AmqpError as error:
        raise CliError(f"'{address}': {error}") from None
    finally:
        client.close()
        _flush_traces(tracer)
    if not payloads:
        raise CliError(f"no message within {timeout:g} s on '{address}'")
    return payloads


def peek(
    endpoint: Endpoint,
    *,
    address: str,
    count: int,
    timeout: float = 2.0,
    login: Login | None = None,
) -> list[bytes]:
    """Up to `count` messages of a queue, browsed (`copy` distribution mode: the broker sends
    each settled and keeps it; a router passes the mode on to its brokers), in queue order;
    stops at `count` or when none came for `timeout` s. Empty: the queue holds nothing."""
    client = _connect(endpoint, timeout=max(timeout, 5.0), login=login)
    try:
        receiver = client.receiver(
            address,
            credit=count,
            source=Terminus(address=address, distribution_mode="copy"),
        )
        payloads: list[bytes] = []
        while len(payloads) < count:
            try:
                payloads.append(receiver.receive(timeout).payload)
            except TimeoutError:
                break
        return payloads
    except AmqpError as error:
        raise CliError(f"'{address}': {error}") from None
    finally:
        client.close()


def take(
    receiver: Receiver,
    *,
    count: int,
    timeout: float,
    tracer: trace.Tracer | None = None,
    space: str | None = None,
) -> list[bytes]:
    """Up to `count` messages, accepting each, until the deadline (see `taken`)."""
    return list(taken(receiver, count=count, timeout=timeout, tracer=tracer, space=space))


def taken(
    receiver: Receiver,
    *,
    count: int,
    timeout: float,
    tracer: trace.Tracer | None = None,
    space: str | None = None,
) -> Iterator[bytes]:
    """Up to `count` messages, each yielded once accepted, until the deadline; with `tracer`, a
    sampled message's `amqp.deliver` and `amqp.settle` spans. A generator so that what came
    before a lost link is kept by the caller when the AmqpError arrives."""
    deadline = time.monotonic() + timeout
    for _ in range(count):
        left = deadline - time.monotonic()
        if left <= 0:
            return
        try:
            delivery = receiver.receive(left)
        except TimeoutError:
            return
        if tracer is None:
            receiver.accept(delivery)
            yield delivery.payload
            continue
        spans = message_trace.ConsumerSpans(
            tracer=tracer, payload=delivery.payload, address=receiver.address or "", space=space
        )
        spans.handed_over()
        spans.settling()
        receiver.accept(delivery)
        spans.settled(Outcome.ACCEPTED)
        yield delivery.payload


# ---------------------------------------------------------------- the demo round


@dataclass(frozen=True)
class DemoAddress:
    kind: str
    address: str
    publish_to: str  # where the message is sent (a subscription's topic)


@dataclass(frozen=True)
class DemoResult:
    kind: str
    address: str
    sent: int
    received: int
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error and self.sent == 1 and self.received == 1

    def line(self) -> str:
        verdict = "ok" if self.ok else f"FAILED: {self.error or 'message lost'}"
        return (
            f"{self.kind:<13} {self.address:<14} sent {self.sent}, received {self.received}  "
            f"{verdict}"
        )


def demo_addresses(addresses: Sequence[resources_pb2.Address]) -> list[DemoAddress]:
    """One address per type, in DEMO_ORDER; a subscription publishes to its topic's address.
    The space's own queues (its DLQ) are not the demo's: nothing sent there is a dead letter."""
    by_name = {a.metadata.name: a for a in addresses}
    declared = [a for a in addresses if a.metadata.managed_by != SPACE_MANAGER]
    chosen: list[DemoAddress] = []
    for kind in DEMO_ORDER:
        found = sorted((a for a in declared if a.spec.type == kind), key=lambda a: a.metadata.name)
        if not found:
            continue
        first = found[0]
        publish_to = first.spec.address
        if kind == SUBSCRIPTION:
            topic = by_name.get(first.spec.topic)
            publish_to = topic.spec.address if topic is not None else first.spec.topic
        chosen.append(DemoAddress(kind=kind, address=first.spec.address, publish_to=publish_to))
    return chosen


def demo_one(
    endpoint: Endpoint,
    target: DemoAddress,
    *,
    timeout: float = 10.0,
    login: Login | None = None,
) -> DemoResult:
    """Sends one message to the address (its topic for a subscription) and reads it back,
    logged in as `login` (the demo user)."""
    body = f"hello {target.kind} {uuid.uuid4().hex[:8]}"
    sent = received = 0
    consumer = _connect(endpoint, timeout=timeout, login=login)
    producer = _connect(endpoint, timeout=timeout, login=login)
    try:
        # The receiver first: topic, anycast and multicast give nothing to the absent.
        receiver = consumer.receiver(target.address, credit=10)
        outcome = producer.sender(target.publish_to).send_async(
            codec.encode_message(body, durable=target.kind in STORED_TYPES)
        )
        # Earlier runs may have left messages here: read until ours, a bounded number of times.
        deadline = time.monotonic() + timeout
        for _ in range(100):
            got = take(receiver, count=1, timeout=max(deadline - time.monotonic(), 0.0))
            if not got or body_text(got[0]) == body:
                received = len(got)
                break
        delivery = outcome.result(max(deadline - time.monotonic(), 0.1))
        if delivery.outcome is not Outcome.ACCEPTED:
            return DemoResult(target.kind, target.address, 0, received, f"{delivery.outcome}")
        sent = 1
    except (AmqpError, TimeoutError, FutureTimeout) as error:
        return DemoResult(target.kind, target.address, sent, received, str(error) or "timed out")
    finally:
        with contextlib.suppress(Exception):
            producer.close()
        with contextlib.suppress(Exception):
            consumer.close()
    return DemoResult(target.kind, target.address, sent, received)
