"""The router's side of the brokers of its space: waypoints for queue, topic and subscription.

What flows in: the configuration's brokers (each with Active / Draining per address), producers'
deliveries the core routes to a waypoint address, client consumers attaching to one, and the
brokers' own events (connection up or lost, credit, outcomes, deliveries for a consumer). What
flows out: one connection per broker (redialled after a loss), a sender link per address and
broker that the core balances over as the address's targets (Active brokers only: a Draining one
takes no new messages), and per client consumer one receiver per broker holding the address,
which pulls on the consumer's credit and hands the consumer's outcome back to the broker.

A broker may refuse a link (amqp:not-found: the storage-controller has not created the address
on it yet) or end one with an error (the address was deleted and made again). While the address
is still configured with that broker, the link is attached again after a short back-off (0.1 s
doubling to 2 s, for as long as it stays configured; back to 0.1 s after a success), because no
further configuration push may ever come to say "try again". A sender joins the address's
targets only once the broker has answered its attach, so producers get no credit (they wait, they
are not refused) until a broker really takes the address.

Why a receiver per consumer and not one shared feed: the broker's subscription semantics hang on
the link. A topic subscriber's link is named after the client's container id and link name and
carries the client's source terminus (durable, expiry policy, capabilities, filter), and every
router connects to brokers with the same container id, so a durable subscriber that comes back,
through any router of the mesh, finds its subscription.

A router with a certificate (`--tls-dir`) dials its brokers over mutual TLS: it presents its
certificate, which a standard space's broker requires (no one else reaches a broker's queues
behind the routers' back), and verifies the broker's against the same CA. A broker that turns
the router away is logged with the reason (again only when the reason changes: it is redialled
after a back-off, as when it is down).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from enmasse.amqp.engine import (
    Condition,
    Connection,
    ConnectionHandler,
    Delivery,
    Link,
    Outcome,
    Terminus,
    Timer,
    Tls,
)
from enmasse.router.config import Waypoint
from enmasse.router.core import ForwardingCore
from enmasse.router.points import (
    BROKER_IN,
    BROKER_OUT,
    REDIAL_SECONDS,
    UNREACHABLE,
    AddressPoint,
    ConnectionRole,
    LinkState,
)

BROKER_CONTAINER_ID = "enmasse-router"
REATTACH_FIRST_SECONDS = 0.1
REATTACH_MAX_SECONDS = 2.0


def reattach_delay(attempts: int) -> float:
    """Back-off before the next attach of a refused broker link: 0.1 s doubling to 2 s."""
    return min(REATTACH_FIRST_SECONDS * 2 ** min(attempts, 16), REATTACH_MAX_SECONDS)


@dataclass(eq=False)
class Reattach:
    """A broker link that the broker refused or ended, waiting to be attached again."""

    attempts: int = 0
    timer: Timer | None = None

    def cancel(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None


@dataclass(eq=False)
class BrokerSession:
    waypoint: Waypoint
    connection: Connection | None = None
    open: bool = False
    senders: dict[str, Link] = field(default_factory=dict)
    attached: set[str] = field(default_factory=set)  # addresses whose sender the broker took
    sender_retries: dict[str, Reattach] = field(default_factory=dict)  # by address
    feed_retries: dict[Link, Reattach] = field(default_factory=dict)  # by client consumer
    redial: int = 0
    retired: bool = False
    refusal: str = ""  # why the broker last turned us away, as logged (logged again on change)

    def forget_links(self) -> None:
        """The connection is gone: its links and their pending re-attaches with it."""
        self.senders.clear()
        self.attached.clear()
        for retry in [*self.sender_retries.values(), *self.feed_retries.values()]:
            retry.cancel()
        self.sender_retries.clear()
        self.feed_retries.clear()


class BrokerLinks:
    """Connections and links to the brokers of the space, for one router (its forwarding core
    seen through `core.ForwardingCore`)."""

    def __init__(
        self,
        router: ForwardingCore,
        *,
        handler_for_broker: Callable[[BrokerSession], ConnectionHandler],
    ) -> None:
        self.router = router
        # The engine handler of a broker connection (`handlers.py`, wired by main): passed in,
        # so this module need not import the handlers that wrap it.
        self._handler_for_broker = handler_for_broker
        self.sessions: dict[str, BrokerSession] = {}
        # This router's certificate and the CA the brokers' must chain to (set by main); None:
        # plain TCP.
        self.tls: Tls | None = None

    def sync_targets(self, point: AddressPoint) -> None:
        """Sender links to every Active broker holding the address become its targets."""
        active = _active_brokers(point)
        for link in point.targets.targets:
            if link.context.router not in active:
                point.targets.remove(link)
        for name in sorted(active):
            session = self.sessions.get(name)
            if session is None or not session.open or session.connection is None:
                continue
            retry = session.sender_retries.get(point.address)
            if retry is not None and retry.timer is not None:
                continue  # refused a moment ago: the back-off says when to ask again
            sender = session.senders.get(point.address)
            if sender is None or not sender.is_open:
                sender = session.connection.open_sender(
                    point.address, name=f"{self.router.router_id}/{point.address}"
                )
                sender.context = LinkState(role=BROKER_OUT, point=point, router=name)
                session.senders[point.address] = sender
                session.attached.discard(point.address)
            elif point.address in session.attached:
                sender.context.point = point
                point.targets.add(sender)
        self.router.drain_pending(point)

    def link_opened(self, link: Link) -> None:
        """The broker took a link we attached: a sender becomes a target, a feed is live."""
        state = link.context
        if not isinstance(state, LinkState):
            return
        session = self.sessions.get(state.router)
        if session is None or link.connection is not session.connection:
            return
        point = state.point
        if state.role is BROKER_IN:
            if state.consumer is not None:
                self._reattached(session.feed_retries.pop(state.consumer, None), link)
            return
        if point is None or session.senders.get(point.address) is not link:
            return
        session.attached.add(point.address)
        self._reattached(session.sender_retries.pop(point.address, None), link)
        current = self.router.points.get(point.address)
        if current is None:
            return
        state.point = current
        if state.router in _active_brokers(current):
            current.targets.add(link)
        self.router.drain_pending(current)
        self.router.grant_credit(current)

    def _reattached(self, retry: Reattach | None, link: Link) -> None:
        if retry is not None:
            retry.cancel()
            self.router.log.info(
                "broker link attached again",
                broker=link.context.router,
                address=link.address,
                attempts=retry.attempts,
            )

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
            retry = session.feed_retries.get(consumer)
            if retry is not None and retry.timer is not None:
                continue  # refused a moment ago: the back-off says when to ask again
            assert session.connection is not None
            source = consumer.source
            node = point.resolution.broker_address
            feed = session.connection.open_receiver(
                node,
                name=_feed_name(consumer),
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
                role=BROKER_IN, point=point, router=waypoint.broker, consumer=consumer
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
        self._send_held(consumer, state)
        if state.draining:
            return  # a drain is on its way through the brokers: no new credit meanwhile
        want = consumer.credit - len(state.held)
        if consumer.draining:
            self._drain_feeds(consumer, state, want=want)
            return
        for feed in state.feeds:
            have = feed.credit
            # In batches: a flow frame to the broker for every message the consumer takes
            # would cost the router and the broker more than the message itself.
            if want > have and (have == 0 or have <= want // 2):
                feed.flow(want - have)

    def _drain_feeds(self, consumer: Link, state: LinkState, *, want: int) -> None:
        """The consumer asked to drain (a receive-no-wait): every broker feed is asked the same,
        and the consumer gets its left-over credit back once all of them answered."""
        feeds = [feed for feed in state.feeds if feed.is_open]
        if want <= 0 or not feeds:
            consumer.drained()
            return
        for feed in feeds:
            feed.drain(max(want - feed.credit, 0))
        state.draining = set(feeds)

    def feed_drained(self, feed: Link) -> None:
        """A broker answered a drain: when the last one has, so does the consumer."""
        consumer = feed.context.consumer if isinstance(feed.context, LinkState) else None
        if consumer is None or not isinstance(consumer.context, LinkState):
            return
        state = consumer.context
        state.draining.discard(feed)
        if state.draining:
            return
        self._send_held(consumer, state)
        consumer.drained()

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

    def _send_held(self, consumer: Link, state: LinkState) -> None:
        """What the brokers sent while the consumer had no credit goes first, as credit allows."""
        held = state.held
        while held and consumer.credit > 0:
            self._send_to_consumer(state.point, consumer, held.popleft())

    def _send_to_consumer(
        self, point: AddressPoint | None, consumer: Link, delivery: Delivery
    ) -> None:
        if delivery.pre_settled:
            consumer.send_settled(delivery.payload)
        else:
            consumer.send(delivery.payload, context=delivery)
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
            if feed in consumer.context.draining and consumer.is_open:
                self.feed_drained(feed)  # a broker gone has nothing more to send

    def sync(self) -> None:
        wanted = self.router.config.brokers()
        for name, session in list(self.sessions.items()):
            waypoint = wanted.get(name)
            if waypoint is None or (waypoint.host, waypoint.port) != (
                session.waypoint.host,
                session.waypoint.port,
            ):
                session.retired = True
                session.forget_links()
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
        session.connection = self.router.engine.connect(
            host=session.waypoint.host,
            port=session.waypoint.port,
            handler=self._handler_for_broker(session),
            # One container id for every router of the space: the broker names a durable
            # subscription after (container id, link name), and a subscriber that comes back
            # through another router must find the same one.
            container_id=BROKER_CONTAINER_ID,
            idle_timeout=self.router.idle_timeout,
            tls=self.tls,
        )

    def broker_open(self, session: BrokerSession, conn: Connection) -> None:
        session.open = True
        session.redial = 0
        session.refusal = ""
        self.router.open_connection(conn, role=ConnectionRole.BROKER)
        self.router.log.info("broker connected", broker=session.waypoint.broker)
        for point in self.router.points.values():
            if not point.waypoint:
                continue
            self.sync_targets(point)
            for consumer in point.local:
                self.open_feeds(consumer)
            self.router.grant_credit(point)

    def broker_closed(
        self, session: BrokerSession, conn: Connection, *, error: Condition | None
    ) -> None:
        self.router.close_record(conn)
        was_open, session.open = session.open, False
        session.forget_links()
        if was_open:
            self.router.log.warning("broker connection lost", broker=session.waypoint.broker)
        elif error is not None and error.name != UNREACHABLE:
            self._turned_away(session, error)
        if session.retired or self.sessions.get(session.waypoint.broker) is not session:
            return
        delay = REDIAL_SECONDS[min(session.redial, len(REDIAL_SECONDS) - 1)]
        session.redial += 1
        self.router.engine.call_later(delay, lambda: self._dial(session))

    def _turned_away(self, session: BrokerSession, error: Condition) -> None:
        """The broker turned the connection away (TLS: no certificate, another CA; a login)."""
        if error.description != session.refusal:
            session.refusal = error.description
            self.router.log.warning(
                "broker refused the router",
                broker=session.waypoint.broker,
                address=f"{session.waypoint.host}:{session.waypoint.port}",
                condition=error.name,
                error=error.description,
            )

    def link_detached(self, link: Link, *, error: Condition | None) -> None:
        """A broker link ended. Refused or ended by the broker while its connection lives on:
        attached again after a back-off, for as long as the address stays configured there."""
        state = link.context
        if not isinstance(state, LinkState):
            return
        session = self.sessions.get(state.router)
        if session is not None and link.connection is not session.connection:
            session = None  # a link of an earlier connection to that broker
        if state.role is BROKER_IN:
            consumer = state.consumer
            self._feed_lost(link)
            if session is not None and consumer is not None and not link.connection.closed:
                self._schedule_feed(session, consumer, error=error)
            return
        point = state.point
        if point is not None:
            point.targets.remove(link)
            if session is not None and session.senders.get(point.address) is link:
                del session.senders[point.address]
                session.attached.discard(point.address)
                if not link.connection.closed:
                    self._schedule_sender(session, point.address, error=error)
        self.router.target_lost(link)

    def _schedule_sender(
        self, session: BrokerSession, address: str, *, error: Condition | None
    ) -> None:
        retry = session.sender_retries.setdefault(address, Reattach())
        if retry.timer is not None:
            return
        self._refused(retry, session=session, address=address, error=error)
        retry.timer = self.router.engine.call_later(
            reattach_delay(retry.attempts), lambda: self._retry_sender(session, address)
        )
        retry.attempts += 1

    def _retry_sender(self, session: BrokerSession, address: str) -> None:
        retry = session.sender_retries.get(address)
        if retry is None:
            return
        retry.timer = None
        point = self.router.points.get(address)
        if (
            point is None
            or not point.waypoint
            or self.sessions.get(session.waypoint.broker) is not session
            or session.waypoint.broker not in _active_brokers(point)
        ):
            del session.sender_retries[address]  # no longer configured there: nothing to retry
            return
        self.sync_targets(point)

    def _schedule_feed(
        self, session: BrokerSession, consumer: Link, *, error: Condition | None
    ) -> None:
        retry = session.feed_retries.setdefault(consumer, Reattach())
        if retry.timer is not None:
            return
        self._refused(retry, session=session, address=consumer.address or "", error=error)
        retry.timer = self.router.engine.call_later(
            reattach_delay(retry.attempts), lambda: self._retry_feed(session, consumer)
        )
        retry.attempts += 1

    def _retry_feed(self, session: BrokerSession, consumer: Link) -> None:
        retry = session.feed_retries.get(consumer)
        if retry is None:
            return
        retry.timer = None
        state = consumer.context
        point = state.point if isinstance(state, LinkState) else None
        route = point.resolution.route if point is not None else None
        if (
            point is None
            or route is None
            or not consumer.is_open
            or consumer not in point.local
            or self.sessions.get(session.waypoint.broker) is not session
            or all(w.broker != session.waypoint.broker for w in route.waypoints)
        ):
            del session.feed_retries[consumer]  # consumer gone or address moved: stop
            return
        self.open_feeds(consumer)

    def _refused(
        self,
        retry: Reattach,
        *,
        session: BrokerSession,
        address: str,
        error: Condition | None,
    ) -> None:
        # Once per refusal streak, not per attempt: a broker that lacks the address for a
        # minute would otherwise write hundreds of lines.
        if retry.attempts == 0:
            self.router.log.warning(
                "broker refused a link; attaching again with back-off",
                broker=session.waypoint.broker,
                address=address,
                error=str(error) if error is not None else None,
            )


def _feed_name(consumer: Link) -> str:
    """The name of a consumer's link on a broker: the client's container id and link name, so a
    durable subscription is the client's across reconnects. A `shared` one (JMS shared, MQTT
    `$share/...`) is known on the broker by what its name holds before `|`: there, the
    client's link name leads, so the consumers of every connection and router share it."""
    name = f"{consumer.connection.container_id}/{consumer.name}"
    if "shared" in consumer.source.capabilities:
        return f"{consumer.name.split('|', 1)[0]}|{name}"
    return name


def _active_brokers(point: AddressPoint) -> set[str]:
    route = point.resolution.route
    return {w.broker for w in route.active_waypoints} if route is not None else set()
