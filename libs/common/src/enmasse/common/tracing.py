"""Tracing for every EnMasse-py process, configured once, here (DESIGN §6).

What flows in: a call to `configure_tracing(service=..., space=...)` at start-up, and the
environment: `OTEL_EXPORTER_OTLP_ENDPOINT` (a Collector: spans go there over OTLP/gRPC),
`ENMASSE_TRACE_SAMPLING` (the head-sampling ratio, 0..1, default 1), `ENMASSE_VAR` (where local
trace files go). What flows out: finished spans, either to the Collector or, on one machine, as
OTLP-JSON lines in `<var>/traces/<service>-<pid>.jsonl`: one `ExportTraceServiceRequest` per
line, the format of the Collector's file exporter, written by the `opentelemetry-exporter-otlp-
json-file` package. One file per process because several processes appending to one file could
interleave partial lines; the analytics job reads the whole folder.

gRPC spans are not hand-written: `server_interceptors()` / `client_interceptors()` hand out the
OpenTelemetry gRPC instrumentation's grpc.aio interceptors (health and reflection excluded: probes
would drown the traces). They are empty until tracing is configured, so a process that never
calls `configure_tracing` pays nothing.

The message plane carries W3C Trace Context inside the AMQP message, per the W3C "Trace Context:
AMQP protocol" draft: a producer puts `traceparent` / `tracestate` in the application-properties;
an intermediary (router, broker), which must not touch the application's section, adds or reads
them in the message-annotations. `inject_context` / `extract_context` are pure functions over a
dict carrier (either section), so the router and broker call them without a tracer of their own;
`is_sampled` is the one lookup an unsampled message costs on the hot path.

The span names and attribute keys the message plane and the control plane use are defined here,
as constants, because `enmasse.analytics` reads spans by exactly these names (docs/tracing.md).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.exporter.otlp.json.file import FileSpanExporter
from opentelemetry.instrumentation.grpc import (
    aio_client_interceptors,
    aio_server_interceptor,
    filters,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

# --- naming conventions (read by enmasse.analytics; documented in docs/tracing.md) -------------

SPAN_SEND = "amqp.send"
"""Producer (root, kind PRODUCER): from handing the message to the link to its settlement."""
SPAN_ROUTE = "router.route"
"""Router: delivery arrived -> forwarded to a consumer link (anycast, multicast, or back out)."""
SPAN_WAYPOINT = "router.waypoint"
"""Router: delivery arrived -> forwarded to the broker waypoint holding the address."""
SPAN_ENQUEUE = "broker.enqueue"
"""Broker: delivery arrived -> stored (journal fsync when durable) and settled."""
SPAN_QUEUE_RESIDENCE = "broker.queue_residence"
"""Broker: stored -> picked for a consumer (time spent waiting in the queue)."""
SPAN_DEQUEUE = "broker.dequeue"
"""Broker: picked -> sent on the consumer's link."""
SPAN_DELIVER = "amqp.deliver"
"""Consumer (kind CONSUMER): delivery received -> handed to the application."""
SPAN_SETTLE = "amqp.settle"
"""Consumer: the application's disposition (outcome attribute) -> settled."""
SPAN_ROUTER_DELIVER = "router.deliver"
"""Router, towards a consumer: handed on to the consumer's link (sent, or parked for its credit)
-> the consumer's settlement arrived (outcome attribute). Recorded for every sampled message, so a
consumer that does not trace still ends the message's trace."""
SPAN_ADDRESS_CREATE = "address.create"
"""Config service: an Address was written for the first time."""
SPAN_ADDRESS_PHASE = "address.phase"
"""Config service: an Address's status phase changed (attribute `enmasse.phase`)."""

