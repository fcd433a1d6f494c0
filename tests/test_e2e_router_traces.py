"""Traces that complete themselves: clients that do not trace, a router that does it for them.

Plain Qpid Proton clients (they send no trace context and record no span) talk through a real
router, to a queue on a real broker and to an anycast address on the router alone. With the
space's trace sampling at 100% the router starts each message's trace (its hop is the root; the
context travels in the message-annotations), the broker traces its hops as for any sampled
message, and the router records `router.deliver` when the consumer's outcome comes back; the
analytics job then has end-to-end and per-hop latency rows for the address. With sampling at 0
nothing is traced. A message recovered from the broker's journal after a SIGKILL keeps its
trace: the spans of its way out, after the restart, carry the trace id its way in started.

What the user sees: the trace files of the router and broker processes, and the job's tables.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from enmasse.common import tracing
from enmasse.v1 import router_pb2
from proton import Message
from proton.handlers import MessagingHandler
from proton.utils import BlockingConnection

from tests.fixtures.broker import BrokerFactory, BrokerProcess
from tests.fixtures.router import RouterFleet, RouterProcess

SPACE = "tenant-traces"
QUEUE = "orders"
ANYCAST = "requests"
MESSAGES = 3
QUEUE_PATH = [
    tracing.SPAN_WAYPOINT,
    tracing.SPAN_ENQUEUE,
    tracing.SPAN_QUEUE_RESIDENCE,
    tracing.SPAN_DEQUEUE,
    tracing.SPAN_ROUTE,
    tracing.SPAN_ROUTER_DELIVER,
]
ANYCAST_PATH = [tracing.SPAN_ROUTE, tracing.SPAN_ROUTER_DELIVER]
MESSAGE_PLANE = {*QUEUE_PATH, tracing.SPAN_SEND, tracing.SPAN_DELIVER, tracing.SPAN_SETTLE}


@pytest.fixture
def var_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every process started from here writes its trace file under this folder."""
    folder = tmp_path / "var"
    monkeypatch.setenv("ENMASSE_VAR", str(folder))
    monkeypatch.delenv(tracing.OTLP_ENDPOINT_ENV, raising=False)
    monkeypatch.delenv(tracing.SAMPLING_ENV, raising=False)
    return folder


@pytest.fixture
def proton_connections() -> Iterator[list[BlockingConnection]]:
    opened: list[BlockingConnection] = []
    yield opened
    for conn in opened:
        conn.close()


def _config(
    *, sampling: float, broker: BrokerProcess | None, generation: int = 1
) -> router_pb2.RouterConfig:
    addresses = [router_pb2.AddressRoute(address=ANYCAST, type="anycast")]
    if broker is not None:
        waypoint = router_pb2.BrokerWaypoint(
            name="b1", host="127.0.0.1", port=broker.amqp_port, state="Active"
        )
        addresses.append(router_pb2.AddressRoute(address=QUEUE, type="queue", brokers=[waypoint]))
    return router_pb2.RouterConfig(
        generation=generation, space=SPACE, addresses=addresses, trace_sampling=sampling
    )


def _connect(router: RouterProcess, opened: list[BlockingConnection]) -> BlockingConnection:
    conn = BlockingConnection(f"127.0.0.1:{router.amqp_port}", timeout=20)
    opened.append(conn)
    return conn


def _send(
    conn: BlockingConnection, address: str, bodies: list[str], *, durable: bool = False
) -> None:
    sender = conn.create_sender(address)
    for body in bodies:
        # Waits for the settlement; raises unless accepted.
        sender.send(Message(body=body, durable=durable))
    sender.close()


def _receive(conn: BlockingConnection, address: str, count: int) -> list[str]:
    receiver = conn.create_receiver(address, credit=count)
    bodies = []
    for _ in range(count):
        message = receiver.receive(timeout=20)
        bodies.append(message.body)
        receiver.accept()
    return bodies


class _Accepting(MessagingHandler):  # type: ignore[misc]
    """A plain consumer that accepts each message as it arrives (proton's auto-accept)."""

    def __init__(self) -> None:
        super().__init__(prefetch=0, auto_accept=True)
        self.bodies: list[str] = []

    def on_message(self, event: Any) -> None:
        self.bodies.append(event.message.body)


