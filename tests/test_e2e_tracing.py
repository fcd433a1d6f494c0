"""Message-plane traces end to end: sampled messages from a producer through a real router, a real
broker queue and the router again to a consumer, and the analytics job over the OTLP-JSON files
that every process wrote.

What the user sees: one trace per sampled message holding every hop (router.waypoint,
broker.enqueue, broker.queue_residence, broker.dequeue, router.route, amqp.deliver, amqp.settle)
as children of the producer's amqp.send, in that order, the disposition (accepted) on both ends,
hops that add up to no more than the end-to-end latency; and nothing at all for messages that are
not sampled, whether they carry no trace context or one whose flags say "not sampled".
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from enmasse.amqp import codec
from enmasse.amqp.client import Client
from enmasse.amqp.engine import Outcome
from enmasse.amqp.message_trace import ConsumerSpans, end_send, start_send
from enmasse.common import tracing
from enmasse.v1 import router_pb2

from tests.fixtures.broker import BrokerFactory, BrokerProcess
from tests.fixtures.router import RouterFleet

ADDRESS = "orders"
SPACE = "tenant-a"
SAMPLED = 5
PATH = [
    tracing.SPAN_SEND,
    tracing.SPAN_WAYPOINT,
    tracing.SPAN_ENQUEUE,
    tracing.SPAN_QUEUE_RESIDENCE,
    tracing.SPAN_DEQUEUE,
    tracing.SPAN_ROUTE,
    tracing.SPAN_DELIVER,
    tracing.SPAN_SETTLE,
]
UNSAMPLED_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
UNSAMPLED_PARENT = f"00-{UNSAMPLED_TRACE}-00f067aa0ba902b7-00"


@pytest.fixture
def var_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every process started from here writes its trace file under this folder."""
    folder = tmp_path / "var"
    monkeypatch.setenv("ENMASSE_VAR", str(folder))
    monkeypatch.delenv(tracing.OTLP_ENDPOINT_ENV, raising=False)
    monkeypatch.delenv(tracing.SAMPLING_ENV, raising=False)
    return folder


def _send_sampled(sender: Any, tracer: Any, n: int) -> str:
    body = f"sampled-{n}".encode()
    span, properties = start_send(
        tracer=tracer,
        address=ADDRESS,
        space=SPACE,
        address_type="queue",
        client_id="producer-1",
        body_size=len(body),
        application_properties={"n": n},
    )
    delivery = sender.send(codec.encode_message(body, application_properties=properties))
    end_send(span, delivery.outcome)
    assert delivery.outcome is Outcome.ACCEPTED
    return format(span.get_span_context().trace_id, "032x")


def _receive(receiver: Any, tracer: Any) -> bytes:
    delivery = receiver.receive(10)
    spans = ConsumerSpans(
        tracer=tracer, payload=delivery.payload, address=ADDRESS, space=SPACE, address_type="queue"
    )
    body = codec.read_body(delivery.payload)
    spans.handed_over()
    spans.settling()
    receiver.accept(delivery)
    spans.settled(Outcome.ACCEPTED)
    return bytes(body)


def _start_queue(routers: RouterFleet, broker: BrokerProcess) -> Any:
    broker.ensure_queue(ADDRESS)
    router = routers.start("r1")
    router.apply(
        routers.mesh_config(
            generation=1,
            space=SPACE,
            addresses={ADDRESS: "queue"},
            waypoints={
                ADDRESS: [
                    router_pb2.BrokerWaypoint(
                        name="b1", host="127.0.0.1", port=broker.amqp_port, state="Active"
                    )
                ]
            },
        )
    )
    return router


def _run_traffic(
    *, routers: RouterFleet, broker: BrokerProcess, clients: list[Client], var_dir: Path
) -> tuple[list[str], list[bytes]]:
    router = _start_queue(routers, broker)
    client_tracing = tracing.build_tracing(service="test-client", var_dir=var_dir, ratio=1.0)
    tracer = client_tracing.provider.get_tracer("tests.e2e")
    producer = Client("127.0.0.1", router.amqp_port)
    clients.append(producer)
    consumer = Client("127.0.0.1", router.amqp_port)
    clients.append(consumer)
    sender = producer.sender(ADDRESS)
    receiver = consumer.receiver(ADDRESS, credit=10)
    trace_ids = [_send_sampled(sender, tracer, n) for n in range(SAMPLED)]
    unsampled = [
        codec.encode_message(b"no-context"),
        codec.encode_message(
            b"not-sampled", application_properties={tracing.TRACEPARENT: UNSAMPLED_PARENT}
        ),
    ]
    for payload in unsampled:
        assert sender.send(payload).outcome is Outcome.ACCEPTED
    bodies = [_receive(receiver, tracer) for _ in range(SAMPLED + len(unsampled))]
    assert client_tracing.flush()
    client_tracing.shutdown()
    # A clean stop: the router and broker export what their batch processors still hold.
    for client in clients:
        client.close()
    clients.clear()
    routers.stop_all()
    broker.stop()
    return trace_ids, bodies


