"""enmasse.common.tracing end to end: a real grpc.aio server and client on loopback, with the
OpenTelemetry gRPC interceptors that `start_server` and `client_interceptors` hand out, write
OTLP-JSON lines (the Collector file exporter's format) whose spans link client -> server -> the
servicer's own span in one trace; a refused call is an ERROR span with its gRPC status; the
health service is not traced. A separate process configured only through the environment
($ENMASSE_VAR, $ENMASSE_TRACE_SAMPLING) writes its file where the docs say, with its resource.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from enmasse.common import tracing
from enmasse.common.serving import RunningServer, start_server
from enmasse.v1 import broker_pb2, broker_pb2_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

SERVICE = "enmasse.v1.BrokerAdmin"


class _Admin(broker_pb2_grpc.BrokerAdminServicer):
    """Just enough of a broker admin: EnsureQueue answers, DeleteQueue refuses unknown names."""

    def __init__(self, provider_tracer: Any) -> None:
        self.tracer = provider_tracer

    async def EnsureQueue(
        self, request: broker_pb2.EnsureAddressRequest, context: grpc.aio.ServicerContext
    ) -> broker_pb2.BrokerAddress:
        with self.tracer.start_as_current_span("broker.ensure_queue") as span:
            span.set_attribute(tracing.ATTR_ADDRESS, request.name)
            return broker_pb2.BrokerAddress(name=request.name, kind="queue")

    async def DeleteQueue(
        self, request: broker_pb2.DeleteAddressRequest, context: grpc.aio.ServicerContext
    ) -> broker_pb2.DeleteAddressResponse:
        await context.abort(grpc.StatusCode.NOT_FOUND, f"no queue {request.name!r}")
        raise AssertionError("abort returns never")


def _spans(path: Path) -> list[dict[str, Any]]:
    """Every span of an OTLP-JSON lines file, with its resource's attributes beside it."""
    found = []
    for line in path.read_text().splitlines():
        request = json.loads(line)
        for resource_spans in request["resourceSpans"]:
            resource = _attributes(resource_spans["resource"].get("attributes", []))
            for scope_spans in resource_spans["scopeSpans"]:
                for span in scope_spans["spans"]:
                    found.append({**span, "resource": resource})
    return found


def _attributes(pairs: list[dict[str, Any]]) -> dict[str, Any]:
    return {pair["key"]: next(iter(pair["value"].values())) for pair in pairs}


@pytest.fixture
def traced(tmp_path: Path) -> Iterator[tracing.Tracing]:
    setup = tracing.build_tracing(service="probe", space="tenant-a", var_dir=tmp_path, ratio=1.0)
    yield setup
    setup.shutdown()


@pytest.fixture
async def admin_server(traced: tracing.Tracing) -> AsyncIterator[RunningServer]:
    servicer = _Admin(traced.provider.get_tracer("test"))
    running = await start_server(
        registrations=[(broker_pb2_grpc.add_BrokerAdminServicer_to_server, servicer, SERVICE)],
        interceptors=tracing.server_interceptors(traced),
    )
    yield running
    await running.stop(grace=0.5)


