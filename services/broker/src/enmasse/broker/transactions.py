"""Local transactions (AMQP 1.0 §4): work that counts all together at commit, or not at all.

What flows in, from the AMQP side (handler.py maps the coordinator link and transactional
transfers and dispositions onto these calls): `declare` (a Declare on a coordinator link), the
work of a transaction as it is done (`publish`: a message sent under it; `acquire`: a message a
consumer settled under it, with the outcome it gave), `discharge` (commit or roll back), and the
ends that roll back whatever is still open (`consumer_gone`, `end_owner`: a coordinator link or
a connection closed). What flows out: calls on the `Broker` domain at commit (`Broker.publish`
for each message, `Queue.settle` for each acquisition) or rollback (`Queue.settle` RELEASED),
each acquisition's `settle_delivery` (tells the consumer's peer how its delivery ended), and
`TransactionError`s in AMQP terms (`amqp:transaction:unknown-id`, `amqp:transaction:rollback`).

Why it is built so:
- Nothing a transaction does touches a queue or the journal before its discharge. A message
  published under it waits here (its bytes count against the broker's memory budget, so a
  producer in a long transaction still meets the memory limit); a message acquired under it
  stays in flight with its consumer (not redelivered to anyone), exactly as an unsettled one.
  So a crash before the discharge loses the whole transaction: nothing of it was written, the
  acquired messages come back from the journal as they were, the published ones never existed.
- A commit does all its work inside `Journal.atomic()`: the ENQUEUE records of its durable
  messages and the ACK records of its durable acquisitions are ONE journal record under one
  checksum, so a crash during the write recovers all of it or none. The discharge is answered
  (`on_done`) only after that record's group commit fsync'd it; without a journal at once.
- What can no longer be done makes the commit fail as a rollback, before anything is applied:
  an address deleted since a message was sent to it, a consumer gone with a message it
  acquired under the transaction (its queue took the message back when it left). Half a
  commit is never applied.
- A rollback puts every acquired message back (released: the delivery-count is unchanged) and
  settles its delivery RELEASED, so a consumer's later outcome for it goes nowhere.
- A transaction belongs to the connection that declared it (`owner`): another connection that
  names its id gets unknown-id, as does any id never declared or already discharged.
No network here: tests drive it with a `Broker` and plain consumers.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field

from enmasse.broker.broker import Broker, now_ms
from enmasse.broker.entry import DEFAULT_PRIORITY, Entry
from enmasse.broker.queue import RELEASED, Consumer, Queue, Settlement

UNKNOWN_ID = "amqp:transaction:unknown-id"
ROLLBACK = "amqp:transaction:rollback"


class TransactionError(Exception):
    """A refused transactional request: `condition` is the AMQP error condition's name."""

    def __init__(self, condition: str, description: str) -> None:
        super().__init__(description)
        self.condition = condition


@dataclass(slots=True)
class Publish:
    """A message sent under a transaction, as `Broker.publish` will take it at commit."""

    address: str
    payload: bytes
    durable: bool
    ttl_ms: int | None
    absolute_expiry_ms: int | None
    priority: int


@dataclass(slots=True)
class Acquisition:
    """A message a consumer settled under a transaction: the settlement waits for the commit."""

    queue: Queue
    consumer: Consumer
    entry: Entry
    settlement: Settlement
    settle_delivery: Callable[[Settlement], None]


@dataclass(eq=False)
class Transaction:
    id: bytes
    owner: object
    publishes: list[Publish] = field(default_factory=list)
    acquisitions: list[Acquisition] = field(default_factory=list)
    doomed: str | None = None  # why a commit can only roll back
    held_bytes: int = 0  # published payload bytes counted against the memory budget


