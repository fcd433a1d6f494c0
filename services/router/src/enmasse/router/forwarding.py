"""The router's forwarding core: every delivery that enters leaves by the right link, and every
outcome finds its way back.

What flows in: engine events, handed over by the thin handlers in `handlers.py` (a client attached
a producer or consumer link, a delivery arrived, an outcome or credit came back, a link or a
connection went away), advert messages from neighbour routers, and configurations from RouterAdmin.
What flows out: sends on links (raw payload bytes, never decoded), settlements, credit, attaches to
neighbours and brokers, and adverts.

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

Everything here runs on the engine thread; nothing blocks.
"""

from __future__ import annotations

import enum
import itertools
from collections import deque
from dataclasses import dataclass, field

import structlog
from enmasse.common.amqp import codec
from enmasse.common.amqp.engine import (
    Condition,
    Connection,
    Delivery,
    Engine,
    Link,
    Outcome,
    Terminus,
)
from enmasse.router.addressing import (
    DYNAMIC,
    ReplyAddresses,
    Resolution,
    UnknownAddress,
    resolve,
)
from enmasse.router.balancing import Balancer
from enmasse.router.config import (
    Distribution,
    MeshPeer,
    RouterConfig,
    Waypoint,
    config_from_proto,
    config_to_proto,
    decide_apply,
)
from enmasse.router.fanout import CopyQueue
from enmasse.router.mesh import LinkStateDatabase, RouterAdvert
from enmasse.router.stats import AddressCounters
from enmasse.v1 import router_pb2

log = structlog.get_logger("enmasse.router")

PRODUCER_WINDOW = 250
TRANSIT_WINDOW = 1000
CONTROL_WINDOW = 1000
REDIAL_SECONDS = (0.1, 0.25, 0.5, 1.0)
SWEEP_SECONDS = 30.0

BROKER_CONTAINER_ID = "enmasse-router"
MESH_CONTROL = "_mesh/control"
MESH_TO = "_mesh/to/"
MESH_MULTICAST = "_mesh/mc/"

ANYCAST = Distribution.ANYCAST.value
MULTICAST = Distribution.MULTICAST.value


class Role(enum.Enum):
    PRODUCER = "producer"  # a client sends to us
    CONSUMER = "consumer"  # we send to a client
    TRANSIT_IN = "transit-in"  # a neighbour router sends anycast deliveries to us
    TRANSIT_OUT = "transit-out"  # we send anycast deliveries to a neighbour
    MULTICAST_IN = "multicast-in"
    MULTICAST_OUT = "multicast-out"
    CONTROL_IN = "control-in"
    CONTROL_OUT = "control-out"
    BROKER_OUT = "broker-out"  # we send a waypoint address's deliveries to a broker
    BROKER_IN = "broker-in"  # a broker sends us deliveries for one client consumer


class ConnectionRole(enum.Enum):
    NORMAL = "normal"
    INTER_ROUTER = "inter-router"
    BROKER = "broker"


@dataclass(eq=False)
class AddressPoint:
    """One address as this router serves it."""

    address: str
    kind: str
    resolution: Resolution
    local: list[Link] = field(default_factory=list)
    targets: Balancer[Link] = field(default_factory=Balancer)
    remote: dict[str, Link] = field(default_factory=dict)  # anycast: router -> link towards it
    producers: list[Link] = field(default_factory=list)
    pending: deque[Delivery] = field(default_factory=deque)
    counters: AddressCounters = field(default_factory=AddressCounters)
    multicast_hops: dict[str, list[str]] = field(default_factory=dict)  # origin -> neighbours
    seen_at_sweep: int = -1  # deliveries_in at the last housekeeping sweep

    @property
    def waypoint(self) -> bool:
        return self.resolution.waypoint


@dataclass(eq=False)
class LinkState:
    role: Role
    point: AddressPoint | None = None
    router: str = ""  # transit: destination router; multicast: origin; control: the neighbour
    consumer: Link | None = None  # broker-in: the client consumer it feeds
    feeds: list[Link] = field(default_factory=list)  # waypoint consumer: its broker receivers
    held: deque[Delivery] = field(default_factory=deque)  # waypoint consumer: awaiting credit
    copies: CopyQueue[bytes] | None = None  # multicast out
    durable: bool = False  # waypoint consumer: detach (not close) its broker links on the way out
    deliveries: int = 0
    unflowed: int = 0  # producer: deliveries taken since credit was last given back


@dataclass(eq=False)
class ConnectionRecord:
    id: int
    role: ConnectionRole
    connection: Connection
    deliveries_in: int = 0
    deliveries_out: int = 0


