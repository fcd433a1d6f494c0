"""Transactions through a standard space's router (`transactions.py`), with real router and
broker processes and Qpid Proton's own client side (`Container.declare_transaction`,
`TransactionHandler`, what the tx_send / tx_recv examples use), each client run in a thread with
a bounded time.

The space's queues live on one broker (started `--routers-only`, as a standard space's): the
router routes the client's coordinator there. Shown: a transactional publish committed (all, in
order) or rolled back (none); a transactional acquisition committed (gone) or rolled back (back
again); the router SIGKILLed between the declare and the discharge (nothing of the transaction
visible, the acquired messages back); a transactional send to an anycast address refused with the
exact words, and its transaction's commit turned into a rollback; a coordinator refused at attach
when the space's queues are on two brokers (or there is no queue); and Proton's own tx_send /
tx_recv examples through the router.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from enmasse.common.passwords import hash_password
from enmasse.router.transactions import no_broker, refusal, rolled_back, several_brokers
from enmasse.v1 import router_pb2
from proton import Delivery, Message, Timeout
from proton.handlers import MessagingHandler, TransactionHandler
from proton.reactor import Container, Transaction
from proton.utils import BlockingConnection, SendException

from tests.fixtures.broker import BrokerFactory, BrokerProcess
from tests.fixtures.router import RouterFleet, RouterProcess
from tests.test_interop_proton_examples import Prompt, running

RUN_SECONDS = 30.0
EXAMPLES = Path("/usr/share/proton/examples/python")


def run(handler: MessagingHandler) -> None:
    """Runs a proton reactor with `handler` in a thread; fails if it is not done in time."""
    failure: list[BaseException] = []

    def target() -> None:
        try:
            Container(handler).run()
        except BaseException as error:  # surfaced to the test below
            failure.append(error)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(RUN_SECONDS)
    assert not thread.is_alive(), f"the proton client did not finish in {RUN_SECONDS}s"
    if failure:
        raise failure[0]


def _waypoint(name: str, broker: BrokerProcess) -> router_pb2.BrokerWaypoint:
    return router_pb2.BrokerWaypoint(name=name, host="127.0.0.1", port=broker.amqp_port)


@pytest.fixture
def standard(broker_factory: BrokerFactory) -> BrokerProcess:
    """A standard space's broker, holding the queues `orders` and `jobs`."""
    broker = broker_factory("--routers-only")
    broker.ensure_queue("orders")
    broker.ensure_queue("jobs")
    return broker


def _router(routers: RouterFleet, broker: BrokerProcess, *, router_id: str = "r1") -> RouterProcess:
    """A router of space `test`: queues `orders` and `jobs` on `broker`, anycast `work`."""
    router = routers.start(router_id)
    router.apply(
        routers.mesh_config(
            generation=1,
            addresses={"orders": "queue", "jobs": "queue", "work": "anycast"},
            waypoints={
                "orders": [_waypoint("b1", broker)],
                "jobs": [_waypoint("b1", broker)],
            },
        )
    )
    return router


def url(router: RouterProcess) -> str:
    return f"127.0.0.1:{router.amqp_port}"


def fill(router: RouterProcess, address: str, bodies: list[str]) -> None:
    conn = BlockingConnection(url(router), timeout=10)
    try:
        sender = conn.create_sender(address)
        for body in bodies:
            sender.send(Message(body=body, durable=True))
    finally:
        conn.close()


def drain(router: RouterProcess, address: str, *, expect: int) -> list[str]:
    """Receives `expect` messages through the router (accepting them), then checks that no
    other one comes."""
    conn = BlockingConnection(url(router), timeout=10)
    try:
        receiver = conn.create_receiver(address, credit=expect + 1)
        got = []
        for _ in range(expect):
            got.append(str(receiver.receive(timeout=10).body))
            receiver.accept()
        with pytest.raises(Timeout):
            receiver.receive(timeout=0.5)
        return got
    finally:
        conn.close()


