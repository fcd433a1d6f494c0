"""The engine when things go wrong: killed peers, garbage, silent sockets, huge and oversized
messages, a sender that detaches with deliveries still buffered, and SASL PLAIN logins.
Each test checks what the surviving side sees, and that it keeps serving others.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from enmasse.amqp import codec
from enmasse.amqp.client import AmqpError
from enmasse.amqp.engine import (
    Condition,
    Connection,
    ConnectionHandler,
    Delivery,
    Engine,
    Link,
    Outcome,
    Tls,
)


class Recorder(ConnectionHandler):
    """Accepts everything, takes every message, records what happened in one shared journal."""

    def __init__(self, journal: Journal) -> None:
        self.journal = journal

    def on_connection_open(self, conn: Connection) -> None:
        self.journal.add("open", conn.container_id)

    def on_link_attach(self, link: Link) -> None:
        link.accept()
        if link.is_receiver:
            link.flow(1000)

    def on_message(self, link: Link, delivery: Delivery) -> None:
        self.journal.messages.append(delivery.payload)
        delivery.settle()
        link.flow(1)

    def on_link_detach(self, link: Link, *, closed: bool, error: Condition | None) -> None:
        self.journal.add("detach", link.address, closed, error)

    def on_connection_close(self, conn: Connection, error: Condition | None) -> None:
        self.journal.add("close", conn.container_id, error)


class Journal:
    def __init__(self) -> None:
        self.entries: list[tuple[object, ...]] = []
        self.messages: list[bytes] = []
        self.lock = threading.Lock()

    def add(self, *entry: object) -> None:
        with self.lock:
            self.entries.append(entry)

    def of(self, kind: str) -> list[tuple[object, ...]]:
        with self.lock:
            return [e for e in self.entries if e[0] == kind]


def wait_for(predicate, *, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


@pytest.fixture
def recorder(amqp_listener):
    journal = Journal()
    engine, port = amqp_listener(lambda: Recorder(journal))
    return journal, engine, port


def read_until_closed(sock: socket.socket, *, timeout: float) -> bytes:
    """Everything the server writes until it closes the socket (bounded by timeout)."""
    sock.settimeout(timeout)
    data = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            break
        except ConnectionResetError:
            return data
        if not chunk:
            return data
        data += chunk
    raise AssertionError(f"server did not close the socket within {timeout}s (got {data!r})")


def test_killed_peer_surfaces_as_detach_and_close_with_error(recorder, tmp_path):
    journal, _engine, port = recorder
    script = textwrap.dedent(
        f"""
        import time
        from enmasse.amqp.client import Client
        client = Client("127.0.0.1", {port}, container_id="doomed")
        client.sender("in")
        client.receiver("out")
        print("attached", flush=True)
        time.sleep(60)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == b"attached"
        assert wait_for(lambda: len(journal.of("open")) == 1)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait(5)
    assert wait_for(lambda: len(journal.of("close")) == 1)
    detaches = journal.of("detach")
    assert sorted(str(d[1]) for d in detaches) == ["in", "out"]
    assert all(d[2] is False and d[3] is not None for d in detaches)
    _kind, container, error = journal.of("close")[0]
    assert container == "doomed"
    assert isinstance(error, Condition)
    assert error.name == "amqp:connection:framing-error"


def test_garbage_closes_that_connection_only(recorder, amqp_client):
    journal, _engine, port = recorder
    good = amqp_client(port, container_id="good")
    sender = good.sender("in")
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        raw.sendall(b"GET / HTTP/1.1\r\nHost: nobody\r\n\r\n")
        reply = read_until_closed(raw, timeout=5)
    # proton answers a bad protocol header with its own header before hanging up
    assert reply.startswith(b"AMQP")
    assert wait_for(lambda: len(journal.of("close")) == 1)
    error = journal.of("close")[0][2]
    assert isinstance(error, Condition)
    assert error.name == "amqp:connection:framing-error"
    assert sender.send(codec.encode_message(b"still here")).outcome == Outcome.ACCEPTED
    assert journal.messages[-1] == codec.encode_message(b"still here")


