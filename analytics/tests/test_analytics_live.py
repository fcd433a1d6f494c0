"""The live mode: span files moved into a watched folder show up in the per-address tables
while the stream runs, file after file, with the same answers the batch job gives.
One Spark session for all (tests/fixtures); the stream is stopped at the end of each test.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from enmasse.analytics import live, synthetic
from enmasse.analytics.job import rows
from enmasse.common import tracing

T0 = 1_700_000_000 * 10**9
MS = 1_000_000

pytestmark = pytest.mark.slow


def _drop_file(
    *, watched: Path, staging: Path, address: str, e2e_ms: list[int], start_ns: int = T0
) -> None:
    """Writes one file of messages to `address` (route + deliver, e2e as given) and moves it
    into the watched folder whole, as a rotating exporter does: each line one service's spans."""
    ids = synthetic.Ids(seed=len(address))
    records = []
    for i, e2e in enumerate(e2e_ms):
        records += synthetic.message_trace(
            ids,
            start_ns=start_ns + i * 10**9,
            space="tenant-live",
            address=address,
            address_type="anycast",
            client_id="c",
            hops=[(tracing.SPAN_ROUTE, MS), (tracing.SPAN_DELIVER, e2e * MS - MS - 2 * MS // 10)],
            gap_ns=MS // 10,
        )
    lines = "".join(p.read_text() for p in synthetic.write_spans(staging, records))
    whole = staging / f"{address}.jsonl"
    whole.write_text(lines)
    whole.rename(watched / whole.name)
    shutil.rmtree(staging)


def _table(spark: Any, output: Path, name: str) -> list[dict[str, Any]]:
    path = live.table_path(output, name)
    return [] if path is None else rows(spark.read.parquet(str(path)))


def _wait_rows(spark: Any, output: Path, name: str, address: str) -> list[dict[str, Any]]:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        found = [r for r in _table(spark, output, name) if r["address"] == address]
        if found:
            return found
        time.sleep(0.2)
    raise AssertionError(f"gave up waiting for {address} in the live {name} table")


def test_span_files_moved_into_the_folder_appear_in_the_live_tables(
    spark: Any, tmp_path: Path
) -> None:
    watched, output = tmp_path / "traces", tmp_path / "live"
    watched.mkdir()
    query = live.start(spark, traces=watched, output=output, trigger_seconds=0.5)
    try:
        _drop_file(watched=watched, staging=tmp_path / "s1", address="first", e2e_ms=[10, 20, 30])
        (latency,) = _wait_rows(spark, output, "latency_address", "first")
        assert latency["messages"] == 3
        assert latency["p50_ms"] == pytest.approx(20.0)
        assert latency["max_ms"] == pytest.approx(30.0)

        # A second file later on: the stream goes on, and the first address's rows stay.
        _drop_file(watched=watched, staging=tmp_path / "s2", address="second", e2e_ms=[5])
        (latency,) = _wait_rows(spark, output, "latency_address", "second")
        assert latency["messages"] == 1
        throughput = _table(spark, output, "throughput_address")
        assert {(r["address"], r["sent"]) for r in throughput} == {("first", 3), ("second", 1)}
        # The tables are swapped in one after another: hop_latency follows latency_address.
        _wait_rows(spark, output, "hop_latency", "second")
        hops = {(r["address"], r["hop"]) for r in _table(spark, output, "hop_latency")}
        assert ("first", tracing.SPAN_ROUTE) in hops
        assert ("second", tracing.SPAN_DELIVER) in hops
        assert spark.read.parquet(str(output / "spans")).count() == 3 * 3 + 3
    finally:
        live.stop(query)
    assert query.exception() is None


def test_with_a_horizon_the_live_tables_forget_what_is_older(spark: Any, tmp_path: Path) -> None:
    watched, output = tmp_path / "traces", tmp_path / "live"
    watched.mkdir()
    query = live.start(
        spark, traces=watched, output=output, trigger_seconds=0.5, horizon_seconds=3600
    )
    try:
        _drop_file(watched=watched, staging=tmp_path / "s1", address="early", e2e_ms=[10])
        _wait_rows(spark, output, "latency_address", "early")
        later = T0 + 2 * 3600 * 10**9
        _drop_file(
            watched=watched, staging=tmp_path / "s2", address="late", e2e_ms=[5], start_ns=later
        )
        _wait_rows(spark, output, "latency_address", "late")
        _wait_rows(spark, output, "hop_latency", "late")  # swapped in after latency_address
        for name in ("throughput_address", "latency_address", "hop_latency"):
            assert {r["address"] for r in _table(spark, output, name)} == {"late"}, name
        # The history itself is kept: only the live tables look back no further than the horizon.
        assert spark.read.parquet(str(output / "spans")).count() == 3 + 3
    finally:
        live.stop(query)
    assert query.exception() is None


def test_the_live_mode_refuses_a_window_that_is_not_positive(spark: Any, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="window must be a positive number of seconds, not 0"):
        live.start(spark, traces=tmp_path, output=tmp_path / "live", window_seconds=0)
    with pytest.raises(ValueError, match="horizon must be a positive number of seconds, not 0"):
        live.start(spark, traces=tmp_path, output=tmp_path / "live", horizon_seconds=0)


def test_enmasse_analytics_live_watches_one_folder(tmp_path: Path) -> None:
    command = Path(sys.executable).with_name("enmasse-analytics")
    span_file = tmp_path / "spans.jsonl"
    span_file.write_text("")
    done = subprocess.run(
        [str(command), "--live", "-i", str(span_file)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert f"Error: --live watches one folder, not {span_file}" in done.stderr
