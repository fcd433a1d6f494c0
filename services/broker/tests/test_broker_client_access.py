"""A brokered space's broker as its client endpoint, with a real broker process (`--client-auth
required`), real clients and the access pushed over BrokerAdmin as the storage-controller does:
nobody gets in before the first push; ANONYMOUS only where the plan allows it; SCRAM-SHA-512/256
and PLAIN (over TLS only, unless the plan allows it); a user attaches only where its rules allow
(refused at the link, the connection staying up; browsing needs `view` or `recv`); a new push
closes the links that lost their right; the plan's limits hold (connections, links and sessions
per connection, message size); a bad push is refused by name, and a broker that serves routers
takes none."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable

import grpc
import pytest
from enmasse.amqp import codec, sasl
from enmasse.amqp.client import AmqpError, Client
from enmasse.amqp.engine import Condition, Outcome, Terminus, Tls
from enmasse.common.passwords import SCRAM_MECHANISMS, hash_password, scram_keys
from enmasse.v1 import broker_pb2, resources_pb2, router_pb2
from proton import Endpoint, Message
from proton.utils import BlockingConnection, BlockingSender

from tests.fixtures.broker import BrokerFactory, BrokerProcess, Rules, client_access

PASSWORD = "secret"
HASH = hash_password(PASSWORD)  # one scrypt for every user of the module
KEYS = [scram_keys(PASSWORD, mechanism=m) for m in SCRAM_MECHANISMS]
SCRAM = sasl.CLIENT_MECHANISMS  # SCRAM-SHA-512 first
NO_LOGIN = Condition("amqp:unauthorized-access", "Authentication failed [mech=none]")
BAD_SCRAM = Condition("amqp:unauthorized-access", "Authentication failed [mech=SCRAM-SHA-512]")

USERS: dict[str, Rules] = {
    "sender": {"send": ["pq"]},
    "reader": {"recv": ["pq"]},
    "viewer": {"view": ["pq", "news"]},
    "all": {"send": ["#"], "recv": ["#"]},
}


def unauthorized(description: str) -> Condition:
    return Condition("amqp:unauthorized-access", description)


def access(
    version: str,
    users: dict[str, Rules] = USERS,
    *,
    limits: router_pb2.RouterLimits | None = None,
    **policy: bool,
) -> broker_pb2.ClientAccess:
    """Users with their hash, SCRAM keys and rules."""
    return client_access(
        version=version,
        users=users,
        password_hash=HASH,
        scram_credentials=[
            resources_pb2.ScramCredential(
                mechanism=k.mechanism,
                salt=k.salt,
                iterations=k.iterations,
                stored_key=k.stored_key,
                server_key=k.server_key,
            )
            for k in KEYS
        ],
        limits=limits,
        **policy,
    )


def push(broker: BrokerProcess, message: broker_pb2.ClientAccess) -> None:
    answer = broker.admin().SetClientAccess(message, timeout=10)
    assert answer.version == message.version


@pytest.fixture
def endpoint(broker_factory: BrokerFactory) -> BrokerProcess:
    """A brokered space's broker with the queues `pq` and `pq2`, not pushed to yet."""
    broker = broker_factory("--client-auth=required")
    broker.ensure_queue("pq")
    broker.ensure_queue("pq2")
    return broker


def log_in(
    port: int,
    user: str | None = None,
    password: str = PASSWORD,
    *,
    mechanisms: tuple[str, ...] | None = SCRAM,
    tls: Tls | None = None,
) -> Client:
    """A client logged in as `user` (None: no login; mechanisms None: proton's PLAIN)."""
    return Client(
        "127.0.0.1",
        port,
        timeout=10,
        user=user,
        password=password if user is not None else None,
        mechanisms=mechanisms if user is not None else None,
        tls=tls,
        hostname="localhost" if tls is not None else None,
    )


def _refusal(attempt: Callable[[], Client]) -> Condition | None:
    with pytest.raises(AmqpError) as refused:
        attempt().close()
    return refused.value.condition


def _arrives(producer: Client, consumer: Client, address: str, body: str) -> None:
    """`body` goes through the broker's queue; the producer sees it accepted."""
    receiver = consumer.receiver(address, credit=10)
    assert producer.sender(address).send(codec.encode_message(body)).outcome is Outcome.ACCEPTED
    delivery = receiver.receive(10)
    assert codec.read_body(delivery.payload) == body
    receiver.accept(delivery)
    receiver.close()


