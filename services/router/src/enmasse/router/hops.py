"""The router's hop of a sampled message's trace: `router.waypoint` (a producer's delivery on its
way to a broker) or `router.route` (to a consumer: anycast, multicast, back from a broker, or
through the mesh).

What flows in: a delivery the forwarding core is about to handle, already known to carry the
word `traceparent` (the only check the unsampled hot path pays, in `Router.message`). What flows
out: one span, a child of the message's own context, from the delivery's arrival to the moment
the core handed it on (sent on a link, parked waiting for credit, or settled), with the address,
its type and the space. The router never re-encodes a message, so it adds no annotations: the
bytes go on untouched and the next hop reads the producer's `traceparent`.
"""

from __future__ import annotations

from collections.abc import Callable

from enmasse.amqp.message_trace import now_ns, record_hop, sampled_context
from enmasse.common import tracing
from opentelemetry import trace

_tracer: trace.Tracer | None = None


def _get_tracer() -> trace.Tracer:
    # Looked up on first use: main.py installs the provider after this module is imported.
    global _tracer
    if _tracer is None:
        _tracer = trace.get_tracer("enmasse.router")
    return _tracer


def traced_hop(
    payload: bytes,
    *,
    waypoint: bool,
    address: str | None,
    address_type: str | None,
    space: str | None,
    forward: Callable[[], None],
) -> None:
    """Runs `forward` and, when the message is sampled, records it as this router's hop."""
    parent = sampled_context(payload)
    if parent is None:
        forward()
        return
    start = now_ns()
    forward()
    record_hop(
        tracer=_get_tracer(),
        name=tracing.SPAN_WAYPOINT if waypoint else tracing.SPAN_ROUTE,
        parent=parent,
        start_ns=start,
        end_ns=now_ns(),
        attributes=tracing.span_attributes(
            address=address or "", space=space, address_type=address_type
        ),
    )
