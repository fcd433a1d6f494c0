"""The AMQP side of transactions: a coordinator link's Declare and Discharge, and transfers and
dispositions that carry a transactional state, mapped onto `Transactions` (transactions.py).

What flows in (from handler.py, only on a connection that attached a coordinator): every
message of that connection first (`takes`): a control message on the coordinator link, or a
transfer whose state is TransactionalState{txn-id}; and consumers' transactional dispositions
(`acquire`). What flows out: the answers, as Qpid Proton's client side (`Container.
declare_transaction`, `Transaction`) expects them: a Declare is settled with the delivery state
Declared{txn-id} (`amqp:declared:list`, a binary id); a Discharge{txn-id, fail} is settled
ACCEPTED once the commit is on disk (or at once for a rollback), or REJECTED with
`amqp:transaction:unknown-id` / `amqp:transaction:rollback`; a transactional transfer is
settled TransactionalState{txn-id, Accepted} (held until commit), or REJECTED with unknown-id.
A disposition naming an unknown transaction closes the consumer's link with unknown-id: a
disposition has no answer of its own.

Why it is built so: the per-message path of every connection without a coordinator is
untouched (handler.py installs `takes` in front of its message path at the first coordinator
attach, the way a drain's or a relay's path is installed); control messages are few, so they
are decoded with proton's Message (the rest of the broker never decodes a body).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import structlog
from enmasse.amqp.engine import Condition, Delivery, Link, Outcome
from enmasse.amqp.wire import DECLARED, TRANSACTIONAL_STATE
from enmasse.broker.queue import Consumer, Queue, Settlement
from enmasse.broker.transactions import TransactionError, Transactions
from proton import Described, Message, ulong

log = structlog.get_logger(__name__)

DECLARE = ("amqp:declare:list", 0x31)
DISCHARGE = ("amqp:discharge:list", 0x32)
CONTROL_CREDIT = 100  # Declares and Discharges a client may have in flight on one coordinator
NOT_IMPLEMENTED = "amqp:not-implemented"
DECODE_ERROR = "amqp:decode-error"

_OUTCOME_OF = {
    Settlement.ACCEPTED: Outcome.ACCEPTED,
    Settlement.REJECTED: Outcome.REJECTED,
    Settlement.RELEASED: Outcome.RELEASED,
    Settlement.MODIFIED: Outcome.MODIFIED,
    Settlement.FAILED: Outcome.MODIFIED,
}


class CoordinatorLink:
    """A coordinator link's context: the transactions come from its connection."""

    __slots__ = ("link",)

    def __init__(self, link: Link) -> None:
        self.link = link


class Coordination:
    """One connection's transactional side (it owns the transactions it declares)."""

    def __init__(
        self,
        *,
        transactions: Transactions,
        owner: object,
        schedule_commit: Callable[[], None],
    ) -> None:
        self.transactions = transactions
        self.owner = owner
        self._schedule_commit = schedule_commit

    def attach(self, link: Link) -> None:
        link.context = CoordinatorLink(link)
        link.accept()
        link.flow(CONTROL_CREDIT)
        log.debug("coordinator attached", link=link.name)

    # ------------------------------------------------------------------ messages

    def takes(self, link: Link, delivery: Delivery, *, publish: Callable[..., None] | None) -> bool:
        """Handles the delivery if it is transactional (True); False: the plain path takes it.
        `publish(txn_id, delivery)` holds a transactional message of a producer link (None:
        the link is not a producer of one address)."""
        if type(link.context) is CoordinatorLink:
            self._control(link, delivery)
            return True
        state, fields = delivery.remote_state()
        if state != TRANSACTIONAL_STATE:
            return False
        txn_id = _txn_id(fields[0] if isinstance(fields, list) and fields else None)
        if publish is None:
            delivery.settle(
                Outcome.REJECTED,
                error=Condition(NOT_IMPLEMENTED, "a transactional send needs a target address"),
            )
            return True
        try:
            publish(txn_id, delivery)
        except TransactionError as error:
            delivery.settle(Outcome.REJECTED, error=Condition(error.condition, str(error)))
            return True
        delivery.settle_with_state(
            TRANSACTIONAL_STATE, [txn_id, Described(ulong(Outcome.ACCEPTED), [])]
        )
        return True

    def _control(self, link: Link, delivery: Delivery) -> None:
        link.flow(1)  # each control message is answered: keep the window as it was
        try:
            body = _control_body(delivery.payload)
        except ValueError as error:
            delivery.settle(Outcome.REJECTED, error=Condition(DECODE_ERROR, str(error)))
            return
        descriptor, fields = body
        if descriptor in DECLARE:
            txn = self.transactions.declare(owner=self.owner)
            delivery.settle_with_state(DECLARED, [txn.id])
            log.debug("transaction declared", txn=txn.id)
        elif descriptor in DISCHARGE:
            self._discharge(delivery, fields)
        else:
            delivery.settle(
                Outcome.REJECTED,
                error=Condition(NOT_IMPLEMENTED, f"unknown coordinator message {descriptor!r}"),
            )

    def _discharge(self, delivery: Delivery, fields: list[Any]) -> None:
        txn_id = _txn_id(fields[0] if fields else None)
        fail = bool(fields[1]) if len(fields) > 1 else False
        try:
            done = self.transactions.discharge(
                txn_id, owner=self.owner, fail=fail, on_done=delivery.settle
            )
        except TransactionError as error:
            delivery.settle(Outcome.REJECTED, error=Condition(error.condition, str(error)))
            self._schedule_commit()
            return
        if done:
            delivery.settle()
        self._schedule_commit()  # the commit's record, or the acks a rollback dead-lettered
        log.debug("transaction discharged", txn=txn_id, fail=fail, answered=done)

    # ------------------------------------------------------------------ consumers

    def acquire(
        self,
        link: Link,
        delivery: Delivery,
        *,
        txn_id: bytes | None,
        queue: Queue,
        consumer: Consumer,
        settlement: Settlement,
    ) -> None:
        """A consumer settled `delivery` under a transaction: held for its discharge."""
        try:
            self.transactions.acquire(
                txn_id,
                owner=self.owner,
                queue=queue,
                consumer=consumer,
                entry=delivery.context,
                settlement=settlement,
                settle_delivery=lambda s: delivery.settle_sent(_OUTCOME_OF[s]),
            )
        except TransactionError as error:
            link.close(Condition(error.condition, str(error)))

    def end(self) -> int:
        """The coordinator link or the connection closed: open transactions roll back."""
        return self.transactions.end_owner(self.owner)


def _txn_id(value: Any) -> bytes | None:
    return bytes(value) if isinstance(value, bytes | memoryview) else None


def _control_body(payload: bytes) -> tuple[str | int, list[Any]]:
    """A control message's body: (descriptor, fields) of its described list."""
    message = Message()
    try:
        message.decode(payload)
    except Exception as error:  # proton raises its own exception types for bad bytes
        raise ValueError(f"undecodable coordinator message: {error}") from error
    body = message.body
    if not isinstance(body, Described) or not isinstance(body.value, list):
        raise ValueError("a coordinator message's body is a described list (Declare, Discharge)")
    descriptor = body.descriptor
    key: str | int = int(descriptor) if isinstance(descriptor, int) else str(descriptor)
    return key, body.value
