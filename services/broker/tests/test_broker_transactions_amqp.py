"""Transactions on a real broker process with Qpid Proton's own client side (`Container.
declare_transaction`, `TransactionHandler`, what the tx_send / tx_recv examples use), run in a
thread with a bounded time: commit and rollback of sends and of acquisitions, a SIGKILL between
declare and discharge (all or nothing after the restart), and an unknown txn-id refused."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from proton import Delivery, Described, Message, Terminus, symbol
from proton.handlers import MessagingHandler, TransactionHandler
from proton.reactor import Container, Transaction
from proton.utils import BlockingConnection

from tests.fixtures.broker import BrokerProcess

RUN_SECONDS = 30.0


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


def url(broker: BrokerProcess) -> str:
    return f"127.0.0.1:{broker.amqp_port}"


def fill(broker: BrokerProcess, address: str, bodies: list[str], *, durable: bool = True) -> None:
    conn = BlockingConnection(url(broker), timeout=10)
    try:
        sender = conn.create_sender(address)
        for body in bodies:
            sender.send(Message(body=body, durable=durable))
    finally:
        conn.close()


def drain(broker: BrokerProcess, address: str, *, expect: int) -> list[Message]:
    """Receives `expect` messages (accepting them), then checks nothing more is there."""
    conn = BlockingConnection(url(broker), timeout=10)
    try:
        receiver = conn.create_receiver(address, credit=expect + 1)
        got = []
        for _ in range(expect):
            got.append(receiver.receive(timeout=10))
            receiver.accept()
        return got
    finally:
        conn.close()


def depth(broker: BrokerProcess, address: str) -> int:
    return broker.addresses()[address].depth


class TxClient(MessagingHandler, TransactionHandler):  # type: ignore[misc]
    """Connects, declares a transaction, then runs `script(self, transaction)`; what happens
    next is up to the test's callbacks (`then_*`)."""

    def __init__(self, broker: BrokerProcess, *, prefetch: int = 0) -> None:
        super().__init__(prefetch=prefetch, auto_accept=False)
        self.broker = broker
        self.container: Any = None
        self.conn: Any = None
        self.transaction: Transaction | None = None
        self.events: list[str] = []
        self.sent: list[Any] = []
        self.received: list[Any] = []

    def on_start(self, event: Any) -> None:
        self.container = event.container
        self.conn = self.container.connect(url(self.broker), reconnect=False)
        self.opened(self.conn)
        self.container.declare_transaction(self.conn, handler=self)

    def opened(self, conn: Any) -> None:
        """Links to open before the declare."""

    def on_transaction_declared(self, event: Any) -> None:
        self.transaction = event.transaction
        self.events.append("declared")
        self.declared(event.transaction)

    def declared(self, transaction: Transaction) -> None:
        """What to do under the transaction."""

    def on_transaction_committed(self, event: Any) -> None:
        self.events.append("committed")
        self.finished()

    def on_transaction_aborted(self, event: Any) -> None:
        self.events.append("aborted")
        self.finished()

    def on_transaction_commit_failed(self, event: Any) -> None:
        self.events.append("commit failed")
        self.conn.close()

    def on_transaction_declare_failed(self, event: Any) -> None:
        self.events.append("declare failed")
        self.conn.close()

    def finished(self) -> None:
        self.conn.close()

    def on_transport_error(self, event: Any) -> None:
        self.events.append("transport error")


class TxSender(TxClient):
    """Sends `bodies` under the transaction; once every one was answered, `all_answered`."""

    def __init__(self, broker: BrokerProcess, *, address: str, bodies: list[str]) -> None:
        super().__init__(broker)
        self.address = address
        self.bodies = bodies
        self.sender: Any = None
        self.answers: list[tuple[int, Any]] = []
        self.all_answered: Callable[[TxSender], None] = lambda client: None

    def opened(self, conn: Any) -> None:
        self.sender = self.container.create_sender(conn, self.address)

    def declared(self, transaction: Transaction) -> None:
        for body in self.bodies:
            self.sent.append(transaction.send(self.sender, Message(body=body, durable=True)))

    def on_settled(self, event: Any) -> None:
        if event.link.name != self.sender.name:
            return  # the coordinator's
        delivery = event.delivery
        self.answers.append((delivery.remote_state, delivery.remote.data))
        if len(self.answers) == len(self.bodies):
            self.all_answered(self)


