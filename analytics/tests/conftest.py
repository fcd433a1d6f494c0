"""The known traffic the analytics tests check the job's answers against.

T0 is aligned to a 10 s window. Two tenants:

- tenant-a / `orders` (queue): 5 messages at T0 + 1, 2, 3, 12, 25 s (windows: 3, 1, 1); app-1
  sends the first three, app-2 the last two. Hops: waypoint 1 ms, enqueue 2 ms, queue residence R,
  dequeue 1, route 1, deliver 1, settle 1 ms, with 0.1 ms between hops (7 gaps), so
  end-to-end = 7.7 ms + R; R is chosen for end-to-end 10, 20, 30, 40, 50 ms:
  p50 30, p95 48, p99 49.6 ms (linear interpolation), hop sum = e2e - 0.7 ms.
- tenant-b / `events` (anycast): 4 messages at T0 + 5..8 s by sensor-1 (route 1, deliver 2,
  settle 1 ms: e2e 4.3 ms); the consumer rejects the second with amqp:not-allowed; a fifth message
  at T0 + 9 s finds no consumer: the router releases it (route only, never delivered).
- control plane: tenant-a/orders created at T0, Pending at +0.1 s, Active at +0.25 s (250 ms);
  tenant-b/events created, never Active. ConfigService/CreateAddress server spans of 2 and 4 ms,
  the second refused with ALREADY_EXISTS (gRPC 6).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from enmasse.analytics import synthetic
from enmasse.analytics.synthetic import SpanRecord
from enmasse.common import tracing

MS = 1_000_000
S = 1_000_000_000
T0 = 1_700_000_000 * S
GAP = MS // 10
ORDERS_E2E_MS = (10, 20, 30, 40, 50)


def _orders(ids: synthetic.Ids) -> list[SpanRecord]:
    records = []
    sends = [(1, "app-1"), (2, "app-1"), (3, "app-1"), (12, "app-2"), (25, "app-2")]
    for (second, client), e2e_ms in zip(sends, ORDERS_E2E_MS, strict=True):
        residence = e2e_ms * MS - 7 * MS - 7 * GAP
        hops = [
            (tracing.SPAN_WAYPOINT, 1 * MS),
            (tracing.SPAN_ENQUEUE, 2 * MS),
            (tracing.SPAN_QUEUE_RESIDENCE, residence),
            (tracing.SPAN_DEQUEUE, 1 * MS),
            (tracing.SPAN_ROUTE, 1 * MS),
            (tracing.SPAN_DELIVER, 1 * MS),
            (tracing.SPAN_SETTLE, 1 * MS),
        ]
        records += synthetic.message_trace(
            ids,
            start_ns=T0 + second * S,
            space="tenant-a",
            address="orders",
            address_type="queue",
            client_id=client,
            hops=hops,
            gap_ns=GAP,
            body_size=1000,
        )
    return records


def _events(ids: synthetic.Ids) -> list[SpanRecord]:
    records = []
    direct = [
        (tracing.SPAN_ROUTE, 1 * MS),
        (tracing.SPAN_DELIVER, 2 * MS),
        (tracing.SPAN_SETTLE, MS),
    ]
    for second in (5, 6, 7, 8):
        rejected = second == 6
        settle = (
            {tracing.ATTR_OUTCOME: "rejected", tracing.ATTR_CONDITION: "amqp:not-allowed"}
            if rejected
            else {tracing.ATTR_OUTCOME: "accepted"}
        )
        records += synthetic.message_trace(
            ids,
            start_ns=T0 + second * S,
            space="tenant-b",
            address="events",
            address_type="anycast",
            client_id="sensor-1",
            hops=direct,
            gap_ns=GAP,
            body_size=10,
            outcome="rejected" if rejected else "accepted",
            hop_attributes={tracing.SPAN_SETTLE: settle},
        )
    records += synthetic.message_trace(
        ids,
        start_ns=T0 + 9 * S,
        space="tenant-b",
        address="events",
        address_type="anycast",
        client_id="sensor-1",
        hops=[(tracing.SPAN_ROUTE, 1 * MS)],
        gap_ns=GAP,
        body_size=10,
        outcome="released",
        hop_attributes={tracing.SPAN_ROUTE: {tracing.ATTR_OUTCOME: "released"}},
    )
    return records


def _control_plane(ids: synthetic.Ids) -> list[SpanRecord]:
    def event(name: str, at: int, space: str, address: str, **extra: Any) -> SpanRecord:
        return SpanRecord(
            service="config",
            trace_id=ids.trace(),
            span_id=ids.span(),
            parent_span_id=None,
            name=name,
            start_ns=at,
            end_ns=at + MS // 2,
            attributes={tracing.ATTR_SPACE: space, tracing.ATTR_ADDRESS_RESOURCE: address, **extra},
        )

    def rpc(at: int, duration: int, code: int) -> SpanRecord:
        return SpanRecord(
            service="config",
            trace_id=ids.trace(),
            span_id=ids.span(),
            parent_span_id=None,
            name="/enmasse.v1.ConfigService/CreateAddress",
            start_ns=at,
            end_ns=at + duration,
            kind=synthetic.KIND_SERVER,
            attributes={
                "rpc.system": "grpc",
                "rpc.service": "enmasse.v1.ConfigService",
                "rpc.method": "CreateAddress",
                "rpc.grpc.status_code": code,
            },
        )

    return [
        event(tracing.SPAN_ADDRESS_CREATE, T0, "tenant-a", "orders"),
        event(
            tracing.SPAN_ADDRESS_PHASE,
            T0 + 100 * MS,
            "tenant-a",
            "orders",
            **{tracing.ATTR_PHASE: "Pending"},
        ),
        event(
            tracing.SPAN_ADDRESS_PHASE,
            T0 + 250 * MS,
            "tenant-a",
            "orders",
            **{tracing.ATTR_PHASE: "Active"},
        ),
        event(tracing.SPAN_ADDRESS_CREATE, T0, "tenant-b", "events"),
        rpc(T0, 2 * MS, 0),
        rpc(T0 + S, 4 * MS, 6),
    ]


def scenario_records() -> list[SpanRecord]:
    ids = synthetic.Ids(seed=11)
    return [*_orders(ids), *_events(ids), *_control_plane(ids)]


@pytest.fixture(scope="session")
def scenario_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("scenario") / "traces"
    synthetic.write_spans(folder, scenario_records(), batch=7)
    return folder


@pytest.fixture(scope="session")
def scenario_spans(spark: Any, scenario_dir: Path) -> Any:
    from enmasse.analytics.spans import load_spans

    spans, malformed = load_spans(spark, [scenario_dir])
    assert malformed == 0
    return spans.cache()


@pytest.fixture(scope="session")
def job_output(spark: Any, scenario_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    from enmasse.analytics import job

    return job.run(
        spark, inputs=[scenario_dir], output=tmp_path_factory.mktemp("analytics"), window_seconds=10
    )
