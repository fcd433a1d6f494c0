"""Message-plane spans: a sampled message's trace from producer through routers and brokers to
the consumer and back (docs/tracing.md §2-3).

What flows in: encoded AMQP messages (payload bytes) at each hop, and at the edges the client's
own calls (send, receive, settle). What flows out: spans named by `enmasse.common.tracing`
(`amqp.send`, `router.route`, `router.waypoint`, `broker.enqueue`, `broker.queue_residence`,
`broker.dequeue`, `amqp.deliver`, `amqp.settle`) on the process's global tracer provider, each
a child of the context the message carries.

Why it is built so: routers and brokers forward raw bytes and must not pay for tracing what is
not traced. `might_be_traced(payload)` is the one check an unsampled message costs: a byte
search for `traceparent` (a C-level scan over a few hundred bytes). A message that has the word
has the flags of its str8 traceparent read in place (`flagged_unsampled`); only one that may be
sampled is decoded (`sampled_context`: message-annotations first, as the W3C AMQP draft wants
for intermediaries, then application-properties) and traced if its flags say sampled.
Intermediaries here do not re-encode a sampled message, so they add no annotations: every hop's
span is a child of the producer's `amqp.send`, and the bytes travel untouched. The one exception
is a message that came without any context and whose trace a router starts
(`enmasse.router.hops`): that router writes the new trace's `traceparent` into its
message-annotations, where every later hop reads it first.

Hops are measured as explicit (start, end) wall-clock nanoseconds rather than as "current
spans", because a hop's start and end happen in different engine callbacks (arrival and
settlement; enqueue and dispatch), where no context manager could span them.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from enmasse.amqp import codec
from enmasse.amqp.wire import Outcome
from enmasse.common import tracing
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind

MARK = b"traceparent"
"""What `might_be_traced` looks for: a message without these bytes carries no trace context."""

OUTCOME_NAMES = {
    Outcome.ACCEPTED: "accepted",
    Outcome.REJECTED: "rejected",
    Outcome.RELEASED: "released",
    Outcome.MODIFIED: "modified",
    Outcome.NONE: "released",
}


def might_be_traced(payload: bytes) -> bool:
    """The hot-path check: False for every message that carries no trace context at all."""
    return MARK in payload


def sampled_context(payload: bytes) -> otel_context.Context | None:
    """The context of a sampled message (annotations win, else application-properties); None
    when the message is not sampled or its trace sections cannot be read."""
    if flagged_unsampled(payload):
        return None
    try:
        annotations = codec.read_message_annotations(payload)
        properties = None if tracing.is_sampled(annotations) else _properties(payload)
    except (codec.CodecError, IndexError, ValueError):
        return None
    carrier = annotations if tracing.is_sampled(annotations) else properties
    if not tracing.is_sampled(carrier):
        return None
    return tracing.extract_context(carrier)


_STR8_TRACEPARENT = b"\xa1\x37"  # str8-utf8 of the 55 characters a W3C traceparent has


def flagged_unsampled(payload: bytes) -> bool:
    """True when the bytes hold no `traceparent`, or when the first one is a well-formed str8
    value whose flags say 'not sampled': a propagated but unsampled message is then passed
    without decoding anything. Any other shape returns False: the sections are read properly."""
    at = payload.find(MARK)
    if at < 0:
        return True
    value = at + len(MARK)
    if payload[value : value + 2] != _STR8_TRACEPARENT or payload[value + 54] != 0x2D:  # '-'
        return False
    try:
        return not int(payload[value + 55 : value + 57], 16) & 0x01
    except ValueError:
        return False


def _properties(payload: bytes) -> dict[str, Any]:
    return codec.read_application_properties(payload)


def record_hop(
    *,
    tracer: trace.Tracer,
    name: str,
    parent: otel_context.Context,
    start_ns: int,
    end_ns: int | None = None,
    attributes: Mapping[str, Any],
) -> Span:
    """One finished hop span (or, without `end_ns`, a started one the caller ends later)."""
    span = tracer.start_span(
        name, context=parent, kind=SpanKind.INTERNAL, attributes=attributes, start_time=start_ns
    )
    if end_ns is not None:
        span.end(end_time=end_ns)
    return span


def now_ns() -> int:
    return time.time_ns()


# --- clients: producer and consumer spans ------------------------------------------------------


def start_send(
    *,
    tracer: trace.Tracer,
    address: str,
    space: str | None = None,
    address_type: str | None = None,
    client_id: str | None = None,
    body_size: int | None = None,
    application_properties: Mapping[str, Any] | None = None,
) -> tuple[Span, dict[str, Any]]:
    """Starts a message's `amqp.send` span (a new trace, sampled by the provider's ratio) and
    returns it with the application-properties to encode: the caller's plus `traceparent` (and
    `tracestate`) when the span is sampled, so an unsampled message carries nothing extra."""
    extra: dict[str, Any] = {}
    if client_id:
        extra[tracing.ATTR_CLIENT] = client_id
    if body_size is not None:
        extra[tracing.ATTR_BODY_SIZE] = body_size
    span = tracer.start_span(
        tracing.SPAN_SEND,
        context=otel_context.Context(),  # every message is a trace of its own
        kind=SpanKind.PRODUCER,
        attributes=tracing.span_attributes(
            address=address, space=space, address_type=address_type, extra=extra
        ),
    )
    properties = dict(application_properties or {})
    if span.get_span_context().trace_flags.sampled:
        tracing.inject_context(properties, context=trace.set_span_in_context(span))
    return span, properties


def end_send(span: Span, outcome: Outcome | None, *, condition: str | None = None) -> None:
    """Ends `amqp.send` with the disposition that came back from the network."""
    if outcome is not None:
        span.set_attribute(tracing.ATTR_OUTCOME, OUTCOME_NAMES.get(outcome, "released"))
    if condition:
        span.set_attribute(tracing.ATTR_CONDITION, condition)
    span.end()


class ConsumerSpans:
    """A consumer's view of one received message: `amqp.deliver` from arrival to the hand-over
    to the application, then `amqp.settle` around the application's disposition."""

    def __init__(
        self,
        *,
        tracer: trace.Tracer,
        payload: bytes,
        address: str,
        space: str | None = None,
        address_type: str | None = None,
        arrived_ns: int | None = None,
    ) -> None:
        self.tracer = tracer
        self.parent = sampled_context(payload) if might_be_traced(payload) else None
        self.attributes = tracing.span_attributes(
            address=address, space=space, address_type=address_type
        )
        self.arrived_ns = arrived_ns if arrived_ns is not None else now_ns()
        self._settle_start = 0

    @property
    def traced(self) -> bool:
        return self.parent is not None

    def handed_over(self) -> None:
        """The application has the message now: the end of `amqp.deliver`."""
        if self.parent is None:
            return
        span = self.tracer.start_span(
            tracing.SPAN_DELIVER,
            context=self.parent,
            kind=SpanKind.CONSUMER,
            attributes=self.attributes,
            start_time=self.arrived_ns,
        )
        span.end()

    def settling(self) -> None:
        self._settle_start = now_ns()

    def settled(self, outcome: Outcome) -> None:
        """The disposition went back: `amqp.settle` carries its outcome."""
        if self.parent is None:
            return
        attributes = {**self.attributes, tracing.ATTR_OUTCOME: OUTCOME_NAMES.get(outcome, "")}
        record_hop(
            tracer=self.tracer,
            name=tracing.SPAN_SETTLE,
            parent=self.parent,
            start_ns=self._settle_start or now_ns(),
            end_ns=now_ns(),
            attributes=attributes,
        )
