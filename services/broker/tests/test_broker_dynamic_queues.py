"""Dynamic (temporary) queues on a brokered space's broker, with a real broker process
(`--client-auth required`, the access pushed over BrokerAdmin), Qpid Proton's own blocking client
and our proton-based `Client`: a receiver that asks for a dynamic source gets a `_dynamic/...`
address of its own; request-response through it works as through a standard space's router
(proton's `SyncRequestResponse` included); anyone of the space may send to it, only the
connection that made it may receive from it; it lives as long as its link (or its connection,
when the source's expiry-policy says `connection-close`) and then it and its messages are gone:
a sender attaching to it is refused with amqp:not-found."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from enmasse.amqp import codec
from enmasse.amqp.client import AmqpError, Client, Sender
from enmasse.amqp.engine import Condition, Outcome
from enmasse.broker.broker import Broker
from enmasse.common.passwords import hash_password
from enmasse.v1 import broker_pb2
from proton import Link, Message
from proton import Terminus as ProtonTerminus
from proton.reactor import LinkOption
from proton.utils import BlockingConnection, BlockingReceiver, SyncRequestResponse

from tests.fixtures.broker import BrokerFactory, BrokerProcess, client_access

PASSWORD = "secret"
HASH = hash_password(PASSWORD)
USERS: dict[str, dict[str, list[str]]] = {
    "requester": {"send": ["requests"]},  # no recv right anywhere: its replies come anyway
    "server": {"recv": ["requests"]},  # no send right: a reply address takes it anyway
    "other": {"send": ["#"], "recv": ["#"]},  # every right: still not another's replies
}


def _access(version: str) -> broker_pb2.ClientAccess:
    """PLAIN in clear, so proton's own client logs in."""
    return client_access(
        version=version, users=USERS, password_hash=HASH, allow_plain_without_tls=True
    )


@pytest.fixture
def endpoint(broker_factory: BrokerFactory) -> BrokerProcess:
    """A brokered space's broker with the queue `requests` and its users in force."""
    broker = broker_factory("--client-auth=required")
    broker.ensure_queue("requests")
    answer = broker.admin().SetClientAccess(_access("v1"), timeout=10)
    assert answer.version == "v1"
    return broker


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


def _client(broker: BrokerProcess, user: str) -> Client:
    return Client(
        "127.0.0.1", broker.amqp_port, timeout=10, user=user, password=PASSWORD, mechanisms=None
    )


def _address(receiver: BlockingReceiver) -> str:
    """The address the broker gave a dynamic receiver, from its attach's source."""
    address = receiver.link.remote_source.address
    assert isinstance(address, str)
    return address


def _serve(broker: BrokerProcess, stop: threading.Event, count: int) -> None:
    """A server on `requests`: answers each request to its reply-to, with its correlation-id."""
    with _client(broker, "server") as server:
        requests = server.receiver("requests", credit=10)
        replies: dict[str, Sender] = {}
        for _ in range(count):
            if stop.is_set():
                return
            delivery = requests.receive(10)
            request = Message()
            request.decode(delivery.payload)
            reply_to = str(request.reply_to)
            sender = replies.get(reply_to) or server.sender(reply_to)
            replies[reply_to] = sender
            answer = Message(body=str(request.body).upper(), correlation_id=request.correlation_id)
            assert sender.send(answer.encode()).outcome is Outcome.ACCEPTED
            requests.accept(delivery)


@pytest.fixture
def server(endpoint: BrokerProcess) -> Iterator[threading.Thread]:
    stop = threading.Event()
    failures: list[BaseException] = []

    def run() -> None:
        try:
            _serve(endpoint, stop, count=3)
        except BaseException as error:  # reported by the test, not lost in the thread
            failures.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    yield thread
    stop.set()
    thread.join(30)
    assert not failures, failures


def test_request_response_through_a_dynamic_reply_queue(
    endpoint: BrokerProcess, server: threading.Thread
) -> None:
    conn = _proton(endpoint, "requester")
    try:
        client = SyncRequestResponse(conn, "requests")
        assert client.reply_to.startswith("_dynamic/"), client.reply_to
        for word in ("one", "two", "three"):
            response = client.call(Message(body=word))
            assert response.body == word.upper()
    finally:
        conn.close()
    server.join(30)
    assert not server.is_alive()
    listed = endpoint.admin().ListAddresses(broker_pb2.ListAddressesRequest(), timeout=10)
    assert [a.name for a in listed.addresses] == ["requests"], "a reply queue is nobody's address"