def listed(broker: BrokerProcess, address: str) -> tuple[int, int, int]:
    """(depth, enqueued, dequeued) of a queue, as the broker lists it."""
    entry = broker.addresses()[address]
    return entry.depth, entry.enqueued, entry.dequeued


def wait_for(check: Callable[[], bool], *, what: str) -> None:
    deadline = time.monotonic() + 15
    while not check():
        assert time.monotonic() < deadline, f"not within 15s: {what}"
        time.sleep(0.05)


class TxClient(MessagingHandler, TransactionHandler):  # type: ignore[misc]
    """Connects to the router, opens its links (`opened`), declares a transaction and runs
    `declared`; what happens next is up to the test's callbacks."""

    def __init__(self, router: RouterProcess) -> None:
        super().__init__(prefetch=0, auto_accept=False)
        self.router = router
        self.container: Any = None
        self.conn: Any = None
        self.transaction: Transaction | None = None
        self.events: list[str] = []
        self.errors: list[tuple[str, str]] = []
        self.login: tuple[str, str] | None = None  # (user, password): SASL PLAIN

    def on_start(self, event: Any) -> None:
        self.container = event.container
        login: dict[str, Any] = {}
        if self.login is not None:
            user, password = self.login
            login = {
                "user": user,
                "password": password,
                "allowed_mechs": "PLAIN",
                "allow_insecure_mechs": True,
            }
        self.conn = self.container.connect(url(self.router), reconnect=False, **login)
        self.opened(self.conn)
        self.container.declare_transaction(self.conn, handler=self)

    def opened(self, conn: Any) -> None:
        """Links to open before the declare (as tx_recv does)."""

    def declared(self, transaction: Transaction) -> None:
        """What to do under the transaction."""

    def on_transaction_declared(self, event: Any) -> None:
        self.transaction = event.transaction
        self.events.append("declared")
        self.declared(event.transaction)

    def on_transaction_committed(self, event: Any) -> None:
        self.events.append("committed")
        self.conn.close()

    def on_transaction_aborted(self, event: Any) -> None:
        self.events.append("aborted")
        self.conn.close()

    def on_transaction_commit_failed(self, event: Any) -> None:
        self.events.append("commit failed")
        condition = event.delivery.remote.condition
        if condition is not None:
            self.errors.append((condition.name, condition.description))
        self.conn.close()

    def on_transaction_declare_failed(self, event: Any) -> None:
        self.events.append("declare failed")
        self.conn.close()

    def on_link_error(self, event: Any) -> None:
        condition = event.link.remote_condition
        self.errors.append((condition.name, condition.description))
        self.conn.close()

    def on_transport_error(self, event: Any) -> None:
        self.events.append("transport error")

    def on_connection_error(self, event: Any) -> None:
        self.events.append("connection error")


class TxSender(TxClient):
    """Sends `bodies` to `address` under the transaction; once all were answered,
    `all_answered`."""

    def __init__(self, router: RouterProcess, *, address: str, bodies: list[str]) -> None:
        super().__init__(router)
        self.address = address
        self.bodies = bodies
        self.sender: Any = None
        self.answers: list[tuple[int, Any, Any]] = []
        self.all_answered: Callable[[TxSender], None] = lambda client: None

    def opened(self, conn: Any) -> None:
        self.sender = self.container.create_sender(conn, self.address)

    def declared(self, transaction: Transaction) -> None:
        for body in self.bodies:
            transaction.send(self.sender, Message(body=body, durable=True))

    def on_settled(self, event: Any) -> None:
        if event.link.name != self.sender.name:
            return  # the coordinator's
        delivery = event.delivery
        condition = delivery.remote.condition
        self.answers.append(
            (
                delivery.remote_state,
                delivery.remote.data,
                (condition.name, condition.description) if condition else None,
            )
        )
        if len(self.answers) == len(self.bodies):
            self.all_answered(self)


