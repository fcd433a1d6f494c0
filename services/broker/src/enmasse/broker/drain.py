"""Drain: move every message of some queues and durable subscriptions to another broker, at least
once, including the deliveries consumers hold unsettled.

What flows in: the target broker's AMQP host and port, the queues to move (chosen by `select`:
queues, and the durable subscription queues of topics) and, when the target was prepared through
its BrokerAdmin (`PrepareDrain`, see inbox.py), the token that lets this connection send into
its subscription queues. What flows out: the messages, as the same bytes (with the header's
delivery-count set when they had been redelivered), on one sending link per queue to the SAME
address on the target: `orders` to `orders`, and `<topic>::<identity>` to the same subscription
there, so a durable subscriber that reattaches to the target finds everything that waited for it,
in order. The result is a future: (messages moved, queues drained).

The rules:
- A message is removed here (its journal record acknowledged) only when the target settled it
  ACCEPTED, which on a broker means "owned, and fsync'd if durable". Anything else (released,
  rejected, the link or connection lost) puts it back in its queue, in its place, and the drain
  stops with the reason. A crash between the target's accept and our ack duplicates, never loses.
- From the start, a drained queue gives its consumers nothing new (`Queue.hand_off`): every ready
  message, and every new arrival, goes to the drain. What consumers already hold unsettled is
  theirs to finish: accepted is gone; released / modified, or the consumer detached, puts it back
  ready, and it moves like the rest. The drain finishes only when the queues are empty AND no
  consumer holds anything of them, so nothing in flight is lost or skipped. The storage-controller
  drains a broker before removing it: its consumers are expected to move to the new broker, and
  a consumer that neither settles nor detaches holds the drain until the caller's deadline, which
  cancels it (everything not yet accepted by the target goes back, consumers are served again).
- Non-durable subscriptions do not move: they belong to one live link here and die with it;
  nobody could ever attach to them on the target.
- Failed attempts towards max-delivery-attempts are not carried: on the target a moved message
  starts with none (it may get more attempts, never fewer), while its delivery-count travels.

Why it is built so: losing a message is never acceptable, a duplicate is. The hand-off runs on
the broker's own engine with the target's credit as the window, so a drain of 50,000 messages
never holds more than one window in flight. Completion of deliveries consumers accept is not an
event the queue reports (that is the hot path, kept free of drain checks), so a short timer
watches for the last one.
"""

from __future__ import annotations

import concurrent.futures
from dataclasses import dataclass

import structlog
from enmasse.amqp import codec
from enmasse.amqp.engine import (
    Condition,
    Connection,
    ConnectionHandler,
    Delivery,
    Engine,
    Link,
    Outcome,
    Timer,
    Tls,
)
from enmasse.broker.broker import AddressError, Broker, NotFound, now_ms
from enmasse.broker.entry import Entry
from enmasse.broker.inbox import DRAIN_TOKEN_PROPERTY, InboxAddress
from enmasse.broker.queue import Queue

log = structlog.get_logger(__name__)

DrainResult = tuple[int, list[str]]
WATCH_SECONDS = 0.05  # how often a drain waiting on consumers' deliveries looks again


class DrainRefused(AddressError):
    """This drain cannot start as asked (FAILED_PRECONDITION)."""


class NeedsTargetAdmin(DrainRefused):
    """Moving subscriptions needs the target prepared through its BrokerAdmin."""


@dataclass
class Selection:
    """What one drain moves (`queues`) and what the target must hold for it (`inbox`)."""

    queues: list[Queue]
    inbox: list[InboxAddress]


def select(broker: Broker, names: list[str], *, with_topics: bool) -> Selection:
    """The queues and topics named (none: every queue, and every topic when `with_topics`).

    A topic moves its durable subscriptions. Raises NotFound for a name this broker does not
    have, NeedsTargetAdmin for a topic when the target cannot be prepared (no `target_admin`),
    DrainRefused for a queue another drain is moving.
    """
    if not names:
        names = sorted(broker.queues) + (sorted(broker.topics) if with_topics else [])
    unknown = [n for n in names if n not in broker.queues and n not in broker.topics]
    if unknown:
        raise NotFound(f"no queue or topic {', '.join(map(repr, unknown))} on this broker")
    selection = Selection(queues=[], inbox=[])
    for name in names:
        queue = broker.queues.get(name)
        if queue is not None:
            selection.queues.append(queue)
            selection.inbox.append(InboxAddress(name=name, kind="queue", plan=queue.plan))
            continue
        if not with_topics:
            raise NeedsTargetAdmin(
                f"{name!r} is a topic: moving its subscriptions needs target_admin "
                "(the target's BrokerAdmin host:port)"
            )
        topic = broker.topics[name]
        durable = [s for s in topic.subscriptions.values() if s.durable]
        selection.queues.extend(s.queue for s in durable)
        selection.inbox.append(
            InboxAddress(
                name=name,
                kind="topic",
                plan=topic.plan,
                subscriptions=tuple(s.identity for s in durable),
            )
        )
    busy = [q.name for q in selection.queues if q.hand_off is not None]
    if busy:
        raise DrainRefused(f"another drain is moving {', '.join(map(repr, busy))}")
    return selection


