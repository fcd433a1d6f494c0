"""amqps with passwords: listen(tls=..., authenticator=...), where the engine does TLS itself (in
memory, `tls.TlsSession`) under its own SASL PLAIN. First the TLS session as a pure object fed
with an in-memory client's bytes, then real clients (ours and proton's) over loopback with a
self-signed certificate: the right password gets in and messages flow both ways in order, wrong
ones get amqp:unauthorized-access, plain AMQP on the TLS port is refused, half a handshake is
dropped while another client streams on, and 1 MiB messages pass.
"""

from __future__ import annotations

import socket
import ssl
import time
from collections import deque
from collections.abc import Callable

import pytest
from enmasse.amqp import codec, sasl
from enmasse.amqp.client import AmqpError, Client
from enmasse.amqp.engine import (
    Condition,
    Connection,
    ConnectionHandler,
    Delivery,
    Link,
    Tls,
)
from enmasse.amqp.tls import RECORD_SIZE, TlsFailure, TlsSession, server_context
from proton import Message, SSLDomain
from proton.utils import BlockingConnection

USERS = {"alice": "wonderland"}
BAD_LOGIN = Condition("amqp:unauthorized-access", "Authentication failed [mech=PLAIN]")
NO_LOGIN = Condition("amqp:unauthorized-access", "Authentication failed [mech=none]")
NOT_TLS = Condition("amqp:connection:framing-error", "TLS handshake failed: wrong version number")


# -- the TLS session alone, against an in-memory client ------------------------------------------


class MemoryClient:
    """A TLS client without a socket: what it writes is handed to the session and back."""

    def __init__(self, ca_file: str) -> None:
        context = ssl.create_default_context(cafile=ca_file)
        self.incoming, self.outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.ssl = context.wrap_bio(self.incoming, self.outgoing, server_hostname="localhost")

    def exchange(self, session: TlsSession) -> bytes:
        """One round: our bytes to the session, its answer back; returns its plaintext."""
        plain = session.receive(self.outgoing.read())
        self.incoming.write(session.take_output())
        return plain

    def handshake(self, session: TlsSession) -> None:
        for _ in range(5):  # TLS 1.3 needs two rounds; bounded all the same
            try:
                self.ssl.do_handshake()
                return
            except ssl.SSLWantReadError:
                self.exchange(session)
        raise AssertionError("handshake did not complete")


def test_session_carries_plaintext_both_ways_and_closes(tls_certificate):
    cert, key = tls_certificate("listener")
    session = TlsSession(server_context(Tls(cert_file=cert, key_file=key)))
    client = MemoryClient(cert)
    client.handshake(session)
    client.ssl.write(sasl.SASL_HEADER)
    assert client.exchange(session) == sasl.SASL_HEADER
    assert session.established
    session.send(b"answer")
    client.incoming.write(session.take_output())
    assert client.ssl.read(100) == b"answer"
    session.close()
    client.incoming.write(session.take_output())
    assert client.ssl.read(100) == b""  # our close_notify arrived: end of data
    client.ssl.unwrap()  # the client answers with its own
    assert client.exchange(session) == b""
    assert session.peer_closed


def test_session_refuses_plain_amqp_and_bad_files(tls_certificate, tmp_path):
    cert, key = tls_certificate("listener")
    session = TlsSession(server_context(Tls(cert_file=cert, key_file=key)))
    with pytest.raises(TlsFailure) as not_tls:
        session.receive(sasl.SASL_HEADER + b"\x00" * 64)
    assert str(not_tls.value) == "TLS handshake failed: wrong version number"
    missing = str(tmp_path / "missing.key")
    with pytest.raises(ValueError, match="cannot load TLS certificate") as no_key:
        server_context(Tls(cert_file=cert, key_file=missing))
    assert str(no_key.value).startswith(f"cannot load TLS certificate {cert} / key {missing}: ")
    with pytest.raises(ValueError, match="needs cert_file and key_file") as half:
        server_context(Tls(cert_file=cert))
    assert str(half.value) == "a TLS listener needs cert_file and key_file"