@dataclass(eq=False)
class Neighbor:
    router_id: str
    connection: Connection
    cost: int
    control: Link | None = None
    backlog: deque[bytes] = field(default_factory=deque)
    senders: dict[str, Link] = field(default_factory=dict)  # target address -> our link


@dataclass(eq=False)
class BrokerSession:
    waypoint: Waypoint
    connection: Connection | None = None
    open: bool = False
    senders: dict[str, Link] = field(default_factory=dict)
    redial: int = 0
    retired: bool = False


class Router:
    """The forwarding core of one router process. See the module docstring."""

    def __init__(
        self, *, router_id: str, engine: Engine, idle_timeout: float | None = None
    ) -> None:
        self.router_id = router_id
        self.engine = engine
        self.idle_timeout = idle_timeout  # for the connections this router dials
        self.config = RouterConfig()
        self.mesh = LinkStateDatabase(router_id)
        self.replies = ReplyAddresses(router_id)
        self.points: dict[str, AddressPoint] = {}
        self.neighbors: dict[str, Neighbor] = {}
        self.brokers: dict[str, BrokerSession] = {}
        self.connections: dict[int, ConnectionRecord] = {}
        self._connection_ids = itertools.count(1)
        self._dialing: dict[str, int] = {}  # peer router id -> attempts so far
        self._max_message_size = 0
        self._log = log.bind(router=router_id)

    # ------------------------------------------------------------------ configuration

    def apply_config(self, pushed: router_pb2.RouterConfig) -> router_pb2.ApplyConfigResponse:
        """Validates first (ConfigError / StaleGeneration change nothing), then swaps in whole."""
        if not decide_apply(running=self.config, pushed_generation=pushed.generation):
            return router_pb2.ApplyConfigResponse(generation=self.config.generation, changed=False)
        config = config_from_proto(pushed, router_id=self.router_id)
        previous, self.config = self.config, config
        self._max_message_size = config.limits.max_message_size
        self._log.info("config applied", generation=config.generation, space=config.space)
        self._retire_addresses(previous)
        self._sync_brokers()
        self._sync_peers()
        self._advertise()
        self._on_mesh_changed()
        return router_pb2.ApplyConfigResponse(generation=config.generation, changed=True)

    def config_proto(self) -> router_pb2.RouterConfig:
        return config_to_proto(self.config)

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
                self._sync_broker_targets(point)

    def _close_point(self, point: AddressPoint, error: Condition) -> None:
        """Closes every client link of the address; its next attach starts afresh."""
        for link in [*point.local, *point.producers]:
            link.close(error)
        self.points.pop(point.address, None)

    # ------------------------------------------------------------------ points

    def _point(self, resolution: Resolution) -> AddressPoint:
        point = self.points.get(resolution.address)
        if point is None:
            point = AddressPoint(
                address=resolution.address, kind=resolution.kind, resolution=resolution
            )
            self.points[resolution.address] = point
            if point.kind == DYNAMIC or point.kind == ANYCAST:
                self._refresh_remote_targets(point)
            elif point.waypoint:
                self._sync_broker_targets(point)
        return point

    def _transit_point(self, address: str) -> AddressPoint:
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

    def _grant_credit(self, point: AddressPoint) -> None:
        if not self._reachable(point) or point.pending:
            return
        for producer in point.producers:
            missing = PRODUCER_WINDOW - producer.credit
            if missing > 0:
                producer.flow(missing)
            producer.context.unflowed = 0

    # ------------------------------------------------------------------ client connections

    def open_connection(self, conn: Connection, *, role: ConnectionRole) -> ConnectionRecord | None:
        """Registers a connection; None (and the connection closed) when over the limit."""
        limit = self.config.limits.max_connections
        if role is ConnectionRole.NORMAL and limit:
            clients = sum(1 for r in self.connections.values() if r.role is ConnectionRole.NORMAL)
            if clients >= limit:
                conn.close(
                    Condition(
                        "amqp:resource-limit-exceeded",
                        f"too many connections: this router allows {limit}",
                    )
                )
                return None
        record = ConnectionRecord(id=next(self._connection_ids), role=role, connection=conn)
        conn.context = record
        self.connections[record.id] = record
        return record

    def close_record(self, conn: Connection) -> None:
        record = conn.context
        if isinstance(record, ConnectionRecord):
            self.connections.pop(record.id, None)

    def client_attach(self, link: Link) -> None:
        if not isinstance(link.connection.context, ConnectionRecord):
            # Pipelined behind an open this router turned away (too many connections).
            link.refuse(Condition("amqp:connection:forced", "the connection is being closed"))
            return
        limit = self.config.limits.max_links_per_connection
        if limit and sum(1 for other in link.connection.links if other.is_open) >= limit:
            link.refuse(
                Condition(
                    "amqp:resource-limit-exceeded",
                    f"too many links on this connection: this router allows {limit}",
                )
            )
            return
        if link.is_sender:
            self._attach_consumer(link)
        else:
            self._attach_producer(link)

    def _attach_producer(self, link: Link) -> None:
        if link.address is None:
            link.context = LinkState(role=Role.PRODUCER)
            link.accept()
            link.flow(PRODUCER_WINDOW)
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
        link.context = LinkState(role=Role.PRODUCER, point=point)
        link.accept()
        point.producers.append(link)
        self._grant_credit(point)

    def _attach_consumer(self, link: Link) -> None:
        if link.source.dynamic:
            address = self.replies.allocate()
            link.set_dynamic_address(address)
            resolution = Resolution(address=address, kind=DYNAMIC, owner=self.router_id)
        else:
            if not link.address:
                link.refuse(Condition("amqp:not-found", "a consumer needs a source address"))
                return
            try:
                resolution = resolve(link.address, config=self.config)
            except UnknownAddress as error:
                link.refuse(Condition("amqp:not-found", str(error)))
                return
        point = self._point(resolution)
        state = LinkState(role=Role.CONSUMER, point=point)
        link.context = state
        link.accept()
        point.local.append(link)
        if point.waypoint:
            state.durable = link.source.durable > 0 or link.source.expiry_policy == "never"
            self._open_feeds(link)
            return
        if point.kind == MULTICAST:
            state.copies = CopyQueue()
        else:
            point.targets.add(link)
            self._drain_pending(point)
            self._grant_credit(point)
        self._advertise()

    def client_detach(self, link: Link, *, closed: bool) -> None:
        state = link.context
        if not isinstance(state, LinkState):
            return
        point = state.point
        if state.role is Role.PRODUCER:
            if point is not None and link in point.producers:
                point.producers.remove(link)
            return
        if point is None:
            return
        if link in point.local:
            point.local.remove(link)
        if point.waypoint:
            self._close_feeds(state, detach=not closed and state.durable)
        point.targets.remove(link)
        if state.copies is not None:
            point.counters.dropped += len(state.copies)
        self._target_lost(link)
        if not point.local and point.kind == DYNAMIC:
            self.points.pop(point.address, None)
        self._advertise()

    # ------------------------------------------------------------------ deliveries in

    def message(self, link: Link, delivery: Delivery) -> None:
        state: LinkState = link.context
        record: ConnectionRecord = link.connection.context
        record.deliveries_in += 1
        state.deliveries += 1
        role = state.role
        if role is Role.PRODUCER:
            self._from_producer(link, state, delivery)
        elif role is Role.BROKER_IN:
            self._from_broker(state, delivery)
        elif role is Role.TRANSIT_IN:
            self._from_transit(link, state, delivery)
        elif role is Role.MULTICAST_IN:
            self._from_multicast(link, state, delivery)
        elif role is Role.CONTROL_IN:
            self._from_control(link, state, delivery)

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
                self._top_up(link, state)
            return
        point = state.point
        if point is None:
            self._from_anonymous(link, delivery)
            return
        point.counters.deliveries_in += 1
        if point.kind == MULTICAST:
            self._fan_out(point, delivery, origin=self.router_id)
        else:
            self._route(point, delivery)
        self._top_up(link, state)

    def _from_anonymous(self, link: Link, delivery: Delivery) -> None:
        link.flow(1)
        try:
            to = delivery.to
        except codec.CodecError as error:
            delivery.settle(
                Outcome.REJECTED,
                error=Condition("amqp:decode-error", f"cannot read the message's 'to': {error}"),
            )
            return
        if not to:
            delivery.settle(
                Outcome.REJECTED,
                error=Condition(
                    "amqp:precondition-failed",
                    "a message on an anonymous link needs a 'to' address",
                ),
            )
            return
        try:
            resolution = resolve(to, config=self.config)
        except UnknownAddress as error:
            delivery.settle(Outcome.REJECTED, error=Condition("amqp:not-found", str(error)))
            return
        refusal = resolution.refuses_producers
        if refusal is not None:
            delivery.settle(Outcome.REJECTED, error=Condition("amqp:not-allowed", refusal))
            return
        point = self._point(resolution)
        point.counters.deliveries_in += 1
        if point.kind == MULTICAST:
            self._fan_out(point, delivery, origin=self.router_id)
        elif not self._reachable(point):
            point.counters.released += 1
            delivery.settle(Outcome.RELEASED)
        else:
            self._route(point, delivery)

    def _top_up(self, link: Link, state: LinkState) -> None:
        """Gives back, in batches, the credit of deliveries that moved on (counted, not asked:
        reading a link's credit is a call into proton, too dear for every message)."""
        state.unflowed += 1
        if state.unflowed < PRODUCER_WINDOW // 2:
            return
        point = state.point
        if point is None or point.pending or not self._reachable(point):
            return
        link.flow(state.unflowed)
        state.unflowed = 0

    # ------------------------------------------------------------------ anycast and waypoints

    def _route(self, point: AddressPoint, delivery: Delivery, *, local_only: bool = False) -> None:
        """Sends to one target with credit; holds when all are busy; releases when none exist."""
        targets = point.targets
        if point.pending:
            point.pending.append(delivery)
            return
        if local_only:
            target = targets.choose(lambda t: t.credit > 0 and t.context.role is Role.CONSUMER)
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
            self._release(point, delivery)

    def _send(self, point: AddressPoint, target: Link, delivery: Delivery) -> None:
        settled = delivery.pre_settled
        target.send(delivery.payload, settled=settled, context=None if settled else delivery)
        if not settled:
            point.targets.sent(target)
        point.counters.deliveries_out += 1
        target.connection.context.deliveries_out += 1

    def _release(self, point: AddressPoint | None, delivery: Delivery) -> None:
        if delivery.pre_settled:
            if point is not None:
                point.counters.dropped += 1
            return
        if point is not None:
            point.counters.released += 1
        delivery.settle(Outcome.RELEASED)

    def _drain_pending(self, point: AddressPoint) -> None:
        pending = point.pending
        local_only = point.kind == DYNAMIC and point.resolution.owner == self.router_id
        while pending:
            if local_only:
                target = point.targets.choose(
                    lambda t: t.credit > 0 and t.context.role is Role.CONSUMER
                )
            else:
                target = point.targets.choose(_has_credit)
            if target is None:
                break
            self._send(point, target, pending.popleft())
        if not pending:
            self._grant_credit(point)

    def credit(self, link: Link) -> None:
        """Our sending link got credit: waiting deliveries or copies may go now."""
        state = link.context
        if not isinstance(state, LinkState):
            return
        if state.copies is not None and len(state.copies):
            for payload in state.copies.take(credit=link.credit):
                self._send_copy(link, payload)
            return
        if state.role is Role.CONTROL_OUT:
            self._flush_control(state.router)
            return
        if state.role is Role.CONSUMER and state.point is not None and state.point.waypoint:
            self._feed_consumer(link, state)
            return
        point = state.point
        if point is not None and point.pending:
            self._drain_pending(point)
        elif point is not None and state.role is Role.BROKER_OUT:
            self._grant_credit(point)

    def outcome(self, link: Link, delivery: Delivery, outcome: Outcome) -> None:
        """A downstream peer settled what we sent: settle the delivery it carried the same way."""
        state: LinkState = link.context
        point = state.point
        carried: Delivery | None = delivery.context
        if point is not None:
            point.targets.settled(link)
            point.counters.count_outcome(_OUTCOME_NAMES.get(outcome, "released"))
        if carried is not None:
            if outcome is Outcome.ACCEPTED:
                carried.settle(outcome)
            elif outcome is Outcome.NONE:
                carried.settle(Outcome.RELEASED)
            else:
                carried.settle(
                    outcome,
                    error=delivery.error,
                    delivery_failed=delivery.delivery_failed,
                    undeliverable_here=delivery.undeliverable_here,
                )
        if point is not None and point.pending and link.credit > 0:
            self._drain_pending(point)

    def _target_lost(self, link: Link) -> None:
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
            if state.role is Role.BROKER_IN:
                delivery.settle(Outcome.RELEASED)  # the broker hands it to the next consumer
                continue
            point = state.point
            if point is None:  # anonymous producer: the address is in the message
                try:
                    point = self._point(resolve(delivery.to or "", config=self.config))
                except UnknownAddress:
                    delivery.settle(Outcome.RELEASED)
                    continue
            if state.role is Role.TRANSIT_IN and state.router == self.router_id:
                if point.local:
                    self._route(point, delivery, local_only=True)
                else:
                    self._release(point, delivery)
            elif len(point.targets) > 0:
                self._route(point, delivery)
            else:
                self._release(point, delivery)

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
            link = self._neighbor_sender(
                hop, f"{MESH_MULTICAST}{origin}/{point.address}", role=Role.MULTICAST_OUT
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
        link.send(payload, settled=True)
        point = link.context.point
        if point is not None:
            point.counters.deliveries_out += 1
        link.connection.context.deliveries_out += 1

    def _from_multicast(self, link: Link, state: LinkState, delivery: Delivery) -> None:
        if link.credit < TRANSIT_WINDOW // 2:
            link.flow(TRANSIT_WINDOW - link.credit)
        point = state.point
        if point is None:
            return
        point.counters.deliveries_in += 1
        self._fan_out(point, delivery, origin=state.router)

    # ------------------------------------------------------------------ waypoints

    def _sync_broker_targets(self, point: AddressPoint) -> None:
        """Sender links to every Active broker holding the address become its targets."""
        route = point.resolution.route
        active = {w.broker for w in route.active_waypoints} if route is not None else set()
        for link in point.targets.targets:
            if link.context.router not in active:
                point.targets.remove(link)
        for name in sorted(active):
            session = self.brokers.get(name)
            if session is None or not session.open or session.connection is None:
                continue
            sender = session.senders.get(point.address)
            if sender is None or not sender.is_open:
                sender = session.connection.open_sender(
                    point.address, name=f"{self.router_id}/{point.address}"
                )
                sender.context = LinkState(role=Role.BROKER_OUT, point=point, router=name)
                session.senders[point.address] = sender
            point.targets.add(sender)
        self._drain_pending(point)

    def _open_feeds(self, consumer: Link) -> None:
        state: LinkState = consumer.context
        point = state.point
        if point is None or point.resolution.route is None:
            return
        have = {feed.context.router for feed in state.feeds}
        for waypoint in point.resolution.route.waypoints:
            session = self.brokers.get(waypoint.broker)
            if waypoint.broker in have or session is None or not session.open:
                continue
            assert session.connection is not None
            source = consumer.source
            node = point.resolution.broker_address
            feed = session.connection.open_receiver(
                node,
                name=f"{consumer.connection.container_id}/{consumer.name}",
                source=Terminus(
                    address=node,
                    durable=source.durable,
                    expiry_policy=source.expiry_policy,
                    distribution_mode=source.distribution_mode,
                    capabilities=source.capabilities,
                    filter=source.filter,
                ),
            )
            feed.context = LinkState(
                role=Role.BROKER_IN, point=point, router=waypoint.broker, consumer=consumer
            )
            state.feeds.append(feed)
        self._feed_consumer(consumer, state)

    def _close_feeds(self, state: LinkState, *, detach: bool) -> None:
        for feed in state.feeds:
            feed.context.consumer = None
            if detach:
                feed.detach()
            else:
                feed.close()
        state.feeds.clear()
        while state.held:
            state.held.popleft().settle(Outcome.RELEASED)

    def _feed_consumer(self, consumer: Link, state: LinkState) -> None:
        """Held deliveries first; then every broker feed is topped up to the consumer's credit."""
        point = state.point
        held = state.held
        while held and consumer.credit > 0:
            self._send_to_consumer(point, consumer, held.popleft())
        want = consumer.credit - len(held)
        for feed in state.feeds:
            have = feed.credit
            # In batches: a flow frame to the broker for every message the consumer takes
            # would cost the router and the broker more than the message itself.
            if want > have and (have == 0 or have <= want // 2):
                feed.flow(want - have)

    def _from_broker(self, state: LinkState, delivery: Delivery) -> None:
        consumer = state.consumer
        point = state.point
        if consumer is None or point is None:
            delivery.settle(Outcome.RELEASED)
            return
        point.counters.deliveries_in += 1
        consumer_state: LinkState = consumer.context
        if consumer.credit > 0 and not consumer_state.held:
            self._send_to_consumer(point, consumer, delivery)
        else:
            consumer_state.held.append(delivery)

    def _send_to_consumer(
        self, point: AddressPoint | None, consumer: Link, delivery: Delivery
    ) -> None:
        settled = delivery.pre_settled
        consumer.send(delivery.payload, settled=settled, context=None if settled else delivery)
        consumer.connection.context.deliveries_out += 1
        if point is not None:
            point.counters.deliveries_out += 1

    def feed_lost(self, feed: Link) -> None:
        """A broker receiver went away (broker died, or refused): the consumer waits for another."""
        state: LinkState = feed.context
        consumer = state.consumer
        if consumer is not None and isinstance(consumer.context, LinkState):
            feeds = consumer.context.feeds
            if feed in feeds:
                feeds.remove(feed)

    def _sync_brokers(self) -> None:
        wanted = self.config.brokers()
        for name, session in list(self.brokers.items()):
            waypoint = wanted.get(name)
            if waypoint is None or (waypoint.host, waypoint.port) != (
                session.waypoint.host,
                session.waypoint.port,
            ):
                session.retired = True
                if session.connection is not None:
                    session.connection.close()
                del self.brokers[name]
        for name, waypoint in wanted.items():
            if name not in self.brokers:
                session = BrokerSession(waypoint=waypoint)
                self.brokers[name] = session
                self._dial_broker(session)

    def _dial_broker(self, session: BrokerSession) -> None:
        if session.retired:
            return
        from enmasse.router.handlers import BrokerHandler  # the handlers wrap this core

        session.connection = self.engine.connect(
            host=session.waypoint.host,
            port=session.waypoint.port,
            handler=BrokerHandler(self, session),
            # One container id for every router of the space: the broker names a durable
            # subscription after (container id, link name), and a subscriber that comes back
            # through another router must find the same one.
            container_id=BROKER_CONTAINER_ID,
            idle_timeout=self.idle_timeout,
        )

    def broker_open(self, session: BrokerSession, conn: Connection) -> None:
        session.open = True
        session.redial = 0
        self.open_connection(conn, role=ConnectionRole.BROKER)
        self._log.info("broker connected", broker=session.waypoint.broker)
        for point in self.points.values():
            if not point.waypoint:
                continue
            self._sync_broker_targets(point)
            for consumer in point.local:
                self._open_feeds(consumer)
            self._grant_credit(point)

    def broker_closed(self, session: BrokerSession, conn: Connection) -> None:
        self.close_record(conn)
        was_open, session.open = session.open, False
        session.senders.clear()
        if was_open:
            self._log.warning("broker connection lost", broker=session.waypoint.broker)
        if session.retired or self.brokers.get(session.waypoint.broker) is not session:
            return
        delay = REDIAL_SECONDS[min(session.redial, len(REDIAL_SECONDS) - 1)]
        session.redial += 1
        self.engine.call_later(delay, lambda: self._dial_broker(session))

    def broker_link_detached(self, link: Link) -> None:
        state = link.context
        if not isinstance(state, LinkState):
            return
        if state.role is Role.BROKER_IN:
            self.feed_lost(link)
            return
        point = state.point
        if point is not None:
            point.targets.remove(link)
            session = self.brokers.get(state.router)
            if session is not None and session.senders.get(point.address) is link:
                del session.senders[point.address]
        self._target_lost(link)

    # ------------------------------------------------------------------ mesh

    def _sync_peers(self) -> None:
        wanted = {p.router_id: p for p in self.config.peers}
        for router_id, neighbor in list(self.neighbors.items()):
            if router_id not in wanted:
                neighbor.connection.close(
                    Condition("amqp:connection:forced", f"router '{router_id}' left the mesh")
                )
        for peer in self.config.peers_to_dial(router_id=self.router_id):
            if peer.router_id not in self.neighbors and peer.router_id not in self._dialing:
                self._dial_peer(peer)

    def _dial_peer(self, peer: MeshPeer) -> None:
        current = {p.router_id: p for p in self.config.peers}.get(peer.router_id)
        if current is None or peer.router_id in self.neighbors:
            self._dialing.pop(peer.router_id, None)
            return
        from enmasse.router.handlers import MeshHandler

        self._dialing[peer.router_id] = self._dialing.get(peer.router_id, 0)
        self.engine.connect(
            host=current.host,
            port=current.port,
            handler=MeshHandler(self, expected=current.router_id),
            container_id=self.router_id,
            idle_timeout=self.idle_timeout,
        )

    def neighbor_open(self, conn: Connection, *, peer_id: str | None) -> None:
        if not peer_id or "/" in peer_id or peer_id == self.router_id:
            conn.close(Condition("amqp:unauthorized-access", f"'{peer_id}' is not a router id"))
            return
        if peer_id in self.neighbors:
            conn.close(
                Condition("amqp:resource-locked", f"router '{peer_id}' is already connected")
            )
            return
        self._dialing.pop(peer_id, None)
        self.open_connection(conn, role=ConnectionRole.INTER_ROUTER)
        cost = next((p.cost for p in self.config.peers if p.router_id == peer_id), 1)
        neighbor = Neighbor(router_id=peer_id, connection=conn, cost=cost)
        self.neighbors[peer_id] = neighbor
        control = conn.open_sender(MESH_CONTROL, name=f"{self.router_id}/control", settled=True)
        control.context = LinkState(role=Role.CONTROL_OUT, router=peer_id)
        neighbor.control = control
        for advert in self.mesh.adverts():
            neighbor.backlog.append(advert.encode())
        self._log.info("router connected", peer=peer_id)
        self._advertise()
        self._on_mesh_changed()

    def neighbor_closed(self, conn: Connection, *, expected: str | None) -> None:
        self.close_record(conn)
        gone = next((n for n in self.neighbors.values() if n.connection is conn), None)
        if gone is not None:
            del self.neighbors[gone.router_id]
            self._log.warning("router connection lost", peer=gone.router_id)
            self._advertise()
            self._on_mesh_changed()
        if expected is not None:
            peer = next((p for p in self.config.peers if p.router_id == expected), None)
            if peer is not None and expected not in self.neighbors:
                attempt = self._dialing.get(expected, 0)
                self._dialing[expected] = attempt + 1
                delay = REDIAL_SECONDS[min(attempt, len(REDIAL_SECONDS) - 1)]
                self.engine.call_later(delay, lambda: self._dial_peer(peer))
            else:
                self._dialing.pop(expected, None)

    def mesh_attach(self, link: Link) -> None:
        """A neighbour attached a link to us: control, anycast transit or multicast."""
        neighbor = self._neighbor_of(link.connection)
        address = link.address or ""
        if neighbor is None or link.is_sender:
            link.refuse(Condition("amqp:not-allowed", "inter-router links carry messages to us"))
            return
        if address == MESH_CONTROL:
            link.context = LinkState(role=Role.CONTROL_IN, router=neighbor.router_id)
            link.accept()
            link.flow(CONTROL_WINDOW)
            return
        router, target = _mesh_target(address)
        if router and target:
            role = Role.TRANSIT_IN if address.startswith(MESH_TO) else Role.MULTICAST_IN
            link.context = LinkState(role=role, point=self._transit_point(target), router=router)
            link.accept()
            link.flow(TRANSIT_WINDOW)
            return
        link.refuse(Condition("amqp:not-found", f"no inter-router address '{address}'"))

    def mesh_link_detached(self, link: Link) -> None:
        state = link.context
        if not isinstance(state, LinkState):
            return
        if state.role in (Role.TRANSIT_OUT, Role.MULTICAST_OUT):
            neighbor = self._neighbor_of(link.connection)
            if neighbor is not None:
                neighbor.senders.pop(link.address or "", None)
            point = state.point
            if point is not None:
                point.targets.remove(link)
                for router, remote in list(point.remote.items()):
                    if remote is link:
                        del point.remote[router]
            self._target_lost(link)

    def _neighbor_of(self, conn: Connection) -> Neighbor | None:
        return next((n for n in self.neighbors.values() if n.connection is conn), None)

    def _neighbor_sender(self, router_id: str, address: str, *, role: Role) -> Link | None:
        neighbor = self.neighbors.get(router_id)
        if neighbor is None:
            return None
        link = neighbor.senders.get(address)
        if link is None or not link.is_open:
            link = neighbor.connection.open_sender(address, name=f"{self.router_id}/{address}")
            point = self.points.get(_mesh_target(address)[1])
            link.context = LinkState(
                role=role,
                point=point,
                router=router_id,
                copies=CopyQueue() if role is Role.MULTICAST_OUT else None,
            )
            neighbor.senders[address] = link
        return link

    def _from_transit(self, link: Link, state: LinkState, delivery: Delivery) -> None:
        if link.credit < TRANSIT_WINDOW // 2:
            link.flow(TRANSIT_WINDOW - link.credit)
        point = state.point
        if point is None:
            self._release(None, delivery)
            return
        point.counters.deliveries_in += 1
        if state.router == self.router_id:
            if point.local:
                self._route(point, delivery, local_only=True)
            else:
                self._release(point, delivery)
            return
        hop = self.mesh.next_hop(state.router)
        onward = (
            self._neighbor_sender(hop, link.address or "", role=Role.TRANSIT_OUT) if hop else None
        )
        if onward is None:
            self._release(point, delivery)
            return
        settled = delivery.pre_settled
        onward.send(delivery.payload, settled=settled, context=None if settled else delivery)
        onward.connection.context.deliveries_out += 1

    def _from_control(self, link: Link, state: LinkState, delivery: Delivery) -> None:
        link.flow(1)
        try:
            body = codec.read_body(delivery.payload)
            advert = RouterAdvert.decode(body if isinstance(body, bytes) else str(body).encode())
        except (ValueError, codec.CodecError) as error:
            self._log.warning("bad advert", peer=state.router, error=str(error))
            return
        if self.mesh.learn(advert):
            self._flood(advert, skip=state.router)
            self._on_mesh_changed()

    def _advertise(self) -> None:
        addresses = [
            p.address for p in self.points.values() if p.local and p.kind in (ANYCAST, MULTICAST)
        ]
        neighbors = {n.router_id: n.cost for n in self.neighbors.values()}
        advert = self.mesh.set_local(neighbors=neighbors, addresses=addresses)
        if advert is not None:
            self._flood(advert, skip=None)
            self._on_mesh_changed()

    def _flood(self, advert: RouterAdvert, *, skip: str | None) -> None:
        encoded = advert.encode()
        for neighbor in self.neighbors.values():
            if neighbor.router_id != skip:
                neighbor.backlog.append(encoded)
                self._flush_control(neighbor.router_id)

    def _flush_control(self, router_id: str) -> None:
        neighbor = self.neighbors.get(router_id)
        if neighbor is None or neighbor.control is None:
            return
        control = neighbor.control
        while neighbor.backlog and control.credit > 0:
            control.send(codec.encode_message(neighbor.backlog.popleft()), settled=True)

    def _on_mesh_changed(self) -> None:
        for point in list(self.points.values()):
            point.multicast_hops.clear()
            if point.kind in (ANYCAST, DYNAMIC):
                self._refresh_remote_targets(point)
                self._drain_pending(point)
                self._grant_credit(point)

    def _refresh_remote_targets(self, point: AddressPoint) -> None:
        """One target per other router with consumers, through the next hop towards it."""
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
        for router in sorted(wanted - set(point.remote)):
            hop = self.mesh.next_hop(router)
            if hop is None:
                continue
            sender = self._neighbor_sender(
                hop, f"{MESH_TO}{router}/{point.address}", role=Role.TRANSIT_OUT
            )
            if sender is None:
                continue
            sender.context.point = point
            point.remote[router] = sender
            point.targets.add(sender)

    # ------------------------------------------------------------------ admin views

    def stats(self, *, address: str) -> router_pb2.RouterStats:
        """Every configured address (used here or not) and every other address in use."""
        names = [
            *self.config.addresses,
            *(a for a in self.points if a not in self.config.addresses),
        ]
        addresses = [self._address_stats(name) for name in names if not address or name == address]
        return router_pb2.RouterStats(
            router_id=self.router_id,
            generation=self.config.generation,
            addresses=addresses,
            connections=self.connection_infos(),
            reachable_routers=self.mesh.reachable(),
        )

    def _address_stats(self, address: str) -> router_pb2.AddressStats:
        point = self.points.get(address)
        route = self.config.route(address)
        remote = len(self.mesh.routers_with_consumers(address))
        if point is None:
            kind = route.distribution.value if route is not None else ANYCAST
            return router_pb2.AddressStats(address=address, type=kind, remote_routers=remote)
        c = point.counters
        return router_pb2.AddressStats(
            address=address,
            type=point.kind,
            deliveries_in=c.deliveries_in,
            deliveries_out=c.deliveries_out,
            accepted=c.accepted,
            rejected=c.rejected,
            released=c.released,
            modified=c.modified,
            dropped=c.dropped,
            consumers=len(point.local),
            producers=len(point.producers),
            remote_routers=remote,
        )

    def connection_infos(self) -> list[router_pb2.ConnectionInfo]:
        return [
            router_pb2.ConnectionInfo(
                id=record.id,
                container_id=record.connection.container_id or "",
                remote=record.connection.peer,
                role=record.role.value,
                user=record.connection.user or "",
                links=len(record.connection.links),
                deliveries_in=record.deliveries_in,
                deliveries_out=record.deliveries_out,
            )
            for record in self.connections.values()
        ]

    def link_infos(self, *, connection_id: int) -> list[router_pb2.LinkInfo]:
        infos = []
        for record in self.connections.values():
            if connection_id and record.id != connection_id:
                continue
            for link in record.connection.links:
                state = link.context
                infos.append(
                    router_pb2.LinkInfo(
                        connection_id=record.id,
                        name=link.name,
                        role="sender" if link.is_sender else "receiver",
                        address=link.address or "",
                        credit=link.credit,
                        unsettled=len(link.unsettled),
                        deliveries=state.deliveries if isinstance(state, LinkState) else 0,
                    )
                )
        return infos

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


def _mesh_target(address: str) -> tuple[str, str]:
    """`_mesh/to/<router>/<address>` or `_mesh/mc/<router>/<address>` -> (router, address)."""
    for prefix in (MESH_TO, MESH_MULTICAST):
        if address.startswith(prefix):
            router, _, target = address[len(prefix) :].partition("/")
            return router, target
    return "", ""


def _has_credit(link: Link) -> bool:
    return link.credit > 0


_OUTCOME_NAMES = {
    Outcome.ACCEPTED: "accepted",
    Outcome.REJECTED: "rejected",
    Outcome.RELEASED: "released",
    Outcome.MODIFIED: "modified",
    Outcome.NONE: "released",
}
