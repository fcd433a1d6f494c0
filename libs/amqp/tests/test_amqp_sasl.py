"""SASL done by the engine itself (listen(authenticator=...)): the exchange as pure functions,
then real clients (ours and proton's) logging in over loopback, right and wrong.
"""

from __future__ import annotations

import socket
import threading

import pytest
from enmasse.amqp import codec, sasl
from enmasse.amqp.client import AmqpError
from enmasse.amqp.engine import Connection, ConnectionHandler, Delivery, Link, Outcome
from proton import Message
from proton.utils import BlockingConnection

USERS = {"alice": "wonderland"}


def check(user: str, password: str) -> bool:
    return USERS.get(user) == password


def passwords(checker=check, *, allow_anonymous: bool = False) -> sasl.Passwords:
    """PLAIN on a plain listener, as these tests log in (the engine's default refuses it)."""
    return sasl.Passwords(checker, allow_anonymous=allow_anonymous, allow_plain_without_tls=True)


def exchange(*, allow_anonymous: bool) -> sasl.SaslServer:
    return sasl.SaslServer(passwords(allow_anonymous=allow_anonymous), encrypted=False)


def init_frame(mechanism: str, response: bytes) -> bytes:
    body = b"\x00\x53\x41" + b"\xc0" + bytes([2 + len(mechanism) + 2 + len(response) + 1, 2])
    body += b"\xa3" + bytes([len(mechanism)]) + mechanism.encode()
    body += b"\xa0" + bytes([len(response)]) + response
    return sasl._frame(body)


def answered(server: sasl.SaslServer, step: sasl.Step) -> sasl.Step:
    """What the engine does with a check: the authenticator's answer, back into the exchange."""
    return server.checked(check(*step.check)) if step.check is not None else step


def test_exchange_accepts_the_right_password_and_keeps_what_follows():
    server = exchange(allow_anonymous=False)
    first = server.feed(sasl.SASL_HEADER)
    assert first.reply == sasl.SASL_HEADER + sasl.mechanisms_frame(("PLAIN",))
    assert not first.done
    asked = server.feed(init_frame("PLAIN", b"\x00alice\x00wonderland") + sasl.AMQP_HEADER)
    assert (asked.check, asked.done, asked.reply) == (("alice", "wonderland"), False, b"")
    # A pipelining client's open arrives while the password is being checked: it is kept.
    assert server.feed(b"open frame...") == sasl.Step()
    step = server.checked(check(*asked.check))
    assert (step.done, step.user, step.error) == (True, "alice", None)
    assert step.reply == sasl.outcome_frame(sasl.OK)
    assert step.rest == sasl.AMQP_HEADER + b"open frame..."


def test_an_authenticator_that_failed_denies_with_its_error():
    server = exchange(allow_anonymous=False)
    server.feed(sasl.SASL_HEADER)
    server.feed(init_frame("PLAIN", b"\x00alice\x00wonderland"))
    step = server.checked(False, failure="store unreachable")
    assert (step.done, step.user, step.rest) == (True, None, b"")
    assert step.error == "authenticator failed: store unreachable"
    assert step.reply == sasl.outcome_frame(sasl.SYS_ERROR)


def test_exchange_fed_one_byte_at_a_time():
    server = exchange(allow_anonymous=True)
    data = sasl.SASL_HEADER + init_frame("ANONYMOUS", b"") + sasl.AMQP_HEADER
    replies = b""
    for i in range(len(data)):
        step = server.feed(data[i : i + 1])
        replies += step.reply
        if step.done:
            break
    assert (step.done, step.user) == (True, "anonymous")
    assert replies.endswith(sasl.outcome_frame(sasl.OK))
    # What the engine hands to proton: whatever came with the last piece, then the rest.
    assert step.rest + data[i + 1 :] == sasl.AMQP_HEADER


@pytest.mark.parametrize(
    ("mechanism", "response", "error"),
    [
        ("PLAIN", b"\x00alice\x00guess", "Authentication failed [mech=PLAIN]"),
        ("PLAIN", b"\x00mallory\x00wonderland", "Authentication failed [mech=PLAIN]"),
        ("ANONYMOUS", b"", "Authentication failed [mech=ANONYMOUS]"),
        ("PLAIN", b"no separators", "malformed PLAIN response"),
    ],
)
def test_exchange_refuses(mechanism, response, error):
    server = exchange(allow_anonymous=False)
    server.feed(sasl.SASL_HEADER)
    step = answered(server, server.feed(init_frame(mechanism, response)))
    assert (step.done, step.user, step.error) == (True, None, error)
    assert step.reply.endswith(
        sasl.outcome_frame(sasl.AUTH_FAILED if "Authentication" in error else sasl.SYS_ERROR)
    )