class TxReceiver(TxClient):
    """Takes `count` messages from `address` and accepts them under the transaction; then
    `all_accepted`."""

    def __init__(self, router: RouterProcess, *, address: str, count: int) -> None:
        super().__init__(router)
        self.address = address
        self.count = count
        self.receiver: Any = None
        self.received: list[str] = []
        self.all_accepted: Callable[[TxReceiver], None] = lambda client: None

    def opened(self, conn: Any) -> None:
        self.receiver = self.container.create_receiver(conn, self.address)

    def declared(self, transaction: Transaction) -> None:
        self.receiver.flow(self.count)

    def on_message(self, event: Any) -> None:
        assert self.transaction is not None
        self.received.append(event.message.body)
        self.transaction.accept(event.delivery)
        if len(self.received) == self.count:
            self.all_accepted(self)


class Later:
    """A reactor timer's handler that runs `fn`."""

    def __init__(self, fn: Callable[[], None]) -> None:
        self.fn = fn

    def on_timer_task(self, event: Any) -> None:
        self.fn()


# ------------------------------------------------------------------ publish


def test_a_committed_publish_arrives_whole_and_in_order(
    routers: RouterFleet, standard: BrokerProcess
) -> None:
    router = _router(routers, standard)
    bodies = [f"m{n}" for n in range(20)]
    client = TxSender(router, address="orders", bodies=bodies)
    before_commit: list[tuple[int, int, int]] = []

    def answered(c: TxSender) -> None:
        before_commit.append(listed(standard, "orders"))
        assert c.transaction is not None
        c.transaction.commit()

    client.all_answered = answered
    run(client)
    assert client.events == ["declared", "committed"]
    assert before_commit == [(0, 0, 0)]  # held by the broker's transaction, not enqueued
    # Each send answered TransactionalState{txn-id, Accepted}, as the broker gives it
    assert client.transaction is not None
    assert {state for state, _, _ in client.answers} == {0x34}
    txn_id: Any = client.transaction.id
    assert {bytes(data[0]) for _, data, _ in client.answers} == {bytes(txn_id)}
    assert drain(router, "orders", expect=20) == bodies


def test_a_rolled_back_publish_is_never_seen(routers: RouterFleet, standard: BrokerProcess) -> None:
    router = _router(routers, standard)
    client = TxSender(router, address="orders", bodies=["a", "b", "c"])
    client.all_answered = lambda c: c.transaction.abort()  # type: ignore[union-attr]
    run(client)
    assert client.events == ["declared", "aborted"]
    assert listed(standard, "orders") == (0, 0, 0)
    assert drain(router, "orders", expect=0) == []


def test_a_client_that_goes_away_mid_transaction_leaves_nothing(
    routers: RouterFleet, standard: BrokerProcess
) -> None:
    """Its coordinator link goes with its connection: the router closes its own connection to
    the broker, which rolls the open transaction back."""
    router = _router(routers, standard)
    client = TxSender(router, address="orders", bodies=["a", "b"])
    client.all_answered = lambda c: c.conn.close()
    run(client)
    assert client.events == ["declared"]
    assert len(client.answers) == 2
    assert listed(standard, "orders") == (0, 0, 0)
    fill(router, "orders", ["after"])  # the queue works on: only what came after is there
    assert drain(router, "orders", expect=1) == ["after"]


# ------------------------------------------------------------------ acquisition


def test_acquired_messages_are_gone_at_commit(
    routers: RouterFleet, standard: BrokerProcess
) -> None:
    router = _router(routers, standard)
    fill(router, "jobs", ["j1", "j2", "j3"])
    client = TxReceiver(router, address="jobs", count=3)
    before_commit: list[tuple[int, int, int]] = []

    def accepted(c: TxReceiver) -> None:
        # Let the transactional dispositions reach the broker before looking.
        c.container.schedule(0.5, Later(lambda: look_then_commit(c)))

    def look_then_commit(c: TxReceiver) -> None:
        before_commit.append(listed(standard, "jobs"))
        assert c.transaction is not None
        c.transaction.commit()

    client.all_accepted = accepted
    run(client)
    assert client.received == ["j1", "j2", "j3"]
    assert client.events == ["declared", "committed"]
    assert before_commit == [(0, 3, 0)]  # acquired, not yet consumed, not redelivered
    assert listed(standard, "jobs") == (0, 3, 3)
    assert drain(router, "jobs", expect=0) == []


