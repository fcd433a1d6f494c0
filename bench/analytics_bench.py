"""Analytics job benchmark: figures, not assertions.

Generates OTLP-JSON span files (`enmasse.analytics.synthetic.traffic`: 4 address spaces, 5
addresses each, half queues (8 spans a message) and half anycast (4 spans), 2% rejected, 2,000
messages/s of simulated time) in a temp dir, starts one Spark session (local[2], 1 GB driver: the
job's defaults), runs the whole job (flatten -> spans Parquet -> every table -> dashboard.html),
and reports wall times and spans/s of the job alone (session start-up apart). The JVM is stopped
at the end, by its PID if it lingers.

Run: `.venv/bin/python -m bench.analytics_bench [--spans N] [--keep DIR]`, or through the shared
harness: `.venv/bin/python -m bench analytics [--quick]` (--quick: 100,000 spans).
The machine's cores are shared with whatever else runs: read the figures as orders of magnitude.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from enmasse.analytics import job, synthetic
from enmasse.analytics.session import spark_session

from bench.harness import Context, Table, machine_note, suite

FULL_SPANS = 1_000_000
QUICK_SPANS = 100_000


def measure(*, spans: int, workdir: Path) -> list[tuple[str, str]]:
    traces = workdir / "traces"
    started = time.perf_counter()
    records = list(synthetic.traffic(synthetic.Ids(seed=1), spans=spans))
    synthetic.write_spans(traces, records)
    generated = time.perf_counter() - started
    made = len(records)
    input_mb = sum(p.stat().st_size for p in traces.iterdir()) / 1e6
    del records

    started = time.perf_counter()
    spark = spark_session()
    session_s = time.perf_counter() - started
    try:
        started = time.perf_counter()
        result = job.run(spark, inputs=[traces], output=workdir / "analytics", window_seconds=10)
        job_s = time.perf_counter() - started
    finally:
        _stop(spark)
    return [
        ("spans (OTLP-JSON lines, generated)", f"{made:,} in {input_mb:.0f} MB"),
        ("messages (traces)", f"{result.messages:,}"),
        ("span generation (Python, not the job)", f"{generated:.1f} s"),
        ("Spark session start (local[2], 1 GB driver)", f"{session_s:.1f} s"),
        ("job wall time: JSON -> 11 Parquet tables + dashboard", f"{job_s:.1f} s"),
        ("job throughput", f"{made / job_s:,.0f} spans/s"),
        ("dashboard", f"{result.charts} charts, {result.dashboard.stat().st_size / 1e6:.1f} MB"),
    ]


def _stop(spark: object) -> None:
    from pyspark import SparkContext

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
    args = parser.parse_args()
    print(machine_note())
    if args.keep:
        shutil.rmtree(args.keep / "traces", ignore_errors=True)
        rows = measure(spans=args.spans, workdir=args.keep)
    else:
        with tempfile.TemporaryDirectory(prefix="analytics-bench-") as tmp:
            rows = measure(spans=args.spans, workdir=Path(tmp))
    for name, value in rows:
        print(f"{name:55} {value}")


if __name__ == "__main__":
    main()
