"""RouterAdmin over real gRPC and the router's limits against bad or greedy clients: the generation
rule, precise refusals that change nothing, listings, closing a connection, connection / session /
link / message-size limits, garbage bytes and a half-open socket that never disturb a neighbour."""

from __future__ import annotations

import concurrent.futures
import socket
import threading
import uuid
from pathlib import Path

import grpc
import pytest
from enmasse.amqp import codec
from enmasse.amqp.client import (
    AmqpError,
    BulkResult,
    Client,
    Receiver,
    run_receiver,
    run_sender,
)
from enmasse.amqp.engine import Condition, Outcome
from enmasse.v1 import router_pb2
from google.protobuf import json_format
from proton import Delivery, Endpoint, Message
from proton.utils import BlockingConnection, BlockingSender

from tests.fixtures.router import RouterFleet, RouterProcess


def _connect(router: RouterProcess, opened: list[Client]) -> Client:
    opened.append(Client("127.0.0.1", router.amqp_port))
    return opened[-1]


def test_apply_is_idempotent_and_refuses_older_generations(routers: RouterFleet) -> None:
    router = routers.start("r1")
    config = routers.mesh_config(generation=4, addresses={"work": "anycast"})
    assert router.apply(config) == router_pb2.ApplyConfigResponse(generation=4, changed=True)
    assert router.apply(config) == router_pb2.ApplyConfigResponse(generation=4, changed=False)
    with pytest.raises(grpc.RpcError) as refused:
        router.apply(routers.mesh_config(generation=3, addresses={}))
    assert refused.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert refused.value.details() == "generation 3 is older than the running generation 4"
    running = router.admin().GetConfig(router_pb2.GetConfigRequest(), timeout=10)
    assert running.generation == 4
    assert [a.address for a in running.addresses] == ["work"]


def test_a_configuration_file_is_applied_before_clients_connect(
    routers: RouterFleet, tmp_path: Path, clients: list[Client]
) -> None:
    config = routers.mesh_config(generation=7, addresses={"work": "anycast"})
    path = tmp_path / "router-config.json"
    path.write_text(json_format.MessageToJson(config))
    router = routers.start("r1", extra_args=("--config", str(path)))
    assert router.stats().generation == 7
    client = _connect(router, clients)
    receiver = client.receiver("work", credit=1)
    client.sender("work").send_async(codec.encode_message(b"from file"))
    assert codec.read_body(receiver.receive(10).payload) == b"from file"


def test_bad_configuration_is_refused_and_the_running_one_keeps_serving(
    routers: RouterFleet, clients: list[Client]
) -> None:
    router = routers.start("r1")
    router.apply(routers.mesh_config(generation=1, addresses={"work": "anycast"}))
    bad = routers.mesh_config(generation=2, addresses={"work": "anycast", "orders": "queue"})
    with pytest.raises(grpc.RpcError) as refused:
        router.apply(bad)
    assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert refused.value.details() == "address 'orders' of type queue needs at least one broker"
    assert router.stats().generation == 1
    client = _connect(router, clients)
    receiver = client.receiver("work", credit=1)
    assert client.sender("work").send_async(codec.encode_message(b"ok")) is not None
    assert codec.read_body(receiver.receive(10).payload) == b"ok"


def test_deleting_an_address_closes_its_links_with_not_found(
    routers: RouterFleet, clients: list[Client]
) -> None:
    router = routers.start("r1")
    router.apply(
        routers.mesh_config(generation=1, addresses={"work": "anycast", "keep": "anycast"})
    )
    client = _connect(router, clients)
    doomed = client.receiver("work", credit=1)
    kept = client.receiver("keep", credit=1)
    router.apply(routers.mesh_config(generation=2, addresses={"keep": "anycast"}))
    assert doomed.detached.result(10) == Condition(
        "amqp:not-found", "address 'work' was deleted from space 'test'"
    )
    client.sender("keep").send_async(codec.encode_message(b"still"))
    assert codec.read_body(kept.receive(10).payload) == b"still"


def test_changing_an_address_type_closes_its_links_and_the_new_type_serves(
    routers: RouterFleet, clients: list[Client]
) -> None:
    router = routers.start("r1")
    router.apply(routers.mesh_config(generation=1, addresses={"work": "anycast"}))
    client = _connect(router, clients)
    old = client.receiver("work", credit=1)
    router.apply(routers.mesh_config(generation=2, addresses={"work": "multicast"}))
    assert old.detached.result(10) == Condition(
        "amqp:resource-deleted", "address 'work' changed from anycast to multicast: attach again"
    )
    first, second = client.receiver("work", credit=5), client.receiver("work", credit=5)
    assert client.sender("work").send(codec.encode_message(b"all")).outcome is Outcome.ACCEPTED
    assert codec.read_body(first.receive(10).payload) == b"all"
    assert codec.read_body(second.receive(10).payload) == b"all"


