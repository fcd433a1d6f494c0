"""The broker's hops of a sampled message's trace: `broker.enqueue` (arrival -> owned, i.e.
stored and, when durable, fsync'd), `broker.queue_residence` (owned -> picked for a consumer)
and `broker.dequeue` (picked -> sent on the consumer's link).

What flows in: a producer's message that carries the word `traceparent` (the handler's one
check; unsampled messages never get here), then the moment the broker owns it, then the moment
a consumer link takes it. What flows out: three spans per message, children of the context the
message carries (the producer's `amqp.send`: the broker does not re-encode, so adds no
annotations), with the address, its type (queue or topic) and the space.

Why it keeps a table: queues hold `Entry` objects the tracing knows nothing of, and an entry
keeps the very `payload` bytes object that arrived (topics share one among their subscription
queues). So an owned, sampled message is remembered by its payload's identity, and the consumer
side asks `picked(payload)`: one dict lookup, and only while some sampled message waits (the
dequeue path first checks that the table is non-empty). The table is bounded: a sampled message
that is never consumed (expired, purged) is forgotten once `LIMIT` newer ones wait.

A message recovered from the journal after a restart keeps its trace: the journal holds its
bytes, trace context included, so `recovered` puts each sampled one back in the table (its
residence counted from the recovery, marked `enmasse.recovered`), and its consumer-side spans
(here, in the routers, in the consumer) join the trace its producer started.
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Mapping
from dataclasses import dataclass

from enmasse.amqp.message_trace import MARK, now_ns, record_hop, sampled_context
from enmasse.common import tracing
from opentelemetry import context as otel_context
from opentelemetry import trace

LIMIT = 10_000
ATTR_RECOVERED = "enmasse.recovered"
"""On `broker.queue_residence` / `broker.dequeue` of a message recovered from the journal: its
residence is counted from the recovery, not from its first arrival."""

_tracer: trace.Tracer | None = None


def _get_tracer() -> trace.Tracer:
    # Looked up on first use: main.py installs the provider after this module is imported.
    global _tracer
    if _tracer is None:
        _tracer = trace.get_tracer("enmasse.broker")
    return _tracer


@dataclass(slots=True)
class Arrival:
    """A sampled message between its arrival and its ownership."""

    payload: bytes
    parent: otel_context.Context
    attributes: dict[str, object]
    start_ns: int


@dataclass(slots=True)
class Waiting:
    """A sampled message the broker owns, waiting for a consumer."""

    payload: bytes
    parent: otel_context.Context
    attributes: dict[str, object]
    stored_ns: int


class TracedMessages:
    """The sampled messages one broker holds, and the spans of their hops."""

    def __init__(self, *, space: str | None = None, tracer: trace.Tracer | None = None) -> None:
        self.space = space
        self._tracer = tracer  # None: the process's global provider, looked up on first use
        self.waiting: dict[int, Waiting] = {}

    @property
    def tracer(self) -> trace.Tracer:
        if self._tracer is None:
            self._tracer = _get_tracer()
        return self._tracer

    def arrived(self, payload: bytes, *, address: str, address_type: str) -> Arrival | None:
        """An incoming message with `traceparent` in it: an Arrival when it is sampled."""
        parent = sampled_context(payload)
        if parent is None:
            return None
        attributes = tracing.span_attributes(
            address=address, space=self.space, address_type=address_type
        )
        return Arrival(payload=payload, parent=parent, attributes=attributes, start_ns=now_ns())

    def owned(self, arrival: Arrival, *, outcome: str = "accepted") -> None:
        """The broker owns it (the producer's delivery is settled now): `broker.enqueue` ends,
        the wait in the queue begins."""
        stored = now_ns()
        record_hop(
            tracer=self.tracer,
            name=tracing.SPAN_ENQUEUE,
            parent=arrival.parent,
            start_ns=arrival.start_ns,
            end_ns=stored,
            attributes={**arrival.attributes, tracing.ATTR_OUTCOME: outcome},
        )
        if len(self.waiting) >= LIMIT:
            del self.waiting[next(iter(self.waiting))]  # the oldest: dicts keep insertion order
        self.waiting[id(arrival.payload)] = Waiting(
            payload=arrival.payload,
            parent=arrival.parent,
            attributes=arrival.attributes,
            stored_ns=stored,
        )

    def rejected(self, arrival: Arrival, *, condition: str) -> None:
        record_hop(
            tracer=self.tracer,
            name=tracing.SPAN_ENQUEUE,
            parent=arrival.parent,
            start_ns=arrival.start_ns,
            end_ns=now_ns(),
            attributes={
                **arrival.attributes,
                tracing.ATTR_OUTCOME: "rejected",
                tracing.ATTR_CONDITION: condition,
            },
        )

    def recovered(
        self, messages: Mapping[str, Iterable[tuple[int, bytes, int]]], *, queues: Container[str]
    ) -> int:
        """The sampled messages among those recovered from the journal (per queue: id, payload,
        expiry), waiting again from now. A name not in `queues` is a topic's subscription queue
        (`<topic>::<identity>`): its spans name the topic. Returns how many were sampled."""
        found = 0
        stored = now_ns()
        for queue, entries in messages.items():
            for _, payload, _ in entries:
                if found >= LIMIT:
                    return found
                if MARK not in payload:
                    continue
                parent = sampled_context(payload)
                if parent is None:
                    continue
                is_queue = queue in queues
                attributes = tracing.span_attributes(
                    address=queue if is_queue else queue.split("::", 1)[0],
                    space=self.space,
                    address_type="queue" if is_queue else "topic",
                    extra={ATTR_RECOVERED: True},
                )
                self.waiting[id(payload)] = Waiting(
                    payload=payload, parent=parent, attributes=attributes, stored_ns=stored
                )
                found += 1
        return found

    def picked(self, payload: bytes) -> Waiting | None:
        """A consumer takes this message: its residence ends (None when it is not sampled)."""
        found = self.waiting.pop(id(payload), None)
        if found is None or found.payload is not payload:
            return None
        return found

    def dequeued(self, waiting: Waiting, *, picked_ns: int) -> None:
        """Sent on the consumer's link: `broker.queue_residence` and `broker.dequeue`."""
        tracer = self.tracer
        record_hop(
            tracer=tracer,
            name=tracing.SPAN_QUEUE_RESIDENCE,
            parent=waiting.parent,
            start_ns=waiting.stored_ns,
            end_ns=max(picked_ns, waiting.stored_ns),
            attributes=waiting.attributes,
        )
        record_hop(
            tracer=tracer,
            name=tracing.SPAN_DEQUEUE,
            parent=waiting.parent,
            start_ns=max(picked_ns, waiting.stored_ns),
            end_ns=now_ns(),
            attributes=waiting.attributes,
        )
