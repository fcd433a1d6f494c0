"""Flat spans -> the analytics tables: pure functions from DataFrame to DataFrame.

What flows in: the `spans` DataFrame of `enmasse.analytics.spans.flatten`. What flows out: one
DataFrame per table of docs/tracing.md; `job.py` writes each as Parquet and the dashboard reads
them back. Nothing here touches files, so tests call each function on known spans and compare
with answers worked out by hand.

Definitions (the docs repeat them):
- a message is one trace holding an `amqp.send` span (one per trace, by convention), or one a
  router started: its root is that router's hop (`tracing.ROUTER_ROOTS`, no parent), standing
  for the send of a producer that does not trace;
- end-to-end latency of a message = the latest end of its consumer-side spans (`amqp.deliver`,
  `amqp.settle`, and the router's `router.deliver`, which ends when the consumer's settlement
  reaches the router) minus the start of its send: for multicast, until the last consumer has
  it;
- a hop is a span named in `tracing.HOP_SPANS`; hops of one message do not overlap, so their sum
  is at most the end-to-end latency (what remains is wire time between processes);
- percentiles are exact, linearly interpolated between the closest ranks (Spark's `percentile`,
  numpy's default);
- throughput windows are tumbling, aligned to the epoch, keyed by span start time.
"""

from __future__ import annotations

from enmasse.common import tracing
from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

NS_PER_MS = 1_000_000.0
PERCENTILES = (0.5, 0.95, 0.99)
CONSUMER_SPANS = (tracing.SPAN_DELIVER, tracing.SPAN_SETTLE, tracing.SPAN_ROUTER_DELIVER)
NEGATIVE_OUTCOMES = ("rejected", "released", "modified")
GRPC_CODES = {
    1: "CANCELLED",
    2: "UNKNOWN",
    3: "INVALID_ARGUMENT",
    4: "DEADLINE_EXCEEDED",
    5: "NOT_FOUND",
    6: "ALREADY_EXISTS",
    7: "PERMISSION_DENIED",
    8: "RESOURCE_EXHAUSTED",
    9: "FAILED_PRECONDITION",
    10: "ABORTED",
    11: "OUT_OF_RANGE",
    12: "UNIMPLEMENTED",
    13: "INTERNAL",
    14: "UNAVAILABLE",
    15: "DATA_LOSS",
    16: "UNAUTHENTICATED",
}
ADDRESS_KEYS = ("space", "address", "address_type")


def _percentiles_ms(value_ns: Column, prefix: str = "") -> list[Column]:
    quantiles = F.percentile(value_ns, list(PERCENTILES))
    return [
        (quantiles[i] / NS_PER_MS).alias(f"{prefix}p{round(q * 100)}_ms")
        for i, q in enumerate(PERCENTILES)
    ]


def _is_send() -> Column:
    """The span that starts a message: a producer's `amqp.send`, or the root hop of a trace a
    router started for a producer that does not trace."""
    return (F.col("name") == tracing.SPAN_SEND) | (
        F.col("name").isin(*tracing.ROUTER_ROOTS) & F.col("parent_span_id").isNull()
    )


def _ts(ns: Column) -> Column:
    return F.timestamp_micros(F.floor(ns / 1000).cast("long"))


# --- throughput ---------------------------------------------------------------------------------


def throughput(
    spans: DataFrame, *, window_seconds: int, keys: tuple[str, ...] = ADDRESS_KEYS
) -> DataFrame:
    """Messages sent (`amqp.send`) and delivered (`amqp.deliver`) per window and `keys`.

    Columns: window_start, window_end, *keys, sent, delivered, bytes_sent, sent_per_s."""
    if window_seconds <= 0:
        raise ValueError(f"window must be a positive number of seconds, not {window_seconds}")
    is_send = _is_send()
    traffic = spans.filter(is_send | (F.col("name") == tracing.SPAN_DELIVER))
    grouped = traffic.groupBy(
        F.window(_ts(F.col("start_ns")), f"{window_seconds} seconds").alias("window"), *keys
    ).agg(
        F.count(F.when(is_send, 1)).alias("sent"),
        F.count(F.when(~is_send, 1)).alias("delivered"),
        F.coalesce(F.sum(F.when(is_send, F.col("body_size"))), F.lit(0)).alias("bytes_sent"),
    )
    return grouped.select(
        F.col("window.start").alias("window_start"),
        F.col("window.end").alias("window_end"),
        *keys,
        "sent",
        "delivered",
        "bytes_sent",
        (F.col("sent") / F.lit(float(window_seconds))).alias("sent_per_s"),
    ).orderBy("window_start", *keys)