def test_sampled_messages_have_one_complete_trace_and_unsampled_none(
    var_dir: Path,
    routers: RouterFleet,
    broker_factory: BrokerFactory,
    clients: list[Client],
    spark: Any,
    tmp_path: Path,
) -> None:
    from enmasse.analytics import job

    broker = broker_factory()
    trace_ids, bodies = _run_traffic(
        routers=routers, broker=broker, clients=clients, var_dir=var_dir
    )
    assert bodies == [f"sampled-{n}".encode() for n in range(SAMPLED)] + [
        b"no-context",
        b"not-sampled",
    ]
    files = sorted(p.name.split("-")[0] for p in (var_dir / "traces").glob("*.jsonl"))
    assert {"broker", "router", "test"} <= set(files)

    result = job.run(spark, inputs=[var_dir / "traces"], output=tmp_path / "analytics")
    spans = spark.read.parquet(str(result.tables["spans"]))
    message_spans = [
        row.asDict()
        for row in spans.where(spans.name.isin(*PATH)).collect()  # gRPC admin spans aside
    ]
    assert not [s for s in message_spans if s["trace_id"] == UNSAMPLED_TRACE]
    assert sorted({s["trace_id"] for s in message_spans}) == sorted(trace_ids)

    for trace_id in trace_ids:
        trace = sorted(
            (s for s in message_spans if s["trace_id"] == trace_id), key=lambda s: s["start_ns"]
        )
        assert [s["name"] for s in trace] == PATH, trace_id
        send = trace[0]
        assert send["parent_span_id"] is None
        assert all(s["parent_span_id"] == send["span_id"] for s in trace[1:])
        assert {s["address"] for s in trace} == {ADDRESS}
        assert {s["address_type"] for s in trace} == {"queue"}
        by_name = {s["name"]: s for s in trace}
        assert by_name[tracing.SPAN_WAYPOINT]["service"] == "enmasse-router"
        assert by_name[tracing.SPAN_ROUTE]["service"] == "enmasse-router"
        assert by_name[tracing.SPAN_ENQUEUE]["service"] == "enmasse-broker"
        assert by_name[tracing.SPAN_SEND]["outcome"] == "accepted"
        assert by_name[tracing.SPAN_SETTLE]["outcome"] == "accepted"
        assert by_name[tracing.SPAN_ENQUEUE]["outcome"] == "accepted"

    messages = {
        row["trace_id"]: row.asDict()
        for row in spark.read.parquet(str(result.tables["messages"])).collect()
    }
    assert sorted(messages) == sorted(trace_ids)
    for trace_id in trace_ids:
        message = messages[trace_id]
        assert message["delivered"] is True
        assert message["path"] == PATH[1:]
        assert message["hop_count"] == len(PATH) - 1
        assert 0 < message["hop_sum_ns"] <= message["e2e_ns"]
        assert message["space"] == SPACE
        assert message["outcome"] == "accepted"


def _spans_in(folder: Path) -> list[dict[str, Any]]:
    """Every span of the OTLP-JSON lines under `folder`, with its service name."""
    found = []
    for path in folder.glob("*.jsonl"):
        for line in path.read_text().splitlines():
            for resource in json.loads(line)["resourceSpans"]:
                service = next(
                    a["value"]["stringValue"]
                    for a in resource["resource"]["attributes"]
                    if a["key"] == "service.name"
                )
                for scope in resource["scopeSpans"]:
                    found += [{**span, "service": service} for span in scope["spans"]]
    return found


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "enmasse.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_cli_send_and_receive_with_trace_write_the_message_trace(
    var_dir: Path, routers: RouterFleet, broker: BrokerProcess
) -> None:
    """(var_dir first: the broker and router must start with ENMASSE_VAR set.)"""
    router = _start_queue(routers, broker)
    url = f"amqp://127.0.0.1:{router.amqp_port}"
    sent = _cli("send", ADDRESS, "--url", url, "-s", SPACE, "-n", "2", "--body", "hi", "--trace")
    assert sent.returncode == 0, sent.stderr
    assert "sent 2 messages to 'orders' (accepted)" in sent.stdout
    got = _cli("receive", ADDRESS, "--url", url, "-s", SPACE, "-n", "2", "--trace")
    assert got.returncode == 0, got.stderr
    assert got.stdout.split() == ["hi", "hi"]
    routers.stop_all()
    broker.stop()

    spans = _spans_in(var_dir / "traces")
    sends = [s for s in spans if s["name"] == tracing.SPAN_SEND]
    assert len(sends) == 2
    assert {s["service"] for s in sends} == {"enmasse-cli"}
    for send in sends:
        names = sorted(s["name"] for s in spans if s["traceId"] == send["traceId"])
        # The router also records the delivery to the consumer (router.deliver) itself.
        assert names == sorted([*PATH, tracing.SPAN_ROUTER_DELIVER])
