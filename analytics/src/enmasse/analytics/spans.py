"""OTLP-JSON span files -> one flat row per span.

What flows in: files of JSON lines, each an OTLP `ExportTraceServiceRequest` as the Collector's
file exporter (and `enmasse.common.tracing`'s local exporter) writes them:
resourceSpans[].resource.attributes + scopeSpans[].spans[]. What flows out: a DataFrame with one
row per span and the columns of `SPAN_COLUMNS` (docs/tracing.md, table `spans`), the input of
every table in `enmasse.analytics.tables`.

The JSON is read with an explicit schema, not inferred: inference reads everything twice, and an
explicit schema makes a missing field a null instead of a changed type. OTLP JSON writes 64-bit
integers as strings and enums as numbers (some writers as names); both are accepted. A line that
is not JSON is counted (`malformed_lines`, or observed in the same pass by `observed_spans`),
never fatal: one torn line at the end of a killed
process's file must not lose the rest.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from enmasse.common import tracing
from pyspark.sql import Column, DataFrame, Observation, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    DoubleType,
    StringType,
    StructField,
    StructType,
)

CORRUPT = "_corrupt_record"

_VALUE = StructType(
    [
        StructField("stringValue", StringType()),
        StructField("intValue", StringType()),
        StructField("boolValue", BooleanType()),
        StructField("doubleValue", DoubleType()),
    ]
)
_ATTRIBUTES = ArrayType(
    StructType([StructField("key", StringType()), StructField("value", _VALUE)])
)
_SPAN = StructType(
    [
        StructField("traceId", StringType()),
        StructField("spanId", StringType()),
        StructField("parentSpanId", StringType()),
        StructField("name", StringType()),
        StructField("kind", StringType()),
        StructField("startTimeUnixNano", StringType()),
        StructField("endTimeUnixNano", StringType()),
        StructField("attributes", _ATTRIBUTES),
        StructField(
            "status",
            StructType([StructField("code", StringType()), StructField("message", StringType())]),
        ),
    ]
)
OTLP_SCHEMA = StructType(
    [
        StructField(
            "resourceSpans",
            ArrayType(
                StructType(
                    [
                        StructField(
                            "resource", StructType([StructField("attributes", _ATTRIBUTES)])
                        ),
                        StructField(
                            "scopeSpans",
                            ArrayType(StructType([StructField("spans", ArrayType(_SPAN))])),
                        ),
                    ]
                )
            ),
        ),
        StructField(CORRUPT, StringType()),
    ]
)

SPAN_COLUMNS = (
    "trace_id",
    "span_id",
    "parent_span_id",
    "name",
    "kind",
    "start_ns",
    "end_ns",
    "duration_ns",
    "service",
    "space",
    "address",
    "address_type",
    "address_resource",
    "status",
    "status_message",
    "outcome",
    "condition",
    "client_id",
    "body_size",
    "rpc_service",
    "rpc_method",
    "grpc_status",
    "phase",
    "attributes",
)

_KINDS = {
    "0": "UNSPECIFIED",
    "1": "INTERNAL",
    "2": "SERVER",
    "3": "CLIENT",
    "4": "PRODUCER",
    "5": "CONSUMER",
}
_STATUSES = {"0": "UNSET", "1": "OK", "2": "ERROR"}


def read_otlp(spark: SparkSession, paths: Sequence[str | Path]) -> DataFrame:
    """The raw OTLP requests of every `*.json` / `*.jsonl` file under `paths` (files or folders)."""
    files = [str(p) for p in expand_paths(paths)]
    if not files:
        raise FileNotFoundError(
            f"no span files (*.jsonl, *.json) in {', '.join(str(p) for p in paths)}"
        )
    return (
        spark.read.schema(OTLP_SCHEMA)
        .option("mode", "PERMISSIVE")
        .option("columnNameOfCorruptRecord", CORRUPT)
        .json(files)
    )


def expand_paths(paths: Sequence[str | Path]) -> list[Path]:
    found: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found.extend(
                sorted(p for p in path.rglob("*.json*") if p.suffix in (".json", ".jsonl"))
            )
        elif path.is_file():
            found.append(path)
    return found


def malformed_lines(raw: DataFrame) -> int:
    # Spark refuses a query over the corrupt-record column alone; naming resourceSpans too is fine.
    return raw.filter(F.col("resourceSpans").isNull() & F.col(CORRUPT).isNotNull()).count()


def flatten(raw: DataFrame) -> DataFrame:
    """One row per span, resource attributes folded in (span attributes win over resource)."""
    resources = raw.select(F.explode("resourceSpans").alias("rs")).select(
        _attribute_map(F.col("rs.resource.attributes")).alias("resource"),
        F.explode("rs.scopeSpans").alias("ss"),
    )
    rows = resources.select("resource", F.explode("ss.spans").alias("s")).select("resource", "s.*")
    # Lookups go through a map of the raw value structs: built from the attribute array's own
    # columns, it stays in generated code, where a lambda over every attribute (the text map below)
    # would be interpreted per element. The text map is built once, for the `attributes` column.
    rows = rows.withColumn(
        "values", F.map_from_arrays(F.col("attributes.key"), F.col("attributes.value"))
    )
    start = F.col("startTimeUnixNano").try_cast("long")
    end = F.col("endTimeUnixNano").try_cast("long")

    def attr(key: str) -> Column:
        return _text(F.element_at(F.col("values"), F.lit(key)))

    def resource(key: str) -> Column:
        return F.element_at(F.col("resource"), F.lit(key))

    return rows.select(
        F.lower("traceId").alias("trace_id"),
        F.lower("spanId").alias("span_id"),
        F.when(F.col("parentSpanId") != "", F.lower("parentSpanId")).alias("parent_span_id"),
        F.col("name"),
        _enum(F.col("kind"), _KINDS, prefix="SPAN_KIND_").alias("kind"),
        start.alias("start_ns"),
        end.alias("end_ns"),
        (end - start).alias("duration_ns"),
        resource("service.name").alias("service"),
        F.coalesce(attr(tracing.ATTR_SPACE), resource(tracing.ATTR_SPACE)).alias("space"),
        attr(tracing.ATTR_ADDRESS).alias("address"),
        attr(tracing.ATTR_ADDRESS_TYPE).alias("address_type"),
        attr(tracing.ATTR_ADDRESS_RESOURCE).alias("address_resource"),
        F.coalesce(
            _enum(F.col("status.code"), _STATUSES, prefix="STATUS_CODE_"), F.lit("UNSET")
        ).alias("status"),
        F.col("status.message").alias("status_message"),
        attr(tracing.ATTR_OUTCOME).alias("outcome"),
        attr(tracing.ATTR_CONDITION).alias("condition"),
        attr(tracing.ATTR_CLIENT).alias("client_id"),
        attr(tracing.ATTR_BODY_SIZE).try_cast("long").alias("body_size"),
        attr("rpc.service").alias("rpc_service"),
        attr("rpc.method").alias("rpc_method"),
        attr("rpc.grpc.status_code").try_cast("int").alias("grpc_status"),
        attr(tracing.ATTR_PHASE).alias("phase"),
        _attribute_map(F.col("attributes")).alias("attributes"),
    )


def _text(value: Column) -> Column:
    """An OTLP AnyValue {stringValue|intValue|boolValue|doubleValue} as text."""
    return F.coalesce(
        value["stringValue"],
        value["intValue"],
        value["boolValue"].cast("string"),
        value["doubleValue"].cast("string"),
    )


def _attribute_map(pairs: Column) -> Column:
    """[{key, value: {stringValue|intValue|boolValue|doubleValue}}] -> map<string, string>."""
    entries = F.transform(
        F.coalesce(pairs, F.array().cast(_ATTRIBUTES)),
        lambda pair: F.struct(pair["key"].alias("key"), _text(pair["value"]).alias("value")),
    )
    return F.map_from_entries(entries)


def _enum(column: Column, names: dict[str, str], *, prefix: str) -> Column:
    """An OTLP enum written as a number ("2") or as its proto name ("SPAN_KIND_SERVER")."""
    mapped = F.element_at(F.create_map(*[F.lit(x) for pair in names.items() for x in pair]), column)
    by_name = F.when(column.startswith(prefix), F.substring(column, len(prefix) + 1, 64))
    return F.coalesce(mapped, by_name)


def load_spans(spark: SparkSession, paths: Sequence[str | Path]) -> tuple[DataFrame, int]:
    """Flat spans of every file under `paths`, and how many lines were not JSON (two passes)."""
    raw = read_otlp(spark, paths)
    return flatten(raw), malformed_lines(raw)


def observed_spans(
    spark: SparkSession, paths: Sequence[str | Path]
) -> tuple[DataFrame, Observation]:
    """Like `load_spans` in one pass: the malformed-line count is observed while the spans are
    computed, and readable (`observation.get["malformed"]`) after the first action on them."""
    observation = Observation("otlp_lines")
    bad = F.col("resourceSpans").isNull() & F.col(CORRUPT).isNotNull()
    raw = read_otlp(spark, paths).observe(observation, F.count(F.when(bad, 1)).alias("malformed"))
    return flatten(raw), observation
