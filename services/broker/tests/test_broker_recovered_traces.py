"""Messages recovered from the journal keep their traces, without a network: the sampled ones
among the recovered payloads wait again as traced messages (their residence counted from the
recovery, marked recovered), under their own trace; unsampled and context-free ones do not, and
a topic's subscription queue is traced under the topic's name."""

from __future__ import annotations

import time

from enmasse.amqp import codec
from enmasse.broker.hops import ATTR_RECOVERED, TracedMessages
from enmasse.common import tracing
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

TRACE = "0af7651916cd43dd8448eb211c80319c"
PARENT = 0xB7AD6B7169203331


def _traced() -> tuple[TracedMessages, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return TracedMessages(space="s", tracer=provider.get_tracer("tests")), exporter


def _in_annotations(flags: str) -> bytes:
    """What a router that started the trace sends on: the context in the message-annotations."""
    plain = codec.encode_message(b"x")
    return codec.with_message_annotations(
        plain, {tracing.TRACEPARENT: f"00-{TRACE}-{PARENT:016x}-{flags}"}
    )


def test_sampled_recovered_messages_wait_again_under_their_trace() -> None:
    traced, exporter = _traced()
    sampled, in_topic = _in_annotations("01"), _in_annotations("01")
    unsampled, plain = _in_annotations("00"), codec.encode_message(b"no context")
    found = traced.recovered(
        {
            "orders": [(1, sampled, 0), (2, unsampled, 0), (3, plain, 0)],
            "prices::sub-1": [(4, in_topic, 0)],
        },
        queues={"orders"},
    )
    assert found == 2
    assert traced.picked(unsampled) is None
    assert traced.picked(plain) is None
    for payload in (sampled, in_topic):
        waiting = traced.picked(payload)
        assert waiting is not None
        traced.dequeued(waiting, picked_ns=time.time_ns())
    spans = exporter.get_finished_spans()
    assert [s.name for s in spans] == [
        tracing.SPAN_QUEUE_RESIDENCE,
        tracing.SPAN_DEQUEUE,
        tracing.SPAN_QUEUE_RESIDENCE,
        tracing.SPAN_DEQUEUE,
    ]
    assert {format(s.context.trace_id, "032x") for s in spans} == {TRACE}
    assert {s.parent.span_id for s in spans} == {PARENT}
    assert all(s.attributes[ATTR_RECOVERED] is True for s in spans)
    assert [
        (s.attributes[tracing.ATTR_ADDRESS], s.attributes[tracing.ATTR_ADDRESS_TYPE]) for s in spans
    ] == [
        ("orders", "queue"),
        ("orders", "queue"),
        ("prices", "topic"),
        ("prices", "topic"),
    ]