HOP_SPANS = (
    SPAN_ROUTE,
    SPAN_WAYPOINT,
    SPAN_ENQUEUE,
    SPAN_QUEUE_RESIDENCE,
    SPAN_DEQUEUE,
    SPAN_DELIVER,
    SPAN_SETTLE,
)
"""Spans that are one hop of a message's path; they do not overlap, so they sum to <= e2e."""
HOP_LATENCY_SPANS = (*HOP_SPANS, SPAN_ROUTER_DELIVER)
"""The per-hop latency table's spans: the hops, and the router's `router.deliver` (the consumer's
side as the router sees it; it holds a tracing consumer's `amqp.deliver` and `amqp.settle`, so it
is not a hop of the path)."""
ROUTER_ROOTS = (SPAN_ROUTE, SPAN_WAYPOINT)
"""A router hop with no parent is the root of a trace the router started (the message came
without trace context and the space's sampling picked it): it stands for the `amqp.send`."""

ATTR_ADDRESS = "messaging.destination.name"
ATTR_SPACE = "enmasse.space"
ATTR_ADDRESS_TYPE = "enmasse.address_type"
ATTR_ADDRESS_RESOURCE = "enmasse.address"
ATTR_OUTCOME = "enmasse.outcome"
"""accepted | rejected | released | modified: the AMQP outcome a delivery settled with."""
ATTR_CONDITION = "enmasse.error.condition"
"""The AMQP error condition (e.g. amqp:not-found) of a rejection or refused link."""
ATTR_CLIENT = "messaging.client.id"
"""The AMQP container-id of the client: the 'talker' of the per-tenant tables."""
ATTR_BODY_SIZE = "messaging.message.body.size"
ATTR_PHASE = "enmasse.phase"

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
SAMPLING_ENV = "ENMASSE_TRACE_SAMPLING"
OTLP_ENDPOINT_ENV = "OTEL_EXPORTER_OTLP_ENDPOINT"

_NOT_TRACED = (
    "grpc.health.v1.Health",
    "grpc.reflection.v1alpha.ServerReflection",
    "grpc.reflection.v1.ServerReflection",
)


class TracingConfigError(ValueError):
    """A tracing setting from the environment that cannot be used (message says which)."""


@dataclass
class Tracing:
    """What `configure_tracing` set up: the provider, and where spans go."""

    provider: TracerProvider
    destination: str
    """The Collector endpoint, or the path of this process's OTLP-JSON file."""
    ratio: float

    def flush(self, *, timeout_ms: int = 5000) -> bool:
        return self.provider.force_flush(timeout_ms)

    def shutdown(self) -> None:
        self.provider.shutdown()


_current: Tracing | None = None


def sampling_ratio(raw: str | None) -> float:
    """Parses ENMASSE_TRACE_SAMPLING: a ratio 0..1 (a trailing % means percent); unset = 1."""
    if raw is None or not raw.strip():
        return 1.0
    text = raw.strip()
    try:
        value = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        raise TracingConfigError(
            f"{SAMPLING_ENV}={raw!r} is not a ratio: give a number from 0 to 1, or a percent"
        ) from None
    if not 0.0 <= value <= 1.0:
        raise TracingConfigError(f"{SAMPLING_ENV}={raw!r} is outside 0..1")
    return value


ROUTER_SAMPLING_DEFAULT = 0.001
"""The share of untraced messages whose trace a router starts when its space plan names none:
one in 1,000, which costs the router about 2.5% more instructions per message (1% would
cost about 16%: a router-started trace is 2 spans and an annotation, ~900,000 instructions)."""
ROUTER_SAMPLING_FINEST = 0.0001
"""The smallest non-zero share: a router samples every n-th untraced message, n <= 10,000."""


def router_sampling_problem(value: float) -> str | None:
    """Why `value` cannot be a space's router sampling share (None: it can): 0 turns router-
    started traces off; otherwise it must lie in 0.0001..1."""
    if value == 0:
        return None
    if not ROUTER_SAMPLING_FINEST <= value <= 1:  # NaN fails both comparisons too
        return f"{value} is not 0 (off) or a share from {ROUTER_SAMPLING_FINEST} to 1"
    return None


