"""Generated span files: message traces with chosen timings, in the Collector file exporter's
OTLP-JSON format, for the job's tests (known answers) and its benchmark (a million spans).

What flows in: the shape of the traffic (addresses, clients, when each message is sent, how long
each hop takes). What flows out: JSON lines, one `ExportTraceServiceRequest` per line, one file
per service as `enmasse.common.tracing` writes them. Spans follow the naming convention of
docs/tracing.md: a queue message goes client -> router.waypoint -> broker (enqueue, residence,
dequeue) -> router.route -> consumer (deliver, settle); an anycast one router.route -> consumer.

Why not the SDK: it writes the same format (a test checks the job reads both alike), but it stamps
its own clock and would take minutes for a million spans. Each hop is laid end to end with a
fixed gap (the wire between processes), so a message's hop sum is its end-to-end latency minus
the gaps: exactly what the job's answers can be checked against.
"""

from __future__ import annotations

import json
import random
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from enmasse.common import tracing

KIND_INTERNAL, KIND_SERVER, KIND_CLIENT, KIND_PRODUCER, KIND_CONSUMER = 1, 2, 3, 4, 5
STATUS_UNSET, STATUS_OK, STATUS_ERROR = 0, 1, 2

STORE_AND_FORWARD_PATH = (
    tracing.SPAN_WAYPOINT,
    tracing.SPAN_ENQUEUE,
    tracing.SPAN_QUEUE_RESIDENCE,
    tracing.SPAN_DEQUEUE,
    tracing.SPAN_ROUTE,
    tracing.SPAN_DELIVER,
    tracing.SPAN_SETTLE,
)
DIRECT_PATH = (tracing.SPAN_ROUTE, tracing.SPAN_DELIVER, tracing.SPAN_SETTLE)
_SERVICE_OF = {
    tracing.SPAN_SEND: "client",
    tracing.SPAN_DELIVER: "client",
    tracing.SPAN_SETTLE: "client",
    tracing.SPAN_ROUTE: "router",
    tracing.SPAN_WAYPOINT: "router",
    tracing.SPAN_ENQUEUE: "broker",
    tracing.SPAN_QUEUE_RESIDENCE: "broker",
    tracing.SPAN_DEQUEUE: "broker",
}


@dataclass(frozen=True)
class SpanRecord:
    service: str
    """Short service name: the resource's service.name is enmasse-<service>."""
    trace_id: str
    span_id: str
    parent_span_id: str | None
    name: str
    start_ns: int
    end_ns: int
    kind: int = KIND_INTERNAL
    attributes: Mapping[str, Any] = field(default_factory=dict)
    status_code: int = STATUS_UNSET
    status_message: str = ""


class Ids:
    """Trace and span ids from a seeded generator: the same seed gives the same files."""

    def __init__(self, seed: int = 7) -> None:
        self.random = random.Random(seed)

    def trace(self) -> str:
        return f"{self.random.getrandbits(128):032x}"

    def span(self) -> str:
        return f"{self.random.getrandbits(64):016x}"


def message_trace(
    ids: Ids,
    *,
    start_ns: int,
    space: str,
    address: str,
    address_type: str,
    client_id: str,
    hops: Sequence[tuple[str, int]],
    gap_ns: int = 100_000,
    body_size: int = 100,
    outcome: str = "accepted",
    hop_attributes: Mapping[str, Mapping[str, Any]] | None = None,
) -> list[SpanRecord]:
    """One message's spans: `amqp.send` at `start_ns`, then each (hop name, duration) in order,
    each after a gap; the send ends one gap after the last hop (its settlement came back)."""
    trace_id = ids.trace()
    common = tracing.span_attributes(address=address, space=space, address_type=address_type)
    send_id = ids.span()
    records: list[SpanRecord] = []
    parent, clock = send_id, start_ns
    for name, duration in hops:
        clock += gap_ns
        span_id = ids.span()
        extra = dict((hop_attributes or {}).get(name, {}))
        records.append(
            SpanRecord(
                service=_SERVICE_OF.get(name, "client"),
                trace_id=trace_id,
                span_id=span_id,
                parent_span_id=parent,
                name=name,
                start_ns=clock,
                end_ns=clock + duration,
                kind=KIND_CONSUMER if name == tracing.SPAN_DELIVER else KIND_INTERNAL,
                attributes={**common, **extra},
            )
        )
        parent, clock = span_id, clock + duration
    send = SpanRecord(
        service="client",
        trace_id=trace_id,
        span_id=send_id,
        parent_span_id=None,
        name=tracing.SPAN_SEND,
        start_ns=start_ns,
        end_ns=clock + gap_ns,
        kind=KIND_PRODUCER,
        attributes={
            **common,
            tracing.ATTR_CLIENT: client_id,
            tracing.ATTR_BODY_SIZE: body_size,
            tracing.ATTR_OUTCOME: outcome,
        },
    )
    return [send, *records]


