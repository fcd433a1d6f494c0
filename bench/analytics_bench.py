"""Analytics job benchmark: figures, not assertions.

Generates OTLP-JSON span files (`enmasse.analytics.synthetic.traffic`: 4 address spaces, 5
addresses each, half queues (8 spans a message) and half anycast (4 spans), 2% rejected, 2,000
messages/s of simulated time) in a temp dir, starts one Spark session (local[2], 1 GB driver: the
job's defaults), runs the whole job (flatten -> spans Parquet -> every table -> dashboard.html),
and reports wall times and spans/s of the job alone (session start-up apart), split into the
parse (JSON -> the `spans` Parquet table) and the rest (every table from `spans`, and the
dashboard); then runs it once more in the same session (the JVM's compiler warm, as in a
long-lived session). Then the live mode (`enmasse.analytics.live`): with a history of generated
spans in its `spans` table, one-message files are moved into the watched folder one at a time,
and the lag from the move to the message's row in the live `throughput_address` table is
measured. The JVM is stopped at the end, by its PID if it lingers.

Run: `.venv/bin/python -m bench.analytics_bench [--spans N] [--keep DIR] [--reuse]`, or the shared
harness: `.venv/bin/python -m bench analytics [--quick]` (--quick: 100,000 spans).
The machine's cores are shared with whatever else runs: read the figures as orders of magnitude.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from enmasse.analytics import job, live, synthetic
from enmasse.analytics.session import spark_session
from enmasse.common import tracing
from pyspark import SparkContext
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from bench.harness import Context, Table, machine_note, suite

FULL_SPANS = 1_000_000
QUICK_SPANS = 100_000
LIVE_HISTORY_SPANS = 100_000
LIVE_SAMPLES = 5
LIVE_TRIGGER_S = 1.0


def measure(*, spans: int, workdir: Path, reuse: bool = False) -> list[tuple[str, str]]:
    traces = workdir / "traces"
    started = time.perf_counter()
    if not (reuse and traces.is_dir()):
        shutil.rmtree(traces, ignore_errors=True)
        synthetic.write_spans(traces, list(synthetic.traffic(synthetic.Ids(seed=1), spans=spans)))
    generated = time.perf_counter() - started
    input_mb = sum(p.stat().st_size for p in traces.iterdir()) / 1e6

    started = time.perf_counter()
    spark = spark_session()
    session_s = time.perf_counter() - started
    try:
        started, cpu = time.perf_counter(), _jvm_cpu_s()
        result = job.run(spark, inputs=[traces], output=workdir / "analytics", window_seconds=10)
        job_s, job_cpu = time.perf_counter() - started, _jvm_cpu_s() - cpu
        # The same job again in the same session: what a long-lived session (the live mode's)
        # pays once the JVM's compiler has warmed to the job's loops.
        started, cpu = time.perf_counter(), _jvm_cpu_s()
        warm = job.run(spark, inputs=[traces], output=workdir / "analytics", window_seconds=10)
        warm_s, warm_cpu = time.perf_counter() - started, _jvm_cpu_s() - cpu
        lags = measure_lag(spark, workdir=workdir / "live")
    finally:
        _stop(spark)
    made = result.spans
    parse_s = result.seconds["spans"]
    rest_s = job_s - parse_s
    return [
        ("spans (OTLP-JSON lines, generated)", f"{made:,} in {input_mb:.0f} MB"),
        ("messages (traces)", f"{result.messages:,}"),
        ("span generation (Python, not the job)", f"{generated:.1f} s"),
        ("Spark session start (local[2], 1 GB driver)", f"{session_s:.1f} s"),
        ("job wall time: JSON -> 11 Parquet tables + dashboard", f"{job_s:.1f} s"),
        ("job throughput", f"{made / job_s:,.0f} spans/s"),
        ("job CPU time of the JVM (all threads; steadier than wall)", f"{job_cpu:.1f} s"),
        ("  parse: JSON -> spans Parquet (once per file)", f"{parse_s:.1f} s"),
        ("  from spans Parquet: 10 tables + dashboard", f"{rest_s:.1f} s"),
        ("  of which messages / dashboard", _of(result, "messages", job.DASHBOARD)),
        (
            "job again, same session (warm JIT)",
            f"{warm_s:.1f} s, {made / warm_s:,.0f} spans/s, JVM CPU {warm_cpu:.1f} s",
        ),
        (
            "  parse / from spans Parquet",
            f"{warm.seconds['spans']:.1f} s / {warm_s - warm.seconds['spans']:.1f} s",
        ),
        ("dashboard", f"{result.charts} charts, {result.dashboard.stat().st_size / 1e6:.1f} MB"),
        (
            f"live lag, file moved -> row in throughput_address (n={len(lags)}, "
            f"{LIVE_HISTORY_SPANS:,} spans of history, trigger {LIVE_TRIGGER_S:g} s)",
            f"median {statistics.median(lags):.1f} s, max {max(lags):.1f} s",
        ),
    ]


def _jvm_cpu_s() -> float:
    """CPU seconds the session's JVM has used so far (user + system, /proc): on a shared machine
    the wall time swings with the load, the CPU a job costs much less."""
    proc = getattr(SparkContext._gateway, "proc", None)
    if proc is None:
        return 0.0
    fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _of(result: job.JobResult, *names: str) -> str:
    return " / ".join(f"{result.seconds[n]:.1f} s" for n in names)


def measure_lag(spark: SparkSession, *, workdir: Path) -> list[float]:
    """Seconds from a span file moved into the watched folder to its row in a live table, per
    sample; the live tables already hold `LIVE_HISTORY_SPANS` spans (one file, waited for)."""
    watched, staging, output = workdir / "traces", workdir / "staging", workdir / "tables"
    watched.mkdir(parents=True)
    ids = synthetic.Ids(seed=2)
    query = live.start(spark, traces=watched, output=output, trigger_seconds=LIVE_TRIGGER_S)
    try:
        history = list(synthetic.traffic(ids, spans=LIVE_HISTORY_SPANS))
        _move_in(history, name="history", staging=staging, watched=watched)
        _wait_row(spark, output, address=history[0].attributes[tracing.ATTR_ADDRESS], limit=600)
        lags = []
        for sample in range(LIVE_SAMPLES):
            address = f"lag-{sample}"
            records = synthetic.message_trace(
                ids,
                start_ns=time.time_ns(),
                space="bench",
                address=address,
                address_type="anycast",
                client_id="bench",
                hops=[(tracing.SPAN_ROUTE, 50_000), (tracing.SPAN_DELIVER, 50_000)],
            )
            started = time.perf_counter()
            _move_in(records, name=address, staging=staging, watched=watched)
            _wait_row(spark, output, address=address, limit=120)
            lags.append(time.perf_counter() - started)
        return lags
    finally:
        live.stop(query)


def _move_in(
    records: list[synthetic.SpanRecord], *, name: str, staging: Path, watched: Path
) -> None:
    """One file of `records`, written aside and moved in whole (a rotating exporter's way)."""
    shutil.rmtree(staging, ignore_errors=True)
    lines = "".join(p.read_text() for p in synthetic.write_spans(staging, records))
    whole = staging / f"{name}.jsonl"
    whole.write_text(lines)
    whole.rename(watched / whole.name)


def _wait_row(spark: SparkSession, output: Path, *, address: str, limit: float) -> None:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        path = live.table_path(output, "throughput_address")
        if (
            path is not None
            and spark.read.parquet(str(path)).filter(F.col("address") == address).count()
        ):
            return
        time.sleep(0.1)
    raise TimeoutError(f"no live row for {address} after {limit} s")


def _stop(spark: object) -> None:
    gateway = SparkContext._gateway
    jvm = getattr(gateway, "proc", None)
    spark.stop()  # type: ignore[attr-defined]
    if gateway is not None:
        gateway.shutdown()
    if jvm is not None and jvm.poll() is None:
        jvm.kill()
        jvm.wait(timeout=30)


@suite("analytics", "analytics job on generated spans: wall time and spans/s (1M spans)")
def analytics_suite(ctx: Context) -> Iterator[Table]:
    spans = QUICK_SPANS if ctx.quick else FULL_SPANS
    with tempfile.TemporaryDirectory(prefix="analytics-bench-") as tmp:
        rows = measure(spans=spans, workdir=Path(tmp))
    table = Table(title=f"Analytics job, {spans:,} spans", columns=["measure", "value"])
    for name, value in rows:
        table.add(name, value)
    yield table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--spans", type=int, default=FULL_SPANS)
    parser.add_argument("--keep", type=Path, help="generate and write here, and keep it")
    parser.add_argument("--reuse", action="store_true", help="with --keep: reuse its span files")
    args = parser.parse_args()
    print(machine_note())
    if args.keep:
        for previous in ("analytics", "live"):
            shutil.rmtree(args.keep / previous, ignore_errors=True)
        rows = measure(spans=args.spans, workdir=args.keep, reuse=args.reuse)
    else:
        with tempfile.TemporaryDirectory(prefix="analytics-bench-") as tmp:
            rows = measure(spans=args.spans, workdir=Path(tmp))
    for name, value in rows:
        print(f"{name:55} {value}")


if __name__ == "__main__":
    main()