def test_before_its_first_push_the_broker_lets_nobody_in(endpoint: BrokerProcess) -> None:
    port = endpoint.amqp_port
    listed = endpoint.admin().ListAddresses(broker_pb2.ListAddressesRequest(), timeout=10)
    assert listed.client_access_version == ""
    assert _refusal(lambda: log_in(port)) == NO_LOGIN, "no anonymous fallback"
    assert _refusal(lambda: log_in(port, "all")) == BAD_SCRAM
    push(endpoint, access("v1"))
    listed = endpoint.admin().ListAddresses(broker_pb2.ListAddressesRequest(), timeout=10)
    assert listed.client_access_version == "v1"
    log_in(port, "all").close()


def test_logins_as_the_plan_and_the_users_say(endpoint: BrokerProcess) -> None:
    port = endpoint.amqp_port
    push(endpoint, access("v1"))
    assert _refusal(lambda: log_in(port)) == NO_LOGIN, "ANONYMOUS: the plan does not allow it"
    assert _refusal(lambda: log_in(port, "all", "guess")) == BAD_SCRAM
    assert _refusal(lambda: log_in(port, "stranger")) == BAD_SCRAM, "not a user of the space"
    # proton's PLAIN on the plain port: offered only where the plan allows it
    assert _refusal(lambda: log_in(port, "all", mechanisms=None)) == NO_LOGIN
    for mechanism in SCRAM_MECHANISMS:
        with log_in(port, "all", mechanisms=(mechanism,)) as client:
            _arrives(client, client, "pq", f"in with {mechanism}")

    push(endpoint, access("v2", allow_anonymous=True, allow_plain_without_tls=True))
    with log_in(port) as anonymous:
        _arrives(anonymous, anonymous, "pq2", "anonymous: full access where the plan allows it")
    with log_in(port, "all", mechanisms=None) as plain:
        _arrives(plain, plain, "pq", "PLAIN in clear, as the plan allows")


def test_plain_logins_go_over_tls(
    broker_factory: BrokerFactory, tls_certificate: Callable[[str], tuple[str, str]]
) -> None:
    cert, key = tls_certificate("broker")
    broker = broker_factory(
        "--client-auth=required", f"--tls-cert={cert}", f"--tls-key={key}", "--amqps-port=0"
    )
    broker.ensure_queue("pq")
    push(broker, access("v1"))
    amqps = json.loads(broker.ports_file.read_text())["amqps"]
    assert amqps not in (broker.amqp_port, broker.admin_port)
    plain = (sasl.PLAIN,)
    assert _refusal(lambda: log_in(broker.amqp_port, "all", mechanisms=plain)) == NO_LOGIN
    verified = Tls(ca_file=cert, verify_hostname=True)
    with log_in(amqps, "all", mechanisms=plain, tls=verified) as secure:
        assert secure.call(lambda: secure.connection.encrypted)
        _arrives(secure, secure, "pq", "PLAIN over TLS")
    assert _refusal(lambda: log_in(amqps, tls=verified)) == NO_LOGIN, "and no ANONYMOUS there"


def test_a_user_attaches_only_where_its_rules_allow(endpoint: BrokerProcess) -> None:
    push(endpoint, access("v1"))
    with (
        log_in(endpoint.amqp_port, "sender") as sender,
        log_in(endpoint.amqp_port, "reader") as reader,
    ):
        producer = sender.sender("pq")
        with pytest.raises(AmqpError) as recv:
            sender.receiver("pq")
        assert recv.value.condition == unauthorized("user 'sender' may not recv from 'pq'")
        with pytest.raises(AmqpError) as other:
            sender.sender("pq2")
        assert other.value.condition == unauthorized("user 'sender' may not send to 'pq2'")
        with pytest.raises(AmqpError) as nowhere:
            sender.sender("nowhere")
        assert nowhere.value.condition == unauthorized("user 'sender' may not send to 'nowhere'"), (
            "refused before the address is looked up: its existence is not told"
        )
        # The connection stays up: the link it had still sends, and a new allowed attach too.
        assert not sender.closed_with.done()
        assert producer.send(codec.encode_message("one")).outcome is Outcome.ACCEPTED
        assert sender.sender("pq").send(codec.encode_message("two")).outcome is Outcome.ACCEPTED
        consumer = reader.receiver("pq", credit=10)
        got = [consumer.receive(10) for _ in range(2)]
        assert [codec.read_body(d.payload) for d in got] == ["one", "two"]
        for delivery in got:
            consumer.accept(delivery)
        with pytest.raises(AmqpError) as send:
            reader.sender("pq")
        assert send.value.condition == unauthorized("user 'reader' may not send to 'pq'")