class TxReceiver(TxClient):
    """Takes `count` messages and accepts them under the transaction; then `all_accepted`."""

    def __init__(self, broker: BrokerProcess, *, address: str, count: int) -> None:
        super().__init__(broker)
        self.address = address
        self.count = count
        self.receiver: Any = None
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


def test_committed_sends_are_visible_only_after_the_commit(broker: BrokerProcess) -> None:
    broker.ensure_queue("orders")
    client = TxSender(broker, address="orders", bodies=["a", "b", "c"])
    depth_before_commit: list[int] = []

    def answered(c: TxSender) -> None:
        depth_before_commit.append(depth(broker, "orders"))
        assert c.transaction is not None
        c.transaction.commit()

    client.all_answered = answered
    run(client)
    assert client.events == ["declared", "committed"]
    assert depth_before_commit == [0]
    # Each send was answered TransactionalState{txn-id, Accepted}
    assert {state for state, _ in client.answers} == {0x34}
    assert client.transaction is not None
    txn_id: Any = client.transaction.id
    for _, data in client.answers:
        assert bytes(data[0]) == bytes(txn_id)
        assert data[1] == Described(0x24, [])
    assert [m.body for m in drain(broker, "orders", expect=3)] == ["a", "b", "c"]
    assert depth(broker, "orders") == 0


def test_sends_under_a_transaction_on_an_anonymous_relay_link(broker: BrokerProcess) -> None:
    """As Qpid Proton's server_tx.py replies: a link with no target, each message's `to`."""
    broker.ensure_queue("orders")

    class RelaySender(TxSender):
        def opened(self, conn: Any) -> None:
            self.sender = self.container.create_sender(conn, None)

        def declared(self, transaction: Transaction) -> None:
            for body in self.bodies:
                message = Message(address="orders", body=body, durable=True)
                self.sent.append(transaction.send(self.sender, message))

    client = RelaySender(broker, address="", bodies=["r1", "r2"])
    depth_before_commit: list[int] = []

    def answered(c: TxSender) -> None:
        depth_before_commit.append(depth(broker, "orders"))
        assert c.transaction is not None
        c.transaction.commit()

    client.all_answered = answered
    run(client)
    assert client.events == ["declared", "committed"]
    assert {state for state, _ in client.answers} == {0x34}
    assert depth_before_commit == [0]
    assert [m.body for m in drain(broker, "orders", expect=2)] == ["r1", "r2"]


def test_rolled_back_sends_are_never_visible(broker: BrokerProcess) -> None:
    broker.ensure_queue("orders")
    client = TxSender(broker, address="orders", bodies=["a", "b"])
    client.all_answered = lambda c: c.transaction.abort()  # type: ignore[union-attr]
    run(client)
    assert client.events == ["declared", "aborted"]
    listed = broker.addresses()["orders"]
    assert (listed.depth, listed.enqueued) == (0, 0)


def test_acquired_messages_are_held_then_gone_at_commit(broker: BrokerProcess) -> None:
    broker.ensure_queue("jobs")
    fill(broker, "jobs", ["j1", "j2", "j3"])
    client = TxReceiver(broker, address="jobs", count=3)
    before_commit: list[tuple[int, int]] = []

    def accepted(c: TxReceiver) -> None:
        # Let the transactional dispositions reach the broker before looking.
        c.container.schedule(0.5, _Later(lambda: look_then_commit(c)))

    def look_then_commit(c: TxReceiver) -> None:
        listed = broker.addresses()["jobs"]
        before_commit.append((listed.depth, listed.dequeued))
        assert c.transaction is not None
        c.transaction.commit()

    client.all_accepted = accepted
    run(client)
    assert client.received == ["j1", "j2", "j3"]
    assert client.events == ["declared", "committed"]
    assert before_commit == [(0, 0)]  # acquired, not yet consumed, not redelivered
    listed = broker.addresses()["jobs"]
    assert (listed.depth, listed.dequeued, listed.bytes) == (0, 3, 0)


