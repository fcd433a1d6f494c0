"""The router's part of a sampled message's trace: its hop (`router.waypoint`, a producer's
delivery on its way to a broker, or `router.route`, towards a consumer: anycast, multicast, back
from a broker, or through the mesh), the trace it starts for a message that came without one,
and `router.deliver`, the delivery to a consumer up to the consumer's settlement.

What flows in: a delivery the forwarding core is about to handle, either known to carry the word
`traceparent` (the check every message pays, in `Router.message`) or picked by the space's
sampling (`sampling_ticks`: one `next()` per untraced producer message, which allocates
nothing). What flows out: the hop's span, a child of the message's own context, from the
delivery's arrival to the moment the core handed it on (sent on a link, parked waiting for
credit, or settled), with the address, its type and the space; and, when a consumer's outcome
comes back for it, `router.deliver` from that hand-over to the outcome, so end-to-end latency
exists even when the consumer does not trace.

A message the router starts the trace of is the one it changes: its hop span is the trace's
root (no parent: analytics takes it for the message, in place of a producer's `amqp.send`), and
its `traceparent` goes into the message-annotations (the W3C AMQP draft's place for an
intermediary), so brokers and the next routers trace it like any other sampled message. Only
these messages are re-encoded, and only that one section; every other message travels byte
for byte as it came.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Iterator
from typing import Any

from enmasse.amqp import codec
from enmasse.amqp.engine import Delivery, Outcome
from enmasse.amqp.message_trace import OUTCOME_NAMES, now_ns, record_hop, sampled_context
from enmasse.common import tracing
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import SpanKind

ANNOTATION_ROOM = 96
"""Bytes a started trace may add to a message (its traceparent annotation, at most ~80): a
message closer than this to the space's size limit is not picked, so tracing never makes a
message too big to be accepted."""

_tracer: trace.Tracer | None = None


def _get_tracer() -> trace.Tracer:
    # Looked up on first use: main.py installs the provider after this module is imported.
    global _tracer
    if _tracer is None:
        _tracer = trace.get_tracer("enmasse.router")
    return _tracer


def sampling_ticks(share: float) -> Iterator[bool]:
    """True for one untraced message in every round(1 / share) (never when share is 0): the
    space's sampling as the hot path asks it, one `next()` on a cycle of shared bools, which
    allocates nothing. Validated shares (`tracing.router_sampling_problem`) keep the cycle at
    10,000 entries at most. The n-th, 2n-th, ... untraced message of a router is picked."""
    if share <= 0:
        return itertools.repeat(False)
    every = max(1, round(1 / share))
    return itertools.cycle((False,) * (every - 1) + (True,))


class RouterTrace:
    """A sampled delivery's trace in this router: its hop's context (the parent of
    `router.deliver`), the attributes it shares, and when the hop handed it on."""

    __slots__ = ("attributes", "context", "handed_ns")

    def __init__(self, *, context: otel_context.Context, attributes: dict[str, Any]) -> None:
        self.context = context
        self.attributes = attributes
        self.handed_ns = 0


def traced_hop(
    delivery: Delivery,
    *,
    start_trace: bool,
    waypoint: bool,
    address: str | None,
    address_type: str | None,
    space: str | None,
    forward: Callable[[], None],
) -> None:
    """Runs `forward` and, when the message is sampled (or `start_trace`: this router picked
    it), records it as this router's hop and marks the delivery for `delivered`."""
    if start_trace:
        parent = otel_context.Context()  # a new trace: this hop is its root
    else:
        found = sampled_context(delivery.payload)
        if found is None:
            forward()
            return
        parent = found
    attributes = tracing.span_attributes(
        address=address or "", space=space, address_type=address_type
    )
    span = _get_tracer().start_span(
        tracing.SPAN_WAYPOINT if waypoint else tracing.SPAN_ROUTE,
        context=parent,
        kind=SpanKind.INTERNAL,
        attributes=attributes,
        start_time=now_ns(),
    )
    if not span.get_span_context().trace_flags.sampled:
        # The process's own ratio (ENMASSE_TRACE_SAMPLING) turned the new trace down.
        forward()
        return
    here = trace.set_span_in_context(span)
    if start_trace:
        _carry_context(delivery, here)
    hop = RouterTrace(context=here, attributes=attributes)
    delivery.trace = hop
    forward()
    hop.handed_ns = handed = now_ns()
    span.end(end_time=handed)


def _carry_context(delivery: Delivery, context: otel_context.Context) -> None:
    """Writes the new trace's context into the message's annotations; a message whose sections
    cannot be read travels unchanged (its trace then ends at this hop)."""
    carrier: dict[str, Any] = {}
    tracing.inject_context(carrier, context=context)
    with contextlib.suppress(codec.CodecError, IndexError, ValueError):
        delivery.payload = codec.with_message_annotations(delivery.payload, carrier)


def delivered(hop: RouterTrace, outcome: Outcome) -> None:
    """A consumer settled a sampled message this router handed it: `router.deliver`, from the
    hand-over to this outcome."""
    end = now_ns()
    record_hop(
        tracer=_get_tracer(),
        name=tracing.SPAN_ROUTER_DELIVER,
        parent=hop.context,
        start_ns=min(hop.handed_ns or end, end),
        end_ns=end,
        attributes={**hop.attributes, tracing.ATTR_OUTCOME: OUTCOME_NAMES.get(outcome, "released")},
    )