def test_a_reply_queue_is_received_from_only_by_the_connection_that_made_it(
    endpoint: BrokerProcess,
) -> None:
    conn = _proton(endpoint, "requester")
    try:
        replies = conn.create_receiver(None, dynamic=True, credit=10)
        address = _address(replies)
        with _client(endpoint, "other") as other, _client(endpoint, "requester") as again:
            for stranger, user in ((other, "other"), (again, "requester")):
                with pytest.raises(AmqpError) as refused:
                    stranger.receiver(address)
                assert refused.value.condition == Condition(
                    "amqp:unauthorized-access",
                    f"user '{user}' may not recv from '{address}': a reply address belongs to "
                    "the connection that made it",
                )
            sent = other.sender(address).send(codec.encode_message("for the requester"))
            assert sent.outcome is Outcome.ACCEPTED, "anyone of the space may send a reply"
        assert replies.receive(timeout=10).body == "for the requester"
        replies.accept()
    finally:
        conn.close()


def _gone(address: str) -> Condition:
    return Condition(
        "amqp:not-found",
        f"reply address {address!r} is gone: the receiver that asked for it detached, "
        "or its connection closed",
    )


def test_a_reply_queue_and_its_messages_go_with_its_link(endpoint: BrokerProcess) -> None:
    conn = _proton(endpoint, "requester")
    with _client(endpoint, "server") as server:
        try:
            replies = conn.create_receiver(None, dynamic=True, credit=0)  # takes nothing yet
            address = _address(replies)
            sender = server.sender(address)
            for n in range(3):
                assert sender.send(codec.encode_message(f"late {n}")).outcome is Outcome.ACCEPTED
            replies.close()
            with pytest.raises(AmqpError) as refused:
                server.sender(address)
            assert refused.value.condition == _gone(address)
            # The sender attached before: its next message is rejected and its link closed.
            rejected = sender.send(codec.encode_message("too late"))
            assert rejected.outcome is Outcome.REJECTED
            assert sender.detached.result(10) == Condition(
                "amqp:not-found", f"no queue or topic {address!r} on this broker"
            )
            # A new reply queue on the same connection: a new address, none of the old messages.
            fresh = conn.create_receiver(None, dynamic=True, credit=10)
            assert _address(fresh) != address
            server.sender(_address(fresh)).send(codec.encode_message("fresh"))
            assert fresh.receive(timeout=10).body == "fresh"
            fresh.accept()
        finally:
            conn.close()


class _UntilConnectionClose(LinkOption):
    """A dynamic source that asks to live as long as the connection (expiry-policy)."""

    def apply(self, link: Link) -> None:
        link.source.expiry_policy = ProtonTerminus.EXPIRE_WITH_CONNECTION

    def test(self, link: Link) -> bool:
        return link.is_receiver


def test_a_reply_queue_can_live_as_long_as_its_connection(endpoint: BrokerProcess) -> None:
    conn = _proton(endpoint, "requester")
    with _client(endpoint, "server") as server:
        try:
            first = conn.create_receiver(
                None, dynamic=True, credit=0, options=_UntilConnectionClose()
            )
            address = _address(first)
            assert address.startswith("_dynamic/"), address
            first.close()
            sent = server.sender(address).send(codec.encode_message("kept for the connection"))
            assert sent.outcome is Outcome.ACCEPTED, "the link went, the connection holds it"
            again = conn.create_receiver(address, credit=10)
            assert again.receive(timeout=10).body == "kept for the connection"
            again.accept()
        finally:
            conn.close()
        with pytest.raises(AmqpError) as refused:
            server.sender(address)
        assert refused.value.condition == _gone(address)


def test_a_reply_queue_is_never_journaled_nor_catalogued(tmp_path: Path) -> None:
    broker = Broker(data_dir=tmp_path)
    broker.start()
    try:
        queue = broker.create_dynamic_queue()
        assert queue.name.startswith("_dynamic/broker/")
        assert broker.find_queue(queue.name) is queue
        owned = broker.publish(queue.name, payload=codec.encode_message("reply"), durable=True)
        assert owned, "owned at once: in memory, no journal record to wait for"
        assert queue.depth == 1
        assert broker.drop_dynamic_queue(queue.name) == 1
        assert broker.find_queue(queue.name) is None
    finally:
        broker.close()
    again = Broker(data_dir=tmp_path)
    again.start()
    try:
        assert again.all_queues() == [], "nothing of it survives a restart"
    finally:
        again.close()
