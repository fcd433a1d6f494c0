"""Transactions suite: transactional publish in batches of 100 beside plain durable publish on
`enmasse-broker`, and what RabbitMQ's AMQP 1.0 plugin answers to a transaction. Figures, never
assertions.

What flows in: `python -m bench transactions [--quick] [--record]`. What flows out: one table
(msgs/s per mode) and, when RabbitMQ is installed, a note with its answer to a Declare.

What is measured: one Qpid Proton reactor client (proton's own `Container.declare_transaction`
and `Transaction.send`, as the tx_send example uses them), 100 B durable messages to a
persistent queue. "plain durable": every message sent unsettled, at most 1,000 in flight (the
broker's credit), each settled by the broker after its group commit. "transactional, batches
of 100": declare, send 100 under the transaction, commit, wait for the commit's answer (the
broker fsyncs the transaction's one journal record first), declare the next: one batch in
flight at a time, as tx_send.py does. Rate = messages / wall time from the first send to the
last settlement or commit. The client runs in this process, the broker in its own.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from proton import Message
from proton.handlers import MessagingHandler, TransactionHandler
from proton.reactor import Container

from bench.harness import Context, Table, suite
from bench.peers.rabbitmq import PASSWORD, USER, rabbitmq
from tests.fixtures.broker import BrokerProcess

BATCH = 100
BODY = "x" * 100


class Publisher(MessagingHandler, TransactionHandler):  # type: ignore[misc]
    """Sends `total` durable messages, plain (batch=0) or in transactions of `batch`."""

    def __init__(self, url: str, address: str, *, total: int, batch: int) -> None:
        super().__init__()
        self.url, self.address, self.total, self.batch = url, address, total, batch
        self.sent = self.done = 0
        self.in_batch = 0
        self.transaction: Any = None
        self.started = self.finished_at = 0.0
        self.error: str | None = None

    def on_start(self, event: Any) -> None:
        self.container = event.container
        self.conn = self.container.connect(self.url, reconnect=False)
        self.sender = self.container.create_sender(self.conn, self.address)
        self.started = time.monotonic()
        if self.batch:
            self.container.declare_transaction(self.conn, handler=self)

    def on_sendable(self, event: Any) -> None:
        if not self.batch:
            while self.sender.credit and self.sent < self.total:
                self.sender.send(Message(body=BODY, durable=True))
                self.sent += 1
        else:
            self._send_batch()

    def on_accepted(self, event: Any) -> None:
        if not self.batch:
            self.done += 1
            if self.done == self.total:
                self._finish()

    def on_rejected(self, event: Any) -> None:
        self.error = str(event.delivery.remote.condition)
        self.conn.close()

    def on_transaction_declared(self, event: Any) -> None:
        self.transaction = event.transaction
        self.in_batch = 0
        self._send_batch()

    def _send_batch(self) -> None:
        txn = self.transaction
        while txn is not None and self.sender.credit and self.in_batch < self.batch:
            txn.send(self.sender, Message(body=BODY, durable=True))
            self.in_batch += 1
            self.sent += 1
            if self.in_batch == self.batch or self.sent == self.total:
                self.transaction = None
                txn.commit()
                return

    def on_transaction_committed(self, event: Any) -> None:
        self.done = self.sent
        if self.done >= self.total:
            self._finish()
        else:
            self.container.declare_transaction(self.conn, handler=self)

    def on_transaction_commit_failed(self, event: Any) -> None:
        self.error = "commit failed"
        self.conn.close()

    def on_transaction_declare_failed(self, event: Any) -> None:
        self.error = "declare failed"
        self.conn.close()

    def _finish(self) -> None:
        self.finished_at = time.monotonic()
        self.conn.close()

    @property
    def rate(self) -> float:
        elapsed = self.finished_at - self.started
        return self.done / elapsed if self.finished_at and elapsed > 0 else 0.0


def publish(url: str, address: str, *, total: int, batch: int) -> Publisher:
    publisher = Publisher(url, address, total=total, batch=batch)
    thread = threading.Thread(target=Container(publisher).run, daemon=True)
    thread.start()
    thread.join(600)
    if thread.is_alive():
        publisher.error = "did not finish in 600 s"
    return publisher


@contextlib.contextmanager
def enmasse_broker() -> Iterator[BrokerProcess]:
    with tempfile.TemporaryDirectory(prefix="bench-tx-") as tmp:
        broker = BrokerProcess(workdir=Path(tmp), args=["--memory-limit=2000000000"])
        broker.start()
        try:
            yield broker
        finally:
            broker.stop()


class CoordinatorProbe(MessagingHandler):  # type: ignore[misc]
    """Attaches a coordinator and sends a Declare: what does the peer answer?"""

    def __init__(self, url: str) -> None:
        super().__init__()
        self.url = url
        self.answer = "no answer in 20 s"

    def on_start(self, event: Any) -> None:
        self.conn = event.container.connect(
            self.url,
            reconnect=False,
            user=USER,
            password=PASSWORD,
            allow_insecure_mechs=True,
            allowed_mechs="PLAIN",
        )
        event.container.declare_transaction(self.conn, handler=self)

    def on_transaction_declared(self, event: Any) -> None:
        self.answer = "declared"
        self.conn.close()

    def on_transaction_declare_failed(self, event: Any) -> None:
        self.answer = f"declare failed: {event.delivery.remote.condition}"
        self.conn.close()

    def on_link_error(self, event: Any) -> None:
        self.answer = f"coordinator link refused: {event.link.remote_condition}"
        self.conn.close()

    def on_session_error(self, event: Any) -> None:
        self.answer = f"session ended: {event.session.remote_condition}"
        self.conn.close()

    def on_transport_error(self, event: Any) -> None:
        self.answer = f"connection closed: {event.transport.condition}"


def probe(url: str) -> str:
    prober = CoordinatorProbe(url)
    thread = threading.Thread(target=Container(prober).run, daemon=True)
    thread.start()
    thread.join(20)
    return prober.answer


@suite("transactions", "transactional publish (batches of 100) vs plain durable publish")
def transactions_suite(ctx: Context) -> Iterator[Table]:
    total = ctx.messages(20_000)
    table = Table(
        f"durable publish, 100 B, 1 proton client, {total} messages",
        ["broker", "mode", "messages", "msgs/s", "error"],
    )
    with enmasse_broker() as broker:
        url = f"127.0.0.1:{broker.amqp_port}"
        for mode, address, batch in (
            ("plain durable (1000 in flight)", "tx-plain", 0),
            (f"transactional, batches of {BATCH}", "tx-batch", BATCH),
        ):
            broker.ensure_queue(address)
            done = publish(url, address, total=total, batch=batch)
            table.add("enmasse-broker", mode, done.done, round(done.rate), done.error or "")
    if shutil.which("rabbitmq-server"):
        with rabbitmq() as node:
            answer = probe(f"{node.host}:{node.port}")
        table.notes.append(f"RabbitMQ (AMQP 1.0 plugin) to a coordinator and Declare: {answer}")
    yield table
