"""Transactions through a standard space's routers: a client's `$coordinator` link routed to the
broker that holds the space's queues and topics, like a link route.

What flows in: a client's attach of a sender whose target is a Coordinator (AMQP 1.0 §4.5.1,
Qpid Proton's `Container.declare_transaction`), the control messages on it (Declare,
Discharge), and on the same connection the transfers that carry TransactionalState{txn-id} and
the consumers' transactional dispositions. What flows out: a connection of the router's own to
that broker for each client coordinator (its "transaction connection"), with a coordinator link
that carries the client's Declares and Discharges as they are and brings back the broker's
answers (Declared{txn-id}, accepted, rejected) as the client's outcomes; a sender link per
address on it that carries the client's transactional transfers with their TransactionalState
(the broker answers TransactionalState{txn-id, Accepted}); and, on the consumer's usual feed from
that broker, the client's TransactionalState{txn-id, outcome} for the message it acquires.

The rule (which broker): a coordinator has no address, so the router picks the broker when the
client attaches it. When every store-and-forward address the router knows for the space (queue,
topic, subscription) sits on ONE broker, the coordinator goes there. With none, or with several
brokers, the attach is refused with amqp:not-implemented and words that say why (`no_broker`,
`several_brokers`): binding to the broker of the first transactional delivery would let a
transaction's first message decide silently, and a client could not know before it sends.
Then, per transactional delivery, its address must be a queue or topic on that broker (and
Active there); anything else (an anycast or multicast address, a reply address, an address on
another broker) is refused alone, with words naming the address and saying that a transaction
cannot span brokers (`refusal`): a transfer is REJECTED with amqp:not-implemented, a consumer's
transactional disposition closes that consumer's link with the same condition. And that
transaction can then only roll back: its commit is turned into a rollback at the broker and
answered REJECTED with amqp:transaction:rollback and the first refusal's words. Why so: a
client library hands a rejected transfer's condition to the application as it is (Proton: the
delivery's remote condition in `on_rejected`), and not-implemented says what is true (a
transaction across brokers is not served) where rollback would name an outcome the transaction
has not had yet; amqp:transaction:rollback on the discharge is the error AMQP 1.0 §4.5.9 gives a
commit that could not be done, which clients report as a failed commit (Proton:
`on_transaction_commit_failed`), so an application that did not look at each send still never
sees part of a transaction committed. While a broker drains (two brokers in the configuration)
a new coordinator is refused the same way.

Why it is built so:
- Ownership: the broker's transactions belong to the connection that declared them and roll
  back when it or its coordinator link ends; one transaction connection per client coordinator
  keeps that true per client (one client's coordinator that goes never rolls back another's),
  and a router that dies takes its transaction connections with it, so the broker rolls back
  everything open: never a partial commit.
- Acquisition goes on the consumer's feed (the router's shared connection, where the message was
  delivered); a routers-only broker lets it join the transaction of the router's transaction
  connection (`handler.BrokerConnection._routed_coordination`), because the router checked here
  that the client declared that txn-id on its own coordinator.
- The hot path pays nothing: a connection that never attached a coordinator has its handler's
  message event go straight to the router, as before; one that did gets `message` in front
  (installed at the coordinator's attach, as the broker does), which reads each transfer's state
  once. Transactional dispositions are an engine event of their own.
- Authorization: a coordinator link needs no address rights; each transactional transfer is held
  to the user's send rules (a named link's at attach, an anonymous sender's per `to`, here) and a
  consumer to its recv rules at attach, as any other.
- Credit: a transactional transfer's credit goes back to its link when the broker answered it, so
  a client has at most its window of them in flight.
- Order: a Discharge goes to the broker only after the transaction's transfers were answered
  (a sender link opened for a new address may still wait for credit while the coordinator link
  has some) and, where acquisitions went on another connection (a feed), after a `Barrier` on
  that connection came back: frames on one connection are handled in order, so the broker holds
  every acquisition before it sees the Discharge.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

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
    Terminus,
)
from enmasse.amqp.wire import DECLARED, TRANSACTIONAL_STATE
from enmasse.resources.authorization import SEND
from enmasse.resources.contracts import dynamic_owner
from enmasse.resources.permissions import Permissions
from enmasse.router.addressing import UnknownAddress, resolve
from enmasse.router.config import RouterConfig
from enmasse.router.points import LinkState
from enmasse.router.waypoints import BROKER_CONTAINER_ID, BrokerLinks
from proton import Described, Message, symbol, ulong

log = structlog.get_logger("enmasse.router")

NOT_IMPLEMENTED = "amqp:not-implemented"
UNKNOWN_ID = "amqp:transaction:unknown-id"
ROLLBACK = "amqp:transaction:rollback"
CONTROL_CREDIT = 100  # Declares and Discharges a client may have in flight on one coordinator
DISCHARGE = ("amqp:discharge:list", 0x32)
LOCAL_TRANSACTIONS = "amqp:local-transactions"


def no_broker(space: str) -> str:
    return (
        f"no transaction coordinator: space '{space}' has no queue or topic, and a transaction "
        "through a standard space's routers is served by the broker that holds them"
    )


def several_brokers(space: str, brokers: list[str]) -> str:
    named = ", ".join(f"'{b}'" for b in brokers)
    return (
        f"no transaction coordinator: space '{space}' holds its queues and topics on brokers "
        f"{named}, and a transaction cannot span brokers"
    )


def refusal(address: str, *, kind: str, broker: str) -> str:
    """Why a transactional delivery for `address` (of kind `kind`) is refused."""
    if kind in ("queue", "topic", "subscription"):
        where = f"address '{address}' is not on broker '{broker}'"
    else:
        where = f"address '{address}' is {kind}, not a queue or topic of broker '{broker}'"
    return f"a transaction cannot span brokers: {where}, where this transaction is"


def rolled_back(reason: str) -> str:
    return f"transaction rolled back: {reason}"


class TransactionsCore(Protocol):
    """What the coordinators need of the forwarding core (`forwarding.Router`)."""

    engine: Engine
    idle_timeout: float | None
    config: RouterConfig
    broker_links: BrokerLinks

    def outcome(self, link: Link, delivery: Delivery, outcome: Outcome) -> None: ...


class ClientCoordinator:
    """A client's coordinator link's context."""

    __slots__ = ("route",)

    def __init__(self, route: TransactionRoute) -> None:
        self.route = route


@dataclass(eq=False)
class Control:
    """A Declare or Discharge on its way to the broker: the client's delivery it answers."""

    client: Delivery
    txn_id: bytes | None = None  # a Discharge's
    rollback: str | None = None  # a commit turned into a rollback: why (answered REJECTED)


