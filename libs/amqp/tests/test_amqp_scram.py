"""SCRAM-SHA-256 and SCRAM-SHA-512 done by the engine (RFC 5802/7677 over AMQP SASL, with
`scramp`), and what a listener offers: first our client and server exchanging bytes in memory,
then real engines over loopback: SCRAM logins in, wrong and unknown users out with
amqp:unauthorized-access, PLAIN not offered on a plain listener unless allowed (but over TLS),
ANONYMOUS only when allowed, SCRAM under our own client TLS, and a peer that keeps failing
turned away before its password is checked."""

from __future__ import annotations

import threading

import pytest
from enmasse.amqp import sasl
from enmasse.amqp.client import AmqpError, Client
from enmasse.amqp.engine import Condition, Connection, ConnectionHandler, Tls
from enmasse.amqp.throttle import LoginThrottle
from enmasse.common.passwords import SCRAM_MECHANISMS, ScramKeys, scram_keys
from proton.utils import BlockingConnection

PASSWORDS = {"alice": "wonderland", "bob": "builder"}
KEYS = {
    (m, user): scram_keys(p, mechanism=m) for user, p in PASSWORDS.items() for m in SCRAM_MECHANISMS
}
NO_LOGIN = Condition("amqp:unauthorized-access", "Authentication failed [mech=none]")


def refused(mechanism: str) -> Condition:
    return Condition("amqp:unauthorized-access", f"Authentication failed [mech={mechanism}]")


class Users:
    """An authenticator over PASSWORDS and KEYS that notes what it was asked."""

    def __init__(self, **policy: bool) -> None:
        self.authenticator = sasl.Passwords(self.check, scram=self.keys, **policy)
        self.checked: list[str] = []
        self.asked: list[tuple[str, str]] = []

    def check(self, user: str, password: str) -> bool:
        self.checked.append(user)
        return PASSWORDS.get(user) == password

    def keys(self, mechanism: str, user: str) -> ScramKeys | None:
        self.asked.append((mechanism, user))
        return KEYS.get((mechanism, user))


class Names(ConnectionHandler):
    def __init__(self, seen: list[str | None]) -> None:
        self.seen = seen

    def on_connection_open(self, conn: Connection) -> None:
        self.seen.append(conn.user)


def listener(amqp_listener, users: Users, **options) -> tuple[int, list[str | None]]:
    seen: list[str | None] = []
    _engine, port = amqp_listener(lambda: Names(seen), authenticator=users.authenticator, **options)
    return port, seen


def refusal(port: int, **login) -> Condition | None:
    with pytest.raises(AmqpError) as failed:
        Client("127.0.0.1", port, timeout=5, **login).close()
    return failed.value.condition


# -- in memory ------------------------------------------------------------------------------------


@pytest.mark.parametrize("mechanism", SCRAM_MECHANISMS)
def test_our_client_and_server_agree_in_memory(mechanism: str) -> None:
    users = Users()
    server = sasl.SaslServer(users.authenticator, encrypted=False)
    client = sasl.SaslClient(mechanisms=(mechanism,), user="alice", password="wonderland")
    step = server.feed(client.start)
    assert step.reply.startswith(sasl.SASL_HEADER)
    assert server.mechanisms == (*SCRAM_MECHANISMS,), "no PLAIN on a plain listener by default"
    answer = client.feed(step.reply)  # our sasl-init with the client-first message
    gated = server.feed(answer.reply)
    assert (gated.gate, gated.done, gated.reply) == ("alice", False, b"")
    challenge = server.go_on()
    assert not challenge.done
    response = client.feed(challenge.reply)
    assert response.reply
    assert not response.done
    outcome = server.feed(response.reply + sasl.AMQP_HEADER)
    assert (outcome.done, outcome.user, outcome.error) == (True, "alice", None)
    assert outcome.rest.endswith(sasl.AMQP_HEADER)
    finished = client.feed(outcome.reply)  # the client checks the server's signature too
    assert (finished.done, finished.user, finished.error) == (True, "alice", None)
    assert users.asked == [(mechanism, "alice")]
    assert users.checked == []