class Drain(ConnectionHandler):
    def __init__(
        self, *, engine: Engine, broker: Broker, queues: list[Queue], after_change: object
    ) -> None:
        self.engine = engine
        self.broker = broker
        self.queues = queues
        self.after_change = after_change  # schedules the journal commit of our acks
        self.result: concurrent.futures.Future[DrainResult] = concurrent.futures.Future()
        self.moved = 0
        self._links: dict[Queue, Link] = {}
        self._outstanding: dict[Link, int] = {}
        self._conn: Connection | None = None
        self._watch: Timer | None = None
        self._done = False

    @classmethod
    def start(
        cls,
        *,
        engine: Engine,
        broker: Broker,
        host: str,
        port: int,
        queues: list[Queue],
        token: str = "",
        after_change: object,
        tls: Tls | None = None,
    ) -> Drain:
        """(engine thread) Takes the queues over and dials the target; see `result`. tls: the
        target takes routers only (a standard space's broker): present our certificate."""
        drain = cls(engine=engine, broker=broker, queues=queues, after_change=after_change)
        if not queues:
            drain._done = True
            drain.result.set_result((0, []))
            return drain
        for queue in queues:
            queue.hand_off = drain._pump_queue
        properties = {DRAIN_TOKEN_PROPERTY: token} if token else None
        drain._conn = engine.connect(
            host=host, port=port, handler=drain, properties=properties, tls=tls
        )
        drain._watch = engine.call_later(WATCH_SECONDS, drain._look_again)
        return drain

    def cancel(self, why: str = "cancelled by the caller") -> None:
        """(engine thread) Stops: what the target did not accept goes back to its queue."""
        self._fail(why)

    # ------------------------------------------------------------------ engine events

    def on_connection_open(self, conn: Connection) -> None:
        for queue in self.queues:
            link = conn.open_sender(queue.name)
            link.context = queue
            self._links[queue] = link
            self._outstanding[link] = 0

    def on_link_credit(self, link: Link) -> None:
        self._pump(link)

    def on_outcome(self, link: Link, delivery: Delivery, outcome: Outcome) -> None:
        queue: Queue = link.context
        entry: Entry | None = delivery.context
        if entry is None:
            return  # given back already (we stopped): the queue has it again
        delivery.context = None
        self._outstanding[link] -= 1
        if outcome == Outcome.ACCEPTED:
            queue.finish_hand_off(entry)
            self.moved += 1
        else:
            queue.undo_hand_off(entry)
            self._fail(f"target settled a message of {queue.name!r} as {outcome.name}")
            return
        self.after_change()  # type: ignore[operator]
        self._pump(link)

    def on_link_detach(self, link: Link, *, closed: bool, error: Condition | None) -> None:
        self._give_back(link)
        if not self._done:
            why = str(error) if error else "link detached"
            self._fail(f"target refused {link.address!r}: {why}")

    def on_connection_close(self, conn: Connection, error: Condition | None) -> None:
        for link in list(self._outstanding):
            self._give_back(link)
        if not self._done:
            self._fail(f"connection to the target ended: {error or 'closed'}")

    # ------------------------------------------------------------------ moving

    def _pump_queue(self, queue: Queue) -> None:
        """The queue's dispatch while we own it: ready entries (new or given back) go to us."""
        link = self._links.get(queue)
        if link is not None:
            self._pump(link)

    def _pump(self, link: Link) -> None:
        credit = link.credit
        if self._done or credit <= 0 or not link.is_open:
            self._check_done()
            return
        queue: Queue = link.context
        for entry in queue.take_ready(credit):
            payload = entry.payload
            if entry.delivery_count:
                payload = codec.with_delivery_count(payload, entry.delivery_count)
            link.send(payload, context=entry)
            self._outstanding[link] += 1
        self._check_done()

    def _give_back(self, link: Link) -> None:
        queue: Queue = link.context
        for delivery in link.unsettled:
            if delivery.context is not None:
                queue.undo_hand_off(delivery.context)
                delivery.context = None  # once: it may be a consumer's again soon
        self._outstanding[link] = 0

    def _look_again(self) -> None:
        self._watch = None
        if self._done:
            return
        for link in self._links.values():
            self._pump(link)  # credit may have come while nothing else woke us
        self._check_done()
        if not self._done:
            self._watch = self.engine.call_later(WATCH_SECONDS, self._look_again)

    # ------------------------------------------------------------------ ending

    def _check_done(self) -> None:
        if self._done or self._conn is None or not self._links:
            return
        if any(self._outstanding.values()):
            return
        if any(q.depth or q.in_flight or q.dead_letters_held or q.scheduled for q in self.queues):
            return  # messages to move (held dead letters too), or consumers holding deliveries
        self._end()
        log.info("drain complete", moved=self.moved, queues=[q.name for q in self.queues])
        self.result.set_result((self.moved, [q.name for q in self.queues]))

    def _fail(self, why: str) -> None:
        if self._done:
            return
        self._end()
        log.warning("drain stopped", moved=self.moved, reason=why)
        self.result.set_exception(RuntimeError(f"{why} (moved {self.moved} before that)"))

    def _end(self) -> None:
        self._done = True
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        if self._conn is not None:
            for link in list(self._outstanding):
                self._give_back(link)
            self._conn.close()
        now = now_ms()
        for queue in self.queues:
            if queue.hand_off == self._pump_queue:
                queue.hand_off = None
                queue.dispatch(now)  # consumers are served again (what went back, new arrivals)
        self.after_change()  # type: ignore[operator]