@dataclass(eq=False)
class Carried:
    """A client's transactional transfer on its way to the broker."""

    client: Delivery
    txn_id: bytes


@dataclass(eq=False)
class Barrier:
    """A receiver attached with no source on a connection that carried a transaction's
    acquisitions: the broker refuses it at once, and its answer comes after everything sent
    before it on that connection, so once it is back the broker holds those acquisitions."""

    route: TransactionRoute
    txn_id: bytes


@dataclass(eq=False)
class TransactionRoute:
    """One client coordinator, routed to one broker over a connection of its own."""

    broker: str
    client: Link
    connection: Connection | None = None
    coordinator: Link | None = None
    senders: dict[str, Link] = field(default_factory=dict)  # by address, on `connection`
    declared: set[bytes] = field(default_factory=set)  # open, as the broker answered
    doomed: dict[bytes, str] = field(default_factory=dict)  # txn-id -> why it must roll back
    # What a Discharge waits for, so that the broker has all of the transaction before it:
    in_flight: dict[bytes, int] = field(default_factory=dict)  # transfers not yet answered
    acquired_on: dict[bytes, set[Connection]] = field(default_factory=dict)  # feeds' connections
    barriers: dict[bytes, int] = field(default_factory=dict)  # barriers not yet answered
    held: dict[bytes, tuple[Control, bytes]] = field(default_factory=dict)  # waiting Discharge
    ended: bool = False

    def sender(self, address: str) -> Link:
        link = self.senders.get(address)
        if link is None or not link.is_open:
            assert self.connection is not None
            link = self.connection.open_sender(address, name=f"txn/{address}")
            self.senders[address] = link
        return link

    def doom(self, txn_id: bytes, reason: str) -> None:
        self.doomed.setdefault(txn_id, rolled_back(reason))