def test_rollback_gives_acquired_messages_back_with_delivery_count_unchanged(
    broker: BrokerProcess,
) -> None:
    broker.ensure_queue("jobs")
    fill(broker, "jobs", ["j1", "j2"])
    client = TxReceiver(broker, address="jobs", count=2)

    def accepted(c: TxReceiver) -> None:
        assert c.transaction is not None
        c.transaction.abort()

    client.all_accepted = accepted
    run(client)
    assert client.events == ["declared", "aborted"]
    again = drain(broker, "jobs", expect=2)
    assert [m.body for m in again] == ["j1", "j2"]
    assert [m.delivery_count for m in again] == [0, 0]


def test_unknown_txn_id_is_rejected_for_a_discharge_and_a_send(broker: BrokerProcess) -> None:
    broker.ensure_queue("orders")

    class Stranger(MessagingHandler):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__(auto_settle=True)
            self.outcomes: dict[str, tuple[int, str | None, str | None]] = {}
            self.sent: dict[str, str] = {}  # link name -> what was sent on it

        def on_start(self, event: Any) -> None:
            self.conn = event.container.connect(url(broker), reconnect=False)
            self.coordinator = event.container.create_sender(self.conn, None, name="txn-ctrl")
            self.coordinator.target.type = Terminus.COORDINATOR
            self.coordinator.target.capabilities.put_object(symbol("amqp:local-transactions"))
            self.orders = event.container.create_sender(self.conn, "orders")

        def on_sendable(self, event: Any) -> None:
            name = event.link.name
            if name == self.coordinator.name and "discharge" not in self.sent.values():
                body = Described(symbol("amqp:discharge:list"), [b"nope", False])
                self.coordinator.send(Message(body=body))
                self.sent[name] = "discharge"
            if name == self.orders.name and "send" not in self.sent.values():
                delivery = self.orders.send(Message(body="x"))
                delivery.local.data = [b"nope"]
                delivery.update(0x34)
                self.sent[name] = "send"

        def on_settled(self, event: Any) -> None:
            delivery = event.delivery
            condition = delivery.remote.condition
            self.outcomes[self.sent[event.link.name]] = (
                delivery.remote_state,
                condition.name if condition else None,
                condition.description if condition else None,
            )
            if len(self.outcomes) == 2:
                self.conn.close()

    client = Stranger()
    run(client)
    for what in ("discharge", "send"):
        state, name, description = client.outcomes[what]
        assert (state, name) == (Delivery.REJECTED, "amqp:transaction:unknown-id")
        assert description is not None
        assert "'nope'" in description
    assert depth(broker, "orders") == 0


@pytest.mark.parametrize("discharged", [False, True], ids=["killed-before", "killed-after"])
def test_sigkill_commits_all_or_nothing(broker: BrokerProcess, discharged: bool) -> None:
    """A transaction that published 3 durable messages and acquired 2: SIGKILL between the
    declare and the discharge loses all of it; SIGKILL after the commit was accepted keeps it."""
    broker.ensure_queue("ledger")
    fill(broker, "ledger", ["old-1", "old-2"])

    class Both(TxSender):
        def opened(self, conn: Any) -> None:
            super().opened(conn)
            self.receiver = self.container.create_receiver(conn, "ledger")

        def declared(self, transaction: Transaction) -> None:
            super().declared(transaction)
            self.receiver.flow(2)

        def on_message(self, event: Any) -> None:
            assert self.transaction is not None
            self.received.append(event.message.body)
            self.transaction.accept(event.delivery)
            self.maybe_done()

        def on_settled(self, event: Any) -> None:
            super().on_settled(event)
            self.maybe_done()

        def maybe_done(self) -> None:
            if len(self.received) == 2 and len(self.answers) == 3 and not self.events[1:]:
                self.events.append("all done")
                # the last accept's disposition must be on the broker before the discharge
                self.container.schedule(0.5, _Later(self.discharge_or_kill))

        def discharge_or_kill(self) -> None:
            assert self.transaction is not None
            if discharged:
                self.transaction.commit()
            else:
                crash(self)

        def finished(self) -> None:
            crash(self)  # the commit was answered: now the crash

    def crash(client: TxClient) -> None:
        client.events.append("killed")
        broker.kill()
        client.conn.close()

    client = Both(broker, address="ledger", bodies=["new-1", "new-2", "new-3"])
    run(client)
    assert client.received == ["old-1", "old-2"]
    expected_events = ["declared", "all done"]
    expected_events += ["committed", "killed"] if discharged else ["killed"]
    assert [e for e in client.events if e != "transport error"] == expected_events
    broker.start()
    if discharged:
        bodies = [m.body for m in drain(broker, "ledger", expect=3)]
        assert bodies == ["new-1", "new-2", "new-3"]
    else:
        bodies = [m.body for m in drain(broker, "ledger", expect=2)]
        assert bodies == ["old-1", "old-2"]
    assert depth(broker, "ledger") == 0