class Transactions:
    """The broker's transaction coordinator: open transactions by id, and their discharge."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.open: dict[bytes, Transaction] = {}
        self._numbers = itertools.count(1)
        self.committed = 0
        self.rolled_back = 0

    def declare(self, *, owner: object) -> Transaction:
        txn_id = b"txn:%d" % next(self._numbers)
        txn = self.open[txn_id] = Transaction(txn_id, owner)
        return txn

    def find(self, txn_id: bytes | None, *, owner: object) -> Transaction:
        txn = self.open.get(txn_id) if txn_id is not None else None
        if txn is None or txn.owner is not owner:
            shown = txn_id.decode(errors="replace") if txn_id is not None else None
            raise TransactionError(
                UNKNOWN_ID,
                f"no open transaction {shown!r} on this connection (never declared, "
                "already discharged, or declared by another connection)",
            )
        return txn

    # ------------------------------------------------------------------ the work

    def publish(
        self,
        txn_id: bytes | None,
        *,
        owner: object,
        address: str,
        payload: bytes,
        durable: bool = False,
        ttl_ms: int | None = None,
        absolute_expiry_ms: int | None = None,
        priority: int = DEFAULT_PRIORITY,
    ) -> None:
        """Holds a message for the commit: no queue sees it before then."""
        txn = self.find(txn_id, owner=owner)
        txn.publishes.append(
            Publish(address, payload, durable, ttl_ms, absolute_expiry_ms, priority)
        )
        txn.held_bytes += len(payload)
        self.broker.budget.used += len(payload)

    def acquire(
        self,
        txn_id: bytes | None,
        *,
        owner: object,
        queue: Queue,
        consumer: Consumer,
        entry: Entry,
        settlement: Settlement,
        settle_delivery: Callable[[Settlement], None],
    ) -> None:
        """A consumer's outcome for an entry it holds, applied at commit; until then the entry
        stays in flight with that consumer."""
        txn = self.find(txn_id, owner=owner)
        txn.acquisitions.append(Acquisition(queue, consumer, entry, settlement, settle_delivery))

    def consumer_gone(self, consumer: Consumer) -> None:
        """The consumer left: its queue took back what it held, so no transaction that acquired
        from it can commit that any more."""
        for txn in self.open.values():
            kept = [a for a in txn.acquisitions if a.consumer is not consumer]
            if len(kept) != len(txn.acquisitions):
                txn.acquisitions = kept
                txn.doomed = txn.doomed or (
                    "a consumer link that acquired messages under the transaction detached "
                    "before the discharge: its messages went back to their queue"
                )

    # ------------------------------------------------------------------ discharge

    def discharge(
        self, txn_id: bytes | None, *, owner: object, fail: bool, on_done: Callable[[], None]
    ) -> bool:
        """Commits (fail=False) or rolls back the transaction. True: done, answer now. False:
        `on_done` is called once the commit's journal record is fsync'd (the caller schedules
        the group commit). A commit that cannot be done is rolled back and raises
        TransactionError(amqp:transaction:rollback)."""
        txn = self.find(txn_id, owner=owner)
        del self.open[txn.id]
        self._unhold(txn)
        if fail:
            self._roll_back(txn)
            return True
        problem = txn.doomed or self._missing_address(txn)
        if problem is not None:
            self._roll_back(txn)
            raise TransactionError(ROLLBACK, f"the transaction was rolled back: {problem}")
        return self._commit(txn, on_done)

    def end_owner(self, owner: object) -> int:
        """The owner's coordinator link or connection closed: its open transactions roll back."""
        ended = [txn for txn in self.open.values() if txn.owner is owner]
        for txn in ended:
            del self.open[txn.id]
            self._unhold(txn)
            self._roll_back(txn)
        return len(ended)

    def _missing_address(self, txn: Transaction) -> str | None:
        broker = self.broker
        for publish in txn.publishes:
            address = publish.address
            if broker.find_queue(address) is None and address not in broker.topics:
                return f"no queue or topic {address!r} on this broker any more"
        return None

    def _commit(self, txn: Transaction, on_done: Callable[[], None]) -> bool:
        broker = self.broker
        journal = broker.journal
        touched: set[Queue] = set()
        with journal.atomic() if journal is not None else nullcontext():
            for p in txn.publishes:
                broker.publish(
                    p.address,
                    payload=p.payload,
                    durable=p.durable,
                    ttl_ms=p.ttl_ms,
                    absolute_expiry_ms=p.absolute_expiry_ms,
                    priority=p.priority,
                )
            for a in txn.acquisitions:
                a.queue.settle(a.consumer, a.entry, a.settlement)
                a.settle_delivery(a.settlement)
                touched.add(a.queue)
        self.committed += 1
        _dispatch(touched)  # outcomes other than accepted may have put some back
        if journal is None:
            return True
        journal.after_commit(on_done)
        return False

    def _roll_back(self, txn: Transaction) -> None:
        touched: set[Queue] = set()
        for a in txn.acquisitions:
            a.queue.settle(a.consumer, a.entry, RELEASED)
            a.settle_delivery(RELEASED)
            touched.add(a.queue)
        self.rolled_back += 1
        _dispatch(touched)

    def _unhold(self, txn: Transaction) -> None:
        self.broker.budget.used -= txn.held_bytes
        txn.held_bytes = 0
        self.broker.wake_if_room()


def _dispatch(queues: set[Queue]) -> None:
    now = now_ms()
    for queue in queues:
        queue.dispatch(now)
