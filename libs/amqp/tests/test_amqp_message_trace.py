"""The message-plane tracing helpers without a network: which payloads count as sampled, what a
producer's send puts into the message, and the consumer's spans, read back from an in-memory
exporter."""

from __future__ import annotations

from enmasse.amqp import codec
from enmasse.amqp.engine import Outcome
from enmasse.amqp.message_trace import (
    ConsumerSpans,
    end_send,
    might_be_traced,
    sampled_context,
    start_send,
)
from enmasse.common import tracing
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
SAMPLED = f"00-{TRACE}-00f067aa0ba902b7-01"
NOT_SAMPLED = f"00-{TRACE}-00f067aa0ba902b7-00"


def _tracer(*, on: bool = True) -> tuple[trace.Tracer, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=ALWAYS_ON if on else ALWAYS_OFF)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider.get_tracer("tests"), exporter


def _trace_id(context: object) -> str:
    span_context = trace.get_current_span(context).get_span_context()  # type: ignore[arg-type]
    return format(span_context.trace_id, "032x")


def test_only_a_sampled_traceparent_gives_a_context() -> None:
    plain = codec.encode_message(b"x", application_properties={"n": 1})
    unsampled = codec.encode_message(b"x", application_properties={"traceparent": NOT_SAMPLED})
    sampled = codec.encode_message(b"x", application_properties={"traceparent": SAMPLED})
    assert not might_be_traced(plain)
    assert sampled_context(plain) is None
    assert sampled_context(unsampled) is None
    assert _trace_id(sampled_context(sampled)) == TRACE


def test_annotations_win_over_application_properties() -> None:
    other = "0af7651916cd43dd8448eb211c80319c"
    payload = codec.encode_message(
        b"x",
        message_annotations={"traceparent": f"00-{other}-b7ad6b7169203331-01"},
        application_properties={"traceparent": SAMPLED},
    )
    assert _trace_id(sampled_context(payload)) == other


def test_a_malformed_traceparent_is_not_sampled() -> None:
    for bad in ("00-xyz-01", f"00-{TRACE}-00f067aa0ba902b7-zz", "traceparent"):
        payload = codec.encode_message(b"x", application_properties={"traceparent": bad})
        assert sampled_context(payload) is None, bad
    assert sampled_context(b"\x00Sw\xa1\x0btraceparent") is None  # the word in a body


def test_a_sampled_send_carries_its_own_traceparent_and_outcome() -> None:
    tracer, exporter = _tracer()
    span, properties = start_send(
        tracer=tracer, address="orders", space="s", application_properties={"n": 7}
    )
    payload = codec.encode_message(b"x", application_properties=properties)
    end_send(span, Outcome.ACCEPTED)
    (finished,) = exporter.get_finished_spans()
    assert finished.name == tracing.SPAN_SEND
    assert finished.attributes[tracing.ATTR_OUTCOME] == "accepted"
    assert codec.read_application_properties(payload)["n"] == 7
    assert _trace_id(sampled_context(payload)) == format(finished.context.trace_id, "032x")


def test_an_unsampled_send_adds_nothing_to_the_message() -> None:
    tracer, exporter = _tracer(on=False)
    span, properties = start_send(tracer=tracer, address="orders")
    end_send(span, Outcome.ACCEPTED)
    assert properties == {}
    assert exporter.get_finished_spans() == ()


def test_consumer_spans_are_children_of_the_message_and_carry_the_outcome() -> None:
    tracer, exporter = _tracer()
    payload = codec.encode_message(b"x", application_properties={"traceparent": SAMPLED})
    spans = ConsumerSpans(tracer=tracer, payload=payload, address="orders", address_type="queue")
    spans.handed_over()
    spans.settling()
    spans.settled(Outcome.REJECTED)
    deliver, settle = exporter.get_finished_spans()
    assert [deliver.name, settle.name] == [tracing.SPAN_DELIVER, tracing.SPAN_SETTLE]
    assert {format(s.context.trace_id, "032x") for s in (deliver, settle)} == {TRACE}
    assert {s.parent.span_id for s in (deliver, settle)} == {0x00F067AA0BA902B7}
    assert settle.attributes[tracing.ATTR_OUTCOME] == "rejected"
    assert deliver.end_time <= settle.start_time


def test_consumer_of_an_unsampled_message_records_nothing() -> None:
    tracer, exporter = _tracer()
    payload = codec.encode_message(b"x", application_properties={"traceparent": NOT_SAMPLED})
    spans = ConsumerSpans(tracer=tracer, payload=payload, address="orders")
    spans.handed_over()
    spans.settled(Outcome.ACCEPTED)
    assert not spans.traced
    assert exporter.get_finished_spans() == ()
