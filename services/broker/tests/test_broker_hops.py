"""The broker's hops of a sampled message without a network: enqueue, residence and dequeue as
children of the message's context, in order, and nothing remembered for unsampled messages."""

from __future__ import annotations

import time

from enmasse.amqp import codec
from enmasse.broker.hops import LIMIT, TracedMessages
from enmasse.common import tracing
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = 0x00F067AA0BA902B7


def _traced() -> tuple[TracedMessages, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return TracedMessages(space="s", tracer=provider.get_tracer("tests")), exporter


def _payload(flags: str) -> bytes:
    return codec.encode_message(
        b"x", application_properties={"traceparent": f"00-{TRACE}-{PARENT:016x}-{flags}"}
    )


def test_a_sampled_message_gets_its_three_broker_hops_in_order() -> None:
    traced, exporter = _traced()
    payload = _payload("01")
    arrival = traced.arrived(payload, address="orders", address_type="queue")
    assert arrival is not None
    traced.owned(arrival)
    waiting = traced.picked(payload)
    assert waiting is not None
    traced.dequeued(waiting, picked_ns=time.time_ns())
    spans = exporter.get_finished_spans()
    assert [s.name for s in spans] == [
        tracing.SPAN_ENQUEUE,
        tracing.SPAN_QUEUE_RESIDENCE,
        tracing.SPAN_DEQUEUE,
    ]
    assert {s.parent.span_id for s in spans} == {PARENT}
    assert {format(s.context.trace_id, "032x") for s in spans} == {TRACE}
    assert spans[0].end_time <= spans[1].start_time <= spans[1].end_time <= spans[2].start_time
    assert spans[0].attributes[tracing.ATTR_OUTCOME] == "accepted"
    assert spans[2].attributes[tracing.ATTR_ADDRESS] == "orders"
    assert spans[2].attributes[tracing.ATTR_SPACE] == "s"
    assert traced.waiting == {}  # picked once: a redelivery is not a second residence


def test_an_unsampled_message_is_not_remembered() -> None:
    traced, exporter = _traced()
    assert traced.arrived(_payload("00"), address="orders", address_type="queue") is None
    assert traced.picked(_payload("00")) is None
    assert exporter.get_finished_spans() == ()


def test_messages_never_consumed_are_forgotten_beyond_the_limit() -> None:
    traced, _exporter = _traced()
    payloads = [_payload("01") + bytes([n % 256]) * (n // 256 + 1) for n in range(LIMIT + 5)]
    for payload in payloads:
        arrival = traced.arrived(payload, address="orders", address_type="queue")
        assert arrival is not None
        traced.owned(arrival)
    assert len(traced.waiting) == LIMIT
    assert traced.picked(payloads[0]) is None  # the oldest went first
    assert traced.picked(payloads[-1]) is not None
