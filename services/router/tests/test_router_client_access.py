"""The client port's options with a real router process and real clients: amqps with a
self-signed certificate beside the plain port, and SASL PLAIN against the configuration's users
(required: anonymous refused; optional: anonymous allowed, wrong passwords refused), with a
password change pushed as a new generation, and both at once: users logging in over amqps;
SCRAM-SHA-512/256 against the users' keys, and the plan's policy (ANONYMOUS? PLAIN on the plain
port?) as the configuration says it."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from enmasse.amqp import codec
from enmasse.amqp.client import AmqpError, Client
from enmasse.amqp.engine import Condition, Outcome, Tls
from enmasse.common.passwords import hash_password, scram_credentials
from enmasse.v1 import router_pb2

from tests.fixtures.router import RouterFleet, RouterProcess

ADDRESSES = {"work": "anycast"}
NO_LOGIN = Condition("amqp:unauthorized-access", "Authentication failed [mech=none]")
BAD_LOGIN = Condition("amqp:unauthorized-access", "Authentication failed [mech=PLAIN]")
# A user with no rule may do nothing (test_router_authorization.py): these users may do all.
EVERYWHERE = router_pb2.RouterRule(addresses=["#"], operations=["send", "recv"])


def _refusal(port: int, **login: str | None) -> Condition | None:
    with pytest.raises(AmqpError) as refused:
        Client("127.0.0.1", port, **login).close()  # type: ignore[arg-type]
    return refused.value.condition


def _relay(producer: Client, consumer: Client, body: bytes) -> None:
    """`body` goes from producer to consumer through the router; the producer sees it accepted."""
    receiver = consumer.receiver("work", credit=10)
    sent = producer.sender("work").send_async(codec.encode_message(body))
    delivery = receiver.receive(10)
    receiver.accept(delivery)
    assert codec.read_body(delivery.payload) == body
    assert sent.result(10).outcome is Outcome.ACCEPTED
    receiver.close()


def _config(
    generation: int, users: dict[str, str], *, allow_plain_without_tls: bool = True
) -> router_pb2.RouterConfig:
    """Users as the config service stores them (hash and SCRAM keys); these tests log in with
    proton's PLAIN on the plain port too, which the plan must allow (`allow_plain_without_tls`)."""
    return router_pb2.RouterConfig(
        generation=generation,
        space="shop",
        allow_plain_without_tls=allow_plain_without_tls,
        addresses=[router_pb2.AddressRoute(address=a, type=t) for a, t in ADDRESSES.items()],
        users=[
            router_pb2.RouterUser(
                username=name,
                password_hash=hash_password(password),
                authorization=[EVERYWHERE],
                scram_credentials=scram_credentials(password),
            )
            for name, password in users.items()
        ],
    )


def _tls_router(
    routers: RouterFleet,
    tls_certificate: Callable[[str], tuple[str, str]],
    *,
    users: dict[str, str],
    client_auth: str | None = None,
) -> tuple[RouterProcess, int, str]:
    """A router with an amqps port beside its plain one: (router, amqps port, its certificate)."""
    cert, key = tls_certificate("router")
    options = (f"--tls-cert={cert}", f"--tls-key={key}", "--amqps-port=0")
    if client_auth is not None:
        options = (f"--client-auth={client_auth}", *options)
    router = routers.start("r1", extra_args=options)
    router.apply(_config(1, users))
    amqps: int = json.loads((routers.workdir / "r1.ports.json").read_text())["amqps"]
    return router, amqps, cert


def test_amqps_beside_the_plain_port(
    routers: RouterFleet,
    tls_certificate: Callable[[str], tuple[str, str]],
    amqp_client: Callable[..., Client],
) -> None:
    router, amqps, cert = _tls_router(routers, tls_certificate, users={})
    assert amqps not in (router.amqp_port, router.inter_router_port)
    verified = Tls(ca_file=cert, verify_hostname=True)
    secure = amqp_client(amqps, tls=verified, hostname="localhost")
    assert secure.call(lambda: secure.connection.encrypted)
    plain = amqp_client(router.amqp_port)
    _relay(plain, secure, b"plain in, tls out")
    _relay(secure, plain, b"tls in, plain out")
    with pytest.raises(AmqpError) as plain_on_tls:
        Client("127.0.0.1", amqps, timeout=5).close()
    assert plain_on_tls.value.condition == Condition(
        "amqp:connection:framing-error",
        "Expected AMQP protocol header: no protocol header found (connection aborted)",
    )
    other_cert, _ = tls_certificate("impostor")
    with pytest.raises(AmqpError):
        Client("127.0.0.1", amqps, tls=Tls(ca_file=other_cert), timeout=5).close()
    assert [c.user for c in router.stats().connections] == ["anonymous", "anonymous"]


def _password_router(routers: RouterFleet, mode: str) -> RouterProcess:
    router = routers.start("r1", extra_args=(f"--client-auth={mode}",))
    router.apply(_config(1, {"alice": "wonderland", "bob": "builder"}))
    return router


