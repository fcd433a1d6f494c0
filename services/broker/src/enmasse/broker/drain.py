"""Drain: move every ready message of some queues to another broker, at least once.

What flows in: the target broker's AMQP host and port and the queue names (from BrokerAdmin's
`Drain`, posted onto the engine thread). What flows out: the messages, as the same bytes, on one
sending link per queue to the same address on the target; a message is removed here (and its
journal record acknowledged) only when the target settled it ACCEPTED, which on a broker means
"owned, and fsync'd if durable". Anything else (released, rejected, the connection lost) puts the
message back in its queue, in its place. The result is a future: (messages moved, queues drained).

Why it is built so: it is the storage-controller's tool to empty a broker before removing it
(DESIGN §3), so losing a message is never acceptable and a duplicate (target accepted, our ack
lost in a crash) is. The hand-off runs on the broker's own engine, with the target's credit as the
window, so a drain of 50,000 messages never holds more than one window in flight.
"""

from __future__ import annotations

import concurrent.futures

import structlog
from enmasse.broker.broker import Broker
from enmasse.broker.entry import Entry
from enmasse.broker.queue import Queue
from enmasse.common.amqp.engine import (
    Condition,
    Connection,
    ConnectionHandler,
    Delivery,
    Engine,
    Link,
    Outcome,
)

log = structlog.get_logger(__name__)

DrainResult = tuple[int, list[str]]


class Drain(ConnectionHandler):
    def __init__(self, *, broker: Broker, queues: list[Queue], after_change: object) -> None:
        self.broker = broker
        self.queues = queues
        self.after_change = after_change  # schedules the journal commit of our acks
        self.result: concurrent.futures.Future[DrainResult] = concurrent.futures.Future()
        self.moved = 0
        self._outstanding: dict[Link, int] = {}
        self._conn: Connection | None = None
        self._done = False

    @classmethod
    def start(
        cls,
        *,
        engine: Engine,
        broker: Broker,
        host: str,
        port: int,
        names: list[str],
        after_change: object,
    ) -> concurrent.futures.Future[DrainResult]:
        queues = [broker.queues[n] for n in (names or sorted(broker.queues))]
        drain = cls(broker=broker, queues=queues, after_change=after_change)
        if not queues:
            drain.result.set_result((0, []))
            return drain.result
        drain._conn = engine.connect(host=host, port=port, handler=drain)
        return drain.result

    def on_connection_open(self, conn: Connection) -> None:
        for queue in self.queues:
            link = conn.open_sender(queue.name)
            link.context = queue
            self._outstanding[link] = 0

    def on_link_credit(self, link: Link) -> None:
        queue: Queue = link.context
        credit = link.credit
        if credit <= 0 or self._done:
            return
        for entry in queue.take_ready(credit):
            link.send(entry.payload, context=entry)
            self._outstanding[link] += 1
        self._check_done()

    def on_outcome(self, link: Link, delivery: Delivery, outcome: Outcome) -> None:
        queue: Queue = link.context
        entry: Entry = delivery.context
        self._outstanding[link] -= 1
        if outcome == Outcome.ACCEPTED:
            queue.finish_hand_off(entry)
            self.moved += 1
        else:
            queue.undo_hand_off(entry)
            self._fail(f"target settled a message of {queue.name!r} as {outcome.name}")
            return
        self.after_change()  # type: ignore[operator]
        if link.credit > 0:
            self.on_link_credit(link)
        self._check_done()

    def on_link_detach(self, link: Link, *, closed: bool, error: Condition | None) -> None:
        self._give_back(link)
        if not self._done:
            why = str(error) if error else "link detached"
            self._fail(f"target refused queue {link.address!r}: {why}")

    def on_connection_close(self, conn: Connection, error: Condition | None) -> None:
        for link in list(self._outstanding):
            self._give_back(link)
        if not self._done:
            self._fail(f"connection to the target ended: {error or 'closed'}")

    def _give_back(self, link: Link) -> None:
        queue: Queue = link.context
        for delivery in link.unsettled:
            queue.undo_hand_off(delivery.context)
        self._outstanding[link] = 0

    def _check_done(self) -> None:
        if self._done:
            return
        if any(self._outstanding.values()) or any(q.depth for q in self.queues):
            return
        self._done = True
        log.info("drain complete", moved=self.moved, queues=[q.name for q in self.queues])
        self.result.set_result((self.moved, [q.name for q in self.queues]))
        if self._conn is not None:
            self._conn.close()

    def _fail(self, why: str) -> None:
        if self._done:
            return
        self._done = True
        log.warning("drain stopped", moved=self.moved, reason=why)
        self.result.set_exception(RuntimeError(f"{why} (moved {self.moved} before that)"))
        if self._conn is not None:
            self._conn.close()
