"""The engine's basic path, over real loopback sockets: a tiny queue peer built on the engine
(attach / refuse, credit, transfer, every outcome, pre-settled, detach, dynamic nodes, timers,
cross-thread calls, a session the handler ends at its begin, sessions the peer ends freed),
driven by the engine's blocking client and by proton's own BlockingConnection.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import threading
import time
from collections import deque

import pytest
from cproton_ffi import ffi, lib
from enmasse.amqp import codec
from enmasse.amqp.client import AmqpError, Client
from enmasse.amqp.engine import (
    Condition,
    Connection,
    ConnectionClosed,
    ConnectionHandler,
    Delivery,
    Engine,
    Link,
    Outcome,
    Terminus,
)
from proton import Endpoint, Message
from proton.utils import BlockingConnection, BlockingSender, LinkDetached


class Queues:
    """State shared by every connection of the tiny peer: named queues and waiting consumers."""

    def __init__(self, names: tuple[str, ...] = ("q",)) -> None:
        self.messages: dict[str, deque[bytes]] = {name: deque() for name in names}
        self.consumers: dict[str, list[Link]] = {name: [] for name in names}
        self.seen: list[Delivery] = []
        self.events: list[str] = []
        self.closed: list[Condition | None] = []


class QueuePeer(ConnectionHandler):
    """Stores what producers send, hands it to consumers; settles by the body's instruction."""

    def __init__(self, queues: Queues) -> None:
        self.queues = queues

    def on_link_attach(self, link: Link) -> None:
        if link.source.dynamic and link.is_sender:
            name = f"dynamic-{len(self.queues.messages)}"
            self.queues.messages[name] = deque()
            self.queues.consumers[name] = []
            link.set_dynamic_address(name)
        if link.address not in self.queues.messages:
            link.refuse(Condition("amqp:not-found", f"no address '{link.address}' in space 'demo'"))
            return
        link.accept()
        if link.is_receiver:
            link.flow(100)
        else:
            self.queues.consumers[link.address].append(link)

    def on_link_credit(self, link: Link) -> None:
        pending = self.queues.messages[link.address]
        while link.credit > 0 and pending:
            link.send(pending.popleft())

    def on_message(self, link: Link, delivery: Delivery) -> None:
        self.queues.seen.append(delivery)
        body = codec.read_body(delivery.payload)
        if body == b"reject":
            delivery.settle(Outcome.REJECTED, error=Condition("amqp:precondition-failed", "no"))
        elif body == b"release":
            delivery.settle(Outcome.RELEASED)
        elif body == b"modify":
            delivery.settle(Outcome.MODIFIED, delivery_failed=True, undeliverable_here=True)
        elif body == b"hold":
            pass  # the test settles it later
        else:
            self.queues.messages[link.address].append(delivery.payload)
            for consumer in self.queues.consumers[link.address]:
                self.on_link_credit(consumer)
            delivery.settle(Outcome.ACCEPTED)
        link.flow(1)

    def on_link_detach(self, link: Link, *, closed: bool, error: Condition | None) -> None:
        self.queues.events.append(f"detach {link.address} closed={closed}")
        if link.is_sender:
            self.queues.consumers[link.address].remove(link)

    def on_connection_close(self, conn: Connection, error: Condition | None) -> None:
        self.queues.closed.append(error)


@pytest.fixture
def queue_peer(amqp_listener):
    queues = Queues()
    engine, port = amqp_listener(lambda: QueuePeer(queues))
    return queues, engine, port


