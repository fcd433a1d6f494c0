"""The trace views' data (`enmasse.console.traces`) over tables the real analytics job wrote.

A few message traces with known timings (`enmasse.analytics.synthetic`, the job's own test
generator) for two tenants go through the real batch job on the pytest session's Spark session
(tests/fixtures/spark.py); the console then reads the Parquet folders it wrote with pyarrow, as it
does at run time, no Spark involved:

- tenant-a / `orders` (queue): 3 messages of end-to-end 10, 20 and 30 ms in one 10 s window
  (waypoint 1 ms, enqueue 2, queue residence the rest, dequeue 1, route 1, deliver 1, settle 1):
  p50 20, p95 29, p99 29.8 ms (linear interpolation), 3 sent, 3 delivered;
- tenant-b / `events` (anycast): 2 messages, route 1 ms, deliver 2 ms, settle 1 ms.

Asked for tenant-a's spaces only, the reader returns tenant-a's row and never tenant-b's; the
same tables laid out as `--live` leaves them (each table a link to a copy under `.copies`) read
alike; missing and old tables come with the command that makes or refreshes them.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from enmasse.analytics import job, synthetic
from enmasse.common import tracing
from enmasse.console import traces

MS = 1_000_000
S = 1_000_000_000
T0 = 1_700_000_000 * S  # aligned to a 10 s window
GAP = MS // 10
ORDERS_E2E_MS = (10, 20, 30)


def _spans() -> list[synthetic.SpanRecord]:
    ids = synthetic.Ids()
    records: list[synthetic.SpanRecord] = []
    for second, e2e_ms in enumerate(ORDERS_E2E_MS, start=1):
        residence = e2e_ms * MS - 7 * MS - 7 * GAP  # the send ends one gap after the last hop
        records += synthetic.message_trace(
            ids,
            start_ns=T0 + second * S,
            space="tenant-a",
            address="orders",
            address_type="queue",
            client_id="app-1",
            hops=[
                (tracing.SPAN_WAYPOINT, 1 * MS),
                (tracing.SPAN_ENQUEUE, 2 * MS),
                (tracing.SPAN_QUEUE_RESIDENCE, residence),
                (tracing.SPAN_DEQUEUE, 1 * MS),
                (tracing.SPAN_ROUTE, 1 * MS),
                (tracing.SPAN_DELIVER, 1 * MS),
                (tracing.SPAN_SETTLE, 1 * MS),
            ],
            gap_ns=GAP,
        )
    for second in (5, 6):
        records += synthetic.message_trace(
            ids,
            start_ns=T0 + second * S,
            space="tenant-b",
            address="events",
            address_type="anycast",
            client_id="sensor-1",
            hops=[
                (tracing.SPAN_ROUTE, 1 * MS),
                (tracing.SPAN_DELIVER, 2 * MS),
                (tracing.SPAN_SETTLE, 1 * MS),
            ],
            gap_ns=GAP,
        )
    return records


@pytest.fixture(scope="module")
def tables(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The analytics folder the real batch job wrote for the spans above."""
    root = tmp_path_factory.mktemp("console-traces")
    synthetic.write_spans(root / "traces", _spans())
    result = job.run(spark, inputs=[root / "traces"], output=root / "analytics")
    assert result.messages == 5
    return result.output