def test_rolled_back_acquisitions_are_there_again(
    routers: RouterFleet, standard: BrokerProcess
) -> None:
    router = _router(routers, standard)
    fill(router, "jobs", ["j1", "j2"])
    client = TxReceiver(router, address="jobs", count=2)

    def accepted(c: TxReceiver) -> None:
        c.container.schedule(0.5, Later(lambda: c.transaction.abort()))  # type: ignore[union-attr]

    client.all_accepted = accepted
    run(client)
    assert client.events == ["declared", "aborted"]
    assert drain(router, "jobs", expect=2) == ["j1", "j2"]


# ------------------------------------------------------------------ a router that dies


def test_a_router_killed_between_declare_and_discharge_commits_nothing(
    routers: RouterFleet, standard: BrokerProcess
) -> None:
    router = _router(routers, standard)
    fill(router, "jobs", ["j1", "j2"])
    held: list[tuple[tuple[int, int, int], tuple[int, int, int]]] = []

    class Both(TxReceiver):
        """Publishes three to `orders` and acquires two from `jobs`, in one transaction."""

        def opened(self, conn: Any) -> None:
            super().opened(conn)
            self.sender = self.container.create_sender(conn, "orders")
            self.answered = 0

        def declared(self, transaction: Transaction) -> None:
            super().declared(transaction)
            for body in ("x1", "x2", "x3"):
                transaction.send(self.sender, Message(body=body, durable=True))

        def on_settled(self, event: Any) -> None:
            if event.link.name == self.sender.name:
                self.answered += 1
                self.maybe_kill()

        def on_message(self, event: Any) -> None:
            super().on_message(event)
            self.maybe_kill()

        def maybe_kill(self) -> None:
            if self.answered == 3 and len(self.received) == 2 and not held:
                self.container.schedule(0.5, Later(self.kill))
                held.append(((-1, -1, -1), (-1, -1, -1)))

        def kill(self) -> None:
            held[0] = (listed(standard, "orders"), listed(standard, "jobs"))
            router.kill()  # SIGKILL, between the declare and the discharge
            self.conn.close()

    client = Both(router, address="jobs", count=2)
    run(client)
    assert client.received == ["j1", "j2"]
    # Never discharged: the client only saw the connection go
    assert [e for e in client.events if e != "transport error"] == ["declared"]
    assert held == [((0, 0, 0), (0, 2, 0))]  # both held by the transaction
    # The broker rolled it back: the published never appear, the acquired come back.
    wait_for(lambda: listed(standard, "jobs")[0] == 2, what="the acquired messages back")
    assert listed(standard, "orders") == (0, 0, 0)
    again = routers.restart("r1")
    again.apply(
        routers.mesh_config(
            generation=1,
            addresses={"orders": "queue", "jobs": "queue", "work": "anycast"},
            waypoints={
                "orders": [_waypoint("b1", standard)],
                "jobs": [_waypoint("b1", standard)],
            },
        )
    )
    assert drain(again, "jobs", expect=2) == ["j1", "j2"]
    assert drain(again, "orders", expect=0) == []


# ------------------------------------------------------------------ refusals