def test_stats_listings_and_closing_a_connection(
    routers: RouterFleet, clients: list[Client]
) -> None:
    router = routers.start("r1")
    router.apply(routers.mesh_config(generation=1, addresses={"work": "anycast"}))
    consumer = _connect(router, clients)
    receiver = consumer.receiver("work", credit=10)
    producer = _connect(router, clients)
    sender = producer.sender("work")
    for n in range(3):
        sender.send_async(codec.encode_message(str(n).encode()))
    for _ in range(3):
        receiver.accept(receiver.receive(10))
    stats = router.address_stats("work")
    assert stats is not None
    assert (stats.deliveries_in, stats.deliveries_out, stats.accepted) == (3, 3, 3)
    assert (stats.consumers, stats.producers) == (1, 1)
    connections = router.admin().ListConnections(router_pb2.ListConnectionsRequest(), timeout=10)
    by_container = {c.container_id: c for c in connections.connections}
    target = by_container[producer.engine.container_id]
    assert target.deliveries_in == 3
    assert by_container[consumer.engine.container_id].deliveries_out == 3
    links = router.admin().ListLinks(
        router_pb2.ListLinksRequest(connection_id=target.id), timeout=10
    )
    assert [(link.role, link.address, link.deliveries) for link in links.links] == [
        ("receiver", "work", 3)
    ]
    router.admin().CloseConnection(
        router_pb2.CloseConnectionRequest(id=target.id, reason="maintenance"), timeout=10
    )
    assert producer.closed_with.result(10) == Condition("amqp:connection:forced", "maintenance")
    with pytest.raises(grpc.RpcError) as missing:
        router.admin().CloseConnection(router_pb2.CloseConnectionRequest(id=9999), timeout=10)
    assert missing.value.code() is grpc.StatusCode.NOT_FOUND
    assert missing.value.details() == "no connection 9999"


def test_connection_link_and_message_size_limits(
    routers: RouterFleet, clients: list[Client]
) -> None:
    router = routers.start("r1")
    limits = router_pb2.RouterLimits(
        max_connections=2, max_links_per_connection=2, max_message_size=1000
    )
    router.apply(routers.mesh_config(generation=1, addresses={"work": "anycast"}, limits=limits))
    first = _connect(router, clients)
    receiver = first.receiver("work", credit=10)
    sender = first.sender("work")
    with pytest.raises(AmqpError) as refused:
        first.receiver("work")
    assert refused.value.condition == Condition(
        "amqp:resource-limit-exceeded", "too many links on this connection: this router allows 2"
    )
    too_big = sender.send(codec.encode_message(b"x" * 2000))
    assert too_big.outcome is Outcome.REJECTED
    assert too_big.error is not None
    assert too_big.error.name == "amqp:link:message-size-exceeded"
    fine = sender.send_async(codec.encode_message(b"fits"))
    delivery = receiver.receive(10)
    assert codec.read_body(delivery.payload) == b"fits"
    receiver.accept(delivery)
    assert fine.result(10).outcome is Outcome.ACCEPTED

    _connect(router, clients)
    over = Condition("amqp:resource-limit-exceeded", "too many connections: this router allows 2")
    assert _refusal(router.amqp_port, clients) == over


def _session_sender(conn: BlockingConnection, address: str) -> BlockingSender:
    """A sender on a session of its own (proton's BlockingConnection puts every link on one)."""
    session = conn.conn.session()
    session.open()
    link = session.sender(f"{address}-{uuid.uuid4().hex[:8]}")
    link.target.address = address
    link.open()
    return BlockingSender(conn, link)


def test_a_session_beyond_the_limit_is_ended_while_the_earlier_ones_keep_working(
    routers: RouterFleet, clients: list[Client]
) -> None:
    router = routers.start("r1")
    limits = router_pb2.RouterLimits(max_sessions_per_connection=3)
    router.apply(routers.mesh_config(generation=1, addresses={"work": "anycast"}, limits=limits))
    receiver = _connect(router, clients).receiver("work", credit=20)
    conn = BlockingConnection(f"127.0.0.1:{router.amqp_port}", timeout=10)
    try:
        senders = [_session_sender(conn, "work") for _ in range(3)]
        fourth = conn.conn.session()
        fourth.open()
        pipelined = fourth.sender("pipelined")  # attached before the router's answer comes
        pipelined.target.address = "work"
        pipelined.open()
        conn.wait(lambda: bool(fourth.state & Endpoint.REMOTE_CLOSED), msg="the fourth session")
        ended = fourth.remote_condition
        assert Condition(ended.name, ended.description) == Condition(
            "amqp:resource-limit-exceeded",
            "too many sessions: this connection holds 3, the space's limit is 3",
        )
        fourth.close()
        bodies = [f"from session {n}" for n in range(3)]
        assert sorted(_exchange(conn, senders, bodies, receiver)) == bodies
        assert pipelined.state & Endpoint.REMOTE_UNINIT, "no answer to an attach on it"
        record = next(
            c
            for c in router.admin()
            .ListConnections(router_pb2.ListConnectionsRequest(), timeout=10)
            .connections
            if c.container_id == conn.container.container_id
        )
        links = router.admin().ListLinks(
            router_pb2.ListLinksRequest(connection_id=record.id), timeout=10
        )
        assert len(links.links) == 3, "the router holds only the links of the sessions it took"

        # A session the client ends makes room for another.
        first = senders[0].link.session
        first.close()
        conn.wait(lambda: bool(first.state & Endpoint.REMOTE_CLOSED), msg="the first session")
        again = _session_sender(conn, "work")
        assert _exchange(conn, [again], ["from a new session"], receiver) == ["from a new session"]
    finally:
        conn.close()