def test_browsing_needs_view_or_recv(endpoint: BrokerProcess) -> None:
    push(endpoint, access("v1"))
    browse = Terminus(address="pq", distribution_mode="copy")
    with (
        log_in(endpoint.amqp_port, "sender") as sender,
        log_in(endpoint.amqp_port, "viewer") as viewer,
        log_in(endpoint.amqp_port, "reader") as reader,
    ):
        assert sender.sender("pq").send(codec.encode_message("look")).outcome is Outcome.ACCEPTED
        looking = viewer.receiver("pq", source=browse, credit=10)
        assert codec.read_body(looking.receive(10).payload) == "look"
        with pytest.raises(AmqpError) as take:
            viewer.receiver("pq")
        assert take.value.condition == unauthorized("user 'viewer' may not recv from 'pq'")
        with pytest.raises(AmqpError) as look:
            sender.receiver("pq", source=browse)
        assert look.value.condition == unauthorized("user 'sender' may not view 'pq'")
        # a topic's `copy` subscriber gets every message published: that takes `recv`
        endpoint.ensure_topic("news")
        with pytest.raises(AmqpError) as topic:
            viewer.receiver("news", source=Terminus(address="news", distribution_mode="copy"))
        assert topic.value.condition == unauthorized(
            "user 'viewer' may not recv from 'news': only a queue is browsed"
        )
        # recv implies browsing; and the browsed message is still there to take
        assert codec.read_body(reader.receiver("pq", source=browse).receive(10).payload) == "look"
        taken = reader.receiver("pq", credit=1)
        delivery = taken.receive(10)
        assert codec.read_body(delivery.payload) == "look"
        taken.accept(delivery)


def test_a_new_push_closes_the_links_that_lost_their_right(endpoint: BrokerProcess) -> None:
    mover = {"send": ["pq", "pq2"], "recv": ["pq"]}
    push(endpoint, access("v1", {**USERS, "mover": mover}))
    with (
        log_in(endpoint.amqp_port, "mover") as client,
        log_in(endpoint.amqp_port, "all") as other,
    ):
        kept = client.receiver("pq", credit=10)
        losing = client.sender("pq2")
        assert losing.send(codec.encode_message("before")).outcome is Outcome.ACCEPTED
        unchanged = other.sender("pq2")

        push(endpoint, access("v2", {**USERS, "mover": {"send": ["pq"], "recv": ["pq"]}}))
        assert losing.detached.result(10) == unauthorized("user 'mover' may not send to 'pq2'")
        assert not kept.detached.done(), "a link the new rules still allow stays"
        assert not unchanged.detached.done(), "another user's links are not touched"
        assert not client.closed_with.done(), "the connection stays"
        assert unchanged.send(codec.encode_message("x")).outcome is Outcome.ACCEPTED
        assert other.sender("pq").send(codec.encode_message("still")).outcome is Outcome.ACCEPTED
        delivery = kept.receive(10)
        assert codec.read_body(delivery.payload) == "still"
        kept.accept(delivery)

        push(endpoint, access("v3", USERS))  # the user removed: its connection may do nothing
        assert kept.detached.result(10) == unauthorized("user 'mover' may not recv from 'pq'")
        assert not client.closed_with.done()


def _turned_away(port: int, user: str) -> Condition | None:
    """How the broker turned a connection away: at open, or by closing it right after."""
    try:
        client = log_in(port, user)
    except AmqpError as refused:
        return refused.condition
    try:
        return client.closed_with.result(10)
    finally:
        client.close()