def test_required_logins_let_users_in_and_keep_others_out(
    routers: RouterFleet, amqp_client: Callable[..., Client]
) -> None:
    router = _password_router(routers, "required")
    alice = amqp_client(router.amqp_port, user="alice", password="wonderland")
    bob = amqp_client(router.amqp_port, user="bob", password="builder")
    _relay(alice, bob, b"from alice")
    assert _refusal(router.amqp_port) == NO_LOGIN
    assert _refusal(router.amqp_port, user="alice", password="wonder") == BAD_LOGIN
    assert _refusal(router.amqp_port, user="mallory", password="wonderland") == BAD_LOGIN
    assert sorted(c.user for c in router.stats().connections) == ["alice", "bob"]
    _relay(bob, alice, b"still served")


def test_a_new_password_takes_over_with_the_next_generation(
    routers: RouterFleet, amqp_client: Callable[..., Client]
) -> None:
    router = _password_router(routers, "required")
    first = amqp_client(router.amqp_port, user="alice", password="wonderland")
    router.apply(_config(2, {"alice": "looking-glass"}))
    assert _refusal(router.amqp_port, user="alice", password="wonderland") == BAD_LOGIN
    assert _refusal(router.amqp_port, user="bob", password="builder") == BAD_LOGIN, "bob removed"
    again = amqp_client(router.amqp_port, user="alice", password="looking-glass")
    _relay(again, first, b"new password")


def test_optional_logins_admit_anonymous_but_check_passwords(
    routers: RouterFleet, amqp_client: Callable[..., Client]
) -> None:
    router = _password_router(routers, "optional")
    anonymous = amqp_client(router.amqp_port)
    alice = amqp_client(router.amqp_port, user="alice", password="wonderland")
    _relay(anonymous, alice, b"anonymous to alice")
    assert _refusal(router.amqp_port, user="alice", password="wonder") == BAD_LOGIN
    assert sorted(c.user for c in router.stats().connections) == ["alice", "anonymous"]


def test_users_log_in_over_amqps(
    routers: RouterFleet,
    tls_certificate: Callable[[str], tuple[str, str]],
    amqp_client: Callable[..., Client],
) -> None:
    router, amqps, cert = _tls_router(
        routers,
        tls_certificate,
        users={"alice": "wonderland", "bob": "builder"},
        client_auth="required",
    )
    verified = {"tls": Tls(ca_file=cert, verify_hostname=True), "hostname": "localhost"}
    alice = amqp_client(amqps, user="alice", password="wonderland", **verified)
    assert alice.call(lambda: alice.connection.encrypted)
    bob = amqp_client(router.amqp_port, user="bob", password="builder")
    _relay(alice, bob, b"tls in, plain out")
    _relay(bob, alice, b"plain in, tls out")
    assert _refusal(amqps, user="alice", password="wonder", **verified) == BAD_LOGIN  # type: ignore[arg-type]
    assert _refusal(amqps, **verified) == NO_LOGIN  # type: ignore[arg-type]
    assert _refusal(amqps, user="alice", password="wonderland") == Condition(
        "amqp:connection:framing-error",
        "Expected SASL protocol header: no protocol header found (connection aborted)",
    ), "plain AMQP on the amqps port"
    assert sorted(c.user for c in router.stats().connections) == ["alice", "bob"]
    _relay(alice, bob, b"still served")


def test_scram_logins_and_the_plans_policy(
    routers: RouterFleet, amqp_client: Callable[..., Client]
) -> None:
    """`required` with a plan that allows nothing more: SCRAM-SHA-512 and -256 get in, PLAIN on
    the plain port and ANONYMOUS are not offered; a plan that allows them lets them in."""
    router = routers.start("r1", extra_args=("--client-auth=required",))
    users = {"alice": "wonderland", "bob": "builder"}
    router.apply(_config(1, users, allow_plain_without_tls=False))
    alice = amqp_client(
        router.amqp_port, user="alice", password="wonderland", mechanisms=("SCRAM-SHA-512",)
    )
    bob = amqp_client(
        router.amqp_port, user="bob", password="builder", mechanisms=("SCRAM-SHA-256",)
    )
    _relay(alice, bob, b"scram both ways")
    scram_refused = _refusal(
        router.amqp_port, user="alice", password="wonder", mechanisms=("SCRAM-SHA-256",)
    )
    assert scram_refused == Condition(
        "amqp:unauthorized-access", "Authentication failed [mech=SCRAM-SHA-256]"
    )
    assert _refusal(router.amqp_port, user="alice", password="wonderland") == NO_LOGIN, "PLAIN"
    assert _refusal(router.amqp_port) == NO_LOGIN, "ANONYMOUS"
    assert sorted(c.user for c in router.stats().connections) == ["alice", "bob"]

    open_plan = _config(2, users)
    open_plan.allow_anonymous = True
    router.apply(open_plan)
    anonymous = amqp_client(router.amqp_port)
    plain = amqp_client(router.amqp_port, user="bob", password="builder")
    _relay(anonymous, plain, b"the plan lets them in")
    assert sorted(c.user for c in router.stats().connections) == [
        "alice",
        "anonymous",
        "bob",
        "bob",
    ]
