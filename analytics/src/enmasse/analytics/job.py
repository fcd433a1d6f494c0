"""The analytics job: span files in, Parquet tables and the HTML dashboard out.

What flows in: OTLP-JSON span files (a folder such as var/traces, or files), a Spark session, the
throughput window and the top-talkers count. What flows out, under the output folder: one Parquet
table per name in `TABLES` (schemas in docs/tracing.md), and `dashboard.html`.

Order matters for cost: the flattened spans are written to Parquet first and read back, so the
JSON is parsed once and every table after that scans a columnar file instead of re-reading text
(Spark would otherwise recompute the flattening per table). Likewise `messages`. The dashboard
reads the small aggregate tables back into plain rows (`collect`), never the spans.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog
from enmasse.analytics import dashboard, tables
from enmasse.analytics.spans import observed_spans
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import TimestampType

log = structlog.get_logger("enmasse.analytics")

TABLES = (
    "spans",
    "messages",
    "throughput_address",
    "throughput_space",
    "latency_address",
    "latency_type",
    "hop_latency",
    "errors",
    "top_talkers",
    "address_readiness",
    "rpc_latency",
)
DASHBOARD = "dashboard.html"


@dataclass
class JobResult:
    output: Path
    spans: int
    messages: int
    malformed_lines: int
    charts: int
    tables: dict[str, Path] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    """Wall time of each table's write (and of the dashboard): where the job's time went."""

    @property
    def dashboard(self) -> Path:
        return self.output / DASHBOARD


def run(
    spark: SparkSession,
    *,
    inputs: Sequence[str | Path],
    output: str | Path,
    window_seconds: int = 10,
    top: int = 10,
    title: str = "EnMasse tracing dashboard",
) -> JobResult:
    if window_seconds <= 0:
        raise ValueError(f"window must be a positive number of seconds, not {window_seconds}")
    if top <= 0:
        raise ValueError(f"top must be a positive number of talkers, not {top}")
    out = Path(output)
    raw_spans, lines = observed_spans(spark, inputs)
    written: dict[str, Path] = {}
    seconds: dict[str, float] = {}

    def save(name: str, frame: DataFrame) -> DataFrame:
        path = out / name
        started = time.perf_counter()
        frame.write.mode("overwrite").parquet(str(path))
        seconds[name] = time.perf_counter() - started
        log.debug("table written", table=name, seconds=round(seconds[name], 2))
        written[name] = path
        return spark.read.parquet(str(path))

    spans = save("spans", raw_spans)
    malformed = int(lines.get["malformed"])
    messages = save("messages", tables.messages(spans))
    derived: dict[str, Callable[[], DataFrame]] = {
        "throughput_address": lambda: tables.throughput(spans, window_seconds=window_seconds),
        "throughput_space": lambda: tables.throughput(
            spans, window_seconds=window_seconds, keys=("space",)
        ),
        "latency_address": lambda: tables.latency(messages),
        "latency_type": lambda: tables.latency(messages, keys=("address_type",)),
        "hop_latency": lambda: tables.hop_latency(spans),
        "errors": lambda: tables.errors(spans),
        "top_talkers": lambda: tables.top_talkers(spans, top=top),
        "address_readiness": lambda: tables.address_readiness(spans),
        "rpc_latency": lambda: tables.rpc_latency(spans),
    }
    frames = {name: save(name, build()) for name, build in derived.items()}
    started = time.perf_counter()
    span_count, message_count = spans.count(), messages.count()
    summary = f"{span_count} spans, {message_count} messages, window {window_seconds} s" + (
        f", {malformed} malformed lines skipped" if malformed else ""
    )
    page = dashboard.render(
        dashboard.DashboardData(
            title=title, summary=summary, **{n: rows(f) for n, f in frames.items()}
        )
    )
    (out / DASHBOARD).write_text(page.html, encoding="utf-8")
    seconds[DASHBOARD] = time.perf_counter() - started
    log.info("analytics done", spans=span_count, messages=message_count, malformed=malformed)
    return JobResult(
        output=out,
        spans=span_count,
        messages=message_count,
        malformed_lines=malformed,
        charts=page.charts,
        tables=written,
        seconds=seconds,
    )


def rows(frame: DataFrame) -> list[dict[str, Any]]:
    """A small table as plain dicts; timestamps as UTC text (the session time zone)."""
    columns = [
        F.date_format(f.name, "yyyy-MM-dd HH:mm:ss").alias(f.name)
        if isinstance(f.dataType, TimestampType)
        else F.col(f.name)
        for f in frame.schema.fields
    ]
    return [row.asDict() for row in frame.select(*columns).collect()]