def _exchange(
    conn: BlockingConnection, senders: list[BlockingSender], bodies: list[str], receiver: Receiver
) -> list[object]:
    """Each sender sends its body; what `receiver` got, each accepted (in a thread of its own,
    while proton's connection turns here) once every sender has its ACCEPTED outcome."""

    def consume() -> list[object]:
        got = []
        for _ in bodies:
            delivery = receiver.receive(10)
            got.append(codec.read_body(delivery.payload))
            receiver.accept(delivery)
        return got

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        consumed = pool.submit(consume)
        sent = [s.link.send(Message(body=b)) for s, b in zip(senders, bodies, strict=True)]
        conn.wait(
            lambda: all(d.settled for d in sent) or bool(consumed.done() and consumed.exception()),
            msg="the outcomes",
        )
        got = consumed.result(10)
    assert [d.remote_state for d in sent] == [Delivery.ACCEPTED] * len(bodies)
    return got


def _refusal(port: int, opened: list[Client]) -> Condition | None:
    """How the router turned a connection away: at open, or by closing it right after."""
    try:
        client = Client("127.0.0.1", port)
    except AmqpError as refused:
        return refused.condition
    opened.append(client)
    return client.closed_with.result(10)


def _closed_by_peer(sock: socket.socket) -> bool:
    """Reads until the router closes the socket (bounded by the socket's timeout)."""
    try:
        while sock.recv(4096):
            pass
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False
    return True


def test_garbage_half_open_sockets_and_a_flood_do_not_disturb_a_neighbour(
    routers: RouterFleet,
) -> None:
    router = routers.start("r1", extra_args=("--idle-timeout", "1"))
    router.apply(
        routers.mesh_config(generation=1, addresses={"work": "anycast", "news": "multicast"})
    )
    count = 5000
    results: dict[str, BulkResult] = {}
    ready = threading.Event()

    def receive() -> None:
        results["receiver"] = run_receiver(
            "127.0.0.1", router.amqp_port, address="work", count=count, ready=ready, time_limit=60
        )

    def send() -> None:
        ready.wait(10)
        results["sender"] = run_sender(
            "127.0.0.1",
            router.amqp_port,
            address="work",
            payload=codec.encode_message(b"x" * 100),
            count=count,
            time_limit=60,
        )

    def flood() -> None:
        # Pre-settled to a multicast address nobody listens to: the router takes them all.
        results["flood"] = run_sender(
            "127.0.0.1",
            router.amqp_port,
            address="news",
            payload=codec.encode_message(b"f" * 100),
            count=100_000,
            settled=True,
            time_limit=30,
        )

    threads = [threading.Thread(target=f, daemon=True) for f in (receive, send, flood)]
    for thread in threads:
        thread.start()
    garbage = [socket.create_connection(("127.0.0.1", router.amqp_port)) for _ in range(5)]
    for n, sock in enumerate(garbage):
        sock.settimeout(10)
        prefix = b"AMQP\x03\x01\x00\x00" if n % 2 else b""
        sock.sendall(prefix + bytes(range(256)) * 4)
    half_open = [socket.create_connection(("127.0.0.1", router.amqp_port)) for _ in range(3)]
    for sock in half_open:
        sock.settimeout(15)
        sock.sendall(b"AMQP")  # a header that never completes
    try:
        for thread in threads:
            thread.join(90)
        assert all(_closed_by_peer(sock) for sock in garbage)
        assert all(_closed_by_peer(sock) for sock in half_open)
    finally:
        for sock in garbage + half_open:
            sock.close()
    assert results["receiver"].received == count
    assert results["receiver"].error is None
    assert results["sender"].accepted == count
    assert results["flood"].sent == 100_000
    assert router.alive
    stats = router.address_stats("work")
    assert stats is not None
    assert stats.accepted == count