def test_plain_amqp_without_sasl_is_told_sasl_is_required():
    step = exchange(allow_anonymous=False).feed(sasl.AMQP_HEADER)
    assert (step.reply, step.done, step.error) == (sasl.SASL_HEADER, True, "SASL is required")


class Greeter(ConnectionHandler):
    def __init__(self, users: list[str | None]) -> None:
        self.users = users

    def on_connection_open(self, conn: Connection) -> None:
        self.users.append(conn.user)

    def on_link_attach(self, link: Link) -> None:
        link.accept()
        link.flow(10)

    def on_message(self, link: Link, delivery: Delivery) -> None:
        delivery.settle()


def test_clients_log_in_with_checked_passwords(amqp_listener, amqp_client):
    users: list[str | None] = []
    calls: list[tuple[str, str]] = []

    def authenticator(user: str, password: str) -> bool:
        calls.append((user, password))
        if user == "crash":
            raise RuntimeError("store unreachable")
        return check(user, password)

    _engine, port = amqp_listener(lambda: Greeter(users), authenticator=passwords(authenticator))
    client = amqp_client(port, user="alice", password="wonderland")
    assert client.sender("in").send(codec.encode_message(b"hi")).outcome == Outcome.ACCEPTED
    for user, password in (("alice", "wrong"), ("crash", "x"), (None, None)):
        with pytest.raises(AmqpError, match="amqp:unauthorized-access"):
            amqp_client(port, user=user, password=password)
    proton_client = BlockingConnection(
        f"amqp://alice:wonderland@127.0.0.1:{port}", timeout=5, allowed_mechs="PLAIN"
    )
    try:
        proton_client.create_sender("in").send(Message(body="from proton"))
    finally:
        proton_client.close()
    assert users == ["alice", "alice"]
    assert calls[:3] == [("alice", "wonderland"), ("alice", "wrong"), ("crash", "x")]


def test_a_login_being_checked_holds_up_no_other_connection(amqp_listener, amqp_client):
    # Checking a password hash costs tens of milliseconds: the engine does it on a worker thread.
    # Here one check waits until the test lets it go; meanwhile a connected client's messages
    # go through, which they could not if the check ran on the engine's thread.
    users: list[str | None] = []
    checking, release = threading.Event(), threading.Event()

    def authenticator(user: str, password: str) -> bool:
        if user == "slow":
            checking.set()
            release.wait(10)
            return password == "patience"
        return check(user, password)

    _engine, port = amqp_listener(lambda: Greeter(users), authenticator=passwords(authenticator))
    busy = amqp_client(port, user="alice", password="wonderland").sender("in")
    slow = threading.Thread(target=lambda: amqp_client(port, user="slow", password="patience"))
    slow.start()
    try:
        assert checking.wait(5)
        outcomes = [busy.send(codec.encode_message(b"m"), timeout=5).outcome for _ in range(8)]
        assert outcomes == [Outcome.ACCEPTED] * 8  # Greeter gives 10 credits
        assert slow.is_alive()  # still waiting for its answer
    finally:
        release.set()
        slow.join(10)
    assert users == ["alice", "slow"]


def test_anonymous_allowed_when_asked(amqp_listener, amqp_client):
    users: list[str | None] = []
    _engine, port = amqp_listener(
        lambda: Greeter(users), authenticator=passwords(allow_anonymous=True)
    )
    amqp_client(port).sender("in").send(codec.encode_message(b"hi"))
    amqp_client(port, user="alice", password="wonderland")
    assert users == ["anonymous", "alice"]


def test_plain_amqp_client_is_turned_away(amqp_listener):
    _engine, port = amqp_listener(ConnectionHandler, authenticator=passwords())
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        raw.sendall(sasl.AMQP_HEADER)
        raw.settimeout(5)
        reply = b""
        while chunk := raw.recv(1024):
            reply += chunk
    assert reply == sasl.SASL_HEADER