def wait_for(predicate, *, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


def test_messages_sent_arrive_in_order_and_accepted(queue_peer, amqp_client):
    _queues, _engine, port = queue_peer
    client = amqp_client(port)
    sender = client.sender("q")
    outcomes = [sender.send(codec.encode_message(f"m{i}".encode())).outcome for i in range(20)]
    receiver = client.receiver("q")
    bodies = []
    for _ in range(20):
        delivery = receiver.receive()
        bodies.append(codec.read_body(delivery.payload))
        receiver.accept(delivery)
    assert outcomes == [Outcome.ACCEPTED] * 20
    assert bodies == [f"m{i}".encode() for i in range(20)]


def test_attach_to_unknown_address_is_refused_with_exact_error(queue_peer, amqp_client):
    _queues, _engine, port = queue_peer
    client = amqp_client(port)
    with pytest.raises(AmqpError) as refused:
        client.sender("nope")
    assert str(refused.value) == "attach refused: amqp:not-found: no address 'nope' in space 'demo'"
    # The connection keeps serving after the refusal.
    assert client.sender("q").send(codec.encode_message(b"ok")).outcome == Outcome.ACCEPTED


def test_proton_client_sees_refusal_condition(queue_peer):
    _queues, _engine, port = queue_peer
    conn = BlockingConnection(f"127.0.0.1:{port}", timeout=5)
    try:
        with pytest.raises(LinkDetached, match="no address 'nope' in space 'demo'"):
            conn.create_sender("nope")
        conn.create_sender("q").send(Message(body="fine"))
    finally:
        conn.close()


def test_every_outcome_reaches_the_sender(queue_peer, amqp_client):
    _queues, _engine, port = queue_peer
    sender = amqp_client(port).sender("q")
    accepted = sender.send(codec.encode_message(b"fine"))
    rejected = sender.send(codec.encode_message(b"reject"))
    released = sender.send(codec.encode_message(b"release"))
    modified = sender.send(codec.encode_message(b"modify"))
    assert accepted.outcome == Outcome.ACCEPTED
    assert rejected.outcome == Outcome.REJECTED
    assert rejected.error == Condition("amqp:precondition-failed", "no")
    assert released.outcome == Outcome.RELEASED
    assert modified.outcome == Outcome.MODIFIED
    assert (modified.delivery_failed, modified.undeliverable_here) == (True, True)


def test_out_of_order_settlement_reaches_the_right_delivery(queue_peer, amqp_client):
    queues, engine, port = queue_peer
    sender = amqp_client(port).sender("q")
    futures = [sender.send_async(codec.encode_message(b"hold")) for _ in range(6)]
    assert wait_for(lambda: len(queues.seen) == 6)
    wanted = [Outcome.ACCEPTED, Outcome.RELEASED, Outcome.REJECTED] * 2

    def settle_backwards() -> None:
        for delivery, outcome in reversed(list(zip(queues.seen, wanted, strict=True))):
            delivery.settle(outcome)

    engine.call_soon_threadsafe(settle_backwards)
    assert [f.result(5).outcome for f in futures] == wanted


def test_pre_settled_messages_arrive_settled(queue_peer, amqp_client):
    queues, _engine, port = queue_peer
    sender = amqp_client(port).sender("q", settled=True)
    for i in range(50):
        sender.send(codec.encode_message(str(i).encode()))
    assert wait_for(lambda: len(queues.seen) == 50)
    assert all(d.pre_settled for d in queues.seen)
    assert [codec.read_body(d.payload) for d in queues.seen] == [str(i).encode() for i in range(50)]


def test_sender_gets_only_the_credit_given(amqp_listener, amqp_client):
    received: list[bytes] = []
    links: list[Link] = []

    class Stingy(ConnectionHandler):
        def on_link_attach(self, link: Link) -> None:
            link.accept()
            link.flow(3)
            links.append(link)

        def on_message(self, link: Link, delivery: Delivery) -> None:
            received.append(codec.read_body(delivery.payload))
            delivery.settle()

    engine, port = amqp_listener(Stingy)
    sender = amqp_client(port).sender("any")
    futures = [sender.send_async(codec.encode_message(str(i).encode())) for i in range(5)]
    assert wait_for(lambda: len(received) == 3)
    time.sleep(0.2)  # give a misbehaving engine the chance to overrun the credit
    assert received == [b"0", b"1", b"2"]
    engine.call_soon_threadsafe(lambda: links[0].flow(2))
    assert [f.result(5).outcome for f in futures] == [Outcome.ACCEPTED] * 5
    assert received == [b"0", b"1", b"2", b"3", b"4"]


def test_header_and_to_are_read_without_decoding(queue_peer):
    queues, _engine, port = queue_peer
    conn = BlockingConnection(f"127.0.0.1:{port}", timeout=5)
    try:
        conn.create_sender("q").send(
            Message(body="x", durable=True, ttl=1.5, address="q", priority=7, delivery_count=2)
        )
    finally:
        conn.close()
    delivery = queues.seen[0]
    assert (delivery.durable, delivery.ttl, delivery.priority) == (True, 1500, 7)
    assert (delivery.delivery_count, delivery.to) == (2, "q")


def test_consumer_receives_from_proton_sender(queue_peer, amqp_client):
    _queues, _engine, port = queue_peer
    conn = BlockingConnection(f"127.0.0.1:{port}", timeout=5)
    try:
        sender = conn.create_sender("q")
        for i in range(5):
            sender.send(Message(body=f"p{i}"))
    finally:
        conn.close()
    receiver = amqp_client(port).receiver("q")
    got = [codec.read_body(receiver.receive().payload) for _ in range(5)]
    assert got == [f"p{i}" for i in range(5)]


class TwoSessions(QueuePeer):
    """Takes at most two sessions a connection; says how many each begin found held."""

    def on_session_begin(self, conn: Connection, *, held: int) -> Condition | None:
        self.queues.events.append(f"begin held={held}")
        if held >= 2:
            return Condition("amqp:resource-limit-exceeded", f"{held} sessions are enough")
        return None


def test_a_session_begun_by_the_peer_is_the_handlers_to_take_or_end(amqp_listener):
    queues = Queues()
    _engine, port = amqp_listener(lambda: TwoSessions(queues))
    conn = BlockingConnection(f"127.0.0.1:{port}", timeout=5)

    def sender_on_a_new_session() -> BlockingSender:
        session = conn.conn.session()
        session.open()
        link = session.sender(f"q-{len(queues.events)}")
        link.target.address = "q"
        link.open()
        return BlockingSender(conn, link)

    try:
        first, second = sender_on_a_new_session(), sender_on_a_new_session()
        third = conn.conn.session()
        third.open()
        conn.wait(lambda: bool(third.state & Endpoint.REMOTE_CLOSED), msg="the third session")
        ended = third.remote_condition
        assert (ended.name, ended.description) == (
            "amqp:resource-limit-exceeded",
            "2 sessions are enough",
        )
        third.close()
        first.send(Message(body="first"))
        second.send(Message(body="second"))
        session = first.link.session
        session.close()
        conn.wait(lambda: bool(session.state & Endpoint.REMOTE_CLOSED), msg="the first session")
        sender_on_a_new_session().send(Message(body="after"))
    finally:
        conn.close()
    begins = [event for event in queues.events if event.startswith("begin")]
    assert begins == ["begin held=0", "begin held=1", "begin held=2", "begin held=1"]
    assert "detach q closed=False" in queues.events, "the first session's end ended its link"
    assert list(map(codec.read_body, queues.messages["q"])) == ["first", "second", "after"]


class Remembers(QueuePeer):
    """Keeps each connection it serves, to count what the engine holds for it."""

    def on_connection_open(self, conn: Connection) -> None:
        self.queues.events.append("open")
        self.conn = conn


def sessions_held(engine: Engine, conn: Connection) -> int:
    """The sessions proton holds on the server's side of `conn` (read on the engine thread)."""

    def count() -> int:
        held, session = 0, lib.pn_session_head(conn._ptr, 0)
        while session != ffi.NULL:
            held += 1
            session = lib.pn_session_next(session, 0)
        return held

    return int(engine.submit(count).result(5))


def test_sessions_the_peer_ended_are_freed_and_the_connection_goes_on(amqp_listener):
    queues = Queues()
    peers: list[Remembers] = []

    def handler() -> Remembers:
        peers.append(Remembers(queues))
        return peers[-1]

    engine, port = amqp_listener(handler)
    conn = BlockingConnection(f"127.0.0.1:{port}", timeout=10)
    try:
        for _batch in range(20):  # 2,000 sessions begun and ended, 100 at a time
            batch = [conn.conn.session() for _ in range(100)]
            for session in batch:
                session.open()
            conn.wait(
                lambda batch=batch: all(s.state & Endpoint.REMOTE_ACTIVE for s in batch),
                msg="a batch of sessions begun",
            )
            for session in batch:
                session.close()
            conn.wait(
                lambda batch=batch: all(s.state & Endpoint.REMOTE_CLOSED for s in batch),
                msg="a batch of sessions ended",
            )
            for session in batch:
                session.free()
        server = peers[0].conn
        assert wait_for(lambda: sessions_held(engine, server) == 0), sessions_held(engine, server)
        assert server._peer_sessions == set()
        sender = conn.create_sender("q")
        sender.send(Message(body="after 2,000 sessions"))
    finally:
        conn.close()
    assert list(map(codec.read_body, queues.messages["q"])) == ["after 2,000 sessions"]


def test_dynamic_receiver_gets_the_address_the_peer_made(queue_peer, amqp_client):
    _queues, _engine, port = queue_peer
    client = amqp_client(port)
    receiver = client.receiver(None, source=Terminus(dynamic=True))
    assert receiver.address == "dynamic-1"
    client.sender("dynamic-1").send(codec.encode_message(b"to the temp queue"))
    assert codec.read_body(receiver.receive().payload) == b"to the temp queue"


def test_closing_links_and_connection_is_reported_once(queue_peer, amqp_client):
    queues, _engine, port = queue_peer
    client = amqp_client(port)
    client.sender("q").close()
    client.receiver("q").detach()
    client.close()
    assert wait_for(lambda: len(queues.closed) == 1)
    assert queues.events == ["detach q closed=True", "detach q closed=False"]
    assert queues.closed == [None]


def test_link_closed_by_peer_with_error_is_seen_by_client(amqp_listener, amqp_client):
    class Closer(ConnectionHandler):
        def on_link_attach(self, link: Link) -> None:
            link.accept()
            link.flow(10)

        def on_message(self, link: Link, delivery: Delivery) -> None:
            link.close(Condition("amqp:resource-deleted", "address 'q' was deleted"))

    _engine, port = amqp_listener(Closer)
    sender = amqp_client(port).sender("q")
    with pytest.raises(AmqpError, match="amqp:resource-deleted: address 'q' was deleted"):
        sender.send(codec.encode_message(b"x"))


def test_timers_run_in_order_and_cancelled_ones_do_not():
    engine = Engine()
    fired: list[str] = []
    done = threading.Event()

    def schedule() -> None:
        engine.call_later(0.05, lambda: fired.append("b"))
        engine.call_later(0.01, lambda: fired.append("a"))
        engine.call_later(0.03, lambda: fired.append("never")).cancel()
        engine.call_later(0.1, done.set)

    thread = engine.run_in_thread()
    try:
        engine.call_soon_threadsafe(schedule)
        assert done.wait(5)
        assert fired == ["a", "b"]
    finally:
        engine.stop()
        thread.join(5)


def test_call_soon_threadsafe_runs_everything_on_the_engine_thread():
    engine = Engine()
    seen: list[tuple[int, str]] = []
    thread = engine.run_in_thread(name="the-engine")
    try:

        def feed(start: int) -> None:
            for i in range(start, start + 100):
                engine.call_soon_threadsafe(
                    lambda i=i: seen.append((i, threading.current_thread().name))
                )

        feeders = [threading.Thread(target=feed, args=(n * 100,)) for n in range(4)]
        for feeder in feeders:
            feeder.start()
        for feeder in feeders:
            feeder.join()
        assert wait_for(lambda: len(seen) == 400)
        assert sorted(i for i, _ in seen) == list(range(400))
        assert {name for _, name in seen} == {"the-engine"}
    finally:
        engine.stop()
        thread.join(5)


def test_connect_to_closed_port_reports_error(amqp_listener):
    engine, port = amqp_listener(ConnectionHandler)
    engine.submit(lambda: engine.stop_listening(port)).result(5)
    errors: list[Condition | None] = []
    done = threading.Event()

    class Dialer(ConnectionHandler):
        def on_connection_close(self, conn: Connection, error: Condition | None) -> None:
            errors.append(error)
            done.set()

    engine.call_soon_threadsafe(
        lambda: engine.connect(host="127.0.0.1", port=port, handler=Dialer())
    )
    assert done.wait(5)
    assert errors[0] is not None
    assert "Connection refused" in errors[0].description


def test_drain_gives_back_unused_credit(amqp_listener, amqp_client):
    drained: list[int] = []

    class OneThenDrain(ConnectionHandler):
        def on_link_attach(self, link: Link) -> None:
            link.accept()

        def on_link_credit(self, link: Link) -> None:
            if link.credit and not drained:
                link.send(codec.encode_message(b"only one"))
            if link.draining:
                drained.append(link.drained())

    _engine, port = amqp_listener(OneThenDrain)
    client = amqp_client(port)
    receiver = client.receiver("q", credit=0)
    client._call(lambda: receiver.link.drain(10))
    assert codec.read_body(receiver.receive().payload) == b"only one"
    assert wait_for(lambda: drained == [9])
    assert wait_for(lambda: client._call(lambda: receiver.link.credit) == 0)


@pytest.mark.parametrize(("available", "asked"), [(1, 10), (3, 3)])
def test_a_receiver_hears_once_its_drain_is_answered(amqp_listener, available, asked):
    """The peer gives back what it did not use (a flow says so), or uses it all (no flow
    comes): either way on_link_drained is called, once, and later flow() asks no drain."""

    class Holding(ConnectionHandler):
        def __init__(self) -> None:
            self.left = available

        def on_link_attach(self, link: Link) -> None:
            link.accept()

        def on_link_credit(self, link: Link) -> None:
            while link.credit and self.left:
                self.left -= 1
                link.send(codec.encode_message(b"m"))
            if link.draining:
                link.drained()

    heard: list[tuple[str, int]] = []

    class Draining(ConnectionHandler):
        def on_connection_open(self, conn: Connection) -> None:
            conn.open_receiver("q")

        def on_link_open(self, link: Link) -> None:
            link.drain(asked)

        def on_message(self, link: Link, delivery: Delivery) -> None:
            heard.append(("message", link.credit))
            delivery.settle()

        def on_link_drained(self, link: Link) -> None:
            heard.append(("drained", link.credit))

    _server, port = amqp_listener(Holding)
    engine = Engine()
    thread = engine.run_in_thread()
    try:
        engine.submit(lambda: engine.connect(host="127.0.0.1", port=port, handler=Draining()))
        assert wait_for(lambda: ("drained", 0) in heard)
        time.sleep(0.2)
        assert [kind for kind, _ in heard] == ["message"] * available + ["drained"]
        link = engine.submit(lambda: engine.connections[0].links[0]).result(5)
        engine.submit(lambda: link.flow(2)).result(5)
        assert wait_for(lambda: engine.submit(lambda: link.credit).result(5) == 2)
        assert not engine.submit(lambda: bool(lib.pn_link_get_drain(link._ptr))).result(5)
    finally:
        engine.stop()
        thread.join(5)


def test_terminus_properties_reach_the_peer(amqp_listener, amqp_client):
    from proton import Described, symbol

    seen: list[Link] = []

    class Inspector(ConnectionHandler):
        def on_link_attach(self, link: Link) -> None:
            seen.append(link)
            link.accept()

    _engine, port = amqp_listener(Inspector)
    selector = Described(symbol("apache.org:selector-filter:string"), "colour = 'red'")
    amqp_client(port, container_id="subscriber").receiver(
        "news",
        name="my-subscription",
        source=Terminus(
            address="news",
            durable=2,
            expiry_policy="never",
            distribution_mode="copy",
            capabilities=("topic", "shared"),
            filter={"selector": selector},
        ),
    )
    link = seen[0]
    assert (link.name, link.address, link.is_sender) == ("my-subscription", "news", True)
    assert link.source.durable == 2
    assert link.source.expiry_policy == "never"
    assert link.source.distribution_mode == "copy"
    assert link.source.capabilities == ("topic", "shared")
    assert link.source.filter == {"selector": selector}
    assert link.connection.container_id == "subscriber"


def test_open_frame_properties_and_capabilities_both_ways(amqp_listener, amqp_client):
    seen: list[tuple[dict, tuple, tuple]] = []

    class Router(ConnectionHandler):
        def on_connection_open(self, conn: Connection) -> None:
            seen.append(
                (
                    conn.remote_properties,
                    conn.remote_desired_capabilities,
                    conn.remote_offered_capabilities,
                )
            )

    _engine, port = amqp_listener(
        Router, properties={"product": "enmasse-router"}, offered_capabilities=("ANONYMOUS-RELAY",)
    )
    client = amqp_client(port, properties={"role": "inter-router"}, desired_capabilities=("x",))
    assert seen == [({"role": "inter-router"}, ("x",), ())]
    conn = client.connection
    assert client.call(lambda: conn.remote_offered_capabilities) == ("ANONYMOUS-RELAY",)
    assert client.call(lambda: conn.remote_properties) == {"product": "enmasse-router"}


def test_submit_returns_results_and_errors_across_threads(amqp_listener):
    engine, _port = amqp_listener(ConnectionHandler)
    names = engine.submit(lambda: threading.current_thread().name).result(5)
    assert names.startswith("amqp-listener-")
    failing = engine.submit(lambda: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        failing.result(5)
    # The engine survived the error and still runs callables.
    assert engine.submit(lambda: "still serving").result(5) == "still serving"


def test_using_a_closed_connection_or_link_is_a_clear_error(queue_peer, amqp_client):
    from enmasse.amqp import ConnectionClosed, LinkClosed

    _queues, _engine, port = queue_peer
    client = amqp_client(port)
    sender = client.sender("q")
    link, conn = sender.link, client.connection
    sender.close()
    with pytest.raises(LinkClosed, match="is closed"):
        client.call(lambda: link.send(codec.encode_message(b"late")))
    client.call(conn.close)
    client.closed_with.result(5)
    with pytest.raises(ConnectionClosed, match="is closed"):
        client.call(lambda: conn.open_sender("q"))


def test_shutdown_closes_connections_politely(amqp_client):
    closed: list[Condition | None] = []

    class Watcher(ConnectionHandler):
        def on_connection_close(self, conn: Connection, error: Condition | None) -> None:
            closed.append(error)

    engine = Engine()
    port = engine.listen(handler_factory=Watcher)
    thread = engine.run_in_thread()
    clients = [amqp_client(port) for _ in range(3)]
    going_away = Condition("amqp:connection:forced", "broker shutting down")
    engine.shutdown(error=going_away, timeout=5)
    thread.join(5)
    assert not thread.is_alive()
    assert [c.closed_with.result(5) for c in clients] == [going_away] * 3
    assert closed == [None] * 3  # our own close, answered by each client


def test_thousands_settled_in_random_order_each_get_their_own_outcome(amqp_listener, amqp_client):
    import random

    held: list[Delivery] = []
    kinds = [Outcome.ACCEPTED, Outcome.RELEASED, Outcome.REJECTED, Outcome.MODIFIED]

    class Shuffler(ConnectionHandler):
        def on_link_attach(self, link: Link) -> None:
            link.accept()
            link.flow(3000)

        def on_message(self, link: Link, delivery: Delivery) -> None:
            held.append(delivery)

    engine, port = amqp_listener(Shuffler)
    sender = amqp_client(port).sender("q")
    futures = [sender.send_async(codec.encode_message(str(i).encode())) for i in range(2000)]
    assert wait_for(lambda: len(held) == 2000, timeout=30)

    def settle_shuffled() -> None:
        order = list(held)
        random.Random(7).shuffle(order)
        for delivery in order:
            delivery.settle(kinds[int(codec.read_body(delivery.payload)) % 4])

    engine.call_soon_threadsafe(settle_shuffled)
    outcomes = [f.result(30).outcome for f in futures]
    assert outcomes == [kinds[i % 4] for i in range(2000)]


def test_nothing_is_left_behind_after_connections_come_and_go(queue_peer, amqp_client):
    _queues, engine, port = queue_peer
    for i in range(30):
        client = amqp_client(port, container_id=f"visitor-{i}")
        client.sender("q").send(codec.encode_message(b"hello"))
        client.receiver("q", credit=1)
        if i % 2:
            client.close()  # a polite close
        else:
            client.engine.stop()  # gone without a close frame, as a crashed client would be
    assert wait_for(lambda: engine.submit(lambda: len(engine.connections)).result(5) == 0)
    assert engine.submit(lambda: (len(engine._links), len(engine._conn_by_ptr))).result(5) == (0, 0)


def test_a_timer_that_reschedules_itself_at_once_does_not_hold_the_loop():
    engine = Engine()
    turns: list[int] = []
    done = threading.Event()

    def again() -> None:
        turns.append(1)
        if len(turns) < 500:
            engine.call_later(0, again)
        else:
            done.set()

    thread = engine.run_in_thread()
    try:
        engine.call_soon_threadsafe(again)
        # While the timer chain runs, other work still gets its turn.
        assert engine.submit(lambda: "served meanwhile").result(5) == "served meanwhile"
        assert done.wait(10)
        assert len(turns) == 500
    finally:
        engine.stop()
        thread.join(5)


class Sink(ConnectionHandler):
    """Takes every message and forgets it: what a connection leaves behind is the engine's."""

    def on_link_attach(self, link: Link) -> None:
        link.accept()
        if link.is_receiver:
            link.flow(500)

    def on_message(self, link: Link, delivery: Delivery) -> None:
        delivery.settle(Outcome.ACCEPTED)
        link.flow(1)


class _MallocInfo(ctypes.Structure):
    _fields_ = [  # glibc's struct mallinfo2
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def _malloc_in_use() -> int:
    """Bytes malloc has handed out and not had back (proton's objects live there; Python's
    small objects do not: they come from obmalloc's own arenas)."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    libc.mallinfo2.restype = _MallocInfo
    info = libc.mallinfo2()
    return info.uordblks + info.hblkhd


def test_a_finished_connection_gives_its_memory_back(amqp_listener):
    # Each busy connection leaves proton a pool of a few hundred deliveries (on both sides
    # here: client and listener share this process), and each client engine a collector.
    # Freed with them, 60 connections leave about 50 kB; kept, about 10 MB (connections
    # released without our last reference) or 1 MB (collectors never freed).
    _engine, port = amqp_listener(Sink)
    payload = codec.encode_message(b"x" * 100)

    def busy_connection() -> None:
        client = Client("127.0.0.1", port)  # not the fixture's: it would keep each one alive
        try:
            sender = client.sender("sink")
            futures = [sender.send_async(payload) for _ in range(200)]
            outcomes = {future.result(10).outcome for future in futures}
        finally:
            client.close()
        assert outcomes == {Outcome.ACCEPTED}

    for _ in range(10):  # warm-up: the allocator's and the interpreter's own first growth
        busy_connection()
    gc.collect()
    before = _malloc_in_use()
    for _ in range(60):
        busy_connection()
    gc.collect()
    grown = _malloc_in_use() - before
    assert grown < 500_000, f"{grown:,} bytes more in use after 60 connections came and went"


def test_dialling_from_an_engine_that_has_shut_down_is_a_clear_error(amqp_listener):
    _listener, port = amqp_listener(Sink)
    engine = Engine()
    thread = engine.run_in_thread()
    engine.stop()
    thread.join(5)
    with pytest.raises(ConnectionClosed, match="the engine has shut down"):
        engine.connect(host="127.0.0.1", port=port, handler=Sink())
