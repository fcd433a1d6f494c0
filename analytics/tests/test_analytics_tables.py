"""The analytics tables on known traffic (analytics/tests/conftest.py tells the story of it):
windows, percentiles, per-hop sums, errors by condition, per-tenant counts, control-plane times,
each compared with the answer worked out by hand. One Spark session for all (tests/fixtures).
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from enmasse.analytics import synthetic, tables
from enmasse.analytics.job import rows
from enmasse.analytics.spans import load_spans
from enmasse.common import tracing
from opentelemetry import trace

# The known answers restate the traffic of conftest.py (T0 aligned to a 10 s window).
T0 = 1_700_000_000 * 10**9
ORDERS_E2E_MS = (10, 20, 30, 40, 50)

pytestmark = pytest.mark.slow


def _window(offset_s: int) -> str:
    return datetime.fromtimestamp(T0 // 10**9 + offset_s, UTC).strftime("%Y-%m-%d %H:%M:%S")


def test_spans_are_flattened_with_resource_and_attributes(scenario_spans: Any) -> None:
    assert scenario_spans.count() == 5 * 8 + 4 * 4 + 2 + 6
    (send,) = rows(
        scenario_spans.filter("name = 'amqp.send' and client_id = 'app-2' and address = 'orders'")
        .orderBy("start_ns")
        .limit(1)
    )
    assert send["service"] == "enmasse-client"
    assert send["space"] == "tenant-a"
    assert send["address_type"] == "queue"
    assert send["kind"] == "PRODUCER"
    assert send["parent_span_id"] is None
    assert send["body_size"] == 1000
    assert send["start_ns"] == T0 + 12 * 10**9
    assert send["status"] == "UNSET"
    (rpc,) = rows(scenario_spans.filter("rpc_method = 'CreateAddress' and grpc_status = 6"))
    assert rpc["kind"] == "SERVER"
    assert rpc["service"] == "enmasse-config"


def test_throughput_counts_messages_per_ten_second_window(scenario_spans: Any) -> None:
    per_address = rows(tables.throughput(scenario_spans, window_seconds=10))
    orders = [
        (r["window_start"], r["sent"], r["delivered"], r["bytes_sent"])
        for r in per_address
        if r["address"] == "orders"
    ]
    assert orders == [
        (_window(0), 3, 3, 3000),
        (_window(10), 1, 1, 1000),
        (_window(20), 1, 1, 1000),
    ]
    events = [
        (r["window_start"], r["sent"], r["delivered"])
        for r in per_address
        if r["address"] == "events"
    ]
    assert events == [(_window(0), 5, 4)]  # one released, never delivered

    per_space = rows(tables.throughput(scenario_spans, window_seconds=10, keys=("space",)))
    assert [(r["space"], r["window_start"], r["sent"], r["sent_per_s"]) for r in per_space] == [
        ("tenant-a", _window(0), 3, 0.3),
        ("tenant-b", _window(0), 5, 0.5),
        ("tenant-a", _window(10), 1, 0.1),
        ("tenant-a", _window(20), 1, 0.1),
    ]


def test_throughput_refuses_a_window_that_is_not_positive(scenario_spans: Any) -> None:
    with pytest.raises(ValueError, match="window must be a positive number of seconds, not 0"):
        tables.throughput(scenario_spans, window_seconds=0)


def test_end_to_end_percentiles_per_address_and_type(scenario_spans: Any) -> None:
    messages = tables.messages(scenario_spans)
    by_address = {r["address"]: r for r in rows(tables.latency(messages))}
    orders = by_address["orders"]
    assert orders["messages"] == 5
    assert orders["p50_ms"] == pytest.approx(30.0)
    assert orders["p95_ms"] == pytest.approx(48.0)
    assert orders["p99_ms"] == pytest.approx(49.6)
    assert orders["max_ms"] == pytest.approx(50.0)
    assert orders["mean_ms"] == pytest.approx(30.0)
    events = by_address["events"]
    assert events["messages"] == 4  # the released one is not a delivered message
    assert events["p50_ms"] == pytest.approx(4.3)
    assert events["p99_ms"] == pytest.approx(4.3)

    by_type = {r["address_type"]: r for r in rows(tables.latency(messages, keys=("address_type",)))}
    assert set(by_type) == {"queue", "anycast"}
    assert by_type["queue"]["p95_ms"] == pytest.approx(48.0)


def test_every_message_has_its_path_and_hops_sum_to_at_most_end_to_end(
    scenario_spans: Any,
) -> None:
    messages = rows(tables.messages(scenario_spans))
    assert len(messages) == 10
    orders = sorted((m for m in messages if m["address"] == "orders"), key=lambda m: m["start_ns"])
    assert [round(m["e2e_ns"] / 1e6, 3) for m in orders] == list(map(float, ORDERS_E2E_MS))
    for message in orders:
        assert message["path"] == [
            "router.waypoint",
            "broker.enqueue",
            "broker.queue_residence",
            "broker.dequeue",
            "router.route",
            "amqp.deliver",
            "amqp.settle",
        ]
        assert message["hop_sum_ns"] == message["e2e_ns"] - 7 * 100_000
    for message in messages:
        if message["delivered"]:
            assert 0 < message["hop_sum_ns"] <= message["e2e_ns"]
    released = [m for m in messages if not m["delivered"]]
    assert [(m["address"], m["path"], m["e2e_ns"]) for m in released] == [
        ("events", ["router.route"], None)
    ]


def test_hop_breakdown_per_address(scenario_spans: Any) -> None:
    hops = rows(tables.hop_latency(scenario_spans))
    orders = [
        (r["hop"], r["spans"], round(r["mean_ms"], 6)) for r in hops if r["address"] == "orders"
    ]
    residence = sum(ORDERS_E2E_MS) / 5 - 7.7
    assert orders == [
        ("router.route", 5, 1.0),
        ("router.waypoint", 5, 1.0),
        ("broker.enqueue", 5, 2.0),
        ("broker.queue_residence", 5, round(residence, 6)),
        ("broker.dequeue", 5, 1.0),
        ("amqp.deliver", 5, 1.0),
        ("amqp.settle", 5, 1.0),
    ]
    events = {r["hop"]: (r["spans"], r["p50_ms"]) for r in hops if r["address"] == "events"}
    assert events == {
        "router.route": (5, 1.0),
        "amqp.deliver": (4, 2.0),
        "amqp.settle": (4, 1.0),
    }


def test_errors_and_rejections_by_condition(scenario_spans: Any) -> None:
    found = {
        (r["space"], r["span"], r["condition"]): r["count"]
        for r in rows(tables.errors(scenario_spans))
    }
    assert found == {
        ("tenant-b", tracing.SPAN_SETTLE, "amqp:not-allowed"): 1,  # the consumer's rejection
        ("tenant-b", tracing.SPAN_SEND, "rejected"): 1,  # ... as the producer saw it
        ("tenant-b", tracing.SPAN_ROUTE, "released"): 1,  # no consumer
        ("tenant-b", tracing.SPAN_SEND, "released"): 1,
        (None, "/enmasse.v1.ConfigService/CreateAddress", "grpc:ALREADY_EXISTS"): 1,
    }


def test_top_talkers_per_tenant(scenario_spans: Any) -> None:
    top_two = [
        (r["space"], r["rank"], r["client_id"], r["messages"], r["bytes"])
        for r in rows(tables.top_talkers(scenario_spans, top=2))
    ]
    assert top_two == [
        ("tenant-a", 1, "app-1", 3, 3000),
        ("tenant-a", 2, "app-2", 2, 2000),
        ("tenant-b", 1, "sensor-1", 5, 50),
    ]
    top_one = rows(tables.top_talkers(scenario_spans, top=1))
    assert [(r["space"], r["client_id"]) for r in top_one] == [
        ("tenant-a", "app-1"),
        ("tenant-b", "sensor-1"),
    ]


def test_address_create_to_active(scenario_spans: Any) -> None:
    found = {
        (r["space"], r["address"]): r["create_to_active_ms"]
        for r in rows(tables.address_readiness(scenario_spans))
    }
    assert found == {("tenant-a", "orders"): 250.0, ("tenant-b", "events"): None}


def test_rpc_latency_per_method(scenario_spans: Any) -> None:
    (create,) = rows(tables.rpc_latency(scenario_spans))
    assert (create["service"], create["rpc_method"], create["calls"], create["errors"]) == (
        "enmasse-config",
        "CreateAddress",
        2,
        1,
    )
    assert create["p50_ms"] == pytest.approx(3.0)
    assert create["mean_ms"] == pytest.approx(3.0)


def test_malformed_lines_are_counted_and_the_rest_is_read(spark: Any, tmp_path: Path) -> None:
    ids = synthetic.Ids(seed=3)
    records = synthetic.message_trace(
        ids,
        start_ns=T0,
        space="s",
        address="a",
        address_type="anycast",
        client_id="c",
        hops=[(tracing.SPAN_ROUTE, 10)],
    )
    (path,) = synthetic.write_spans(tmp_path, records[:1])
    with path.open("a") as out:
        out.write('{"resourceSpans": [ {"torn line of a killed process\n')
        out.write("not json at all\n")
    spans, malformed = load_spans(spark, [tmp_path])
    assert malformed == 2
    assert [r["name"] for r in rows(spans)] == ["amqp.send"]


def test_no_span_files_is_a_precise_error(spark: Any, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"no span files \(\*\.jsonl, \*\.json\) in "):
        load_spans(spark, [tmp_path / "missing"])


def test_files_written_by_the_sdk_read_like_generated_ones(spark: Any, tmp_path: Path) -> None:
    """The real exporter (opentelemetry-exporter-otlp-json-file, via enmasse.common.tracing)
    and the generator write the same format: the job reads the SDK's spans the same way."""
    setup = tracing.build_tracing(service="router", space="tenant-x", var_dir=tmp_path, ratio=1.0)
    tracer = setup.provider.get_tracer("test")
    attributes = tracing.span_attributes(address="orders", address_type="queue")
    send = tracer.start_span(tracing.SPAN_SEND, start_time=T0, attributes=attributes)
    with trace.use_span(send, end_on_exit=False):
        route = tracer.start_span(tracing.SPAN_ROUTE, start_time=T0 + 5_000, attributes=attributes)
        route.end(end_time=T0 + 7_500)
    send.end(end_time=T0 + 10_000)
    setup.shutdown()

    spans, malformed = load_spans(spark, [tmp_path / "traces"])
    assert malformed == 0
    by_name = {r["name"]: r for r in rows(spans)}
    assert set(by_name) == {tracing.SPAN_SEND, tracing.SPAN_ROUTE}
    hop = by_name[tracing.SPAN_ROUTE]
    assert hop["service"] == "enmasse-router"
    assert hop["space"] == "tenant-x"  # from the resource: the span did not name it
    assert hop["address"] == "orders"
    assert hop["kind"] == "INTERNAL"
    assert hop["duration_ns"] == 2_500
    assert hop["parent_span_id"] == by_name[tracing.SPAN_SEND]["span_id"]
    assert hop["trace_id"] == by_name[tracing.SPAN_SEND]["trace_id"]
    (message,) = rows(tables.messages(spans))
    assert message["path"] == [tracing.SPAN_ROUTE]
    assert message["hop_sum_ns"] == 2_500