def test_session_decrypts_each_record_as_soon_as_it_is_whole(tls_certificate):
    """feed() in pieces that cut records (and their 5-byte headers) anywhere: read_into() brings
    every record out as soon as its last byte came, and never asks OpenSSL for half a record."""
    cert, key = tls_certificate("listener")
    session = TlsSession(server_context(Tls(cert_file=cert, key_file=key)))
    client = MemoryClient(cert)
    client.handshake(session)
    asked = []
    real_read = session._ssl.read

    def read(size: int, buffer: memoryview) -> int:
        try:
            return real_read(size, buffer)  # type: ignore[return-value]
        except ssl.SSLWantReadError:
            asked.append(size)  # OpenSSL was asked for a record that was not all there
            raise

    session._ssl.read = read  # type: ignore[method-assign, assignment]
    buffer = memoryview(bytearray(RECORD_SIZE))
    records = []
    for n in range(60):
        body = bytes([n]) * (n * 271 + 1)  # up to 16,260 B: one record each
        client.ssl.write(body)
        records.append((body, client.outgoing.read()))
    stream = memoryview(b"".join(ciphertext for _, ciphertext in records))
    cuts = [1, 2, 3, 4, 5, 6, 7, 100, 4000, 17000]
    ends = [0]
    for _, ciphertext in records:
        ends.append(ends[-1] + len(ciphertext))
    position, decrypted, piece = 0, bytearray(), 0
    while position < len(stream):
        size = cuts[piece % len(cuts)]
        piece += 1
        session.feed(stream[position : position + size])
        position = min(position + size, len(stream))
        while got := session.read_into(buffer, RECORD_SIZE):
            decrypted += buffer[:got]
        whole = sum(1 for end in ends[1:] if end <= position)
        assert len(decrypted) == sum(len(body) for body, _ in records[:whole])
    assert bytes(decrypted) == b"".join(body for body, _ in records)
    assert asked == []
    # A record cut in two: nothing after the first half, all of it right after the second.
    client.ssl.write(b"halves")
    ciphertext = client.outgoing.read()
    session.feed(ciphertext[:7])
    assert session.read_into(buffer, RECORD_SIZE) == 0
    session.feed(ciphertext[7:])
    assert session.read_into(buffer, RECORD_SIZE) == len(b"halves")
    assert bytes(buffer[:6]) == b"halves"
    # A header announcing more than any record holds is refused at once, not waited for.
    session.feed(b"\x17\x03\x03\xff\xff" + b"\x00" * 10)
    with pytest.raises(TlsFailure) as garbled:
        session.read_into(buffer, RECORD_SIZE)
    assert str(garbled.value) == "TLS failed: packet length too long"


# -- real clients over loopback ------------------------------------------------------------------


class Echo(ConnectionHandler):
    """Sends what a client sends (on any link) back on the link the client receives on, in
    order; records who logged in and how each connection ended."""

    def __init__(self, seen: list[tuple[str | None, bool]], ends: list[Condition | None]) -> None:
        self.seen = seen
        self.ends = ends
        self.backlog: deque[bytes] = deque()
        self.out: Link | None = None

    def on_connection_open(self, conn: Connection) -> None:
        self.seen.append((conn.user, conn.encrypted))

    def on_link_attach(self, link: Link) -> None:
        link.accept()
        if link.is_receiver:
            link.flow(200)
        else:
            self.out = link

    def on_message(self, link: Link, delivery: Delivery) -> None:
        self.backlog.append(delivery.payload)
        delivery.settle()
        link.flow(1)
        self._pump()

    def on_link_credit(self, link: Link) -> None:
        self._pump()

    def _pump(self) -> None:
        out = self.out
        while self.backlog and out is not None and out.credit > 0:
            out.send(self.backlog.popleft(), settled=True)

    def on_connection_close(self, conn: Connection, error: Condition | None) -> None:
        self.ends.append(error)


class Server:
    """An Echo listener on amqps with PLAIN checked against USERS; keeps what it saw."""

    def __init__(self, start: Callable[..., tuple[object, int]], cert: str, key: str, **options):
        self.seen: list[tuple[str | None, bool]] = []
        self.ends: list[Condition | None] = []
        self.logins: list[tuple[str, str]] = []
        self.cert = cert
        _engine, self.port = start(
            lambda: Echo(self.seen, self.ends),
            tls=Tls(cert_file=cert, key_file=key),
            authenticator=sasl.Passwords(self.check),
            **options,
        )

    def check(self, user: str, password: str) -> bool:
        self.logins.append((user, password))
        return USERS.get(user) == password

    def wait_ends(self, count: int) -> list[Condition | None]:
        deadline = time.monotonic() + 10
        while len(self.ends) < count and time.monotonic() < deadline:
            time.sleep(0.02)
        return list(self.ends)


@pytest.fixture
def server(amqp_listener, tls_certificate) -> Callable[..., Server]:
    cert, key = tls_certificate("listener")
    return lambda **options: Server(amqp_listener, cert, key, **options)


def login(amqp_client, server: Server, **options: object) -> Client:
    verified = Tls(ca_file=server.cert, verify_hostname=True)
    return amqp_client(server.port, tls=verified, hostname="localhost", timeout=10, **options)


def echo(client: Client, bodies: list[bytes]) -> list[bytes]:
    """Sends every body, returns what came back (each sent one accepted)."""
    receiver = client.receiver("out", credit=200)
    sender = client.sender("in")
    sent = [sender.send_async(codec.encode_message(body)) for body in bodies]
    back = [codec.read_body(receiver.receive(10).payload) for _ in bodies]
    assert {future.result(10).outcome.name for future in sent} == {"ACCEPTED"}
    return back