def _anycast_round(conn: BlockingConnection, bodies: list[str]) -> list[str]:
    """Sends `bodies` to the anycast address while a consumer on the same connection accepts
    them as they come: an anycast sender's settlement is its consumer's, so a blocking send
    returns only once the consumer has accepted."""
    consumer = _Accepting()
    receiver = conn.create_receiver(ANYCAST, credit=len(bodies), handler=consumer)
    _send(conn, ANYCAST, bodies)
    receiver.close()
    return consumer.bodies


def _spans(var_dir: Path) -> list[dict[str, Any]]:
    """Every span in the OTLP-JSON files, with its service and attributes flattened."""
    found = []
    for path in sorted((var_dir / "traces").glob("*.jsonl")):
        for line in path.read_text().splitlines():
            try:
                request = json.loads(line)
            except json.JSONDecodeError:
                continue  # empty, or a line the process is writing right now
            for resource_spans in request.get("resourceSpans", []):
                service = _attributes(resource_spans["resource"]).get("service.name")
                for scope in resource_spans.get("scopeSpans", []):
                    for span in scope.get("spans", []):
                        found.append(
                            {
                                "trace_id": span["traceId"].lower(),
                                "span_id": span["spanId"].lower(),
                                "parent": (span.get("parentSpanId") or "").lower() or None,
                                "name": span["name"],
                                "service": service,
                                "attributes": _attributes(span),
                            }
                        )
    return found


def _attributes(owner: dict[str, Any]) -> dict[str, Any]:
    return {a["key"]: next(iter(a["value"].values()), None) for a in owner.get("attributes", [])}


def _stop(routers: RouterFleet, brokers: list[BrokerProcess], opened: list[Any]) -> None:
    """A clean stop: every process exports what its batch processor still holds."""
    for conn in opened:
        conn.close()
    opened.clear()
    routers.stop_all()
    for broker in brokers:
        broker.stop()


def _traces(spans: list[dict[str, Any]], address: str) -> dict[str, list[dict[str, Any]]]:
    by_trace: dict[str, list[dict[str, Any]]] = {}
    for span in spans:
        if span["attributes"].get(tracing.ATTR_ADDRESS) == address:
            by_trace.setdefault(span["trace_id"], []).append(span)
    return by_trace


def test_untraced_clients_through_router_and_broker_get_complete_traces(
    var_dir: Path,
    routers: RouterFleet,
    broker_factory: BrokerFactory,
    proton_connections: list[BlockingConnection],
    spark: Any,
    tmp_path: Path,
) -> None:
    from enmasse.analytics import job

    broker = broker_factory()
    broker.ensure_queue(QUEUE)
    router = routers.start("r1")
    router.apply(_config(sampling=1.0, broker=broker))
    conn = _connect(router, proton_connections)
    consumer = _connect(router, proton_connections)
    bodies = [f"m-{n}" for n in range(MESSAGES)]
    _send(conn, QUEUE, bodies)
    assert _receive(consumer, QUEUE, MESSAGES) == bodies
    assert _anycast_round(conn, bodies) == bodies
    _stop(routers, [broker], proton_connections)

    spans = _spans(var_dir)
    assert not [s for s in spans if s["name"] in (tracing.SPAN_SEND, tracing.SPAN_DELIVER)]
    for address, path in ((QUEUE, QUEUE_PATH), (ANYCAST, ANYCAST_PATH)):
        traces = _traces(spans, address)
        assert len(traces) == MESSAGES, address
        for trace in traces.values():
            assert sorted(s["name"] for s in trace) == sorted(path), address
            (root,) = [s for s in trace if s["parent"] is None]
            assert (root["name"], root["service"]) == (path[0], "enmasse-router")
            (deliver,) = [s for s in trace if s["name"] == tracing.SPAN_ROUTER_DELIVER]
            assert deliver["attributes"][tracing.ATTR_OUTCOME] == "accepted"
            assert deliver["attributes"][tracing.ATTR_SPACE] == SPACE

    result = job.run(spark, inputs=[var_dir / "traces"], output=tmp_path / "analytics")
    latency = {
        row["address"]: row.asDict()
        for row in spark.read.parquet(str(result.tables["latency_address"])).collect()
    }
    hops = {
        (row["address"], row["hop"]): row.asDict()
        for row in spark.read.parquet(str(result.tables["hop_latency"])).collect()
    }
    for address, kind, path in ((QUEUE, "queue", QUEUE_PATH), (ANYCAST, "anycast", ANYCAST_PATH)):
        assert latency[address]["messages"] == MESSAGES
        assert (latency[address]["space"], latency[address]["address_type"]) == (SPACE, kind)
        assert latency[address]["p50_ms"] > 0
        for hop in path:
            assert hops[(address, hop)]["spans"] == MESSAGES, (address, hop)
    messages = spark.read.parquet(str(result.tables["messages"])).collect()
    assert sorted(m["address"] for m in messages if m["delivered"]) == sorted(
        [QUEUE] * MESSAGES + [ANYCAST] * MESSAGES
    )
    assert all(0 < m["hop_sum_ns"] <= m["e2e_ns"] for m in messages)


