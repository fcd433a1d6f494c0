"""The router's side of the brokers of its space: waypoints for queue, topic and subscription.

What flows in: the configuration's brokers (each with Active / Draining per address), producers'
deliveries the core routes to a waypoint address, client consumers attaching to one, and the
brokers' own events (connection up or lost, credit, outcomes, deliveries for a consumer). What
flows out: one connection per broker (redialled after a loss), a sender link per address and
broker that the core balances over as the address's targets (Active brokers only: a Draining one
takes no new messages), and per client consumer one receiver per broker holding the address,
which pulls on the consumer's credit and hands the consumer's outcome back to the broker.

Why a receiver per consumer and not one shared feed: the broker's subscription semantics hang on
the link. A topic subscriber's link is named after the client's container id and link name and
carries the client's source terminus (durable, expiry policy, capabilities, filter), and every
router connects to brokers with the same container id, so a durable subscriber that comes back,
through any router of the mesh, finds its subscription.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from enmasse.common.amqp.engine import Connection, Delivery, Link, Outcome, Terminus
from enmasse.router.config import Waypoint
from enmasse.router.points import REDIAL_SECONDS, AddressPoint, ConnectionRole, LinkState, Role

if TYPE_CHECKING:
    from enmasse.router.forwarding import Router

BROKER_CONTAINER_ID = "enmasse-router"


@dataclass(eq=False)
class BrokerSession:
    waypoint: Waypoint
    connection: Connection | None = None
    open: bool = False
    senders: dict[str, Link] = field(default_factory=dict)
    redial: int = 0
    retired: bool = False


class BrokerLinks:
    """Connections and links to the brokers of the space, for one router."""

    def __init__(self, router: Router) -> None:
        self.router = router
        self.sessions: dict[str, BrokerSession] = {}

    def sync_targets(self, point: AddressPoint) -> None:
        """Sender links to every Active broker holding the address become its targets."""
        route = point.resolution.route
        active = {w.broker for w in route.active_waypoints} if route is not None else set()
        for link in point.targets.targets:
            if link.context.router not in active:
                point.targets.remove(link)
        for name in sorted(active):
            session = self.sessions.get(name)
            if session is None or not session.open or session.connection is None:
                continue
            sender = session.senders.get(point.address)
            if sender is None or not sender.is_open:
                sender = session.connection.open_sender(
                    point.address, name=f"{self.router.router_id}/{point.address}"
                )
                sender.context = LinkState(role=Role.BROKER_OUT, point=point, router=name)
                session.senders[point.address] = sender
            point.targets.add(sender)
        self.router.drain_pending(point)

    def open_feeds(self, consumer: Link) -> None:
        state: LinkState = consumer.context
        point = state.point
        if point is None or point.resolution.route is None:
            return
        have = {feed.context.router for feed in state.feeds}
        for waypoint in point.resolution.route.waypoints:
            session = self.sessions.get(waypoint.broker)
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
        self.feed_consumer(consumer, state)

    def close_feeds(self, state: LinkState, *, detach: bool) -> None:
        for feed in state.feeds:
            feed.context.consumer = None
            if detach:
                feed.detach()
            else:
                feed.close()
        state.feeds.clear()
        while state.held:
            state.held.popleft().settle(Outcome.RELEASED)

    def feed_consumer(self, consumer: Link, state: LinkState) -> None:
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

    def from_broker(self, state: LinkState, delivery: Delivery) -> None:
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

    def _feed_lost(self, feed: Link) -> None:
        """A broker receiver went away (broker died, or refused): the consumer waits for another."""
        state: LinkState = feed.context
        consumer = state.consumer
        if consumer is not None and isinstance(consumer.context, LinkState):
            feeds = consumer.context.feeds
            if feed in feeds:
                feeds.remove(feed)

    def sync(self) -> None:
        wanted = self.router.config.brokers()
        for name, session in list(self.sessions.items()):
            waypoint = wanted.get(name)
            if waypoint is None or (waypoint.host, waypoint.port) != (
                session.waypoint.host,
                session.waypoint.port,
            ):
                session.retired = True
                if session.connection is not None:
                    session.connection.close()
                del self.sessions[name]
        for name, waypoint in wanted.items():
            if name not in self.sessions:
                session = BrokerSession(waypoint=waypoint)
                self.sessions[name] = session
                self._dial(session)

    def _dial(self, session: BrokerSession) -> None:
        if session.retired:
            return
        from enmasse.router.handlers import BrokerHandler  # the handlers wrap this module

        session.connection = self.router.engine.connect(
            host=session.waypoint.host,
            port=session.waypoint.port,
            handler=BrokerHandler(self.router, session),
            # One container id for every router of the space: the broker names a durable
            # subscription after (container id, link name), and a subscriber that comes back
            # through another router must find the same one.
            container_id=BROKER_CONTAINER_ID,
            idle_timeout=self.router.idle_timeout,
        )

    def broker_open(self, session: BrokerSession, conn: Connection) -> None:
        session.open = True
        session.redial = 0
        self.router.open_connection(conn, role=ConnectionRole.BROKER)
        self.router.log.info("broker connected", broker=session.waypoint.broker)
        for point in self.router.points.values():
            if not point.waypoint:
                continue
            self.sync_targets(point)
            for consumer in point.local:
                self.open_feeds(consumer)
            self.router.grant_credit(point)

    def broker_closed(self, session: BrokerSession, conn: Connection) -> None:
        self.router.close_record(conn)
        was_open, session.open = session.open, False
        session.senders.clear()
        if was_open:
            self.router.log.warning("broker connection lost", broker=session.waypoint.broker)
        if session.retired or self.sessions.get(session.waypoint.broker) is not session:
            return
        delay = REDIAL_SECONDS[min(session.redial, len(REDIAL_SECONDS) - 1)]
        session.redial += 1
        self.router.engine.call_later(delay, lambda: self._dial(session))

    def link_detached(self, link: Link) -> None:
        state = link.context
        if not isinstance(state, LinkState):
            return
        if state.role is Role.BROKER_IN:
            self._feed_lost(link)
            return
        point = state.point
        if point is not None:
            point.targets.remove(link)
            session = self.sessions.get(state.router)
            if session is not None and session.senders.get(point.address) is link:
                del session.senders[point.address]
        self.router.target_lost(link)