# --- end to end ---------------------------------------------------------------------------------


def messages(spans: DataFrame) -> DataFrame:
    """One row per message (a trace holding an `amqp.send`; one send a trace): its path and
    latencies.

    Columns: trace_id, space, address, address_type, client_id, start_ns, e2e_ns, hop_sum_ns,
    hop_count, path (hop names in start order), delivered, outcome (of the producer's send)."""
    # The send need not be the trace's root span: an application may wrap it in its own span.
    # One grouping by trace, no join: the send's columns ride along as the first (only) send of
    # the group, so the spans are shuffled once.
    is_send = _is_send()
    is_hop = F.col("name").isin(*tracing.HOP_SPANS)
    send = F.struct(
        "space",
        "address",
        "address_type",
        "client_id",
        F.col("start_ns").alias("send_start_ns"),
        "outcome",
    )
    per_trace = (
        spans.filter(is_send | is_hop | F.col("name").isin(*CONSUMER_SPANS))
        .groupBy("trace_id")
        .agg(
            F.first(F.when(is_send, send), ignorenulls=True).alias("send"),
            F.max(F.when(F.col("name").isin(*CONSUMER_SPANS), F.col("end_ns"))).alias(
                "consumer_end_ns"
            ),
            F.sum(F.when(is_hop, F.col("duration_ns"))).alias("hop_sum_ns"),
            F.count(F.when(is_hop, 1)).alias("hop_count"),
            F.sort_array(F.collect_list(F.when(is_hop, F.struct("start_ns", "name")))).alias(
                "hops"
            ),
        )
        .filter(F.col("send").isNotNull())
    )
    return per_trace.select(
        "trace_id",
        "send.space",
        "send.address",
        "send.address_type",
        "send.client_id",
        F.col("send.send_start_ns").alias("start_ns"),
        (F.col("consumer_end_ns") - F.col("send.send_start_ns")).alias("e2e_ns"),
        F.coalesce("hop_sum_ns", F.lit(0)).alias("hop_sum_ns"),
        "hop_count",
        F.col("hops.name").alias("path"),
        F.col("consumer_end_ns").isNotNull().alias("delivered"),
        "send.outcome",
    )


def latency(messages_df: DataFrame, *, keys: tuple[str, ...] = ADDRESS_KEYS) -> DataFrame:
    """End-to-end latency of delivered messages per `keys`.

    Columns: *keys, messages, mean_ms, p50_ms, p95_ms, p99_ms, max_ms."""
    delivered = messages_df.filter(F.col("delivered"))
    return (
        delivered.groupBy(*keys)
        .agg(
            F.count(F.lit(1)).alias("messages"),
            (F.avg("e2e_ns") / NS_PER_MS).alias("mean_ms"),
            *_percentiles_ms(F.col("e2e_ns")),
            (F.max("e2e_ns") / NS_PER_MS).alias("max_ms"),
        )
        .orderBy(*keys)
    )


def hop_latency(spans: DataFrame) -> DataFrame:
    """Per-hop breakdown: each hop span's (and `router.deliver`'s) duration per address.

    Columns: space, address, address_type, hop, spans, mean_ms, p50_ms, p95_ms, p99_ms, total_ms."""
    latency_spans = tracing.HOP_LATENCY_SPANS
    hops = spans.filter(F.col("name").isin(*latency_spans)).withColumnRenamed("name", "hop")
    order = F.array_position(F.array(*[F.lit(h) for h in latency_spans]), F.col("hop"))
    return (
        hops.groupBy(*ADDRESS_KEYS, "hop")
        .agg(
            F.count(F.lit(1)).alias("spans"),
            (F.avg("duration_ns") / NS_PER_MS).alias("mean_ms"),
            *_percentiles_ms(F.col("duration_ns")),
            (F.sum("duration_ns") / NS_PER_MS).alias("total_ms"),
        )
        .withColumn("hop_order", order)
        .orderBy(*ADDRESS_KEYS, "hop_order")
        .drop("hop_order")
    )


# --- errors and tenants -------------------------------------------------------------------------