def test_a_wrong_proof_and_an_unknown_user_fail_alike_in_memory() -> None:
    users = Users()
    outcomes = []
    for user, password in (("alice", "wonder"), ("mallory", "wonderland")):
        server = sasl.SaslServer(users.authenticator, encrypted=False)
        client = sasl.SaslClient(mechanisms=("SCRAM-SHA-256",), user=user, password=password)
        first = server.feed(client.feed(server.feed(client.start).reply).reply)
        assert first.gate == user
        step = server.feed(client.feed(server.go_on().reply).reply)
        outcomes.append((step.done, step.wrong, step.error, step.reply))
    assert outcomes[0] == outcomes[1]
    assert outcomes[0] == (
        True,
        True,
        "Authentication failed [mech=SCRAM-SHA-256]",
        sasl.outcome_frame(sasl.AUTH_FAILED),
    )


def test_an_unknown_user_gets_the_same_salt_each_time() -> None:
    first = sasl.decoy_keys("SCRAM-SHA-256", "mallory")
    again = sasl.decoy_keys("SCRAM-SHA-256", "mallory")
    assert first.salt == again.salt
    assert first.stored_key != again.stored_key
    assert sasl.decoy_keys("SCRAM-SHA-256", "eve").salt != first.salt


def test_what_a_listener_offers() -> None:
    assert sasl.Passwords(bool).mechanisms(encrypted=False) == ()
    assert sasl.Passwords(bool).mechanisms(encrypted=True) == ("PLAIN",)
    users = Users(allow_anonymous=True, allow_plain_without_tls=True)
    assert users.authenticator.mechanisms(encrypted=False) == (
        "SCRAM-SHA-512",
        "SCRAM-SHA-256",
        "PLAIN",
        "ANONYMOUS",
    )


# -- real engines ---------------------------------------------------------------------------------


@pytest.mark.parametrize("mechanism", SCRAM_MECHANISMS)
def test_scram_logins_get_in(amqp_listener, amqp_client, mechanism: str) -> None:
    users = Users()
    port, seen = listener(amqp_listener, users)
    client = amqp_client(port, user="bob", password="builder", mechanisms=(mechanism,))
    assert client.call(lambda: client.connection.user) == "bob"
    assert seen == ["bob"]
    assert users.asked == [(mechanism, "bob")]
    assert users.checked == [], "no password check: SCRAM is decided on the engine thread"


def test_our_client_takes_the_best_mechanism_offered(amqp_listener, amqp_client) -> None:
    users = Users(allow_plain_without_tls=True)
    port, seen = listener(amqp_listener, users)
    amqp_client(port, user="alice", password="wonderland", mechanisms=sasl.CLIENT_MECHANISMS)
    amqp_client(port, user="alice", password="wonderland", mechanisms=("PLAIN",))
    assert users.asked == [("SCRAM-SHA-512", "alice")]
    assert users.checked == ["alice"]
    assert seen == ["alice", "alice"]


def test_wrong_passwords_and_unknown_users_are_refused(amqp_listener) -> None:
    users = Users()
    port, seen = listener(amqp_listener, users)
    for mechanism in SCRAM_MECHANISMS:
        for user, password in (("alice", "wonder"), ("mallory", "wonderland"), ("bob", "")):
            assert refusal(port, user=user, password=password, mechanisms=(mechanism,)) == refused(
                mechanism
            )
    assert seen == []


def test_plain_is_not_offered_without_tls_unless_allowed(amqp_listener, amqp_client) -> None:
    strict, strict_seen = listener(amqp_listener, Users())
    assert refusal(strict, user="alice", password="wonderland") == NO_LOGIN, "proton's PLAIN"
    assert refusal(strict, user="alice", password="wonderland", mechanisms=("PLAIN",)) == NO_LOGIN
    with pytest.raises(Exception, match=r"mech=none|Authentication failed"):
        BlockingConnection(
            f"amqp://alice:wonderland@127.0.0.1:{strict}", timeout=5, allowed_mechs="PLAIN"
        ).close()
    assert strict_seen == []
    lax, lax_seen = listener(amqp_listener, Users(allow_plain_without_tls=True))
    amqp_client(lax, user="alice", password="wonderland")
    assert refusal(lax, user="alice", password="wonder") == refused("PLAIN")
    assert lax_seen == ["alice"]