def test_socket_that_never_opens_is_reaped(amqp_listener):
    journal = Journal()
    _engine, port = amqp_listener(lambda: Recorder(journal), idle_timeout=0.3)
    with socket.create_connection(("127.0.0.1", port), timeout=5) as silent:
        read_until_closed(silent, timeout=5)
    with socket.create_connection(("127.0.0.1", port), timeout=5) as half:
        half.sendall(b"AMQP\x03\x01\x00\x00")  # the SASL header, then nothing more
        read_until_closed(half, timeout=5)
    assert wait_for(lambda: len(journal.of("close")) == 2)
    names = {e[2].name for e in journal.of("close") if isinstance(e[2], Condition)}
    assert names == {"amqp:resource-limit-exceeded"}


def test_peer_that_goes_silent_is_dropped_by_idle_timeout(amqp_listener, amqp_client):
    journal = Journal()
    _engine, port = amqp_listener(lambda: Recorder(journal), idle_timeout=0.3)
    client = amqp_client(port, container_id="sleepy")
    client.sender("in")
    # Freeze the client's engine thread: no frames, no heartbeats, the socket stays open.
    client.engine.call_soon_threadsafe(lambda: time.sleep(2))
    assert wait_for(lambda: len(journal.of("close")) == 1, timeout=5)
    _kind, container, error = journal.of("close")[0]
    assert container == "sleepy"
    assert error == Condition("amqp:resource-limit-exceeded", "local-idle-timeout expired")
    assert journal.of("detach")[0][1:3] == ("in", False)


def test_connection_with_heartbeats_outlives_idle_timeout(amqp_listener, amqp_client):
    journal = Journal()
    _engine, port = amqp_listener(lambda: Recorder(journal), idle_timeout=1.0)
    sender = amqp_client(port).sender("in")
    time.sleep(2.5)  # more than two idle periods with no messages, only heartbeats
    assert journal.of("close") == []
    assert sender.send(codec.encode_message(b"alive")).outcome == Outcome.ACCEPTED


def test_large_message_spanning_many_frames_is_reassembled(amqp_listener, amqp_client):
    journal = Journal()
    _engine, port = amqp_listener(lambda: Recorder(journal), max_frame_size=4096)
    body = os.urandom(3 * 1024 * 1024)
    payload = codec.encode_message(body, durable=True)
    sender = amqp_client(port).sender("in")
    assert sender.send(payload, timeout=30).outcome == Outcome.ACCEPTED
    assert len(journal.messages) == 1
    assert journal.messages[0] == payload
    assert codec.read_body(journal.messages[0]) == body


def test_large_messages_back_to_back_are_each_joined_whole(amqp_listener, amqp_client):
    """Chunks are read out of proton as frames come (`engine.large`): each message's chunks are
    its own, and a small one right after a large one on the same link is not mixed in."""
    journal = Journal()
    _engine, port = amqp_listener(
        lambda: Recorder(journal), max_message_size=8 * 1024 * 1024, max_frame_size=16384
    )
    sender = amqp_client(port).sender("in")
    payloads = [
        codec.encode_message(os.urandom(5 * 1024 * 1024)),
        codec.encode_message(os.urandom(3 * 1024 * 1024 + 7)),
        codec.encode_message(b"small"),
        codec.encode_message(os.urandom(2 * 1024 * 1024)),
    ]
    futures = [sender.send_async(p) for p in payloads]
    assert [f.result(60).outcome for f in futures] == [Outcome.ACCEPTED] * 4
    assert journal.messages == payloads


def test_oversized_message_is_rejected_and_its_link_goes_on(amqp_listener, amqp_client):
    journal = Journal()
    _engine, port = amqp_listener(lambda: Recorder(journal), max_message_size=1000)
    client = amqp_client(port)
    sender = client.sender("in")
    oversized = codec.encode_message(b"x" * 5000)
    refused = sender.send(oversized)
    assert refused.outcome == Outcome.REJECTED
    assert refused.error == Condition(
        "amqp:link:message-size-exceeded",
        f"message of {len(oversized)} bytes exceeds the limit of 1000 bytes",
    )
    fits = codec.encode_message(b"x" * 500)
    assert sender.send(fits).outcome == Outcome.ACCEPTED, "the same link takes the next one"
    assert journal.messages == [fits]
    assert journal.of("detach") == []
    assert journal.of("close") == []