def errors(spans: DataFrame) -> DataFrame:
    """Failed spans and negative outcomes, counted by condition.

    A span counts when its status is ERROR, its outcome is rejected/released/modified, or its gRPC
    status is not OK. condition = the AMQP error condition attribute, else `grpc:<CODE>`, else
    the outcome, else the status message.
    Columns: space, address, service, span, outcome, condition, count."""
    grpc_name = F.element_at(
        F.create_map(*[F.lit(x) for pair in GRPC_CODES.items() for x in pair]),
        F.col("grpc_status"),
    )
    failed = spans.filter(
        (F.col("status") == "ERROR")
        | F.col("outcome").isin(*NEGATIVE_OUTCOMES)
        | (F.coalesce(F.col("grpc_status"), F.lit(0)) != 0)
    )
    condition = F.coalesce(
        F.col("condition"),
        F.when(F.col("grpc_status") != 0, F.concat(F.lit("grpc:"), grpc_name)),
        F.col("outcome"),
        F.col("status_message"),
        F.lit("error"),
    )
    return (
        failed.groupBy(
            "space",
            "address",
            "service",
            F.col("name").alias("span"),
            "outcome",
            condition.alias("condition"),
        )
        .agg(F.count(F.lit(1)).alias("count"))
        .orderBy(F.desc("count"), "space", "address", "condition")
    )


def top_talkers(spans: DataFrame, *, top: int = 10) -> DataFrame:
    """The `top` clients per address space (tenant) by messages sent.

    Columns: space, rank, client_id, messages, bytes, addresses."""
    sends = spans.filter(F.col("name") == tracing.SPAN_SEND).withColumn(
        "client_id", F.coalesce(F.col("client_id"), F.lit("unknown"))
    )
    per_client = sends.groupBy("space", "client_id").agg(
        F.count(F.lit(1)).alias("messages"),
        F.coalesce(F.sum("body_size"), F.lit(0)).alias("bytes"),
        F.countDistinct("address").alias("addresses"),
    )
    ranking = Window.partitionBy("space").orderBy(F.desc("messages"), F.asc("client_id"))
    return (
        per_client.withColumn("rank", F.row_number().over(ranking))
        .filter(F.col("rank") <= top)
        .select("space", "rank", "client_id", "messages", "bytes", "addresses")
        .orderBy("space", "rank")
    )


# --- control plane ------------------------------------------------------------------------------


def address_readiness(spans: DataFrame) -> DataFrame:
    """Address create -> Active, from the config service's `address.create` and `address.phase`
    spans. An address never seen Active has active_ns and create_to_active_ms null.

    Columns: space, address, created_ns, active_ns, create_to_active_ms."""
    keys = ["space", "address_resource"]
    created = (
        spans.filter(F.col("name") == tracing.SPAN_ADDRESS_CREATE)
        .groupBy(*keys)
        .agg(F.min("start_ns").alias("created_ns"))
    )
    active = spans.filter(
        (F.col("name") == tracing.SPAN_ADDRESS_PHASE) & (F.col("phase") == "Active")
    ).select(*keys, F.col("start_ns").alias("active_at"))
    first_active = (
        created.join(active, on=keys, how="left")
        .withColumn(
            "active_at",
            F.when(F.col("active_at") >= F.col("created_ns"), F.col("active_at")),
        )
        .groupBy(*keys, "created_ns")
        .agg(F.min("active_at").alias("active_ns"))
    )
    return first_active.select(
        "space",
        F.col("address_resource").alias("address"),
        "created_ns",
        "active_ns",
        ((F.col("active_ns") - F.col("created_ns")) / NS_PER_MS).alias("create_to_active_ms"),
    ).orderBy("space", "address")


def rpc_latency(spans: DataFrame) -> DataFrame:
    """Server-side gRPC call timings per service and method (the OTel gRPC instrumentation's
    SERVER spans).

    Columns: service, rpc_service, rpc_method, calls, errors, mean_ms, p50_ms, p95_ms, p99_ms."""
    calls = spans.filter((F.col("kind") == "SERVER") & F.col("rpc_method").isNotNull())
    return (
        calls.groupBy("service", "rpc_service", "rpc_method")
        .agg(
            F.count(F.lit(1)).alias("calls"),
            F.count(F.when(F.coalesce(F.col("grpc_status"), F.lit(0)) != 0, 1)).alias("errors"),
            (F.avg("duration_ns") / NS_PER_MS).alias("mean_ms"),
            *_percentiles_ms(F.col("duration_ns")),
        )
        .orderBy("service", "rpc_service", "rpc_method")
    )