class RoutedTransactions:
    """The router's transaction coordinators (one `TransactionRoute` per client coordinator)."""

    def __init__(self, router: TransactionsCore) -> None:
        self.router = router

    # ------------------------------------------------------------------ attach / detach

    def attach(self, link: Link) -> None:
        """A client attached a coordinator: routed to the space's one broker, or refused."""
        config = self.router.config
        brokers = config.brokers()
        if len(brokers) != 1:
            text = (
                no_broker(config.space)
                if not brokers
                else several_brokers(config.space, sorted(brokers))
            )
            link.refuse(Condition(NOT_IMPLEMENTED, text))
            return
        ((name, waypoint),) = brokers.items()
        route = TransactionRoute(broker=name, client=link)
        route.connection = self.router.engine.connect(
            host=waypoint.host,
            port=waypoint.port,
            handler=TransactionConnection(self, route),
            container_id=BROKER_CONTAINER_ID,
            idle_timeout=self.router.idle_timeout,
            tls=self.router.broker_links.tls,
        )
        route.coordinator = route.connection.open_sender(
            None,
            name=f"txn/{link.connection.container_id}/{link.name}",
            target=Terminus(coordinator=True, capabilities=(LOCAL_TRANSACTIONS,)),
        )
        link.context = ClientCoordinator(route)
        link.accept()
        link.flow(CONTROL_CREDIT)
        self._install(link.connection)
        log.debug("coordinator routed", broker=name, link=link.name)

    def _install(self, conn: Connection) -> None:
        """From now on this connection's messages pass `message` first (once per connection)."""
        handler = conn.handler
        plain: Callable[[Link, Delivery], None] = handler.on_message
        if isinstance(plain, functools.partial) and plain.func == self.message:
            return
        handler.on_message = functools.partial(self.message, plain=plain)  # type: ignore[method-assign]

    def detach(self, link: Link) -> None:
        """The client's coordinator went (or its connection): the broker rolls back what is
        open, as our transaction connection closes."""
        context = link.context
        if isinstance(context, ClientCoordinator):
            self._end(context.route)

    def _end(self, route: TransactionRoute) -> None:
        route.ended = True
        route.declared.clear()
        if route.connection is not None:
            route.connection.close()

    # ------------------------------------------------------------------ messages in

    def message(
        self, link: Link, delivery: Delivery, *, plain: Callable[[Link, Delivery], None]
    ) -> None:
        """A transfer on a connection with a coordinator: control, transactional, or plain."""
        context = link.context
        if type(context) is ClientCoordinator:
            self._control(context.route, delivery)
            return
        state, fields = delivery.remote_state()
        if state != TRANSACTIONAL_STATE or not isinstance(context, LinkState):
            plain(link, delivery)
            return
        txn_id = _txn_id(fields)
        route = _route_for(link.connection, txn_id)
        if route is None or txn_id is None:
            delivery.settle(
                Outcome.REJECTED,
                error=Condition(UNKNOWN_ID, "no such transaction is open on this connection"),
            )
            link.flow(1)
            return
        address, why = self._destination(route, link, context, delivery)
        if address is None:
            assert why is not None
            delivery.settle(Outcome.REJECTED, error=why)
            route.doom(txn_id, why.description)
            link.flow(1)
            return
        sent = route.sender(address).send(delivery.payload, context=Carried(delivery, txn_id))
        sent.give_state(TRANSACTIONAL_STATE, [txn_id])
        route.in_flight[txn_id] = route.in_flight.get(txn_id, 0) + 1

    def _control(self, route: TransactionRoute, delivery: Delivery) -> None:
        route.client.flow(1)  # each control message is answered: keep the window as it was
        if route.ended or route.coordinator is None:
            delivery.settle(Outcome.REJECTED, error=Condition(ROLLBACK, "coordinator closing"))
            return
        txn_id = _discharged_id(delivery.payload)  # control messages are few: decoded
        control = Control(client=delivery, txn_id=txn_id)
        payload = delivery.payload
        if txn_id is not None and txn_id in route.doomed:
            # A commit of a transaction a refused delivery doomed: rolled back at the broker.
            control.rollback = route.doomed[txn_id]
            body = Described(symbol("amqp:discharge:list"), [txn_id, True])
            payload = Message(body=body).encode()
        if txn_id is None:
            route.coordinator.send(payload, context=control)
            return
        # A Discharge goes to the broker only after what the client did before it under that
        # transaction: its transfers answered (a new sender link may still wait for credit
        # while the coordinator has some), its acquisitions, passed on on other connections,
        # confirmed by a barrier on each.
        route.held[txn_id] = (control, payload)
        for conn in route.acquired_on.pop(txn_id, ()):
            if conn.closed:
                continue
            barrier = conn.open_receiver(None, name=f"txn-barrier/{id(control):x}")
            barrier.context = Barrier(route, txn_id)
            route.barriers[txn_id] = route.barriers.get(txn_id, 0) + 1
        self._discharge_when_ready(route, txn_id)

    def _discharge_when_ready(self, route: TransactionRoute, txn_id: bytes) -> None:
        if route.in_flight.get(txn_id) or route.barriers.get(txn_id):
            return
        waiting = route.held.pop(txn_id, None)
        if waiting is None:
            return
        control, payload = waiting
        if route.ended or route.coordinator is None or not route.coordinator.is_open:
            control.client.settle(
                Outcome.REJECTED, error=Condition(ROLLBACK, "the coordinator is closing")
            )
            return
        route.coordinator.send(payload, context=control)

    def barrier_answered(self, link: Link) -> None:
        """The broker answered (refused) a barrier: what came before it on its connection is
        done (`Barrier`)."""
        barrier = link.context
        if not isinstance(barrier, Barrier):
            return
        link.context = None
        route, txn_id = barrier.route, barrier.txn_id
        left = route.barriers.get(txn_id, 0) - 1
        if left > 0:
            route.barriers[txn_id] = left
        else:
            route.barriers.pop(txn_id, None)
        self._discharge_when_ready(route, txn_id)

    def _destination(
        self, route: TransactionRoute, link: Link, state: LinkState, delivery: Delivery
    ) -> tuple[str | None, Condition | None]:
        """Where a transactional transfer goes on the route's broker, or why it may not."""
        point = state.point
        if point is not None:
            address, kind, route_of = point.address, point.kind, point.resolution.route
        else:
            try:
                to = delivery.to
            except codec.CodecError as error:
                return None, Condition(
                    "amqp:decode-error", f"cannot read the message's 'to': {error}"
                )
            if not to:
                return None, Condition(
                    "amqp:precondition-failed",
                    "a message on an anonymous link needs a 'to' address",
                )
            permissions: Permissions = link.connection.context.permissions
            if dynamic_owner(to) is None and not permissions.may(SEND, to):
                return None, Condition("amqp:unauthorized-access", permissions.refusal(SEND, to))
            try:
                resolution = resolve(to, config=self.router.config)
            except UnknownAddress as error:
                return None, Condition("amqp:not-found", str(error))
            if resolution.refuses_producers is not None:
                return None, Condition("amqp:not-allowed", resolution.refuses_producers)
            address, kind, route_of = to, resolution.kind, resolution.route
        active = {w.broker for w in route_of.active_waypoints} if route_of is not None else set()
        if kind not in ("queue", "topic") or route.broker not in active:
            return None, Condition(
                NOT_IMPLEMENTED, refusal(address, kind=kind, broker=route.broker)
            )
        return address, None

    # ------------------------------------------------------------------ consumers

    def disposition(
        self, link: Link, delivery: Delivery, *, txn_id: bytes | None, outcome: Outcome
    ) -> None:
        """A client consumer settled `delivery` under a transaction: passed on to the broker's
        delivery on the feed, under the same txn-id (the broker holds it until the discharge)."""
        carried = delivery.context
        if not isinstance(carried, Delivery) or carried.settled:
            return  # a repeat (the client settles after the discharge), or nothing to carry
        route = _route_for(link.connection, txn_id)
        if route is None:
            if not _has_coordinator(link.connection):
                if delivery.settled:  # as without transactions: ended without an outcome
                    self.router.outcome(link, delivery, Outcome.NONE)
                return
            link.close(Condition(UNKNOWN_ID, "no such transaction is open on this connection"))
            return
        assert txn_id is not None
        state = link.context
        feed = carried.link.context
        point = state.point if isinstance(state, LinkState) else None
        broker = feed.router if isinstance(feed, LinkState) and feed.consumer is link else None
        if point is None or broker != route.broker:
            address = point.address if point is not None else (link.address or "")
            kind = point.kind if point is not None else "unknown"
            if point is not None and point.waypoint:
                kind = "queue"  # a waypoint on another broker
            why = Condition(NOT_IMPLEMENTED, refusal(address, kind=kind, broker=route.broker))
            route.doom(txn_id, why.description)
            link.close(why)
            return
        carried.settle_with_state(TRANSACTIONAL_STATE, [txn_id, Described(ulong(int(outcome)), [])])
        route.acquired_on.setdefault(txn_id, set()).add(carried.link.connection)

    # ------------------------------------------------------------------ the broker's side

    def answered(self, route: TransactionRoute, sent: Delivery, outcome: Outcome) -> None:
        """The broker settled what we sent on the transaction connection."""
        context = sent.context
        if isinstance(context, Control):
            self._control_answered(route, context, sent, outcome)
            return
        if isinstance(context, Carried):
            _settle_like(context.client, sent, outcome)
            _give_credit(context.client)
            self._answered(route, context.txn_id)

    def _answered(self, route: TransactionRoute, txn_id: bytes) -> None:
        left = route.in_flight.get(txn_id, 0) - 1
        if left > 0:
            route.in_flight[txn_id] = left
        else:
            route.in_flight.pop(txn_id, None)
        self._discharge_when_ready(route, txn_id)

    def _control_answered(
        self, route: TransactionRoute, control: Control, sent: Delivery, outcome: Outcome
    ) -> None:
        client = control.client
        fields = sent.state_fields
        if fields is not None:  # Declared{txn-id}
            txn_id = _txn_id(fields)
            if txn_id is not None and not route.ended:
                route.declared.add(txn_id)
            client.settle_with_state(DECLARED, list(fields))
            return
        if control.txn_id is not None:
            route.declared.discard(control.txn_id)
            route.doomed.pop(control.txn_id, None)
        if control.rollback is not None and outcome is Outcome.ACCEPTED:
            client.settle(Outcome.REJECTED, error=Condition(ROLLBACK, control.rollback))
            return
        _settle_like(client, sent, outcome)

    def transactional_answer(
        self, route: TransactionRoute, sent: Delivery, *, txn_id: bytes | None, outcome: Outcome
    ) -> None:
        """The broker took a transactional transfer under `txn_id`: the client hears the same."""
        carried = sent.context
        if not isinstance(carried, Carried):
            return
        fields = [txn_id or carried.txn_id, Described(ulong(int(outcome)), [])]
        carried.client.settle_with_state(TRANSACTIONAL_STATE, fields)
        _give_credit(carried.client)
        self._answered(route, carried.txn_id)

    def link_lost(self, route: TransactionRoute, link: Link, error: Condition | None) -> None:
        """A link of the transaction connection ended: what it carried ends in a rollback."""
        reason = (
            f"broker '{route.broker}' ended the link: {error.description or error.name}"
            if error is not None
            else f"the router's connection to broker '{route.broker}' ended"
        )
        for txn_id in list(route.declared):
            route.doom(txn_id, reason)
        for sent in list(link.unsettled):
            context = sent.context
            client = context.client if isinstance(context, Control | Carried) else None
            if client is not None and not client.settled:
                client.settle(Outcome.REJECTED, error=Condition(ROLLBACK, rolled_back(reason)))
                _give_credit(client)
            if isinstance(context, Carried):
                self._answered(route, context.txn_id)
        if link is route.coordinator and not route.ended:
            route.ended = True
            route.declared.clear()
            route.client.close(Condition(ROLLBACK, rolled_back(reason)))

    def connection_lost(self, route: TransactionRoute, error: Condition | None) -> None:
        if route.ended:
            return
        reason = f"the router's connection to broker '{route.broker}' was lost"
        if error is not None:
            reason += f" ({error.description or error.name})"
        route.ended = True
        route.declared.clear()
        route.client.close(Condition(ROLLBACK, rolled_back(reason)))


