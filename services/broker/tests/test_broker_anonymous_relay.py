"""The anonymous relay on a brokered space's broker, with a real broker process (`--client-auth
required`, the access pushed over BrokerAdmin as the storage-controller does) and real clients:
a sender attached with no target address sends each message where its `to` says (a queue, a
topic, a dynamic reply queue: Qpid Proton's `server.py` answers requests so); a message whose
`to` is missing, unknown, a subscription queue or not the user's to send to is rejected alone,
with the router's conditions, the link staying up; a new push is seen by the next message; the
broker offers ANONYMOUS-RELAY in its open frame, and a broker behind routers relays too."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from enmasse.amqp import codec
from enmasse.amqp.client import AmqpError, Client, Receiver, Sender
from enmasse.amqp.engine import Condition, Outcome, Terminus
from enmasse.common.passwords import hash_password
from enmasse.v1 import broker_pb2, router_pb2
from proton import Message
from proton.utils import BlockingConnection

from tests.fixtures.broker import BrokerFactory, BrokerProcess, Rules, client_access

PASSWORD = "secret"
HASH = hash_password(PASSWORD)
USERS: dict[str, Rules] = {
    "sender": {"send": ["pq"]},
    "all": {"send": ["#"], "recv": ["#"]},
}


def _access(
    version: str, users: dict[str, Rules] = USERS, *, links: int = 0
) -> broker_pb2.ClientAccess:
    """PLAIN in clear, so proton's own client logs in. `links`: the plan's limit of links on
    one connection (0: none)."""
    return client_access(
        version=version,
        users=users,
        password_hash=HASH,
        limits=router_pb2.RouterLimits(max_links_per_connection=links),
        allow_plain_without_tls=True,
    )


@pytest.fixture
def endpoint(broker_factory: BrokerFactory) -> BrokerProcess:
    """A brokered space's broker with the queues `pq`, `pq2` and the topic `news`."""
    broker = broker_factory("--client-auth=required")
    broker.ensure_queue("pq")
    broker.ensure_queue("pq2")
    broker.ensure_topic("news")
    assert broker.admin().SetClientAccess(_access("v1"), timeout=10).version == "v1"
    return broker


LogIn = Callable[[str], Client]


@pytest.fixture
def log_in(endpoint: BrokerProcess) -> Iterator[LogIn]:
    """Clients logged in as a user (proton's PLAIN), closed at the end."""
    clients: list[Client] = []

    def open_client(user: str) -> Client:
        client = Client("127.0.0.1", endpoint.amqp_port, timeout=10, user=user, password=PASSWORD)
        clients.append(client)
        return client

    yield open_client
    for client in clients:
        client.close()


def _body(receiver: Receiver) -> object:
    delivery = receiver.receive(10)
    receiver.settle(delivery)
    return codec.read_body(delivery.payload)


def _send(relay: Sender, body: str, to: str | None) -> tuple[Outcome | None, Condition | None]:
    delivery = relay.send(codec.encode_message(body, to=to))
    return delivery.outcome, delivery.error


def test_a_relay_sends_each_message_where_its_to_says(
    endpoint: BrokerProcess, log_in: LogIn
) -> None:
    everyone = log_in("all")
    assert everyone.call(lambda: everyone.connection.remote_offered_capabilities) == (
        "ANONYMOUS-RELAY",
    )
    queue = everyone.receiver("pq", credit=10)
    topic = everyone.receiver("news", credit=10)
    reply = everyone.receiver(None, source=Terminus(dynamic=True), credit=10)
    reply_to = reply.address
    assert reply_to is not None
    assert reply_to.startswith("_dynamic/"), reply_to
    relay = everyone.sender(None)
    for to in ("pq", "news", reply_to, "pq"):
        assert _send(relay, f"to {to}", to) == (Outcome.ACCEPTED, None)
    assert [_body(queue), _body(queue), _body(topic), _body(reply)] == [
        "to pq",
        "to pq",
        "to news",
        f"to {reply_to}",
    ]