async def test_grpc_calls_write_linked_spans_as_otlp_json(
    traced: tracing.Tracing, admin_server: RunningServer
) -> None:
    target = f"127.0.0.1:{admin_server.port}"
    parent_tracer = traced.provider.get_tracer("test")
    async with grpc.aio.insecure_channel(
        target, interceptors=tracing.client_interceptors(traced)
    ) as channel:
        stub = broker_pb2_grpc.BrokerAdminStub(channel)
        with parent_tracer.start_as_current_span("cli.apply"):
            reply = await stub.EnsureQueue(
                broker_pb2.EnsureAddressRequest(name="orders"), timeout=5
            )
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.DeleteQueue(broker_pb2.DeleteAddressRequest(name="nope"), timeout=5)
        health = health_pb2_grpc.HealthStub(channel)
        await health.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
    assert reply.name == "orders"
    assert refused.value.code() == grpc.StatusCode.NOT_FOUND
    assert traced.flush()

    path = Path(traced.destination)
    assert path.parent.name == "traces"
    assert path.name == f"probe-{os.getpid()}.jsonl"
    spans = _spans(path)
    by_name: dict[str, list[dict[str, Any]]] = {}
    for span in spans:
        by_name.setdefault(span["name"], []).append(span)

    ensure_calls = by_name[f"/{SERVICE}/EnsureQueue"]
    client = next(s for s in ensure_calls if s["kind"] == 3)  # SPAN_KIND_CLIENT
    server = next(s for s in ensure_calls if s["kind"] == 2)  # SPAN_KIND_SERVER
    (root,) = by_name["cli.apply"]
    (inner,) = by_name["broker.ensure_queue"]
    trace_ids = {root["traceId"], client["traceId"], server["traceId"], inner["traceId"]}
    assert len(trace_ids) == 1
    assert len(root["traceId"]) == 32  # hex, as the Collector writes it, not base64
    assert "parentSpanId" not in root or not root["parentSpanId"]
    assert client["parentSpanId"] == root["spanId"]
    assert server["parentSpanId"] == client["spanId"]
    assert inner["parentSpanId"] == server["spanId"]
    assert _attributes(inner["attributes"])[tracing.ATTR_ADDRESS] == "orders"
    assert _attributes(server["attributes"])["rpc.method"] == "EnsureQueue"
    assert int(server["startTimeUnixNano"]) <= int(inner["startTimeUnixNano"])
    assert int(inner["endTimeUnixNano"]) <= int(server["endTimeUnixNano"])

    delete_calls = by_name[f"/{SERVICE}/DeleteQueue"]
    refused_client = next(s for s in delete_calls if s["kind"] == 3)
    refused_server = next(s for s in delete_calls if s["kind"] == 2)
    assert refused_client["status"] == {"code": 2, "message": "no queue 'nope'"}  # ERROR
    # OTLP JSON writes int64 values as strings.
    assert _attributes(refused_server["attributes"])["rpc.grpc.status_code"] == "5"  # NOT_FOUND

    assert not any("Health" in name for name in by_name), sorted(by_name)
    resource = root["resource"]
    assert resource["service.name"] == "enmasse-probe"
    assert resource[tracing.ATTR_SPACE] == "tenant-a"
    assert resource["process.pid"] == str(os.getpid())
    assert resource["host.name"]


def test_not_configured_means_no_interceptors() -> None:
    if tracing.current() is not None:
        pytest.skip("another test in this process configured global tracing")
    assert tracing.server_interceptors() == []
    assert tracing.client_interceptors() == []


_PROBE = """
from enmasse.common import tracing
setup = tracing.configure_tracing(service="probe-env", space="tenant-b")
again = tracing.configure_tracing(service="other")
assert again is setup
tracer = tracing.tracer("probe")
for i in range(200):
    with tracer.start_as_current_span("amqp.send"):
        pass
setup.shutdown()
print(setup.destination, setup.ratio)
"""


def _run_probe(env_extra: dict[str, str]) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(env_extra)
    return subprocess.run(
        [sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=60
    )


def test_process_configured_from_environment_writes_under_enmasse_var(tmp_path: Path) -> None:
    done = _run_probe({"ENMASSE_VAR": str(tmp_path), "ENMASSE_TRACE_SAMPLING": "0.5"})
    assert done.returncode == 0, done.stderr
    destination, ratio = done.stdout.split()
    assert float(ratio) == 0.5
    files = list((tmp_path / "traces").glob("probe-env-*.jsonl"))
    assert [str(f) for f in files] == [destination]
    spans = _spans(files[0])
    # Ratio sampling on random trace ids: some but not all of the 200 root spans are kept.
    assert 0 < len(spans) < 200
    assert {s["resource"]["service.name"] for s in spans} == {"enmasse-probe-env"}
    assert {s["resource"][tracing.ATTR_SPACE] for s in spans} == {"tenant-b"}


def test_bad_sampling_ratio_is_refused_with_the_setting_named(tmp_path: Path) -> None:
    done = _run_probe({"ENMASSE_VAR": str(tmp_path), "ENMASSE_TRACE_SAMPLING": "lots"})
    assert done.returncode != 0
    assert "ENMASSE_TRACE_SAMPLING='lots' is not a ratio" in done.stderr
    assert not list(tmp_path.glob("traces/*.jsonl"))


@pytest.mark.parametrize(
    ("raw", "expected"),
    [(None, 1.0), ("", 1.0), ("0", 0.0), ("0.01", 0.01), ("1%", 0.01), ("100%", 1.0)],
)
def test_sampling_ratio_parses(raw: str | None, expected: float) -> None:
    assert tracing.sampling_ratio(raw) == pytest.approx(expected)


def test_sampling_ratio_out_of_range() -> None:
    with pytest.raises(tracing.TracingConfigError, match=r"'1\.5' is outside 0\.\.1"):
        tracing.sampling_ratio("1.5")