class TransactionConnection(ConnectionHandler):
    """The engine handler of one transaction connection (router -> broker)."""

    def __init__(self, transactions: RoutedTransactions, route: TransactionRoute) -> None:
        self.transactions = transactions
        self.route = route

    def on_connection_close(self, conn: Connection, error: Condition | None) -> None:
        self.transactions.connection_lost(self.route, error)

    def on_link_attach(self, link: Link) -> None:
        link.refuse(Condition("amqp:not-allowed", "a router takes no links from a broker"))

    def on_link_detach(self, link: Link, *, closed: bool, error: Condition | None) -> None:
        self.transactions.link_lost(self.route, link, error)

    def on_outcome(self, link: Link, delivery: Delivery, outcome: Outcome) -> None:
        self.transactions.answered(self.route, delivery, outcome)

    def on_transactional_outcome(
        self, link: Link, delivery: Delivery, *, txn_id: bytes | None, outcome: Outcome
    ) -> None:
        self.transactions.transactional_answer(self.route, delivery, txn_id=txn_id, outcome=outcome)


def _route_for(conn: Connection, txn_id: bytes | None) -> TransactionRoute | None:
    """The route of the client coordinator on `conn` that declared `txn_id` (a rare path: a
    connection holds few links that carry transactions)."""
    if txn_id is None:
        return None
    for link in conn.links:
        context = link.context
        if type(context) is ClientCoordinator and txn_id in context.route.declared:
            return context.route
    return None