def test_oversized_multi_frame_message_is_thrown_away_as_it_comes(amqp_listener, amqp_client):
    journal = Journal()
    _engine, port = amqp_listener(
        lambda: Recorder(journal), max_message_size=100_000, max_frame_size=4096
    )
    sender = amqp_client(port).sender("in")
    oversized = codec.encode_message(b"x" * 1_000_000)
    refused = sender.send(oversized, timeout=30)
    assert refused.outcome == Outcome.REJECTED
    assert refused.error == Condition(
        "amqp:link:message-size-exceeded",
        f"message of {len(oversized)} bytes exceeds the limit of 100000 bytes",
    ), "the size counts every frame, those thrown away too"
    fits = codec.encode_message(b"y" * 50_000)
    for _ in range(3):
        assert sender.send(fits).outcome == Outcome.ACCEPTED
    assert journal.messages == [fits] * 3
    assert journal.of("detach") == []


def test_sender_detaching_right_after_sending_loses_nothing(recorder):
    journal, _engine, port = recorder
    count = 2000

    class SendThenClose(ConnectionHandler):
        def __init__(self) -> None:
            self.sent = 0
            self.payloads = [codec.encode_message(str(i).encode()) for i in range(count)]

        def on_connection_open(self, conn: Connection) -> None:
            conn.open_sender("in")

        def on_link_credit(self, link: Link) -> None:
            while link.credit > 0 and self.sent < count:
                link.send(self.payloads[self.sent], settled=True)
                self.sent += 1
            if self.sent == count:
                link.close()  # in the same turn: the transfers are still in proton's buffers

    client = Engine()
    client.connect(host="127.0.0.1", port=port, handler=SendThenClose())
    thread = client.run_in_thread()
    try:
        assert wait_for(lambda: len(journal.of("detach")) == 1)
    finally:
        client.stop()
        thread.join(5)
    assert [codec.read_body(m) for m in journal.messages] == [str(i).encode() for i in range(count)]
    assert journal.of("detach")[0][1:4] == ("in", True, None)


def test_unsettled_deliveries_are_listed_when_the_receiver_goes(amqp_listener, amqp_client):
    left: list[list[bytes]] = []
    ready = threading.Event()

    class Feeder(ConnectionHandler):
        def on_link_attach(self, link: Link) -> None:
            link.accept()

        def on_link_credit(self, link: Link) -> None:
            while link.credit > 0 and len(link.unsettled) < 3:
                link.send(codec.encode_message(f"u{len(link.unsettled)}".encode()))
            ready.set()

        def on_link_detach(self, link: Link, *, closed: bool, error: Condition | None) -> None:
            left.append([d.payload for d in link.unsettled])

    _engine, port = amqp_listener(Feeder)
    receiver = amqp_client(port).receiver("out", credit=10)
    first = receiver.receive()
    receiver.accept(first)
    assert ready.wait(5)
    assert wait_for(lambda: receiver._inbox.qsize() == 2)
    receiver.close()
    assert wait_for(lambda: len(left) == 1)
    assert [codec.read_body(p) for p in left[0]] == [b"u1", b"u2"]


