"""Live tables: Structured Streaming over the trace files folder.

What flows in: span files appearing in a folder (OTLP-JSON lines, the batch job's format), read
by Spark's file source with the job's explicit schema. What flows out, under the output folder:
the `spans` Parquet table, appended to once per micro-batch (each file is parsed once), and the
per-address tables of `LIVE_TABLES`, recomputed from `spans` after every micro-batch that brought
spans, so they trail the traffic by about one trigger interval plus one recomputation.

Why recompute instead of keeping streaming aggregates: the percentiles are exact (Spark's
`percentile`, as in the batch job), which a streaming aggregation cannot keep, and a table is
read by the console as a whole. Each refresh writes a new copy of a table and moves the link
`<output>/<name>` to it; a reader resolves the link once (`table_path`) and reads a whole copy,
old or new, never half of one. A checkpoint folder remembers which
files were read: a restarted stream goes on where it stopped.

With a horizon (`horizon_seconds`, `--horizon`), the live tables cover only the spans that
started within it of the newest span seen: a refresh then costs the same however long `spans`
grows; without one they cover the whole history, as the batch job's do.

A file is read once, when it appears: writers move complete files into the folder (the
Collector's file exporter with rotation, or a spool), not append to them.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import structlog
from enmasse.analytics import tables
from enmasse.analytics.spans import CORRUPT, OTLP_SCHEMA, flatten
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

log = structlog.get_logger("enmasse.analytics.live")

LIVE_TABLES = ("throughput_address", "latency_address", "hop_latency", "errors")
SPAN_FILES = "*.{json,jsonl}"
NS_PER_S = 1_000_000_000


def start(
    spark: SparkSession,
    *,
    traces: str | Path,
    output: str | Path,
    window_seconds: int = 10,
    trigger_seconds: float = 2.0,
    horizon_seconds: int | None = None,
) -> StreamingQuery:
    """Starts the stream; it runs until `stop(query)` (or the session ends). With a horizon, the
    live tables cover only the spans that started within that many seconds of the newest span
    seen, which bounds a refresh's work however long the history in `spans` grows."""
    if window_seconds <= 0:
        raise ValueError(f"window must be a positive number of seconds, not {window_seconds}")
    if horizon_seconds is not None and horizon_seconds <= 0:
        raise ValueError(f"horizon must be a positive number of seconds, not {horizon_seconds}")
    out = Path(output)
    out.mkdir(parents=True, exist_ok=True)
    raw = (
        spark.readStream.schema(OTLP_SCHEMA)
        .option("mode", "PERMISSIVE")
        .option("columnNameOfCorruptRecord", CORRUPT)
        .option("pathGlobFilter", SPAN_FILES)
        .json(str(traces))
    )

    newest = _Newest()

    def refresh(batch: DataFrame, batch_id: int) -> None:
        batch.persist()  # the new files are parsed once, though read twice with a horizon
        try:
            since = None
            if horizon_seconds is not None:
                since = newest.after(batch) - horizon_seconds * NS_PER_S
            _refresh(
                batch, batch_id=batch_id, output=out, window_seconds=window_seconds, since=since
            )
        finally:
            batch.unpersist()

    return (
        flatten(raw)
        .writeStream.foreachBatch(refresh)
        .option("checkpointLocation", str(out / "_checkpoint"))
        .trigger(processingTime=f"{trigger_seconds} seconds")
        .queryName("enmasse-analytics-live")
        .start()
    )


class _Newest:
    """The start of the newest span seen so far (ns), moved on by each micro-batch."""

    def __init__(self) -> None:
        self.start_ns = 0

    def after(self, batch: DataFrame) -> int:
        (newest,) = batch.agg(F.max("start_ns")).first() or (None,)
        self.start_ns = max(self.start_ns, newest or 0)
        return self.start_ns


def _refresh(
    batch: DataFrame, *, batch_id: int, output: Path, window_seconds: int, since: int | None
) -> None:
    started = time.perf_counter()
    batch.write.mode("append").parquet(str(output / "spans"))
    if not any((output / "spans").glob("*.parquet")):
        return  # only unreadable lines so far: no table to recompute from yet
    spans = batch.sparkSession.read.parquet(str(output / "spans"))
    if since is not None:
        # Each micro-batch appends files of its own, so Parquet's min/max statistics let the
        # scan skip the older ones whole.
        spans = spans.filter(F.col("start_ns") >= since)
    messages = tables.messages(spans).cache()
    frames = {
        "throughput_address": tables.throughput(spans, window_seconds=window_seconds),
        "latency_address": tables.latency(messages),
        "hop_latency": tables.hop_latency(spans),
        "errors": tables.errors(spans),
    }
    for name, frame in frames.items():
        _swap_in(frame, output / name, batch_id=batch_id)
    messages.unpersist()
    seconds = round(time.perf_counter() - started, 2)
    log.debug("live tables refreshed", batch=batch_id, seconds=seconds)


def stop(query: StreamingQuery) -> None:
    """Stops the stream between micro-batches: the files already there are taken in first, so
    no refresh is cut off halfway (an interrupted one leaves a copy behind and logs a stack)."""
    if query.isActive:
        query.processAllAvailable()
    query.stop()


def table_path(output: str | Path, name: str) -> Path | None:
    """Where the current copy of live table `name` is (None before its first refresh). Read from
    this path, not `<output>/<name>`: the link moves on at the next refresh, this copy stays
    until the refresh after that."""
    link = Path(output) / name
    return link.resolve() if link.exists() else None


def _swap_in(frame: DataFrame, path: Path, *, batch_id: int) -> None:
    """Writes `frame` to a copy of its own, then points the link `path` at it (an atomic rename
    of a new link over the old), and removes the copies older than the one it replaced."""
    copies = path.parent / ".copies"
    copies.mkdir(exist_ok=True)
    fresh = copies / f"{path.name}.{batch_id}"
    frame.write.mode("overwrite").parquet(str(fresh))
    previous = path.resolve() if path.is_symlink() else None
    link = copies / f"{path.name}.{batch_id}.link"
    link.unlink(missing_ok=True)
    link.symlink_to(fresh)
    link.replace(path)
    for old in copies.glob(f"{path.name}.*"):
        if old.is_dir() and not old.is_symlink() and old not in (fresh, previous):
            shutil.rmtree(old, ignore_errors=True)