def test_plain_and_scram_over_tls(amqp_listener, amqp_client, tls_certificate) -> None:
    cert, key = tls_certificate("listener")
    users = Users()
    port, seen = listener(amqp_listener, users, tls=Tls(cert_file=cert, key_file=key))
    verified = {"tls": Tls(ca_file=cert, verify_hostname=True), "hostname": "localhost"}
    plain = amqp_client(port, user="alice", password="wonderland", **verified)
    scram = amqp_client(
        port, user="bob", password="builder", mechanisms=sasl.CLIENT_MECHANISMS, **verified
    )
    assert scram.call(lambda: scram.connection.encrypted)
    assert plain.call(lambda: plain.connection.encrypted)
    assert seen == ["alice", "bob"]
    assert users.asked == [("SCRAM-SHA-512", "bob")]
    impostor, _ = tls_certificate("impostor")
    with pytest.raises(AmqpError) as unverified:
        Client(
            "127.0.0.1",
            port,
            user="bob",
            password="builder",
            mechanisms=sasl.CLIENT_MECHANISMS,
            tls=Tls(ca_file=impostor),
            timeout=5,
        )
    assert unverified.value.condition is not None
    assert "certificate verify failed" in unverified.value.condition.description


def test_anonymous_only_when_allowed(amqp_listener, amqp_client) -> None:
    strict, strict_seen = listener(amqp_listener, Users())
    assert refusal(strict) == NO_LOGIN
    assert refusal(strict, mechanisms=("ANONYMOUS",)) == NO_LOGIN
    open_, open_seen = listener(amqp_listener, Users(allow_anonymous=True))
    amqp_client(open_)
    amqp_client(open_, mechanisms=("ANONYMOUS",))
    assert (strict_seen, open_seen) == ([], ["anonymous", "anonymous"])


def test_a_peer_that_keeps_failing_is_turned_away_before_any_check(amqp_listener) -> None:
    users = Users(allow_plain_without_tls=True)
    limits = LoginThrottle(free_failures=1, refuse_after=3, first_delay=0.01)
    port, seen = listener(amqp_listener, users, throttle=limits)
    for _ in range(3):
        assert refusal(port, user="alice", password="guess", mechanisms=("PLAIN",)) == refused(
            "PLAIN"
        )
    assert users.checked == ["alice"] * 3
    turned_away = Condition(
        "amqp:unauthorized-access",
        "Authentication failed [mech=PLAIN]: turned away for now, try again later",
    )
    login = {"user": "alice", "password": "wonderland"}
    assert refusal(port, mechanisms=("PLAIN",), **login) == turned_away
    scram = refusal(port, mechanisms=("SCRAM-SHA-256",), **login)
    assert scram is not None
    assert scram.description.endswith("try again later")
    assert users.checked == ["alice"] * 3, "nothing checked for a refused peer"
    assert seen == []


def test_a_back_off_holds_no_thread(amqp_listener, amqp_client) -> None:
    # A login waiting out its back-off waits on a timer: meanwhile SCRAM logins get in.
    users = Users(allow_plain_without_tls=True)
    limits = LoginThrottle(free_failures=0, refuse_after=50, first_delay=1.5)
    port, seen = listener(amqp_listener, users, throttle=limits)
    limits.failed(peer="10.9.9.9", user="alice")  # alice failed elsewhere: she waits
    waiting = threading.Thread(
        target=lambda: refusal(port, user="alice", password="guess", mechanisms=("PLAIN",))
    )
    waiting.start()
    try:
        for _ in range(3):
            amqp_client(port, user="bob", password="builder", mechanisms=("SCRAM-SHA-256",))
        assert waiting.is_alive(), "still waiting out its back-off"
        assert users.checked == []
    finally:
        waiting.join(10)
    assert users.checked == ["alice"]
    assert seen == ["bob"] * 3