def test_a_closed_connection_rolls_its_open_transaction_back(broker: BrokerProcess) -> None:
    broker.ensure_queue("jobs")
    fill(broker, "jobs", ["j1"])
    client = TxReceiver(broker, address="jobs", count=1)

    def accepted(c: TxReceiver) -> None:
        c.container.schedule(0.3, _Later(c.conn.close))  # no discharge

    client.all_accepted = accepted
    run(client)
    assert client.received == ["j1"]
    again = drain(broker, "jobs", expect=1)
    assert [m.body for m in again] == ["j1"]
    listed = broker.addresses()["jobs"]
    assert (listed.depth, listed.dequeued) == (0, 1)  # the dequeue is the drain's


def test_a_closed_coordinator_link_rolls_back_while_the_connection_stays(
    broker: BrokerProcess,
) -> None:
    broker.ensure_queue("jobs")
    fill(broker, "jobs", ["j1"])
    client = TxReceiver(broker, address="jobs", count=1)
    seen_elsewhere: list[Any] = []

    def accepted(c: TxReceiver) -> None:
        c.container.schedule(0.3, _Later(lambda: c.conn._txn_ctrl.close()))
        c.container.schedule(1.0, _Later(lambda: look_elsewhere(c)))

    def look_elsewhere(c: TxReceiver) -> None:
        # The message was acquired on this still open connection: only the rollback frees it.
        seen_elsewhere.extend(m.body for m in drain(broker, "jobs", expect=1))
        c.conn.close()

    client.all_accepted = accepted
    run(client)
    assert client.received == ["j1"]
    assert seen_elsewhere == ["j1"]


EXAMPLES = Path(os.environ.get("PROTON_EXAMPLES", "/usr/share/proton/examples/python"))


@pytest.mark.skipif(
    not (EXAMPLES / "tx_send.py").exists(),
    reason="Qpid Proton's python examples (libqpid-proton11-dev-examples) are not installed; "
    "PROTON_EXAMPLES names their directory",
)
def test_qpid_proton_tx_send_and_tx_recv_examples(broker: BrokerProcess) -> None:
    broker.ensure_queue("examples")
    address = f"{url(broker)}/examples"
    sent = subprocess.run(
        [sys.executable, str(EXAMPLES / "tx_send.py"), "-a", address, "-m", "30", "-b", "10"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert sent.stdout.strip() == "all messages committed", sent.stderr
    assert depth(broker, "examples") == 30
    received = subprocess.run(
        [sys.executable, str(EXAMPLES / "tx_recv.py"), "-a", address, "-m", "30", "-b", "10"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    expected = [f"{{'sequence': {n}}}" for n in range(1, 31)]
    assert received.stdout.split("\n")[:-1] == expected, received.stderr
    listed = broker.addresses()["examples"]
    assert (listed.depth, listed.dequeued) == (0, 30)


class _Later:
    """A proton timer task calling `fn`."""

    def __init__(self, fn: Callable[[], None]) -> None:
        self.fn = fn

    def on_timer_task(self, event: Any) -> None:
        self.fn()