def test_a_transactional_send_to_an_anycast_address_is_refused_and_its_commit_rolls_back(
    routers: RouterFleet, standard: BrokerProcess
) -> None:
    router = _router(routers, standard)

    class Mixed(TxSender):
        """Sends `orders` one message, `work` (anycast) one, then tries to commit."""

        def opened(self, conn: Any) -> None:
            self.sender = self.container.create_sender(conn, None)  # anonymous relay

        def declared(self, transaction: Transaction) -> None:
            transaction.send(self.sender, Message(address="orders", body="kept?", durable=True))
            transaction.send(self.sender, Message(address="work", body="elsewhere"))

    client = Mixed(router, address="", bodies=["kept?", "elsewhere"])
    client.all_answered = lambda c: c.transaction.commit()  # type: ignore[union-attr]
    run(client)
    words = refusal("work", kind="anycast", broker="b1")
    assert words == (
        "a transaction cannot span brokers: address 'work' is anycast, not a queue or topic "
        "of broker 'b1', where this transaction is"
    )
    rejected = [answer for state, _, answer in client.answers if state == 0x25]
    assert rejected == [("amqp:not-implemented", words)]
    assert client.events == ["declared", "commit failed"]
    assert client.errors == [("amqp:transaction:rollback", rolled_back(words))]
    assert listed(standard, "orders") == (0, 0, 0)  # the other message went with the rollback


def test_a_transactional_acquisition_from_an_anycast_address_closes_that_consumer(
    routers: RouterFleet, standard: BrokerProcess
) -> None:
    """An anycast message accepted under a transaction: the consumer's link is closed with the
    words, and the message, not consumed, goes back to its producer RELEASED (no other
    consumer)."""
    router = _router(routers, standard)
    client = TxReceiver(router, address="work", count=1)
    producer_heard: list[Any] = []

    def produce() -> None:
        conn = BlockingConnection(url(router), timeout=10)
        try:
            try:
                conn.create_sender("work").send(Message(body="w1"))
                producer_heard.append("accepted")
            except SendException as error:
                producer_heard.append(error.state)
        finally:
            conn.close()

    producer = threading.Thread(target=produce, daemon=True)

    def declared(transaction: Transaction) -> None:
        client.receiver.flow(1)
        producer.start()

    client.declared = declared  # type: ignore[method-assign]
    run(client)
    producer.join(15)
    assert client.received == ["w1"]
    words = refusal("work", kind="anycast", broker="b1")
    assert client.errors == [("amqp:not-implemented", words)]
    assert producer_heard == [Delivery.RELEASED]


def test_each_transactional_send_is_held_to_the_users_send_rules(
    routers: RouterFleet, standard: BrokerProcess
) -> None:
    """alice may send to `orders` only: her coordinator needs no right, her transactional
    send to `jobs` on an anonymous link is refused with the usual words, and the commit of that
    transaction rolls back."""
    router = routers.start("r1", extra_args=("--client-auth=optional",))
    config = routers.mesh_config(
        generation=1,
        addresses={"orders": "queue", "jobs": "queue"},
        waypoints={"orders": [_waypoint("b1", standard)], "jobs": [_waypoint("b1", standard)]},
    )
    config.users.append(
        router_pb2.RouterUser(
            username="alice",
            password_hash=hash_password("alice-pw"),
            authorization=[router_pb2.RouterRule(addresses=["orders"], operations=["send"])],
        )
    )
    router.apply(config)

    class Relay(TxSender):
        def opened(self, conn: Any) -> None:
            self.sender = self.container.create_sender(conn, None)

        def declared(self, transaction: Transaction) -> None:
            for to in ("orders", "jobs"):
                transaction.send(self.sender, Message(address=to, body=to, durable=True))

    client = Relay(router, address="", bodies=["orders", "jobs"])
    client.login = ("alice", "alice-pw")
    client.all_answered = lambda c: c.transaction.commit()  # type: ignore[union-attr]
    run(client)
    refused = ("amqp:unauthorized-access", "user 'alice' may not send to 'jobs'")
    assert [answer for state, _, answer in client.answers if state == 0x25] == [refused]
    assert [state for state, _, _ in client.answers].count(0x34) == 1  # `orders` was taken
    assert client.events == ["declared", "commit failed"]
    assert client.errors == [("amqp:transaction:rollback", rolled_back(refused[1]))]
    assert listed(standard, "orders") == (0, 0, 0)
    assert listed(standard, "jobs") == (0, 0, 0)