def test_sasl_plain_checks_passwords(amqp_client, sasl_users):
    # Cyrus SASL reads its config path once per process, so the PLAIN listener gets its own.
    config_dir, config_name = sasl_users({"alice": "wonderland"})
    script = textwrap.dedent(
        f"""
        import sys
        from enmasse.amqp.engine import ConnectionHandler, Engine

        class WhoIsIt(ConnectionHandler):
            def on_connection_open(self, conn):
                print("user", conn.user, flush=True)

            def on_link_attach(self, link):
                link.accept()
                link.flow(10)

            def on_message(self, link, delivery):
                delivery.settle()

        engine = Engine()
        port = engine.listen(
            handler_factory=WhoIsIt,
            sasl_mechanisms="PLAIN",
            sasl_config_path={config_dir!r},
            sasl_config_name={config_name!r},
        )
        print("port", port, flush=True)
        engine.run()
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline().split()[1])
        client = amqp_client(port, user="alice", password="wonderland")
        assert client.sender("in").send(codec.encode_message(b"hi")).outcome == Outcome.ACCEPTED
        assert proc.stdout.readline().strip() == b"user alice"
        with pytest.raises(AmqpError, match="amqp:unauthorized-access"):
            amqp_client(port, user="alice", password="wrong")
        with pytest.raises(AmqpError, match="amqp:unauthorized-access"):
            amqp_client(port)  # ANONYMOUS is not offered
    finally:
        proc.kill()
        proc.wait(5)


def test_handler_that_raises_closes_only_its_connection(amqp_listener, amqp_client):
    journal = Journal()

    class Fragile(Recorder):
        def on_message(self, link: Link, delivery: Delivery) -> None:
            if codec.read_body(delivery.payload) == b"boom":
                raise RuntimeError("handler bug")
            super().on_message(link, delivery)

    _engine, port = amqp_listener(lambda: Fragile(journal))
    victim = amqp_client(port, container_id="victim")
    bystander = amqp_client(port, container_id="bystander").sender("in")
    with pytest.raises(AmqpError, match="amqp:internal-error"):
        victim.sender("in").send(codec.encode_message(b"boom"))
    assert victim.closed_with.result(5) == Condition("amqp:internal-error", "internal error")
    assert bystander.send(codec.encode_message(b"fine")).outcome == Outcome.ACCEPTED
    # The client sees the close frame before the server's transport has finished closing.
    assert wait_for(lambda: journal.of("close"))
    assert [e[1] for e in journal.of("close")] == ["victim"]


def test_connection_refused_in_on_connection_open(amqp_listener, amqp_client):
    class Bouncer(ConnectionHandler):
        def on_connection_open(self, conn: Connection) -> None:
            conn.close(Condition("amqp:resource-limit-exceeded", "max connections (0) reached"))

    _engine, port = amqp_listener(Bouncer)
    with pytest.raises(AmqpError) as refused:
        amqp_client(port)
    assert str(refused.value) == (
        "connection refused: amqp:resource-limit-exceeded: max connections (0) reached"
    )


def test_many_clients_at_once_each_get_their_messages(amqp_listener, amqp_client):
    journal = Journal()
    _engine, port = amqp_listener(lambda: Recorder(journal))
    senders = [amqp_client(port, container_id=f"c{i}").sender("in") for i in range(20)]
    futures = [
        sender.send_async(codec.encode_message(f"{i}-{n}".encode()))
        for i, sender in enumerate(senders)
        for n in range(50)
    ]
    assert {f.result(10).outcome for f in futures} == {Outcome.ACCEPTED}
    bodies = [codec.read_body(m).decode() for m in journal.messages]
    assert len(bodies) == 1000
    for i in range(20):
        assert [b for b in bodies if b.startswith(f"{i}-")] == [f"{i}-{n}" for n in range(50)]


def test_tls_listener_serves_verified_clients_only(amqp_listener, amqp_client, tls_certificate):
    cert, key = tls_certificate("broker")
    other_cert, _other_key = tls_certificate("impostor")
    journal = Journal()
    encrypted: list[bool] = []

    class Secure(Recorder):
        def on_connection_open(self, conn: Connection) -> None:
            encrypted.append(conn.encrypted)

    _engine, port = amqp_listener(lambda: Secure(journal), tls=Tls(cert_file=cert, key_file=key))
    client = amqp_client(port, hostname="localhost", tls=Tls(ca_file=cert, verify_hostname=True))
    payload = codec.encode_message(b"over tls")
    assert client.sender("in").send(payload).outcome == Outcome.ACCEPTED
    assert journal.messages == [payload]
    assert encrypted == [True]
    assert client.call(lambda: client.connection.encrypted)
    with pytest.raises(AmqpError, match="certificate verify failed"):
        amqp_client(port, tls=Tls(ca_file=other_cert))
    with pytest.raises(AmqpError, match="certificate verify failed"):
        amqp_client(port, hostname="elsewhere", tls=Tls(ca_file=cert, verify_hostname=True))
    with pytest.raises(AmqpError, match="amqp:connection:framing-error"):
        amqp_client(port)  # plain AMQP against a TLS listener
    assert encrypted == [True]
