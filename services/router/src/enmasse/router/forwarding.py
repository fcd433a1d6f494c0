"""The router's forwarding core: every delivery that enters leaves by the right link, and every
outcome finds its way back.

What flows in: engine events, handed over by the thin handlers in `handlers.py` (a client attached
a producer or consumer link, a delivery arrived, an outcome or credit came back, a link or a
connection went away), and configurations, already validated `RouterConfig` values (RouterAdmin's
protobuf is `admin.py`'s business, as are the stats it reads off the state here). What flows out:
sends on links (raw payload bytes, never decoded), settlements and credit. The router's two other
sides are parts of it: `MeshLinks` (`inter_router.py`: neighbours, adverts, links towards other
routers) and `BrokerLinks` (`waypoints.py`: broker connections, sender links, consumer feeds); they
see this core through `core.ForwardingCore`, and get the engine handlers of the connections they
dial from the factory main hands in (`ConnectionHandlers`), so no module of the router imports one
that imports it back. The state all three share is in `points.py`.

How a delivery travels, per address kind:
- anycast (and dynamic reply addresses): to ONE target, chosen by `Balancer` (least outstanding,
  then round robin) among local consumer links and one link per other router that has consumers
  (the link towards that router's next hop, target `_mesh/to/<router>/<address>`; intermediate
  routers pass it on towards `<router>`, which delivers to its own consumers only: no loops). The
  copy is sent unsettled when the producer's was, with the producer's delivery as its `context`;
  the outcome that comes back settles it. When a target link goes away, what it still carried is
  re-routed (another target exists) or settled RELEASED.
- multicast: a pre-settled copy to every local consumer (bounded `CopyQueue` each, drops counted)
  and to the neighbours the shortest-path tree rooted at the origin router names
  (`_mesh/mc/<origin>/<address>`); the router settles the producer's delivery ACCEPTED.
- queue, topic, subscription (waypoints): producers' deliveries go to one Active broker holding
  the address, balanced like anycast; the broker's outcome settles the producer's. Consumers
  attach here; the router attaches a receiver per broker holding the address (named after the
  client's container id and link name, with the client's source terminus, so durable
  subscriptions stay the broker's) and passes on the consumer's credit and, back, the consumer's
  outcomes.

Producers get credit only while the address has somewhere to go (a reachable consumer for anycast,
an attached Active broker for waypoints); deliveries that find every target without credit wait in
the address's pending queue, bounded by the credit the producers were given.

A transaction coordinator attach (`$coordinator`: it has no address) goes to
`transactions.RoutedTransactions`: routed, like a link route, to the broker that holds all the
space's queues and topics (or refused with amqp:not-implemented when there is no such one
broker); a connection that attached one has its transactional transfers and dispositions carried
to that broker and its other traffic forwarded here as before.

A receiver that asks for an address pattern (`patterns.PatternLinks`) is told which addresses
of the space match it, at attach and at each configuration; it carries no message, and the
client receives from each address on an ordinary link, so patterns cost a message nothing.

Who may attach where: each client connection's record carries what its user may do
(`enmasse.resources.permissions.Permissions`, the decision a brokered space's broker makes too),
checked once per link at attach (the answer stays with the link, so a named link's messages pay
nothing; a consumer that browses a queue, source distribution-mode `copy`, needs `view` or
`recv`), per new `to` on an anonymous relay link of a restricted user, and again for the live
links of a user whose rules a new generation changed (those that lost their right are closed).
A dynamic reply address is received from only on the connection that asked for it
(`AddressPoint.creator`); anyone may send to one.

Everything here runs on the engine thread; nothing blocks.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Protocol

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
)
from enmasse.amqp.message_trace import MARK, flagged_unsampled
from enmasse.amqp.selector import SelectorError, selector_of
from enmasse.amqp.windows import first_window
from enmasse.amqp.wire import OUTCOME_ACCEPTED, OUTCOME_NONE
from enmasse.resources.address_patterns import PATTERN_CAPABILITY
from enmasse.resources.authorization import RECV, SEND
from enmasse.resources.contracts import ReplyAddresses, dynamic_owner
from enmasse.resources.permissions import Permissions, browses, logged_in_as
from enmasse.router.addressing import DYNAMIC, Resolution, UnknownAddress, resolve
from enmasse.router.config import Distribution, RouterConfig
from enmasse.router.fanout import CopyQueue
from enmasse.router.hops import ANNOTATION_ROOM, delivered, sampling_ticks, traced_hop
from enmasse.router.inter_router import MeshLinks
from enmasse.router.mesh import LinkStateDatabase
from enmasse.router.patterns import PatternLinks
from enmasse.router.points import (
    ANYCAST,
    BROKER_IN,
    BROKER_OUT,
    CONSUMER,
    CONTROL_IN,
    CONTROL_OUT,
    MESH_MULTICAST,
    MESH_TO,
    MULTICAST,
    MULTICAST_IN,
    MULTICAST_OUT,
    PATTERN,
    PRODUCER,
    PRODUCER_BYTES,
    PRODUCER_WINDOW,
    REVOKED,
    SWEEP_SECONDS,
    TRANSIT_IN,
    TRANSIT_OUT,
    AddressPoint,
    ConnectionRecord,
    ConnectionRole,
    LinkState,
)
from enmasse.router.transactions import ClientCoordinator, RoutedTransactions
from enmasse.router.waypoints import BrokerLinks, BrokerSession
from enmasse.router.windows import refill

log = structlog.get_logger("enmasse.router")

UNAUTHORIZED = "amqp:unauthorized-access"
LIMIT_EXCEEDED = "amqp:resource-limit-exceeded"
# What a `copy` consumer browses (the broker hands it copies and keeps the messages).
BROWSABLE = frozenset({Distribution.QUEUE.value, Distribution.SUBSCRIPTION.value})
# An anonymous sender's decisions per `to` are kept up to this many; then they start afresh
# (a sender replying to many reply addresses must not grow the dict without end).
MAX_SEND_DECISIONS = 1024


class ConnectionHandlers(Protocol):
    """Makes the engine handlers of this router's connections (`handlers.RouterHandlers`)."""

    def client(self) -> ConnectionHandler: ...
    def mesh(self) -> ConnectionHandler: ...
    def peer(self, router_id: str) -> ConnectionHandler: ...
    def broker(self, session: BrokerSession) -> ConnectionHandler: ...


