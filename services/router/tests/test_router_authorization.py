"""Authorization on the message plane, with a real router process and real clients logged in as
MessagingUsers (`--client-auth optional`): each user attaches only where its rules allow (refused
at the link with amqp:unauthorized-access naming user, operation and address; the connection
stays up), an anonymous relay sender is checked per message, a dynamic reply address is
received from only on the connection that made it, and a rule change closes the live links that
lost their right. Anonymous clients keep full access (their policy is another item's). A user's
connections are limited per router (amqp:resource-limit-exceeded). Browsing a queue (through a
real broker) needs `view` or `recv`. The configuration side (bad rules refused by name,
GetConfig showing rules but no hashes) is pure."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future

import grpc
import pytest
from enmasse.amqp import codec
from enmasse.amqp.client import AmqpError, Client, Receiver
from enmasse.amqp.engine import Condition, Delivery, Outcome, Terminus
from enmasse.common.passwords import hash_password
from enmasse.resources.permissions import Permissions, logged_in_as
from enmasse.router.config import ConfigError, config_from_proto, config_to_proto
from enmasse.v1 import router_pb2

from tests.fixtures.broker import BrokerFactory
from tests.fixtures.router import RouterFleet, RouterProcess

ADDRESSES = (
    "pq",
    "pq2",
    "events",
    "orders/eu",
    "orders/us/east",
    "sensors.temp",
    "sensors.temp.max",
    "requests",
)
PASSWORD = "secret"
HASH = hash_password(PASSWORD)  # one scrypt for every user of the module
SEND_PQ = {"send": ["pq"]}
READER = {"recv": ["orders/#", "sensors.*"]}
Rules = dict[str, list[str]]  # operation -> address patterns


def unauthorized(description: str) -> Condition:
    return Condition("amqp:unauthorized-access", description)


def _config(
    generation: int, users: dict[str, Rules], *, limits: router_pb2.RouterLimits | None = None
) -> router_pb2.RouterConfig:
    return router_pb2.RouterConfig(
        generation=generation,
        space="shop",
        limits=limits,
        addresses=[router_pb2.AddressRoute(address=a, type="anycast") for a in ADDRESSES],
        users=[
            router_pb2.RouterUser(
                username=name,
                password_hash=HASH,
                authorization=[
                    router_pb2.RouterRule(addresses=patterns, operations=[operation])
                    for operation, patterns in rules.items()
                ],
            )
            for name, rules in users.items()
        ],
    )


USERS: dict[str, Rules] = {
    "sender": SEND_PQ,
    "reader": READER,
    "client": {"send": ["requests"]},
    "server": {"recv": ["requests"]},
}


@pytest.fixture
def router(routers: RouterFleet) -> RouterProcess:
    started = routers.start("r1", extra_args=("--client-auth=optional",))
    started.apply(_config(1, USERS))
    return started


def _refused(attach: Callable[[], object]) -> Condition | None:
    with pytest.raises(AmqpError) as refused:
        attach()
    return refused.value.condition


def _arrives(sent: Future[Delivery], receiver: Receiver, body: bytes | str) -> None:
    """What was sent arrives at `receiver`, which accepts it; the sender sees it accepted."""
    delivery = receiver.receive(10)
    assert codec.read_body(delivery.payload) == body
    receiver.accept(delivery)
    assert sent.result(10).outcome is Outcome.ACCEPTED


def _passes(sender_client: Client, receiver_client: Client, address: str, body: bytes) -> None:
    receiver = receiver_client.receiver(address, credit=10)
    sent = sender_client.sender(address).send_async(codec.encode_message(body))
    delivery = receiver.receive(10)
    assert codec.read_body(delivery.payload) == body
    receiver.accept(delivery)
    assert sent.result(10).outcome is Outcome.ACCEPTED
    receiver.close()


def test_a_send_only_user_sends_to_its_address_and_nothing_else(
    router: RouterProcess, amqp_client: Callable[..., Client]
) -> None:
    anonymous = amqp_client(router.amqp_port)
    consumer = anonymous.receiver("pq", credit=10)
    user = amqp_client(router.amqp_port, user="sender", password=PASSWORD)
    producer = user.sender("pq")
    _arrives(producer.send_async(codec.encode_message(b"one")), consumer, b"one")

    assert _refused(lambda: user.receiver("pq")) == unauthorized(
        "user 'sender' may not recv from 'pq'"
    )
    assert _refused(lambda: user.sender("pq2")) == unauthorized(
        "user 'sender' may not send to 'pq2'"
    )
    assert _refused(lambda: user.receiver("events")) == unauthorized(
        "user 'sender' may not recv from 'events'"
    )
    assert _refused(lambda: user.sender("nowhere")) == unauthorized(
        "user 'sender' may not send to 'nowhere'"
    ), "no rule: refused before the address is looked up (its existence is not told)"

    # The connection stays up: the link it had still works, and a new allowed attach too.
    assert not user.closed_with.done()
    _arrives(producer.send_async(codec.encode_message(b"two")), consumer, b"two")
    another = user.sender("pq")
    _arrives(another.send_async(codec.encode_message(b"three")), consumer, b"three")


def test_a_user_with_receive_patterns(
    router: RouterProcess, amqp_client: Callable[..., Client]
) -> None:
    anonymous = amqp_client(router.amqp_port)
    reader = amqp_client(router.amqp_port, user="reader", password=PASSWORD)
    _passes(anonymous, reader, "orders/eu", b"orders/# covers one segment")
    _passes(anonymous, reader, "orders/us/east", b"and several")
    _passes(anonymous, reader, "sensors.temp", b"sensors.* covers one segment")
    assert _refused(lambda: reader.receiver("sensors.temp.max")) == unauthorized(
        "user 'reader' may not recv from 'sensors.temp.max'"
    )
    assert _refused(lambda: reader.receiver("pq")) == unauthorized(
        "user 'reader' may not recv from 'pq'"
    )
    assert _refused(lambda: reader.sender("orders/eu")) == unauthorized(
        "user 'reader' may not send to 'orders/eu'"
    )
    assert _refused(lambda: reader.receiver("orders/asia")) == Condition(
        "amqp:not-found", "no address 'orders/asia' in space 'shop'"
    ), "allowed but not configured: the usual not-found"


def test_an_anonymous_relay_sender_is_checked_per_message(
    router: RouterProcess, amqp_client: Callable[..., Client]
) -> None:
    anonymous = amqp_client(router.amqp_port)
    consumer = anonymous.receiver("pq", credit=10)
    user = amqp_client(router.amqp_port, user="sender", password=PASSWORD)
    relay = user.sender(None)
    refused = unauthorized("user 'sender' may not send to 'pq2'")
    for round_ in range(2):  # the second time the link's kept decision answers
        allowed = relay.send_async(codec.encode_message(f"to pq {round_}", to="pq"))
        _arrives(allowed, consumer, f"to pq {round_}")
        rejected = relay.send(codec.encode_message(b"to pq2", to="pq2"))
        assert (rejected.outcome, rejected.error) == (Outcome.REJECTED, refused)
    link = relay.link
    assert link is not None
    assert user.call(lambda: link.is_open), "the link stays"
    assert not user.closed_with.done()
    # An anonymous client's relay link is not checked: full access, for now.
    other = amqp_client(router.amqp_port).sender(None)
    pq2 = anonymous.receiver("pq2", credit=1)
    _arrives(other.send_async(codec.encode_message(b"x", to="pq2")), pq2, b"x")


def test_a_reply_address_is_received_from_only_by_its_connection(
    router: RouterProcess, amqp_client: Callable[..., Client]
) -> None:
    client = amqp_client(router.amqp_port, user="client", password=PASSWORD)
    server = amqp_client(router.amqp_port, user="server", password=PASSWORD)
    requests = server.receiver("requests", credit=10)
    replies = client.receiver(None, source=Terminus(dynamic=True), credit=10)
    reply_to = replies.address
    assert reply_to is not None
    assert reply_to.startswith("_dynamic/r1/")
    asked = client.sender("requests").send_async(codec.encode_message("ping", reply_to=reply_to))
    request = requests.receive(10)
    requests.accept(request)
    assert asked.result(10).outcome is Outcome.ACCEPTED
    # The server has no rule for the reply address, and may send to it (named or by `to`).
    named = server.sender(request.reply_to)
    _arrives(named.send_async(codec.encode_message("pong")), replies, "pong")
    relayed = server.sender(None).send_async(codec.encode_message("pong 2", to=reply_to))
    _arrives(relayed, replies, "pong 2")

    belongs = "a reply address belongs to the connection that made it"
    assert _refused(lambda: server.receiver(reply_to)) == unauthorized(
        f"user 'server' may not recv from '{reply_to}': {belongs}"
    )
    stranger = amqp_client(router.amqp_port)
    assert _refused(lambda: stranger.receiver(reply_to)) == unauthorized(
        f"an anonymous client may not recv from '{reply_to}': {belongs}"
    )
    assert _refused(lambda: stranger.receiver("_dynamic/r1/made-up.1")) == unauthorized(
        f"an anonymous client may not recv from '_dynamic/r1/made-up.1': {belongs}"
    )
    # Its own connection may attach to it again.
    again = client.receiver(reply_to, credit=1)
    assert again.address == reply_to


def test_a_rule_change_closes_the_links_that_lost_their_right(
    router: RouterProcess, amqp_client: Callable[..., Client]
) -> None:
    both = {"send": ["pq", "pq2"], "recv": ["pq"]}
    router.apply(_config(2, {**USERS, "mover": both}))
    anonymous = amqp_client(router.amqp_port)
    pq2 = anonymous.receiver("pq2", credit=10)
    mover = amqp_client(router.amqp_port, user="mover", password=PASSWORD)
    kept = mover.receiver("pq", credit=10)
    losing = mover.sender("pq2")
    relay = mover.sender(None)
    _arrives(relay.send_async(codec.encode_message(b"a", to="pq2")), pq2, b"a")

    started = time.monotonic()
    router.apply(_config(3, {**USERS, "mover": {"send": ["pq"], "recv": ["pq"]}}))
    assert losing.detached.result(10) == unauthorized("user 'mover' may not send to 'pq2'")
    elapsed = time.monotonic() - started
    print(f"rule change to detach: {elapsed * 1000:.1f} ms (ApplyConfig call included)")
    assert elapsed < 5.0
    assert not kept.detached.done(), "a link the new rules still allow stays"
    rejected = relay.send(codec.encode_message(b"b", to="pq2"))
    assert (rejected.outcome, rejected.error) == (
        Outcome.REJECTED,
        unauthorized("user 'mover' may not send to 'pq2'"),
    ), "the relay link's kept decisions went with the old rules"
    _arrives(anonymous.sender("pq").send_async(codec.encode_message(b"still")), kept, b"still")

    router.apply(_config(4, USERS))  # the user removed: its connection may do nothing now
    assert kept.detached.result(10) == unauthorized("user 'mover' may not recv from 'pq'")
    assert not mover.closed_with.done()


def _turned_away(port: int, **login: str) -> Condition | None:
    """How the router turned a connection away: at open, or by closing it right after."""
    try:
        client = Client("127.0.0.1", port, **login)  # type: ignore[arg-type]
    except AmqpError as refused:
        return refused.condition
    try:
        return client.closed_with.result(10)
    finally:
        client.close()


def test_a_users_connections_are_limited(
    router: RouterProcess, amqp_client: Callable[..., Client]
) -> None:
    limits = router_pb2.RouterLimits(max_connections=4, max_connections_per_user=2)
    router.apply(_config(2, USERS, limits=limits))
    reader = {"user": "reader", "password": PASSWORD}
    first, _ = amqp_client(router.amqp_port, **reader), amqp_client(router.amqp_port, **reader)
    assert _turned_away(router.amqp_port, **reader) == Condition(
        "amqp:resource-limit-exceeded",
        "too many connections for user 'reader': this router allows 2",
    )
    amqp_client(router.amqp_port, user="sender", password=PASSWORD)  # another user: room
    amqp_client(router.amqp_port)  # anonymous connections count only against the router's limit
    assert _turned_away(router.amqp_port, user="client", password=PASSWORD) == Condition(
        "amqp:resource-limit-exceeded", "too many connections: this router allows 4"
    )
    first.close()
    amqp_client(router.amqp_port, user="client", password=PASSWORD)  # a place came free
    assert router.admin().GetConfig(router_pb2.GetConfigRequest(), timeout=10).limits == limits


def test_rules_in_the_configuration() -> None:
    pushed = _config(1, {"alice": {"send": ["orders/#"], "recv": ["*"]}})
    config = config_from_proto(pushed, router_id="r1")
    assert [(r.addresses, sorted(r.operations)) for r in config.rules["alice"]] == [
        (("orders/#",), ["send"]),
        (("*",), ["recv"]),
    ]
    echoed = config_to_proto(config).users[0]
    assert (echoed.username, echoed.password_hash) == ("alice", "")
    assert [(list(r.addresses), list(r.operations)) for r in echoed.authorization] == [
        (["orders/#"], ["send"]),
        (["*"], ["recv"]),
    ]


@pytest.mark.parametrize(
    ("rule", "error"),
    [
        (
            router_pb2.RouterRule(addresses=["orders#"], operations=["send"]),
            "user 'alice': rule 1: 'orders#': '#' stands for any number of whole segments "
            "and must stand alone between separators (as in 'orders/#')",
        ),
        (
            router_pb2.RouterRule(addresses=["a..b"], operations=["send"]),
            "user 'alice': rule 1: 'a..b' has an empty segment",
        ),
        (
            router_pb2.RouterRule(addresses=["pq"], operations=["publish"]),
            "user 'alice': rule 1: 'publish' is not an operation (one of send, recv, view, manage)",
        ),
        (router_pb2.RouterRule(operations=["send"]), "user 'alice': rule 1 names no address"),
        (router_pb2.RouterRule(addresses=["pq"]), "user 'alice': rule 1 names no operation"),
    ],
)
def test_bad_rules_are_refused_by_name(rule: router_pb2.RouterRule, error: str) -> None:
    pushed = router_pb2.RouterConfig(
        generation=1,
        users=[router_pb2.RouterUser(username="alice", password_hash=HASH, authorization=[rule])],
    )
    with pytest.raises(ConfigError) as refused:
        config_from_proto(pushed, router_id="r1")
    assert str(refused.value) == error


def test_a_bad_rule_is_refused_over_grpc_and_changes_nothing(router: RouterProcess) -> None:
    bad = _config(2, {"alice": {"send": ["a b"]}})
    with pytest.raises(grpc.RpcError) as refused:
        router.apply(bad)
    assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert refused.value.details() == (
        "user 'alice': rule 1: 'a b' holds ' ': a pattern is letters, digits and _ . - / # *"
    )
    assert router.stats().generation == 1


def test_who_a_connection_is() -> None:
    users = {"alice": HASH}
    assert logged_in_as(None, configured=users) is None
    assert logged_in_as("anonymous", configured=users) is None, "SASL ANONYMOUS"
    assert logged_in_as("alice", configured=users) == "alice"
    assert logged_in_as("gone", configured=users) == "gone", "removed since: no rules, no rights"
    assert logged_in_as("anonymous", configured={"anonymous": HASH}) == "anonymous"
    anonymous = Permissions(user=None)
    assert anonymous.may("recv", "anything")
    assert anonymous.sends_everywhere
    nobody = Permissions(user="gone")
    assert not nobody.may("send", "pq")
    assert not nobody.sends_everywhere


def test_browsing_a_queue_needs_view_or_recv(
    routers: RouterFleet, broker_factory: BrokerFactory, amqp_client: Callable[..., Client]
) -> None:
    """A receiver that browses (source distribution-mode `copy`) a queue through the router needs
    `view` or `recv`; a `view` rule grants browsing only, and only a queue is browsed (a `copy`
    consumer of an anycast address would take its messages)."""
    broker = broker_factory()
    broker.ensure_queue("pq")
    router = routers.start("r2", extra_args=("--client-auth=optional",))
    config = _config(1, {"viewer": {"view": ["pq", "events"]}, "sender": SEND_PQ})
    del config.addresses[:]
    config.addresses.extend(
        [
            router_pb2.AddressRoute(
                address="pq",
                type="queue",
                brokers=[
                    router_pb2.BrokerWaypoint(name="b1", host="127.0.0.1", port=broker.amqp_port)
                ],
            ),
            router_pb2.AddressRoute(address="events", type="anycast"),
        ]
    )
    router.apply(config)
    anonymous = amqp_client(router.amqp_port)
    viewer = amqp_client(router.amqp_port, user="viewer", password=PASSWORD)
    sender = amqp_client(router.amqp_port, user="sender", password=PASSWORD)
    assert anonymous.sender("pq").send(codec.encode_message("look")).outcome is Outcome.ACCEPTED

    looking = viewer.receiver("pq", source=Terminus(address="pq", distribution_mode="copy"))
    assert codec.read_body(looking.receive(10).payload) == "look"
    assert _refused(lambda: viewer.receiver("pq")) == unauthorized(
        "user 'viewer' may not recv from 'pq'"
    )
    events = Terminus(address="events", distribution_mode="copy")
    assert _refused(lambda: viewer.receiver("events", source=events)) == unauthorized(
        "user 'viewer' may not recv from 'events': only a queue is browsed"
    )
    browse = Terminus(address="pq", distribution_mode="copy")
    assert _refused(lambda: sender.receiver("pq", source=browse)) == unauthorized(
        "user 'sender' may not view 'pq'"
    )
    taken = anonymous.receiver("pq", credit=1)  # browsed, not taken: still there
    delivery = taken.receive(10)
    assert codec.read_body(delivery.payload) == "look"
    taken.accept(delivery)