# --- encoding ---------------------------------------------------------------------------------


def _value(value: Any) -> dict[str, Any]:
    # OTLP JSON: int64 as a decimal string, like the SDK's encoder writes it.
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, float):
        return {"doubleValue": value}
    return {"stringValue": str(value)}


def _attributes(values: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [{"key": key, "value": _value(value)} for key, value in values.items()]


def _span(record: SpanRecord) -> dict[str, Any]:
    span: dict[str, Any] = {
        "traceId": record.trace_id,
        "spanId": record.span_id,
        "name": record.name,
        "kind": record.kind,
        "startTimeUnixNano": str(record.start_ns),
        "endTimeUnixNano": str(record.end_ns),
        "attributes": _attributes(record.attributes),
        "status": {},
    }
    if record.parent_span_id:
        span["parentSpanId"] = record.parent_span_id
    if record.status_code:
        span["status"] = {"code": record.status_code, "message": record.status_message}
    return span


def export_request(
    *, service: str, spans: Sequence[SpanRecord], space: str | None = None
) -> dict[str, Any]:
    """One OTLP `ExportTraceServiceRequest` of one service's spans."""
    resource: dict[str, Any] = {"service.name": f"enmasse-{service}", "process.pid": 4242}
    if space:
        resource[tracing.ATTR_SPACE] = space
    return {
        "resourceSpans": [
            {
                "resource": {"attributes": _attributes(resource)},
                "scopeSpans": [
                    {"scope": {"name": "enmasse.synthetic"}, "spans": [_span(s) for s in spans]}
                ],
            }
        ]
    }


def write_spans(folder: Path, records: Sequence[SpanRecord], *, batch: int = 512) -> list[Path]:
    """Writes `records` as `<service>-synthetic.jsonl` files, `batch` spans per line (the SDK's
    batch processor's default), and returns the files."""
    folder.mkdir(parents=True, exist_ok=True)
    by_service: dict[str, list[SpanRecord]] = defaultdict(list)
    for record in records:
        by_service[record.service].append(record)
    paths = []
    for service, spans in sorted(by_service.items()):
        path = folder / f"{service}-synthetic.jsonl"
        with path.open("a", encoding="utf-8") as out:
            for i in range(0, len(spans), batch):
                request = export_request(service=service, spans=spans[i : i + batch])
                out.write(json.dumps(request, separators=(",", ":")) + "\n")
        paths.append(path)
    return paths


# --- bulk traffic (the benchmark) -------------------------------------------------------------


@dataclass(frozen=True)
class Traffic:
    spaces: int = 4
    addresses_per_space: int = 5
    clients_per_space: int = 8
    rate_per_s: float = 2000.0
    """Messages per second over all addresses: sets how many throughput windows there are."""
    start_ns: int = 1_700_000_000_000_000_000


def traffic(ids: Ids, *, spans: int, shape: Traffic = Traffic()) -> Iterator[SpanRecord]:
    """Messages over `shape` until about `spans` spans are made (a message is 4 or 8 spans):
    every other address is a queue (store-and-forward path), the rest anycast; one message in
    fifty is rejected by its consumer; hop times are random but each hop has its own scale."""
    made, clock = 0, shape.start_ns
    step = int(1e9 / shape.rate_per_s)
    while made < spans:
        space_no = ids.random.randrange(shape.spaces)
        address_no = ids.random.randrange(shape.addresses_per_space)
        queue = address_no % 2 == 0
        path = STORE_AND_FORWARD_PATH if queue else DIRECT_PATH
        rejected = ids.random.random() < 0.02
        hops = [(name, _hop_duration(ids, name)) for name in path]
        settle = {tracing.ATTR_OUTCOME: "rejected" if rejected else "accepted"}
        if rejected:
            settle[tracing.ATTR_CONDITION] = "amqp:precondition-failed"
        records = message_trace(
            ids,
            start_ns=clock,
            space=f"space-{space_no}",
            address=f"{'queue' if queue else 'anycast'}-{address_no}",
            address_type="queue" if queue else "anycast",
            client_id=f"client-{space_no}-{ids.random.randrange(shape.clients_per_space)}",
            hops=hops,
            body_size=ids.random.choice((64, 256, 1024)),
            outcome="rejected" if rejected else "accepted",
            hop_attributes={tracing.SPAN_SETTLE: settle},
        )
        yield from records
        made += len(records)
        clock += step


_SCALE_US = {
    tracing.SPAN_WAYPOINT: 80,
    tracing.SPAN_ROUTE: 60,
    tracing.SPAN_ENQUEUE: 400,
    tracing.SPAN_QUEUE_RESIDENCE: 2000,
    tracing.SPAN_DEQUEUE: 50,
    tracing.SPAN_DELIVER: 100,
    tracing.SPAN_SETTLE: 30,
}


def _hop_duration(ids: Ids, name: str) -> int:
    return int(ids.random.expovariate(1.0) * _SCALE_US[name] * 1000) + 1000