def test_the_right_password_over_tls_exchanges_messages_both_ways(server, amqp_client):
    listener = server()
    client = login(amqp_client, listener, user="alice", password="wonderland")
    assert client.call(lambda: client.connection.encrypted)
    bodies = [f"message {i}".encode() for i in range(3000)]
    assert echo(client, bodies) == bodies
    assert listener.seen == [("alice", True)]
    assert listener.logins == [("alice", "wonderland")]
    client.close()
    assert client.closed_with.result(5) is None
    assert listener.wait_ends(1) == [None]  # a clean close, through close_notify


def test_wrong_passwords_are_refused_and_others_go_on(server, amqp_client):
    listener = server()
    alice = login(amqp_client, listener, user="alice", password="wonderland")
    for user, password, refusal in (
        ("alice", "guess", BAD_LOGIN),
        ("mallory", "wonderland", BAD_LOGIN),
        (None, None, NO_LOGIN),
    ):
        with pytest.raises(AmqpError) as refused:
            login(amqp_client, listener, user=user, password=password)
        assert refused.value.condition == refusal
    assert listener.logins == [
        ("alice", "wonderland"),
        ("alice", "guess"),
        ("mallory", "wonderland"),
    ]
    assert echo(alice, [b"still served"]) == [b"still served"]
    assert listener.seen == [("alice", True)]


def test_proton_client_logs_in_over_amqps(server):
    listener = server()
    domain = SSLDomain(SSLDomain.MODE_CLIENT)
    domain.set_trusted_ca_db(listener.cert)
    domain.set_peer_authentication(SSLDomain.VERIFY_PEER)
    url = f"amqps://alice:wonderland@127.0.0.1:{listener.port}"
    conn = BlockingConnection(url, ssl_domain=domain, allowed_mechs="PLAIN", timeout=10)
    try:
        receiver = conn.create_receiver("out")
        conn.create_sender("in").send(Message(body="from proton"))
        assert receiver.receive(timeout=10).body == "from proton"
    finally:
        conn.close()
    assert listener.seen == [("alice", True)]


def test_plain_text_client_on_the_tls_port_is_refused(server, amqp_client):
    listener = server()
    with pytest.raises(AmqpError) as refused:
        amqp_client(listener.port, user="alice", password="wonderland", timeout=10)
    assert refused.value.condition == Condition(
        "amqp:connection:framing-error",
        "Expected SASL protocol header: no protocol header found (connection aborted)",
    )
    assert listener.wait_ends(1) == [NOT_TLS]
    assert listener.logins == [], "no password was read off a plain connection"
    assert listener.seen == []


def half_a_client_hello(cert: str) -> bytes:
    client = MemoryClient(cert)
    with pytest.raises(ssl.SSLWantReadError):
        client.ssl.do_handshake()
    hello = client.outgoing.read()
    return hello[: len(hello) // 2]


def test_a_client_stuck_mid_handshake_is_dropped_while_another_streams(server, amqp_client):
    listener = server(idle_timeout=1.5)  # a socket with no AMQP open after 3 s is dropped
    streaming = login(amqp_client, listener, user="alice", password="wonderland")
    receiver = streaming.receiver("out", credit=200)
    sender = streaming.sender("in")
    hello = half_a_client_hello(listener.cert)
    stuck = socket.create_connection(("127.0.0.1", listener.port), timeout=10)
    quitter = socket.create_connection(("127.0.0.1", listener.port), timeout=10)
    try:
        stuck.sendall(hello)
        quitter.sendall(hello)
        quitter.close()
        sent = [sender.send_async(codec.encode_message(b"%d" % i)) for i in range(500)]
        try:
            dropped = stuck.recv(100)
        except ConnectionResetError:
            dropped = b""
        assert dropped == b"", "the server hung up on the stuck handshake"
        sent += [sender.send_async(codec.encode_message(b"%d" % i)) for i in range(500, 1000)]
        back = [codec.read_body(receiver.receive(10).payload) for _ in range(1000)]
    finally:
        stuck.close()
    assert back == [b"%d" % i for i in range(1000)]
    assert {future.result(10).outcome.name for future in sent} == {"ACCEPTED"}
    ends = listener.wait_ends(2)
    assert sorted(map(str, ends)) == [
        "amqp:connection:framing-error: connection closed in the TLS handshake",
        "amqp:resource-limit-exceeded: no AMQP open from the peer in time",
    ]
    assert listener.seen == [("alice", True)]


def test_one_mebibyte_messages_pass_both_ways(server, amqp_client):
    listener = server()
    client = login(amqp_client, listener, user="alice", password="wonderland")
    bodies = [bytes([i]) * (1024 * 1024) + b"end %d" % i for i in range(4)]
    assert echo(client, bodies) == bodies