def make_resource(*, service: str, space: str | None) -> Resource:
    attributes: dict[str, Any] = {
        "service.name": f"enmasse-{service}",
        "service.namespace": "enmasse",
        "host.name": socket.gethostname(),
        "process.pid": os.getpid(),
    }
    if space:
        attributes[ATTR_SPACE] = space
    return Resource.create(attributes)


def trace_dir(var_dir: str | os.PathLike[str] | None = None) -> Path:
    """<var_dir>/traces, else $ENMASSE_VAR/traces, else ./var/traces."""
    root = Path(var_dir) if var_dir is not None else Path(os.environ.get("ENMASSE_VAR", "var"))
    return root / "traces"


def configure_tracing(
    *,
    service: str,
    space: str | None = None,
    var_dir: str | os.PathLike[str] | None = None,
    ratio: float | None = None,
) -> Tracing:
    """Builds this process's tracing and makes it the global one (OpenTelemetry allows one
    provider per process, so a second call returns the first set-up unchanged).

    `ratio` overrides $ENMASSE_TRACE_SAMPLING. From then on `server_interceptors()` and
    `client_interceptors()` (and so `start_server`) trace gRPC calls.
    """
    global _current
    if _current is None:
        _current = build_tracing(service=service, space=space, var_dir=var_dir, ratio=ratio)
        trace.set_tracer_provider(_current.provider)
    return _current


def configure_service_tracing(
    *, service: str, space: str | None = None, var_dir: str | os.PathLike[str] | None = None
) -> Tracing | None:
    """`configure_tracing` for a service's main.py: a trace folder that cannot be made (a
    read-only working directory) costs the traces, not the service; a bad sampling setting
    still stops the start (TracingConfigError), because it is an operator's typo to fix."""
    try:
        return configure_tracing(service=service, space=space, var_dir=var_dir)
    except OSError as error:
        import structlog  # only on this rare path

        structlog.get_logger("enmasse.tracing").warning(
            "tracing off: cannot write trace files", service=service, error=str(error)
        )
        return None


def build_tracing(
    *,
    service: str,
    space: str | None = None,
    var_dir: str | os.PathLike[str] | None = None,
    ratio: float | None = None,
    exporter: SpanExporter | None = None,
) -> Tracing:
    """A tracer provider with EnMasse's resource, sampler and exporter, not installed globally:
    what `configure_tracing` installs, and what tests use side by side in one process.
    `exporter` overrides the choice between the Collector and the local file."""
    chosen_ratio = sampling_ratio(os.environ.get(SAMPLING_ENV)) if ratio is None else ratio
    destination, span_exporter = _exporter(service=service, var_dir=var_dir, override=exporter)
    provider = TracerProvider(
        resource=make_resource(service=service, space=space),
        # Parent-based: a message sampled by its producer is traced at every hop, and one that
        # is not costs nothing downstream.
        sampler=ParentBased(TraceIdRatioBased(chosen_ratio)),
    )
    provider.add_span_processor(BatchSpanProcessor(span_exporter, schedule_delay_millis=1000))
    return Tracing(provider=provider, destination=destination, ratio=chosen_ratio)


def current() -> Tracing | None:
    return _current


def _exporter(
    *, service: str, var_dir: str | os.PathLike[str] | None, override: SpanExporter | None
) -> tuple[str, SpanExporter]:
    if override is not None:
        return type(override).__name__, override
    endpoint = os.environ.get(OTLP_ENDPOINT_ENV)
    if endpoint:
        # Imported here: only processes that talk to a Collector load the OTLP/gRPC exporter.
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        return endpoint, OTLPSpanExporter()
    folder = trace_dir(var_dir)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{service}-{os.getpid()}.jsonl"
    return str(path), FileSpanExporter(path)


def tracer(name: str) -> trace.Tracer:
    return trace.get_tracer(name)


# --- gRPC -------------------------------------------------------------------------------------


def _traced_services() -> filters.Condition[Any]:
    return filters.negate(filters.any_of(*(filters.service_name(s) for s in _NOT_TRACED)))