def test_sampling_zero_traces_nothing(
    var_dir: Path,
    routers: RouterFleet,
    broker_factory: BrokerFactory,
    proton_connections: list[BlockingConnection],
    spark: Any,
    tmp_path: Path,
) -> None:
    from enmasse.analytics import job

    broker = broker_factory()
    broker.ensure_queue(QUEUE)
    router = routers.start("r1")
    router.apply(_config(sampling=0.0, broker=broker))
    conn = _connect(router, proton_connections)
    bodies = [f"m-{n}" for n in range(MESSAGES)]
    _send(conn, QUEUE, bodies)
    assert _receive(conn, QUEUE, MESSAGES) == bodies
    assert _anycast_round(conn, bodies) == bodies
    _stop(routers, [broker], proton_connections)

    assert not [s for s in _spans(var_dir) if s["name"] in MESSAGE_PLANE]
    result = job.run(spark, inputs=[var_dir / "traces"], output=tmp_path / "analytics")
    for table in ("messages", "latency_address", "hop_latency"):
        assert spark.read.parquet(str(result.tables[table])).count() == 0, table


def test_router_refuses_a_sampling_share_out_of_range(routers: RouterFleet) -> None:
    import grpc

    router = routers.start("r1")
    with pytest.raises(grpc.RpcError) as refused:
        router.apply(_config(sampling=1.5, broker=None))
    assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "trace sampling 1.5 is not 0 (off) or a share from 0.0001 to 1" in str(
        refused.value.details()
    )


def test_message_recovered_from_the_journal_keeps_its_trace(
    var_dir: Path,
    routers: RouterFleet,
    broker_factory: BrokerFactory,
    proton_connections: list[BlockingConnection],
) -> None:
    broker = broker_factory()
    broker.ensure_queue(QUEUE)
    router = routers.start("r1")
    router.apply(_config(sampling=1.0, broker=broker))
    producer = _connect(router, proton_connections)
    _send(producer, QUEUE, ["kept"], durable=True)  # settled: in the broker's journal
    _wait_for_span(var_dir, tracing.SPAN_WAYPOINT)  # the router exported the trace's root
    (root,) = [s for s in _spans(var_dir) if s["name"] == tracing.SPAN_WAYPOINT]

    broker.kill()
    broker.start()  # the same data dir and port: the router's waypoint finds it again
    consumer = _connect(router, proton_connections)
    assert _receive(consumer, QUEUE, 1) == ["kept"]
    _stop(routers, [broker], proton_connections)

    after = [s for s in _spans(var_dir) if s["trace_id"] == root["trace_id"]]
    names = {s["name"]: s for s in after}
    assert {
        tracing.SPAN_QUEUE_RESIDENCE,
        tracing.SPAN_DEQUEUE,
        tracing.SPAN_ROUTE,
        tracing.SPAN_ROUTER_DELIVER,
    } <= set(names)
    residence = names[tracing.SPAN_QUEUE_RESIDENCE]
    assert residence["service"] == "enmasse-broker"
    assert residence["attributes"]["enmasse.recovered"] is True
    assert names[tracing.SPAN_ROUTER_DELIVER]["attributes"][tracing.ATTR_OUTCOME] == "accepted"


def _wait_for_span(var_dir: Path, name: str, *, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(s["name"] == name for s in _spans(var_dir)):
            return
        time.sleep(0.2)
    raise AssertionError(f"no {name} span exported within {timeout}s")