def test_a_coordinator_is_refused_when_the_queues_are_on_two_brokers(
    routers: RouterFleet, broker_factory: BrokerFactory
) -> None:
    first, second = broker_factory("--routers-only"), broker_factory("--routers-only")
    first.ensure_queue("orders")
    second.ensure_queue("jobs")
    router = routers.start("r1")
    router.apply(
        routers.mesh_config(
            generation=1,
            addresses={"orders": "queue", "jobs": "queue"},
            waypoints={"orders": [_waypoint("b1", first)], "jobs": [_waypoint("b2", second)]},
        )
    )
    client = TxClient(router)
    run(client)
    assert client.events == []
    words = several_brokers("test", ["b1", "b2"])
    assert words == (
        "no transaction coordinator: space 'test' holds its queues and topics on brokers "
        "'b1', 'b2', and a transaction cannot span brokers"
    )
    assert client.errors == [("amqp:not-implemented", words)]


def test_a_coordinator_is_refused_in_a_space_without_queues(routers: RouterFleet) -> None:
    router = routers.start("r1")
    router.apply(routers.mesh_config(generation=1, addresses={"work": "anycast"}))
    client = TxClient(router)
    run(client)
    assert client.events == []
    assert client.errors == [("amqp:not-implemented", no_broker("test"))]


# ------------------------------------------------------------------ Proton's own examples


def test_protons_tx_send_and_tx_recv_examples_through_the_router(
    routers: RouterFleet, standard: BrokerProcess, tmp_path: Path
) -> None:
    """tx_send commits 100 messages in batches of 10; tx_recv takes them back in batches of
    10, each accepted in a transaction it commits (their own words are what is asserted)."""
    if not (EXAMPLES / "tx_send.py").is_file():
        pytest.skip("Qpid Proton's examples are not installed: libqpid-proton11-dev-examples")
    router = _router(routers, standard)
    address = f"{url(router)}/orders"

    def example(script: str) -> list[str]:
        done = subprocess.run(
            [sys.executable, str(EXAMPLES / script), "-a", address],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        assert done.returncode == 0, f"{script} exited {done.returncode}:\n{done.stderr}"
        return [line.strip() for line in done.stdout.splitlines()]

    assert example("tx_send.py") == ["all messages committed"]
    assert example("tx_recv.py") == [f"{{'sequence': {n}}}" for n in range(1, 101)]
    assert listed(standard, "orders") == (0, 100, 100)


def test_protons_tx_recv_interactive_example_through_the_router(
    routers: RouterFleet, standard: BrokerProcess, tmp_path: Path
) -> None:
    """Typed at as a user would (it settles each acquisition at once, settle_before_discharge):
    fetch two, abort (they go back), fetch the same two again, commit (gone)."""
    script = EXAMPLES / "tx_recv_interactive.py"
    if not script.is_file():
        pytest.skip("Qpid Proton's examples are not installed: libqpid-proton11-dev-examples")
    standard.ensure_queue("examples")
    router = routers.start("r1")
    router.apply(
        routers.mesh_config(
            generation=1,
            addresses={"examples": "queue"},
            waypoints={"examples": [_waypoint("b1", standard)]},
        )
    )
    (tmp_path / script.name).write_text(script.read_text().replace("localhost:5672", url(router)))
    fill(router, "examples", ["e1", "e2"])
    with running(tmp_path, script.name, stdin=True) as process:
        prompt = Prompt(process)
        prompt.expect("transaction declared")
        for command, answers in (
            ("fetch", ["e1"]),
            ("fetch", ["e2"]),
            ("abort", ["transaction aborted", "transaction declared"]),
            ("fetch", ["e1"]),
            ("fetch", ["e2"]),
            ("commit", ["transaction committed", "transaction declared"]),
        ):
            prompt.send(command)
            for answer in answers:
                prompt.expect(answer)
        prompt.send("quit")
        prompt.end()
        assert process.wait(timeout=60) == 0
    assert listed(standard, "examples")[0] == 0
    assert drain(router, "examples", expect=0) == []