def server_interceptors(tracing: Tracing | None = None) -> list[grpc.aio.ServerInterceptor]:
    """The grpc.aio server interceptor of the OTel gRPC instrumentation, for `tracing` (default:
    the configured one); [] when tracing is not configured."""
    chosen = tracing or _current
    if chosen is None:
        return []
    return [aio_server_interceptor(tracer_provider=chosen.provider, filter_=_traced_services())]


def client_interceptors(tracing: Tracing | None = None) -> list[grpc.aio.ClientInterceptor]:
    """The grpc.aio client interceptors (one per call shape), for `tracing` (default: the
    configured one); [] when tracing is not configured. Pass to `grpc.aio.insecure_channel`."""
    chosen = tracing or _current
    if chosen is None:
        return []
    return list(
        aio_client_interceptors(tracer_provider=chosen.provider, filter_=_traced_services())
    )


# --- message plane: W3C Trace Context in AMQP ---------------------------------------------------

_propagator = TraceContextTextMapPropagator()


def inject_context(
    carrier: MutableMapping[str, Any], *, context: otel_context.Context | None = None
) -> MutableMapping[str, Any]:
    """Writes `traceparent` (and `tracestate` if any) of `context` (default: the current one)
    into `carrier`: a producer's application-properties or an intermediary's message-annotations.
    Writes nothing when there is no valid span context. Returns the carrier."""
    _propagator.inject(carrier, context=context)
    return carrier


def extract_context(carrier: Mapping[str, Any] | None) -> otel_context.Context:
    """The remote span context in `carrier` (an empty Context when it has none or a bad one)."""
    if not carrier:
        return otel_context.Context()
    # AMQP maps may hold symbol keys and non-str values: only string values can be trace context.
    text = {
        str(key): value
        for key, value in carrier.items()
        if str(key) in (TRACEPARENT, TRACESTATE) and isinstance(value, str)
    }
    return _propagator.extract(text)


def message_context(
    *, annotations: Mapping[str, Any] | None, properties: Mapping[str, Any] | None
) -> otel_context.Context:
    """The trace context of an AMQP message: message-annotations win (an intermediary's hop is
    the nearer parent), else application-properties (the producer's)."""
    for carrier in (annotations, properties):
        if carrier and _traceparent(carrier) is not None:
            return extract_context(carrier)
    return otel_context.Context()


def is_sampled(carrier: Mapping[str, Any] | None) -> bool:
    """The hot-path check: does this carrier hold a valid traceparent with the sampled flag?

    One dict lookup and a string slice; no context objects are made. Per W3C Trace Context a
    traceparent is `00-<32 hex>-<16 hex>-<2 hex flags>`; bit 0 of the flags is 'sampled'."""
    if not carrier:
        return False
    value = _traceparent(carrier)
    if value is None or len(value) != 55 or value[2] != "-" or value[52] != "-":
        return False
    try:
        return bool(int(value[53:55], 16) & 0x01)
    except ValueError:
        return False


def _traceparent(carrier: Mapping[str, Any]) -> str | None:
    value = carrier.get(TRACEPARENT)
    return value if isinstance(value, str) else None


def span_attributes(
    *,
    address: str,
    space: str | None = None,
    address_type: str | None = None,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The attributes every message-plane span carries, under the names analytics reads."""
    attributes: dict[str, Any] = {ATTR_ADDRESS: address}
    if space:
        attributes[ATTR_SPACE] = space
    if address_type:
        attributes[ATTR_ADDRESS_TYPE] = address_type
    if extra:
        attributes.update(extra)
    return attributes


__all__: Sequence[str] = [
    "HOP_SPANS",
    "Tracing",
    "TracingConfigError",
    "build_tracing",
    "client_interceptors",
    "configure_service_tracing",
    "configure_tracing",
    "extract_context",
    "inject_context",
    "is_sampled",
    "message_context",
    "server_interceptors",
    "span_attributes",
]