def test_a_tenant_reads_its_addresses_latency_hops_and_throughput(tables: Path) -> None:
    read = traces.read(tables, spaces=["tenant-a"])
    assert list(read.addresses) == [("tenant-a", "orders")]  # tenant-b's row is not read
    orders = read.addresses[("tenant-a", "orders")]
    assert orders.address_type == "queue"
    assert orders.latency is not None
    assert orders.latency.messages == 3
    latency = (orders.latency.p50_ms, orders.latency.p95_ms, orders.latency.p99_ms)
    assert latency == pytest.approx((20.0, 29.0, 29.8))
    assert [hop.name for hop in orders.hops] == [
        tracing.SPAN_WAYPOINT,
        tracing.SPAN_ENQUEUE,
        tracing.SPAN_QUEUE_RESIDENCE,
        tracing.SPAN_DEQUEUE,
        tracing.SPAN_ROUTE,
        tracing.SPAN_DELIVER,
        tracing.SPAN_SETTLE,
    ]  # the order a message meets them
    by_name = {hop.name: hop for hop in orders.hops}
    assert by_name[tracing.SPAN_ENQUEUE].mean_ms == pytest.approx(2.0)
    assert by_name[tracing.SPAN_QUEUE_RESIDENCE].p50_ms == pytest.approx(20.0 - 7.7)
    assert by_name[tracing.SPAN_QUEUE_RESIDENCE].bar_percent == 100.0  # the slowest hop
    assert by_name[tracing.SPAN_WAYPOINT].stage.startswith("producer → router")
    assert orders.throughput is not None
    assert (orders.throughput.sent, orders.throughput.delivered) == (3, 3)
    assert orders.throughput.latest.sent_per_s == pytest.approx(0.3)  # 3 in the 10 s window
    assert read.of_space("tenant-b") == []


def test_the_other_tenant_reads_only_its_own_row(tables: Path) -> None:
    read = traces.read(tables, spaces=["tenant-b"])
    assert list(read.addresses) == [("tenant-b", "events")]
    events = read.addresses[("tenant-b", "events")]
    assert events.latency is not None
    assert events.latency.messages == 2
    assert [hop.name for hop in events.hops] == [
        tracing.SPAN_ROUTE,
        tracing.SPAN_DELIVER,
        tracing.SPAN_SETTLE,
    ]


def test_a_token_that_sees_no_space_reads_no_row(tables: Path) -> None:
    assert traces.read(tables, spaces=[]).addresses == {}
    assert traces.read(tables, spaces=["tenant-c"]).addresses == {}


def test_fresh_tables_carry_no_notice_and_old_ones_say_how_to_refresh(tables: Path) -> None:
    # The oldest of the three tables the views read: the job wrote throughput first.
    written = min(
        (tables / name / "_SUCCESS").stat().st_mtime
        for name in (traces.LATENCY, traces.HOPS, traces.THROUGHPUT)
    )
    fresh = traces.read(tables, spaces=["tenant-a"], now=written + 5).freshness
    assert (fresh.absent, fresh.stale, fresh.notice) == (False, False, "")
    assert fresh.age == "5 s"
    old = traces.read(tables, spaces=["tenant-a"], now=written + 3600).freshness
    assert old.stale
    assert old.notice == (
        "These tables are 60 min old: run `enmasse-analytics` again, or "
        "`enmasse-analytics --live` to keep them within seconds of the traffic."
    )


def test_tables_laid_out_as_the_live_mode_leaves_them_read_alike(
    tables: Path, tmp_path: Path
) -> None:
    """`--live` keeps each table as a link `<output>/<name>` to a whole copy under `.copies`
    (enmasse.analytics.live._swap_in), moved on at every refresh."""
    for name in (traces.LATENCY, traces.HOPS, traces.THROUGHPUT):
        copy = tmp_path / ".copies" / f"{name}.7"
        shutil.copytree(tables / name, copy)
        os.symlink(copy, tmp_path / name)
    live = traces.read(tmp_path, spaces=["tenant-a"])
    batch = traces.read(tables, spaces=["tenant-a"])
    assert live.addresses == batch.addresses


def test_no_tables_say_which_command_makes_them(tmp_path: Path) -> None:
    read = traces.read(tmp_path / "analytics", spaces=["tenant-a"])
    assert read.addresses == {}
    assert read.freshness.absent
    assert read.freshness.notice == (
        f"No trace tables yet in {tmp_path / 'analytics'}: run `enmasse-analytics` (once) or "
        "`enmasse-analytics --live` (kept within seconds of the traffic)."
    )
    unset = traces.read(None, spaces=["tenant-a"]).freshness
    assert "--analytics-dir" in unset.notice