def test_the_plans_limits_hold(endpoint: BrokerProcess, amqp_client: Callable[..., Client]) -> None:
    limits = router_pb2.RouterLimits(
        max_connections=3,
        max_connections_per_user=2,
        max_links_per_connection=2,
        max_message_size=1000,
    )
    push(endpoint, access("v1", limits=limits))
    port = endpoint.amqp_port
    first = amqp_client(port, user="all", password=PASSWORD, mechanisms=SCRAM)
    amqp_client(port, user="all", password=PASSWORD, mechanisms=SCRAM)
    assert _turned_away(port, "all") == Condition(
        "amqp:resource-limit-exceeded", "too many connections for user 'all': this broker allows 2"
    )
    amqp_client(port, user="reader", password=PASSWORD, mechanisms=SCRAM)  # another user: room
    assert _turned_away(port, "sender") == Condition(
        "amqp:resource-limit-exceeded", "too many connections: this broker allows 3"
    )

    sender = first.sender("pq")
    first.receiver("pq", credit=10)
    with pytest.raises(AmqpError) as third:
        first.sender("pq2")
    assert third.value.condition == Condition(
        "amqp:resource-limit-exceeded", "too many links on this connection: this broker allows 2"
    )
    assert sender.send(codec.encode_message("x" * 500)).outcome is Outcome.ACCEPTED
    refused = sender.send(codec.encode_message("x" * 2000))
    assert refused.outcome is Outcome.REJECTED
    assert refused.error == Condition(
        "amqp:link:message-size-exceeded",
        f"message of {len(codec.encode_message('x' * 2000))} bytes exceeds the limit of 1000 bytes",
    )
    assert sender.send(codec.encode_message("x" * 500)).outcome is Outcome.ACCEPTED, "it goes on"


def _session_sender(conn: BlockingConnection, address: str) -> BlockingSender:
    """A sender to `address` on a session of its own."""
    session = conn.conn.session()
    session.open()
    link = session.sender(f"{address}-{uuid.uuid4().hex[:8]}")
    link.target.address = address
    link.open()
    return BlockingSender(conn, link)


def test_a_session_beyond_the_plans_limit_is_ended_and_the_others_go_on(
    endpoint: BrokerProcess, amqp_client: Callable[..., Client]
) -> None:
    limits = router_pb2.RouterLimits(max_sessions_per_connection=2)
    push(endpoint, access("v1", limits=limits, allow_plain_without_tls=True))
    port = endpoint.amqp_port
    conn = BlockingConnection(
        f"127.0.0.1:{port}", timeout=10, user="all", password=PASSWORD, allowed_mechs="PLAIN"
    )
    try:
        senders = [_session_sender(conn, "pq") for _ in range(2)]
        third = conn.conn.session()
        third.open()
        conn.wait(lambda: bool(third.state & Endpoint.REMOTE_CLOSED), msg="the third session")
        ended = third.remote_condition
        assert Condition(ended.name, ended.description) == Condition(
            "amqp:resource-limit-exceeded",
            "too many sessions: this connection holds 2, the space's limit is 2",
        )
        third.close()
        for n, sender in enumerate(senders):
            sender.send(Message(body=f"from session {n}"))
        # A session the client ends makes room for another.
        first = senders[0].link.session
        first.close()
        conn.wait(lambda: bool(first.state & Endpoint.REMOTE_CLOSED), msg="the first session")
        _session_sender(conn, "pq").send(Message(body="from a new session"))
    finally:
        conn.close()
    consumer = amqp_client(port, user="all", password=PASSWORD, mechanisms=SCRAM)
    receiver = consumer.receiver("pq", credit=10)
    got = [codec.read_body(receiver.receive(10).payload) for _ in range(3)]
    assert got == ["from session 0", "from session 1", "from a new session"]


def test_a_bad_push_is_refused_by_name_and_changes_nothing(endpoint: BrokerProcess) -> None:
    push(endpoint, access("v1"))
    bad = access("v2", {"alice": {"send": ["a..b"]}})
    with pytest.raises(grpc.RpcError) as refused:
        endpoint.admin().SetClientAccess(bad, timeout=10)
    assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert refused.value.details() == "user 'alice': rule 1: 'a..b' has an empty segment"
    listed = endpoint.admin().ListAddresses(broker_pb2.ListAddressesRequest(), timeout=10)
    assert listed.client_access_version == "v1"


def test_a_broker_that_serves_routers_takes_no_client_access(broker: BrokerProcess) -> None:
    with pytest.raises(grpc.RpcError) as refused:
        broker.admin().SetClientAccess(access("v1"), timeout=10)
    assert (refused.value.code(), refused.value.details()) == (
        grpc.StatusCode.FAILED_PRECONDITION,
        "this broker is not a client endpoint (started without --client-auth required)",
    )