def _has_coordinator(conn: Connection) -> bool:
    return any(type(link.context) is ClientCoordinator for link in conn.links)


def _settle_like(client: Delivery, sent: Delivery, outcome: Outcome) -> None:
    if outcome is Outcome.NONE:
        client.settle(Outcome.RELEASED)
    else:
        client.settle(
            outcome,
            error=sent.error,
            delivery_failed=sent.delivery_failed,
            undeliverable_here=sent.undeliverable_here,
        )


def _give_credit(client: Delivery) -> None:
    """A transactional transfer was answered: its link's credit comes back."""
    link = client.link
    if link.is_open and isinstance(link.context, LinkState):
        link.flow(1)


def _txn_id(fields: Any) -> bytes | None:
    value = fields[0] if isinstance(fields, list) and fields else None
    return bytes(value) if isinstance(value, bytes | memoryview) else None


def _discharged_id(payload: bytes) -> bytes | None:
    """A Discharge's txn-id (None for a Declare or anything else); control messages are few,
    so they are decoded with proton's Message."""
    message = Message()
    try:
        message.decode(payload)
    except Exception:  # proton raises its own exception types for bad bytes
        return None
    body = message.body
    if not isinstance(body, Described) or not isinstance(body.value, list):
        return None
    descriptor = body.descriptor
    key: str | int = int(descriptor) if isinstance(descriptor, int) else str(descriptor)
    if key not in DISCHARGE:
        return None
    return _txn_id(body.value)