def test_what_cannot_go_is_rejected_alone_and_the_link_stays(
    endpoint: BrokerProcess, log_in: LogIn
) -> None:
    sender = log_in("sender")
    relay = sender.sender(None)
    refusals = {
        "no to": _send(relay, "nowhere", None),
        "not its to send to": _send(relay, "to pq2", "pq2"),
        "unknown": _send(relay, "to nothing", "nothing"),
        "a subscription queue": _send(relay, "sneaky", "news::someone"),
        "a reply address that is gone": _send(relay, "late", "_dynamic/c1/gone"),
    }
    assert refusals == {
        "no to": (
            Outcome.REJECTED,
            Condition(
                "amqp:precondition-failed", "a message on an anonymous link needs a 'to' address"
            ),
        ),
        "not its to send to": (
            Outcome.REJECTED,
            Condition("amqp:unauthorized-access", "user 'sender' may not send to 'pq2'"),
        ),
        # allowed by no rule of its: what it may not send to is refused before it is looked up
        "unknown": (
            Outcome.REJECTED,
            Condition("amqp:unauthorized-access", "user 'sender' may not send to 'nothing'"),
        ),
        "a subscription queue": (
            Outcome.REJECTED,
            Condition(
                "amqp:unauthorized-access",
                "'news::someone' is a subscription queue: only a drain from another broker "
                "(with a PrepareDrain token) may send to it",
            ),
        ),
        "a reply address that is gone": (
            Outcome.REJECTED,
            Condition(
                "amqp:not-found",
                "reply address '_dynamic/c1/gone' is gone: the receiver that asked for it "
                "detached, or its connection closed",
            ),
        ),
    }
    garbage = relay.send(b"\x00Ss\xc0\x05\x03\xa1\x10ab")  # a `to` cut short
    assert garbage.outcome is Outcome.REJECTED
    assert garbage.error is not None
    assert garbage.error.name == "amqp:decode-error"
    assert garbage.error.description.startswith("cannot read the message's 'to': ")
    everyone = log_in("all")
    unknown = _send(everyone.sender(None), "to nothing", "nothing")
    assert unknown == (
        Outcome.REJECTED,
        Condition("amqp:not-found", "no queue or topic 'nothing' on this broker"),
    )
    assert _send(relay, "still here", "pq") == (Outcome.ACCEPTED, None), "the link stays"
    assert not relay.detached.done()
    assert _body(everyone.receiver("pq", credit=1)) == "still here"


def test_a_new_push_is_seen_by_the_next_message(endpoint: BrokerProcess, log_in: LogIn) -> None:
    """The relay's decisions are kept per address, until the next push."""
    relay = log_in("sender").sender(None)
    assert _send(relay, "one", "pq") == (Outcome.ACCEPTED, None)
    moved = {**USERS, "sender": {"send": ["pq2"]}}
    assert endpoint.admin().SetClientAccess(_access("v2", moved), timeout=10).version == "v2"
    assert _send(relay, "two", "pq") == (
        Outcome.REJECTED,
        Condition("amqp:unauthorized-access", "user 'sender' may not send to 'pq'"),
    )
    assert _send(relay, "three", "pq2") == (Outcome.ACCEPTED, None)
    assert not relay.detached.done(), "a relay link is never closed by a push: its messages are"


def test_a_relay_link_counts_against_the_plans_link_limit(
    endpoint: BrokerProcess, log_in: LogIn
) -> None:
    assert endpoint.admin().SetClientAccess(_access("v2", links=1), timeout=10).version == "v2"
    client = log_in("all")
    client.receiver("pq", credit=1)
    with pytest.raises(AmqpError) as refused:
        client.sender(None)
    assert refused.value.condition == Condition(
        "amqp:resource-limit-exceeded", "too many links on this connection: this broker allows 1"
    )


def _proton(broker: BrokerProcess, user: str) -> BlockingConnection:
    """Qpid Proton's own blocking client, logged in with PLAIN."""
    return BlockingConnection(
        f"127.0.0.1:{broker.amqp_port}",
        timeout=10,
        user=user,
        password=PASSWORD,
        allowed_mechs="PLAIN",
        allow_insecure_mechs=True,
    )


def test_proton_server_answers_through_the_relay(endpoint: BrokerProcess) -> None:
    """Qpid Proton's own blocking client, as `server.py` does it: one anonymous sender, each
    reply addressed to the requester's dynamic reply queue; many replies, more than a window."""
    requester, server = _proton(endpoint, "all"), _proton(endpoint, "all")
    try:
        replies = requester.create_receiver(None, dynamic=True, credit=500)
        reply_to = replies.link.remote_source.address
        relay = server.create_sender(None)
        for n in range(300):
            relay.send(Message(address=reply_to, body=f"reply {n}"))
        bodies = []
        for _ in range(300):
            bodies.append(replies.receive(timeout=10).body)
            replies.accept()
        assert bodies == [f"reply {n}" for n in range(300)]
    finally:
        server.close()
        requester.close()


def test_a_broker_behind_routers_relays_too(
    broker: BrokerProcess, amqp_client: Callable[..., Client]
) -> None:
    broker.ensure_queue("pq")
    client = amqp_client(broker.amqp_port)
    relay = client.sender(None)
    assert _send(relay, "via relay", "pq") == (Outcome.ACCEPTED, None)
    assert _send(relay, "nowhere", "nothing") == (
        Outcome.REJECTED,
        Condition("amqp:not-found", "no queue or topic 'nothing' on this broker"),
    )
    assert _body(client.receiver("pq", credit=1)) == "via relay"