class Router:
    """The forwarding core of one router process. See the module docstring."""

    def __init__(
        self,
        *,
        router_id: str,
        engine: Engine,
        handlers: Callable[[Router], ConnectionHandlers],
        idle_timeout: float | None = None,
    ) -> None:
        self.router_id = router_id
        self.engine = engine
        self.idle_timeout = idle_timeout  # for the connections this router dials
        self.config = RouterConfig()
        self.mesh = LinkStateDatabase(router_id)
        self.replies = ReplyAddresses(router_id)
        self.points: dict[str, AddressPoint] = {}
        self.connections: dict[int, ConnectionRecord] = {}
        self._connection_ids = itertools.count(1)
        self._max_message_size = 0
        # The space's trace sampling as the hot path asks it: one next() per untraced message.
        self._start_trace = sampling_ticks(self.config.trace_sampling)
        self.log = log.bind(router=router_id)
        # The factory only keeps the router: handlers are made per connection, once it is whole.
        self.handlers = handlers(self)
        self.mesh_links = MeshLinks(self, handler_for_peer=self.handlers.peer)
        self.broker_links = BrokerLinks(self, handler_for_broker=self.handlers.broker)
        self.patterns = PatternLinks()
        self.transactions = RoutedTransactions(self)

    # ------------------------------------------------------------------ configuration

    def apply_config(self, config: RouterConfig) -> None:
        """Swaps in a configuration whole (validated, and newer than the running one: `admin.py`
        checks both before, so nothing here is half-applied)."""
        previous, self.config = self.config, config
        self._max_message_size = config.limits.max_message_size
        if config.trace_sampling != previous.trace_sampling:
            self._start_trace = sampling_ticks(config.trace_sampling)
        self.log.info("config applied", generation=config.generation, space=config.space)
        self._retire_addresses(previous)
        self._apply_rules(previous)
        self.patterns.config_changed(config)
        self.broker_links.sync()
        self.mesh_links.sync_peers()
        self.mesh_links.advertise()
        self.mesh_changed()

    def _retire_addresses(self, previous: RouterConfig) -> None:
        """Points whose route changed are rebuilt; links to deleted addresses are closed."""
        for address, point in list(self.points.items()):
            if point.kind == DYNAMIC:
                continue
            route = self.config.route(address)
            if route == previous.route(address):
                continue
            if route is None:
                self._close_point(
                    point,
                    Condition(
                        "amqp:not-found",
                        f"address '{address}' was deleted from space '{self.config.space}'",
                    ),
                )
                continue
            if route.distribution.value != point.kind:
                self._close_point(
                    point,
                    Condition(
                        "amqp:resource-deleted",
                        f"address '{address}' changed from {point.kind} to "
                        f"{route.distribution.value}: attach again",
                    ),
                )
                continue
            point.resolution = Resolution(
                address=address, kind=route.distribution.value, route=route
            )
            if point.waypoint:
                self.broker_links.sync_targets(point)

    def _close_point(self, point: AddressPoint, error: Condition) -> None:
        """Closes every client link of the address; its next attach starts afresh. What waited
        for a consumer goes back to its senders, with the credit held back for it, and the
        neighbours' links to the address are bound again by what they carry next, so the address
        defined again works across the mesh."""
        for link in [*point.local, *point.producers]:
            link.close(error)
        self.points.pop(point.address, None)
        while point.pending:
            self.release(point, point.pending.popleft())
        self._give_back_held(point)
        self.mesh_links.unbind(point)

    # ------------------------------------------------------------------ points

    def _point(self, resolution: Resolution) -> AddressPoint:
        point = self.points.get(resolution.address)
        if point is None:
            point = AddressPoint(
                address=resolution.address, kind=resolution.kind, resolution=resolution
            )
            self.points[resolution.address] = point
            if point.kind == DYNAMIC or point.kind == ANYCAST:
                self.refresh_remote_targets(point)
            elif point.waypoint:
                self.broker_links.sync_targets(point)
        return point

    def transit_point(self, address: str) -> AddressPoint:
        """The point for an address a neighbour routes to us; configured or not (yet) here."""
        try:
            return self._point(resolve(address, config=self.config))
        except UnknownAddress:
            return self._point(Resolution(address=address, kind=ANYCAST))

    def _reachable(self, point: AddressPoint) -> bool:
        """Whether producers of the address get credit."""
        if point.kind == MULTICAST:
            return True
        return len(point.targets) > 0

    def grant_credit(self, point: AddressPoint) -> None:
        if not self._reachable(point) or point.pending:
            return
        for link in point.producers:
            refill(link, link.context)
        self._give_back_held(point)

    @staticmethod
    def _give_back_held(point: AddressPoint) -> None:
        """The credit held back while deliveries waited at the point, from senders that are not
        its own producers: neighbours' transit links and anonymous senders."""
        for link in point.transit_in:
            refill(link, link.context)
        owed, point.anonymous_owed = point.anonymous_owed, []
        for link in owed:
            if link.is_open:
                link.flow(1)

    # ------------------------------------------------------------------ client connections

    def open_connection(self, conn: Connection, *, role: ConnectionRole) -> ConnectionRecord | None:
        """Registers a connection; None (and the connection closed) when over a limit."""
        user = None
        if role is ConnectionRole.NORMAL:
            user = logged_in_as(conn.user, configured=self.config.users)
            refusal = self._over_connection_limits(user)
            if refusal is not None:
                conn.close(Condition(LIMIT_EXCEEDED, refusal))
                return None
        record = ConnectionRecord(id=next(self._connection_ids), role=role, connection=conn)
        if role is ConnectionRole.NORMAL:
            record.permissions = self._permissions(user)
        conn.context = record
        self.connections[record.id] = record
        return record

    def _over_connection_limits(self, user: str | None) -> str | None:
        """Why one more client connection (of `user`; None: anonymous) is refused, or None."""
        limits = self.config.limits
        if not (limits.max_connections or (user and limits.max_connections_per_user)):
            return None
        clients = [r for r in self.connections.values() if r.role is ConnectionRole.NORMAL]
        if limits.max_connections and len(clients) >= limits.max_connections:
            return f"too many connections: this router allows {limits.max_connections}"
        per_user = limits.max_connections_per_user
        if user and per_user and sum(1 for r in clients if r.permissions.user == user) >= per_user:
            return f"too many connections for user '{user}': this router allows {per_user}"
        return None

    def close_record(self, conn: Connection) -> None:
        record = conn.context
        if isinstance(record, ConnectionRecord):
            self.connections.pop(record.id, None)

    def client_session(self, conn: Connection, *, held: int) -> Condition | None:
        """Why a client may not begin one more session on `conn` (holding `held`), or None."""
        limit = self.config.limits.max_sessions_per_connection
        if limit and held >= limit:
            return Condition(
                LIMIT_EXCEEDED,
                f"too many sessions: this connection holds {held}, the space's limit is {limit}",
            )
        return None

    def client_attach(self, link: Link) -> None:
        if not isinstance(link.connection.context, ConnectionRecord):
            # Pipelined behind an open this router turned away (too many connections).
            link.refuse(Condition("amqp:connection:forced", "the connection is being closed"))
            return
        limit = self.config.limits.max_links_per_connection
        if limit and sum(1 for other in link.connection.links if other.is_open) >= limit:
            link.refuse(
                Condition(
                    LIMIT_EXCEEDED,
                    f"too many links on this connection: this router allows {limit}",
                )
            )
            return
        # A producer's link advertises the space's limit at attach, and the engine rejects a
        # larger delivery for that producer alone, the link going on (`_from_producer` checks
        # again for links that attached under a larger limit); a no-op on a consumer's link.
        link.limit_message_size(self._max_message_size)
        if link.is_sender:
            self._attach_consumer(link)
        else:
            self._attach_producer(link)

    def _attach_producer(self, link: Link) -> None:
        if link.target.coordinator:
            # Without this, a coordinator (no address) would pass for an anonymous producer and
            # its Declare go unanswered; a transaction lives on one broker, not on the mesh.
            self.transactions.attach(link)
            return
        permissions: Permissions = link.connection.context.permissions
        if link.address is None:
            sends: dict[str, bool] | None = None if permissions.sends_everywhere else {}
            link.context = LinkState(role=PRODUCER, sends=sends)
            link.accept()
            link.flow(self.first_window(PRODUCER_WINDOW, PRODUCER_BYTES))
            return
        if not self._may_send(permissions, link.address):
            link.refuse(Condition(UNAUTHORIZED, permissions.refusal(SEND, link.address)))
            return
        try:
            resolution = resolve(link.address, config=self.config)
        except UnknownAddress as error:
            link.refuse(Condition("amqp:not-found", str(error)))
            return
        refusal = resolution.refuses_producers
        if refusal is not None:
            link.refuse(Condition("amqp:not-allowed", refusal))
            return
        point = self._point(resolution)
        link.context = LinkState(
            role=PRODUCER, point=point, window=self.first_window(PRODUCER_WINDOW, PRODUCER_BYTES)
        )
        link.accept()
        point.producers.append(link)
        self.grant_credit(point)

    def first_window(self, messages: int, budget: int) -> int:
        return first_window(
            messages=messages, budget=budget, max_message_size=self._max_message_size
        )

    def _attach_consumer(self, link: Link) -> None:
        record: ConnectionRecord = link.connection.context
        if PATTERN_CAPABILITY in link.source.capabilities:
            link.context = LinkState(role=PATTERN)
            self.patterns.attach(link, permissions=record.permissions, config=self.config)
            return
        if link.source.dynamic:
            address = self.replies.allocate()
            link.set_dynamic_address(address)
            resolution = Resolution(address=address, kind=DYNAMIC, owner=self.router_id)
        else:
            if not link.address:
                link.refuse(Condition("amqp:not-found", "a consumer needs a source address"))
                return
            browse = browses(link.source.distribution_mode)  # `view` may do, on a queue
            refusal = self._recv_refusal(record, link.address, browse=browse)
            if refusal is not None:
                link.refuse(Condition(UNAUTHORIZED, refusal))
                return
            try:
                resolution = resolve(link.address, config=self.config)
            except UnknownAddress as error:
                link.refuse(Condition("amqp:not-found", str(error)))
                return
            try:
                # A JMS selector is applied by the broker (the feed carries the filter); a bad
                # one is refused here, at once, in the broker's words.
                selector_of(link.source.filter)
            except SelectorError as error:
                link.refuse(Condition("amqp:invalid-field", str(error)))
                return
        point = self._point(resolution)
        if link.source.dynamic:
            point.creator = record
        state = LinkState(role=CONSUMER, point=point)
        link.context = state
        link.accept()
        point.local.append(link)
        if point.waypoint:
            state.durable = link.source.durable > 0 or link.source.expiry_policy == "never"
            self.broker_links.open_feeds(link)
            return
        if point.kind == MULTICAST:
            state.copies = CopyQueue()
        else:
            point.targets.add(link)
            self.drain_pending(point)
            self.grant_credit(point)
        self.mesh_links.advertise()

    def client_detach(self, link: Link, *, closed: bool) -> None:
        state = link.context
        if not isinstance(state, LinkState):
            if type(state) is ClientCoordinator:
                self.transactions.detach(link)
            return
        if state.role is PATTERN:
            self.patterns.detach(link)
            return
        point = state.point
        if state.role is PRODUCER:
            if point is not None and link in point.producers:
                point.producers.remove(link)
            return
        if point is None:
            return
        if link in point.local:
            point.local.remove(link)
        if point.waypoint:
            self.broker_links.close_feeds(state, detach=not closed and state.durable)
        point.targets.remove(link)
        if state.copies is not None:
            point.counters.dropped += len(state.copies)
        self.target_lost(link)
        if not point.local and point.kind == DYNAMIC:
            self.points.pop(point.address, None)
        self.mesh_links.advertise()

    # ------------------------------------------------------------------ authorization

    def _permissions(self, user: str | None) -> Permissions:
        return Permissions(user=user, rules=self.config.rules.get(user, ()) if user else ())

    @staticmethod
    def _may_send(permissions: Permissions, address: str) -> bool:
        """Anyone may send to a reply address (request/response needs that); elsewhere, the
        user's rules say."""
        return dynamic_owner(address) is not None or permissions.may(SEND, address)

    def _recv_refusal(
        self, record: ConnectionRecord, address: str, *, browse: bool = False
    ) -> str | None:
        """Why this connection may not receive from (`browse`: browse) `address` (the
        description), or None. A reply address is received from only on the connection that
        asked for it."""
        permissions = record.permissions
        if dynamic_owner(address) is not None:
            point = self.points.get(address)
            if point is None or point.creator is not record:
                return (
                    f"{permissions.refusal(RECV, address)}: a reply address belongs to the "
                    "connection that made it"
                )
            return None
        return permissions.receive_refusal(
            address, browse=browse, is_queue=lambda: self._browsable(address)
        )

    def _browsable(self, address: str) -> bool:
        """True for an address whose broker lets a `copy` consumer browse: a queue's, or a
        subscription's (a topic's `copy` subscriber gets every message, as any subscriber)."""
        try:
            kind = resolve(address, config=self.config).kind
        except UnknownAddress:
            return False
        return kind in BROWSABLE

    def _decide_send(self, link: Link, sends: dict[str, bool], to: str) -> bool:
        """An anonymous sender's first message to `to`: decided, and kept for the next ones."""
        allowed = self._may_send(link.connection.context.permissions, to)
        if len(sends) >= MAX_SEND_DECISIONS:
            sends.clear()
        sends[to] = allowed
        return allowed

    def _apply_rules(self, previous: RouterConfig) -> None:
        """A generation that changed users' rules: each live link of those users is checked
        again, and one that lost its right is closed with amqp:unauthorized-access."""
        old, new = previous.rules, self.config.rules
        changed = {user for user in old.keys() | new.keys() if old.get(user) != new.get(user)}
        if not changed:
            return
        revoked = 0
        for record in list(self.connections.values()):
            user = record.permissions.user
            if user is None or user not in changed:
                continue
            record.permissions = self._permissions(user)
            for link in record.connection.links:
                revoked += self._recheck(link, record.permissions)
        if revoked:
            self.log.info("links closed by changed rules", links=revoked, users=sorted(changed))

    def _recheck(self, link: Link, permissions: Permissions) -> int:
        """Checks one live client link against new rules; 1 when it was closed, else 0."""
        state = link.context
        if not isinstance(state, LinkState) or not link.is_open:
            return 0
        point = state.point
        if state.role is PRODUCER and point is None:
            state.sends = None if permissions.sends_everywhere else {}
            return 0
        if point is None or point.kind == DYNAMIC:
            return 0  # a reply address stays its connection's, whatever the rules
        refusal: str | None = None
        if state.role is PRODUCER:
            if not permissions.may(SEND, point.address):
                refusal = permissions.refusal(SEND, point.address)
        elif state.role is CONSUMER:
            refusal = permissions.receive_refusal(
                point.address,
                browse=browses(link.source.distribution_mode),
                is_queue=lambda: point.kind in BROWSABLE,
            )
        else:
            return 0
        if refusal is None:
            return 0
        self._revoke(link, Condition(UNAUTHORIZED, refusal))
        return 1

    def _revoke(self, link: Link, error: Condition) -> None:
        """Takes the link out of its address point now (no delivery goes to it or comes from
        it any more; a durable subscriber's broker links are detached, not closed, so its
        subscription stays) and closes it with `error`."""
        self.client_detach(link, closed=False)
        link.context = LinkState(role=REVOKED)
        link.close(error)

    # ------------------------------------------------------------------ deliveries in

    def message(self, link: Link, delivery: Delivery) -> None:
        state: LinkState = link.context
        record: ConnectionRecord = link.connection.context
        record.deliveries_in += 1
        state.deliveries += 1
        role = state.role
        payload = delivery.payload
        # The one tracing check an untraced message pays; a propagated but unsampled one also
        # has its flags read in place.
        if MARK in payload and not flagged_unsampled(payload):
            self._traced_message(link, state, delivery)
        elif role is PRODUCER:
            # The space's sampling: one next() per untraced message (and a message that carries
            # an unsampled context keeps its producer's decision).
            if next(self._start_trace) and MARK not in payload and self._room_to_trace(payload):
                self._traced_message(link, state, delivery, start_trace=True)
            else:
                self._from_producer(link, state, delivery)
        elif role is BROKER_IN:
            self.broker_links.from_broker(state, delivery)
        elif role is TRANSIT_IN:
            self.mesh_links.from_transit(link, state, delivery)
        elif role is MULTICAST_IN:
            self._from_multicast(link, state, delivery)
        elif role is CONTROL_IN:
            self.mesh_links.from_control(link, state, delivery)
        elif role is REVOKED:
            _refuse_revoked(delivery)

    def _room_to_trace(self, payload: bytes) -> bool:
        limit = self._max_message_size
        return not limit or len(payload) + ANNOTATION_ROOM <= limit

    def _traced_message(
        self, link: Link, state: LinkState, delivery: Delivery, *, start_trace: bool = False
    ) -> None:
        """A message that may be sampled (or whose trace this router starts): forwarded as
        usual, recorded as this router's hop (`hops.py`)."""
        role = state.role
        point = state.point
        if role is REVOKED:
            _refuse_revoked(delivery)
            return
        if role is PRODUCER:
            forward = lambda: self._from_producer(link, state, delivery)  # noqa: E731
        elif role is BROKER_IN:
            forward = lambda: self.broker_links.from_broker(state, delivery)  # noqa: E731
        elif role is TRANSIT_IN:
            forward = lambda: self.mesh_links.from_transit(link, state, delivery)  # noqa: E731
        elif role is MULTICAST_IN:
            forward = lambda: self._from_multicast(link, state, delivery)  # noqa: E731
        else:
            self.mesh_links.from_control(link, state, delivery)
            return
        traced_hop(
            delivery,
            start_trace=start_trace,
            waypoint=role is PRODUCER and point is not None and point.waypoint,
            address=point.address if point is not None else _safe_to(delivery),
            address_type=point.kind if point is not None else None,
            space=self.config.space or None,
            forward=forward,
        )

    def _from_producer(self, link: Link, state: LinkState, delivery: Delivery) -> None:
        limit = self._max_message_size
        if limit and len(delivery.payload) > limit:
            delivery.settle(
                Outcome.REJECTED,
                error=Condition(
                    "amqp:link:message-size-exceeded",
                    f"message of {len(delivery.payload)} bytes exceeds the limit of {limit} bytes",
                ),
            )
            if state.point is None:
                link.flow(1)
            else:
                self._top_up(link, state, 0)  # refused: it weighs nothing here
            return
        point = state.point
        if point is None:
            self._from_anonymous(link, state, delivery)
            return
        point.counters.deliveries_in += 1
        if point.kind == MULTICAST:
            self._fan_out(point, delivery, origin=self.router_id)
        else:
            self.route(point, delivery)
        self._top_up(link, state, len(delivery.payload))

    def _from_anonymous(self, link: Link, state: LinkState, delivery: Delivery) -> None:
        """A message with its address in `to`. Its credit comes back at once, unless it waits
        for a consumer: then when the wait ends (`grant_credit`), so that an anonymous sender
        too has at most its window waiting here."""
        waits_at = self._route_anonymous(link, state, delivery)
        if waits_at is None:
            link.flow(1)
        else:
            waits_at.anonymous_owed.append(link)

    def _route_anonymous(
        self, link: Link, state: LinkState, delivery: Delivery
    ) -> AddressPoint | None:
        """Routes by `to` (or refuses); the address point where the delivery now waits, if so.
        A sender whose user may not send everywhere has each `to` checked once (`state.sends`
        keeps the decisions): a repeated `to` costs one dict lookup."""
        try:
            to = delivery.to
        except codec.CodecError as error:
            delivery.settle(
                Outcome.REJECTED,
                error=Condition("amqp:decode-error", f"cannot read the message's 'to': {error}"),
            )
            return None
        if not to:
            delivery.settle(
                Outcome.REJECTED,
                error=Condition(
                    "amqp:precondition-failed",
                    "a message on an anonymous link needs a 'to' address",
                ),
            )
            return None
        sends = state.sends
        if sends is not None:
            allowed = sends.get(to)
            if allowed is None:
                allowed = self._decide_send(link, sends, to)
            if not allowed:
                permissions: Permissions = link.connection.context.permissions
                delivery.settle(
                    Outcome.REJECTED,
                    error=Condition(UNAUTHORIZED, permissions.refusal(SEND, to)),
                )
                return None
        try:
            resolution = resolve(to, config=self.config)
        except UnknownAddress as error:
            delivery.settle(Outcome.REJECTED, error=Condition("amqp:not-found", str(error)))
            return None
        refusal = resolution.refuses_producers
        if refusal is not None:
            delivery.settle(Outcome.REJECTED, error=Condition("amqp:not-allowed", refusal))
            return None
        point = self._point(resolution)
        point.counters.deliveries_in += 1
        if point.kind == MULTICAST:
            self._fan_out(point, delivery, origin=self.router_id)
        elif not self._reachable(point):
            point.counters.released += 1
            delivery.settle(Outcome.RELEASED)
        else:
            self.route(point, delivery)
            if point.pending and point.pending[-1] is delivery:
                return point
        return None

    def _top_up(self, link: Link, state: LinkState, size: int) -> None:
        """Gives back, in half windows, the credit of deliveries that moved on (counted, not
        asked: reading a link's credit is a call into proton, too dear for every message)."""
        state.unflowed += 1
        state.unflowed_bytes += size
        if state.unflowed < state.window // 2:
            return
        point = state.point
        if point is None or point.pending or not self._reachable(point):
            return
        refill(link, state)

    # ------------------------------------------------------------------ anycast and waypoints

    def route(self, point: AddressPoint, delivery: Delivery, *, local_only: bool = False) -> None:
        """Sends to one target with credit; holds when all are busy; releases when none exist."""
        targets = point.targets
        if point.pending:
            point.pending.append(delivery)
            return
        if local_only:
            target = targets.choose(lambda t: t.credit > 0 and t.context.role is CONSUMER)
            has_any = bool(point.local)
        else:
            target = targets.choose(_has_credit)
            has_any = len(targets) > 0
        if target is not None:
            self._send(point, target, delivery)
        elif has_any or (point.kind == ANYCAST and not local_only and not point.waypoint):
            # Waiting for credit, or for a consumer of a configured anycast address to appear.
            point.pending.append(delivery)
        else:
            self.release(point, delivery)

    def _send(self, point: AddressPoint, target: Link, delivery: Delivery) -> None:
        if delivery.pre_settled:
            target.send_settled(delivery.payload)
        else:
            target.send(delivery.payload, context=delivery)
            point.targets.sent(target)
        point.counters.deliveries_out += 1
        target.connection.context.deliveries_out += 1

    def release(self, point: AddressPoint | None, delivery: Delivery) -> None:
        if delivery.pre_settled:
            if point is not None:
                point.counters.dropped += 1
            return
        if point is not None:
            point.counters.released += 1
        delivery.settle(Outcome.RELEASED)

    def drain_pending(self, point: AddressPoint) -> None:
        pending = point.pending
        local_only = point.kind == DYNAMIC and point.resolution.owner == self.router_id
        while pending:
            if local_only:
                target = point.targets.choose(lambda t: t.credit > 0 and t.context.role is CONSUMER)
            else:
                target = point.targets.choose(_has_credit)
            if target is None:
                break
            self._send(point, target, pending.popleft())
        if not pending:
            self.grant_credit(point)

    def credit(self, link: Link) -> None:
        """Our sending link got credit: waiting deliveries or copies may go now."""
        state = link.context
        if not isinstance(state, LinkState):
            return
        if state.copies is not None and len(state.copies):
            for payload in state.copies.take(credit=link.credit):
                self._send_copy(link, payload)
            self._end_drain(link, state)
            return
        if state.role is CONTROL_OUT:
            self.mesh_links.flush_control(state.router)
            return
        if state.role is CONSUMER and state.point is not None and state.point.waypoint:
            self.broker_links.feed_consumer(link, state)
            return
        if state.held_back:
            self.mesh_links.release_held_back(link)
        point = state.point
        if point is not None and point.pending:
            self.drain_pending(point)
        elif point is not None and state.role is BROKER_OUT:
            self.grant_credit(point)
        self._end_drain(link, state)

    @staticmethod
    def _end_drain(link: Link, state: LinkState) -> None:
        """A direct consumer that asked to drain (a receive-no-wait) has had what was waiting
        here: the rest of its credit goes back at once rather than wait for producers.
        (Waypoint consumers drain through their brokers: `BrokerLinks.feed_consumer`.)"""
        if state.role is CONSUMER and link.draining:
            link.drained()

    def outcome(self, link: Link, delivery: Delivery, outcome: Outcome) -> None:
        """A downstream peer settled what we sent: settle the delivery it carried the same way."""
        state: LinkState = link.context
        point = state.point
        carried: Delivery | None = delivery.context
        if point is not None:
            point.targets.settled(link)
            if outcome is OUTCOME_ACCEPTED:
                point.counters.accepted += 1
            else:
                point.counters.count_outcome(_OUTCOME_NAMES.get(outcome, "released"))
        if carried is not None:
            if carried.trace is not None and state.role is CONSUMER:
                delivered(carried.trace, outcome)  # a sampled message reached its consumer
            if outcome is OUTCOME_ACCEPTED:
                carried.settle(outcome)
            elif outcome is OUTCOME_NONE:
                carried.settle(Outcome.RELEASED)
            else:
                carried.settle(
                    outcome,
                    error=delivery.error,
                    delivery_failed=delivery.delivery_failed,
                    undeliverable_here=delivery.undeliverable_here,
                )
        if point is not None and point.pending and link.credit > 0:
            self.drain_pending(point)

    def target_lost(self, link: Link) -> None:
        """A link we sent on went away: what it still carried is re-routed or released.

        Deferred to the end of the loop turn: when a whole connection is lost, every one of its
        links is reported first, and a re-route must not pick a sibling that is about to go.
        """
        carried = [d.context for d in link.unsettled if d.context is not None]
        if carried:
            self.engine.call_soon(lambda: self._reroute(carried))

    def _reroute(self, carried: list[Delivery]) -> None:
        for delivery in carried:
            if delivery.settled:
                continue
            state = delivery.link.context
            if not isinstance(state, LinkState):
                delivery.settle(Outcome.RELEASED)
                continue
            if state.role is BROKER_IN:
                delivery.settle(Outcome.RELEASED)  # the broker hands it to the next consumer
                continue
            point = state.point
            if point is None:  # anonymous producer: the address is in the message
                try:
                    point = self._point(resolve(delivery.to or "", config=self.config))
                except UnknownAddress:
                    delivery.settle(Outcome.RELEASED)
                    continue
            if state.role is TRANSIT_IN and state.router == self.router_id:
                if point.local:
                    self.route(point, delivery, local_only=True)
                else:
                    self.release(point, delivery)
            elif len(point.targets) > 0:
                self.route(point, delivery)
            else:
                self.release(point, delivery)

    # ------------------------------------------------------------------ multicast

    def _fan_out(self, point: AddressPoint, delivery: Delivery, *, origin: str) -> None:
        payload = delivery.payload
        for consumer in point.local:
            self._offer_copy(point, consumer, payload)
        hops = point.multicast_hops.get(origin)
        if hops is None:
            hops = self.mesh.multicast_next_hops(origin=origin, address=point.address)
            point.multicast_hops[origin] = hops
        for hop in hops:
            link = self.mesh_links.sender_towards(
                hop, f"{MESH_MULTICAST}{origin}/{point.address}", role=MULTICAST_OUT
            )
            if link is not None:
                self._offer_copy(point, link, payload)
        if not delivery.pre_settled:
            point.counters.accepted += 1
            delivery.settle(Outcome.ACCEPTED)

    def _offer_copy(self, point: AddressPoint, link: Link, payload: bytes) -> None:
        copies = link.context.copies
        before = copies.dropped
        for ready in copies.offer(payload, credit=link.credit):
            self._send_copy(link, ready)
        point.counters.dropped += copies.dropped - before

    def _send_copy(self, link: Link, payload: bytes) -> None:
        link.send_settled(payload)
        point = link.context.point
        if point is not None:
            point.counters.deliveries_out += 1
        link.connection.context.deliveries_out += 1

    def _from_multicast(self, link: Link, state: LinkState, delivery: Delivery) -> None:
        if link.credit < state.window // 2:  # kept topped up: slow consumers' copies are dropped
            link.flow(state.window - link.credit)
        point = state.point
        if point is None:
            point = self.mesh_links.bind(link, state)
        point.counters.deliveries_in += 1
        self._fan_out(point, delivery, origin=state.router)

    # ------------------------------------------------------------------ mesh changes

    def mesh_changed(self) -> None:
        for point in list(self.points.values()):
            point.multicast_hops.clear()
            if point.kind in (ANYCAST, DYNAMIC):
                self.refresh_remote_targets(point)
                self.drain_pending(point)
                self.grant_credit(point)

    def refresh_remote_targets(self, point: AddressPoint) -> None:
        """One target per other router with consumers, through the next hop towards it,
        weighted by how many consumers that router has."""
        if point.kind == DYNAMIC:
            owner = point.resolution.owner
            wanted = {owner} if owner != self.router_id and self.mesh.next_hop(owner) else set()
        else:
            wanted = set(self.mesh.routers_with_consumers(point.address))
        for router, link in list(point.remote.items()):
            hop = self.mesh.next_hop(router)
            if router not in wanted or link.context.router != hop or not link.is_open:
                point.targets.remove(link)
                del point.remote[router]
            else:
                point.targets.add(link, weight=self._consumers_at(router, point))
        for router in sorted(wanted - set(point.remote)):
            hop = self.mesh.next_hop(router)
            if hop is None:
                continue
            sender = self.mesh_links.sender_towards(
                hop, f"{MESH_TO}{router}/{point.address}", role=TRANSIT_OUT
            )
            if sender is None:
                continue
            sender.context.point = point
            point.remote[router] = sender
            point.targets.add(sender, weight=self._consumers_at(router, point))

    def _consumers_at(self, router: str, point: AddressPoint) -> int:
        if point.kind == DYNAMIC:
            return 1
        return self.mesh.consumers_at(router, point.address)

    # ------------------------------------------------------------------ housekeeping

    def start_housekeeping(self) -> None:
        self.engine.call_later(SWEEP_SECONDS, self._sweep)

    def _sweep(self) -> None:
        """Forgets reply addresses of other routers that saw no traffic for a whole period.

        Replies to a dynamic address elsewhere in the mesh open a link towards its owner; nothing
        says when the owner's receiver went away, so idle ones are closed here, or every RPC
        client that ever replied through this router would leave a link behind.
        """
        for address, point in list(self.points.items()):
            if point.kind != DYNAMIC or point.resolution.owner == self.router_id:
                continue
            seen = point.counters.deliveries_in
            busy = point.producers or point.pending or seen != point.seen_at_sweep
            point.seen_at_sweep = seen
            if busy or any(link.unsettled for link in point.remote.values()):
                continue
            for link in point.remote.values():
                link.close()
            del self.points[address]
        self.engine.call_later(SWEEP_SECONDS, self._sweep)

    def close_connection(self, *, connection_id: int, reason: str) -> bool:
        record = self.connections.get(connection_id)
        if record is None:
            return False
        record.connection.close(Condition("amqp:connection:forced", reason))
        return True

    def close_link(self, *, connection_id: int, name: str, sender: bool, reason: str) -> bool:
        """Closes one link of a client's connection with amqp:link:detach-forced, taken out of
        its address point at once (as a revoked one); False when there is no such link."""
        record = self.connections.get(connection_id)
        if record is None or record.role is not ConnectionRole.NORMAL:
            return False
        for link in record.connection.links:
            if link.name == name and link.is_sender == sender:
                self._revoke(link, Condition("amqp:link:detach-forced", reason))
                return True
        return False


def _refuse_revoked(delivery: Delivery) -> None:
    """A message that was on its way when its link lost the right to send."""
    delivery.settle(
        Outcome.REJECTED,
        error=Condition(UNAUTHORIZED, "the link lost its right to send: it is being closed"),
    )


def _safe_to(delivery: Delivery) -> str | None:
    try:
        return delivery.to
    except codec.CodecError:
        return None


def _has_credit(link: Link) -> bool:
    return link.credit > 0


_OUTCOME_NAMES = {
    Outcome.ACCEPTED: "accepted",
    Outcome.REJECTED: "rejected",
    Outcome.RELEASED: "released",
    Outcome.MODIFIED: "modified",
    Outcome.NONE: "released",
}
