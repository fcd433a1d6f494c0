"""The message-plane helpers of enmasse.common.tracing, per the W3C Trace Context AMQP draft: a
producer's span context goes into application-properties as `traceparent`, survives the trip as
plain strings (what an AMQP map holds), comes back out as the same trace and span with the
sampled flag; an intermediary's hop, written into message-annotations, wins over the producer's;
`is_sampled` (the hot-path check) says yes only for a well-formed, sampled traceparent.
No network: these are pure functions over dict carriers.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import cast

import pytest
from enmasse.common import tracing
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult
from proton import symbol


class _Discard:
    """An exporter that keeps nothing: these tests read contexts, not exported spans."""

    def export(self, spans: object) -> SpanExportResult:
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        return None

    def force_flush(self, timeout_millis: int = 0) -> bool:
        return True


@pytest.fixture
def tracer() -> Iterator[trace.Tracer]:
    setup = tracing.build_tracing(service="probe", ratio=1.0, exporter=_Discard())  # type: ignore[arg-type]
    yield setup.provider.get_tracer("test")
    setup.shutdown()


def _parent_id(span: trace.Span) -> int | None:
    parent = cast(ReadableSpan, span).parent
    return parent.span_id if parent is not None else None


def test_traceparent_round_trips_through_application_properties(tracer: trace.Tracer) -> None:
    properties: dict[str, object] = {"order-id": 7}
    with tracer.start_as_current_span(tracing.SPAN_SEND) as span:
        tracing.inject_context(properties)
        sent = span.get_span_context()
    assert properties["order-id"] == 7
    traceparent = properties[tracing.TRACEPARENT]
    assert isinstance(traceparent, str)
    # Flags: bit 0 = sampled; the SDK also sets bit 1 (Trace Context level 2: random trace id).
    assert re.fullmatch(r"00-[0-9a-f]{32}-[0-9a-f]{16}-0[13]", traceparent)
    assert traceparent.startswith(f"00-{sent.trace_id:032x}-{sent.span_id:016x}-")

    received = trace.get_current_span(tracing.extract_context(properties)).get_span_context()
    assert received.trace_id == sent.trace_id
    assert received.span_id == sent.span_id
    assert received.is_remote
    assert received.trace_flags.sampled
    assert tracing.is_sampled(properties)


def test_intermediary_annotation_is_the_parent_of_the_next_hop(tracer: trace.Tracer) -> None:
    properties: dict[str, object] = {}
    with tracer.start_as_current_span(tracing.SPAN_SEND) as send:
        tracing.inject_context(properties)
    # The router continues the producer's trace and writes its own hop into the annotations,
    # leaving the application's properties as the producer set them.
    producer_context = tracing.message_context(annotations=None, properties=properties)
    annotations: dict[str, object] = {symbol("x-opt-jms-dest"): 0}
    with tracer.start_as_current_span(tracing.SPAN_ROUTE, context=producer_context) as route:
        tracing.inject_context(annotations)
    assert f"-{send.get_span_context().span_id:016x}-" in properties[tracing.TRACEPARENT]  # type: ignore[operator]

    nearest = tracing.message_context(annotations=annotations, properties=properties)
    with tracer.start_as_current_span(tracing.SPAN_ENQUEUE, context=nearest) as enqueue:
        pass
    assert _parent_id(enqueue) == route.get_span_context().span_id
    assert enqueue.get_span_context().trace_id == send.get_span_context().trace_id
    assert _parent_id(route) == send.get_span_context().span_id


def test_symbol_keys_from_a_decoded_amqp_map_are_found() -> None:
    value = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    # Decoded AMQP maps have symbol keys (a str subclass).
    annotations: dict[str, object] = {
        symbol("traceparent"): value,
        symbol("tracestate"): "congo=t61rcWkgMzE",
    }
    context = tracing.extract_context(annotations)
    span_context = trace.get_current_span(context).get_span_context()
    assert f"{span_context.trace_id:032x}" == "0af7651916cd43dd8448eb211c80319c"
    assert span_context.trace_state.get("congo") == "t61rcWkgMzE"
    assert tracing.is_sampled(annotations)


def test_nothing_is_injected_outside_a_span() -> None:
    carrier: dict[str, object] = {}
    tracing.inject_context(carrier)
    assert carrier == {}


def test_unsampled_span_is_propagated_with_the_flag_off() -> None:
    setup = tracing.build_tracing(service="probe", ratio=0.0, exporter=_Discard())  # type: ignore[arg-type]
    try:
        with setup.provider.get_tracer("test").start_as_current_span(tracing.SPAN_SEND):
            carrier = tracing.inject_context({})
    finally:
        setup.shutdown()
    assert carrier[tracing.TRACEPARENT][-2:] in ("00", "02")  # sampled bit off
    assert not tracing.is_sampled(carrier)


@pytest.mark.parametrize(
    "carrier",
    [
        None,
        {},
        {"traceparent": 17},
        {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"},
        {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-zz"},
        {"traceparent": "garbage"},
        {"other": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
    ],
)
def test_is_sampled_says_no_to_missing_unsampled_and_malformed(carrier: dict | None) -> None:
    assert not tracing.is_sampled(carrier)


def test_malformed_traceparent_extracts_to_no_parent() -> None:
    context = tracing.extract_context({"traceparent": "00-not-a-trace-01"})
    assert not trace.get_current_span(context).get_span_context().is_valid


def test_span_attributes_use_the_names_analytics_reads() -> None:
    assert tracing.span_attributes(
        address="orders", space="tenant-a", address_type="queue", extra={"enmasse.outcome": "x"}
    ) == {
        "messaging.destination.name": "orders",
        "enmasse.space": "tenant-a",
        "enmasse.address_type": "queue",
        "enmasse.outcome": "x",
    }
