"""The broker's AMQP side, on the shared engine (`enmasse.amqp.engine`).

What flows in: engine events per connection: a peer attaches a link (to send to a queue or topic,
or to receive from one), a message arrives, credit arrives, an outcome comes back, a link or the
connection ends. What flows out: calls on the `Broker` domain, and back to the peers: credit,
deliveries, settlements, refusals with AMQP conditions.

Why it is built so: the domain (queue, topic, journal) knows nothing of AMQP; this module maps one
onto the other and does no per-message work beyond that mapping. A producer's delivery is settled
ACCEPTED when the broker owns it: at once when it lives in memory, or from the journal's group
commit callback once its record is fsync'd (the `GroupCommitter` thread writes one batch while the
loop goes on; the next batch holds everything that arrived meanwhile, under ONE fsync). New
messages are handed to consumers once per loop turn, per queue, not once per message.
Pre-settled sends are taken at most once: nothing goes back to the producer, and a durable one
that was not yet fsync'd when the broker died is gone. Producers get credit in windows, topped up
only while the target has room: at the memory limit they simply wait. A window is 1,000 messages
bounded in bytes (`PRODUCER_BYTES`, by the router's rule in `enmasse.amqp.windows`): resized at
each top-up to what the link's messages since the last one weighed, and before the first bounded by
the link's max message size, so a link of 100 MiB messages (a client's, or a router's link shared
by its producers) holds one at a time, not 1,000; per message that costs one addition of its size.
Bad input (unknown address, dynamic targets, undecodable headers) is refused on that link alone; an
address the address rule refuses (`address_problem`, the one the config service checks
`spec.address` with) is refused at attach with amqp:invalid-field, never looked at again per
message; the engine already closes connections that send garbage or go silent, and rejects a
delivery over the size limit for its producer alone (amqp:link:message-size-exceeded; the link,
which a standard space's router shares among its producers, goes on).
A receiver's JMS selector (the `apache.org:selector-filter:string` source filter) is compiled
once at attach (`enmasse.amqp.selector`; one that does not parse is refused with
amqp:invalid-field and the parser's words): a queue consumer takes only what it selects, a
topic subscription's queue receives only that; the attach echoes the filter in the source.

A receiver that attaches with a dynamic source (`source {dynamic: true}`, a requester's reply
address) gets a temporary queue of its own (`Broker.create_dynamic_queue`), its `_dynamic/...`
name returned in the attach's source: in memory only, it lives as long as the link (the
default, delete-on-close), or as long as the connection when the source's expiry-policy says
`connection-close` (or `never`: nothing outlives its connection here), and is gone with its
messages when that ends. Anyone may send to it (the reply goes where `reply-to` says); only its
connection may receive from it (`ClientEndpoint`); a sender attaching to a reply address that
is gone is refused with amqp:not-found, and one whose reply address goes while it is attached
has its next delivery rejected with amqp:not-found and its link closed.

A sender with no target address is an anonymous relay (`relay.py`; ANONYMOUS-RELAY is in our
open frame): each message goes where its `to` says, and one that cannot is rejected alone (the
router's conditions), the link staying up; only a connection that attached one takes that path.

A sender whose target is a Coordinator is the connection's transaction coordinator
(`coordinator.py` maps Declare, Discharge and transactional transfers and dispositions onto
`transactions.py`): from its attach on, that connection's messages pass `Coordination.takes`
first, and a consumer's transactional disposition (`on_transactional_outcome`) holds the message
for the transaction; a connection without a coordinator never pays for any of it. A coordinator
link or connection that ends rolls its open transactions back.

A drain from another broker is an ordinary connection that presents a token from PrepareDrain
(inbox.py) in its open frame: only such a connection may attach a sending link to a subscription
queue (`<topic>::<identity>`; anyone else gets amqp:unauthorized-access), and its messages keep
the delivery-count their header carries. The token is read once per connection, at its first
sending link, and the per-message path of every other connection is untouched.

A brokered space's broker is its space's client endpoint (`Endpoint.clients`, `clients.py`): its
listeners check logins (plain port and amqps), each connection is admitted or turned away at open,
each session the client begins is ended at once beyond the plan's sessions per connection
(amqp:resource-limit-exceeded, as a router does), and each attach is checked before the address is
looked up (amqp:unauthorized-access or amqp:resource-limit-exceeded on that link alone); a new
client access closes the links that lost their right (`revoke`). A standard space's broker has no
`clients`: nothing of this runs there.
"""

from __future__ import annotations

import time
from collections.abc import Callable

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
from enmasse.amqp.message_trace import MARK, flagged_unsampled
from enmasse.amqp.selector import SelectorError, selector_of
from enmasse.amqp.throttle import LoginThrottle
from enmasse.amqp.windows import first_window, window
from enmasse.amqp.wire import OUTCOME_ACCEPTED
from enmasse.broker.broker import Broker, Conflict, NotFound, now_ms
from enmasse.broker.clients import ClientEndpoint
from enmasse.broker.config import Settings
from enmasse.broker.coordinator import Coordination, CoordinatorLink
from enmasse.broker.entry import IN_FLIGHT, Entry
from enmasse.broker.facts import message_facts
from enmasse.broker.hops import TracedMessages
from enmasse.broker.inbox import DRAIN_TOKEN_PROPERTY
from enmasse.broker.journal import GroupCommitter
from enmasse.broker.queue import ACCEPTED, MODIFIED, RELEASED, Queue, Settlement
from enmasse.broker.relay import Relay
from enmasse.broker.topic import durable_identity
from enmasse.broker.transactions import TransactionError, Transactions
from enmasse.resources.contracts import SUBSCRIPTION_SEPARATOR, dynamic_owner
from enmasse.resources.validation import address_problem

log = structlog.get_logger(__name__)

INVALID_FIELD = "amqp:invalid-field"
NOT_FOUND = "amqp:not-found"
NOT_IMPLEMENTED = "amqp:not-implemented"
DECODE_ERROR = "amqp:decode-error"
UNAUTHORIZED = "amqp:unauthorized-access"
RESOURCE_LOCKED = "amqp:resource-locked"
# In our open frame: clients check it before sending on a link without a target (`relay.py`).
OFFERED = ("ANONYMOUS-RELAY",)
# What one producer link's window may hold in bytes, once its message sizes are known
# (`enmasse.amqp.windows`, the router's rule): the credit window (1,000) of messages up to 16 kB,
# fewer of larger ones, never fewer than one; before its first message, a link's window holds
# this much of messages of its max size (100 MiB ones: one at a time).
PRODUCER_BYTES = 16 * 1024 * 1024


class Endpoint:
    """What every connection of the broker shares: the domain, the engine, group commit, reaper."""

    def __init__(self, *, engine: Engine, broker: Broker, settings: Settings) -> None:
        self.engine = engine
        self.broker = broker
        self.settings = settings
        self._commit_scheduled = False
        self._to_dispatch: set[Queue] = set()
        self._reaper: Timer | None = None
        self.traced = TracedMessages()
        # Recovered messages keep their traces: their consumer-side spans join them (hops.py).
        self.traced.recovered(broker.recovered.messages, queues=broker.queues)
        # A brokered space's broker: who may log in and attach (None: it serves routers).
        self.clients = (
            ClientEndpoint(revoke=_revoke, is_queue=lambda a: broker.find_queue(a) is not None)
            if settings.client_endpoint
            else None
        )
        self._logins = self.clients.logins() if self.clients is not None else None
        self._throttle = LoginThrottle()  # one count of failed logins for amqp and amqps
        broker.dispatch_later = self.dispatch_later
        broker.scheduler.use_loop(engine.call_later)  # scheduled delivery's timer (schedule.py)
        self.transactions = Transactions(broker)  # the coordinator's (coordinator.py)
        self.committer = (
            GroupCommitter(
                broker.journal, post=engine.call_soon_threadsafe, on_failure=self._journal_failed
            )
            if broker.journal is not None
            else None
        )

    def listen(self) -> int:
        port = self.engine.listen(
            host=self.settings.host,
            port=self.settings.port,
            handler_factory=lambda: BrokerConnection(self),
            max_message_size=self.settings.max_message_size,
            idle_timeout=self.settings.idle_timeout or None,
            tls=self.settings.router_tls,  # a standard space's broker: its routers only
            authenticator=self._logins,  # a brokered space's broker: its clients log in
            offered_capabilities=OFFERED,
            throttle=self._throttle,
        )
        self._reaper = self.engine.call_later(self.settings.reap_interval, self._reap)
        return port

    def listen_amqps(self, tls: Tls) -> int:
        """A client endpoint's TLS port, beside the plain one: the same logins (PLAIN over TLS
        whatever the plan says), the same throttle."""
        return self.engine.listen(
            host=self.settings.host,
            port=self.settings.amqps_port,
            handler_factory=lambda: BrokerConnection(self),
            max_message_size=self.settings.max_message_size,
            idle_timeout=self.settings.idle_timeout or None,
            tls=tls,
            authenticator=self._logins,
            throttle=self._throttle,
            offered_capabilities=OFFERED,
        )

    def schedule_commit(self) -> None:
        """At the end of this loop turn, hand what was journaled to the writer (if it is idle)."""
        if not self._commit_scheduled:
            self._commit_scheduled = True
            self.engine.call_soon(self._commit)

    def _journal_failed(self, exc: BaseException) -> None:
        # Without a journal, accepting durable messages would be a lie: stop, let the
        # supervisor restart us on a working disk, recover what was fsync'd.
        self.engine.stop()

    def dispatch_later(self, queue: Queue) -> None:
        """New messages go out once per loop turn, in one batch per queue."""
        if not self._to_dispatch:
            self.engine.call_soon(self._dispatch)
        self._to_dispatch.add(queue)

    def _dispatch(self) -> None:
        queues, self._to_dispatch = self._to_dispatch, set()
        now = now_ms()
        for queue in queues:
            queue.dispatch(now)

    def _commit(self) -> None:
        self._commit_scheduled = False
        if self.committer is not None:
            self.committer.kick()
        else:
            self.broker.commit()

    def stop(self) -> None:
        """Engine loop over: let the writer finish what it holds."""
        if self.committer is not None:
            self.committer.stop()

    def _reap(self) -> None:
        reaped = self.broker.reap()
        if reaped:
            log.info("messages expired", count=reaped)
            self.schedule_commit()  # the acks of expired journaled messages
        for topic, identity in self.broker.expire_subscriptions(now_ms()):
            log.info("subscription expired", topic=topic, subscription=identity)
            self.schedule_commit()  # the acks of what it held
        self._reaper = self.engine.call_later(self.settings.reap_interval, self._reap)


class LinkConsumer:
    """A consumer as the queue sees it: a sending link of ours and its credit.

    credit_left mirrors the link's credit without a call into proton per message: it is read
    from the link whenever the peer's flow changes it (`on_link_credit`) and counted down here
    for every delivery sent, the only other thing that changes it.
    """

    __slots__ = ("browse", "credit_left", "link", "queue", "subscription", "traced")

    def __init__(
        self,
        link: Link,
        queue: Queue,
        *,
        browse: bool,
        subscription: str | None,
        traced: TracedMessages | None = None,
    ) -> None:
        self.link = link
        self.queue = queue
        self.browse = browse
        self.subscription = subscription  # topic subscriptions: (topic, identity) bookkeeping
        self.traced = traced if traced is not None else TracedMessages()
        self.credit_left = link.credit

    def credit(self) -> int:
        return self.credit_left

    def deliver(self, entry: Entry) -> None:
        self.credit_left -= 1
        if self.traced.waiting and not self.browse:  # some sampled message waits somewhere
            self._deliver_traced(entry)
            return
        payload = entry.payload
        if entry.delivery_count:
            payload = codec.with_delivery_count(payload, entry.delivery_count)
        # Browsing is a look, not a hand-over: pre-settled, nothing to acknowledge.
        self.link.send(payload, settled=self.browse, context=entry)

    def _deliver_traced(self, entry: Entry) -> None:
        picked_ns = time.time_ns()
        waiting = self.traced.picked(entry.payload)
        payload = entry.payload
        if entry.delivery_count:
            payload = codec.with_delivery_count(payload, entry.delivery_count)
        self.link.send(payload, settled=False, context=entry)
        if waiting is not None:
            self.traced.dequeued(waiting, picked_ns=picked_ns)


class Producer:
    """A receiving link of ours: where its messages go and whether it waits for room.

    credit_left counts down the credit we granted, one per message that arrives (only our flow
    raises it), so the per-message check needs no call into proton; taken_bytes adds up what
    they weighed, and at the next top-up (below refill_below) the window is resized from the
    two (`BrokerConnection._grant`); granted is the credit it held after the last one.
    """

    __slots__ = (
        "address",
        "credit_left",
        "granted",
        "link",
        "refill_below",
        "taken_bytes",
        "waiting",
        "window",
    )

    def __init__(self, link: Link, address: str, *, window: int) -> None:
        self.link = link
        self.address = address
        self.waiting = False
        self.credit_left = 0
        self.window = window
        self.granted = 0
        self.taken_bytes = 0
        self.refill_below = 1


def settlement_of(delivery: Delivery, outcome: Outcome) -> Settlement:
    if outcome == Outcome.ACCEPTED:
        return Settlement.ACCEPTED
    if outcome == Outcome.REJECTED:
        return Settlement.REJECTED
    if outcome == Outcome.MODIFIED:
        return Settlement.FAILED if delivery.delivery_failed else Settlement.MODIFIED
    return Settlement.RELEASED  # released, or settled without an outcome


def _no_longer_first_acquirer(queue: Queue, entry: Entry) -> None:
    """A message about to be given back unchanged (released, modified) has still been acquired:
    a header that says first-acquirer goes out again saying false (AMQP 1.0 §3.2.1). Rewritten
    once, on its way back, not per delivery (a redelivery with a count > 0 gets a new header
    anyway); an entry held by a consumer is the queue's, so `rewrite` counts its new size."""
    if entry.state is IN_FLIGHT and codec.read_header(entry.payload).first_acquirer:
        queue.rewrite(entry, codec.with_delivery_count(entry.payload, entry.delivery_count))


class BrokerConnection(ConnectionHandler):
    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self.broker = endpoint.broker
        self.clients = endpoint.clients
        self.window = endpoint.settings.credit_window
        self.container_id = ""
        self._drain: bool | None = None  # a drain's connection; read at the first sender link
        # The temporary queues this connection made: name -> lives as long as the connection
        # (False: as long as its link)
        self._dynamic: dict[str, bool] = {}
        # How named links' messages are taken, once an anonymous relay link came (`_attach_relay`)
        self._named_message: Callable[[Link, Delivery], None] | None = None
        # Its transactions, once a coordinator attached (`_attach_coordinator`)
        self._coordination: Coordination | None = None
        self._plain_message: Callable[[Link, Delivery], None] | None = None

    def on_connection_open(self, conn: Connection) -> None:
        self.container_id = conn.container_id or ""
        log.debug("connection opened", peer=conn.peer, container=self.container_id)
        if self.clients is not None:
            admitted = self.clients.admit(conn)
            if isinstance(admitted, Condition):
                log.info("connection refused", peer=conn.peer, user=conn.user, error=str(admitted))
                conn.close(admitted)

    def on_connection_close(self, conn: Connection, error: Condition | None) -> None:
        if self._coordination is not None:
            self._coordination.end()  # open transactions roll back
        for name in list(self._dynamic):
            self._drop_dynamic(name)
        if self.clients is not None:
            self.clients.forget(conn)
        if error is not None:
            log.info("connection closed", peer=conn.peer, error=str(error))

    def on_session_begin(self, conn: Connection, *, held: int) -> Condition | None:
        """A client endpoint holds a connection to its plan's sessions (`clients.py`)."""
        if self.clients is None:
            return None
        return self.clients.session_refusal(held=held)

    # ------------------------------------------------------------------ attach / detach

    def on_link_attach(self, link: Link) -> None:
        if link.target.coordinator and not link.is_sender:
            self._attach_coordinator(link)
            return
        if link.is_sender and link.source.dynamic:
            self._attach_dynamic_consumer(link)
            return
        if self.clients is not None and self._client_refused(link, self.clients):
            return
        if link.is_sender:
            self._attach_consumer(link)
        else:
            self._attach_producer(link)

    def _attach_coordinator(self, link: Link) -> None:
        """A transaction coordinator (coordinator.py, transactions.py). From now on this
        connection's messages pass its `takes` first; a connection without one never does."""
        if self._coordination is None:
            self._coordination = Coordination(
                transactions=self.endpoint.transactions,
                owner=self,
                schedule_commit=self.endpoint.schedule_commit,
            )
            self._plain_message = self.on_message
            self.on_message = self._on_message_in_transactions  # type: ignore[method-assign,assignment]
        self._coordination.attach(link)

    def _on_message_in_transactions(self, link: Link, delivery: Delivery) -> None:
        coordination = self._coordination
        plain = self._plain_message
        assert coordination is not None
        assert plain is not None
        sends = type(link.context) in (Producer, Relay)
        publish = self._publish_in_transaction if sends else None
        if not coordination.takes(link, delivery, publish=publish):
            plain(link, delivery)

    def _publish_in_transaction(self, txn_id: bytes | None, delivery: Delivery) -> None:
        """A producer's message sent under a transaction: held until it commits. On an
        anonymous relay its `to` says where, decided as for any relayed message."""
        assert self._coordination is not None
        producer: Producer = delivery.link.context
        if type(producer) is Relay:
            to = producer.destination(delivery, broker=self.broker, clients=self.clients)
            if isinstance(to, Condition):
                delivery.link.flow(1)  # refused alone, as a relayed message (`_on_any_message`)
                raise TransactionError(to.name, to.description)
            producer.address = to
        try:
            durable, ttl, expiry, priority = message_facts(delivery.payload)
        except (codec.CodecError, IndexError, ValueError) as exc:
            raise TransactionError(DECODE_ERROR, str(exc)) from exc
        self._coordination.transactions.publish(
            txn_id,
            owner=self,
            address=producer.address,
            payload=delivery.payload,
            durable=durable,
            ttl_ms=ttl,
            absolute_expiry_ms=expiry,
            priority=priority,
        )
        producer.taken_bytes += len(delivery.payload)
        producer.credit_left -= 1
        if producer.credit_left < producer.refill_below:
            self._top_up(producer)

    @staticmethod
    def _client_refused(link: Link, clients: ClientEndpoint) -> bool:
        """A client endpoint's checks, before the address is looked up (its existence is not
        told to whoever may not use it): True when the link was refused."""
        terminus = link.source if link.is_sender else link.target
        if terminus.dynamic or not link.address:
            return False  # refused below: the broker needs an address
        refusal = clients.attach_refusal(link, link.address)
        if refusal is None:
            return False
        link.refuse(refusal)
        return True

    def revoke(self, link: Link, error: Condition) -> None:
        """A new client access took the link's right away: it stops being a consumer or a
        producer now (a durable subscription stays, as when its subscriber detaches) and is
        closed with `error`; its detach later finds nothing left to do."""
        self.on_link_detach(link, closed=False, error=error)
        link.context = None
        link.close(error)

    def _attach_dynamic_consumer(self, link: Link) -> None:
        """A receiver asked for a reply address: a temporary queue of its own, named in the
        attach's source (see the module docstring for how long it lives)."""
        queue = self.broker.create_dynamic_queue()
        name = queue.name
        link.set_dynamic_address(name)
        self._dynamic[name] = link.source.expiry_policy in ("connection-close", "never")
        if self.clients is not None:
            self.clients.claim(name, link.connection)
            refusal = self.clients.attach_refusal(link, name)
            if refusal is not None:  # a link limit, or a connection being closed
                self._drop_dynamic(name)
                link.refuse(refusal)
                return
        try:
            selector = selector_of(link.source.filter)
        except SelectorError as error:
            self._drop_dynamic(name)
            link.refuse(Condition(INVALID_FIELD, str(error)))
            return
        consumer = LinkConsumer(
            link, queue, browse=False, subscription=None, traced=self.endpoint.traced
        )
        queue.add_consumer(consumer, browse=False, selector=selector)
        link.context = consumer
        link.accept()
        log.debug("dynamic queue created", queue=name, container=self.container_id)

    def _drop_dynamic(self, name: str) -> None:
        self._dynamic.pop(name, None)
        gone = self.broker.drop_dynamic_queue(name)
        if self.clients is not None:
            self.clients.release(name)
        log.debug("dynamic queue gone", queue=name, messages=gone)

    def _attach_producer(self, link: Link) -> None:
        address = link.address
        if link.target.dynamic:
            link.refuse(Condition(NOT_IMPLEMENTED, "the broker needs a target address"))
            return
        if not address:
            self._attach_relay(link)
            return
        if self._refused_address(link, address):
            return
        if dynamic_owner(address) is not None and self.broker.find_queue(address) is None:
            link.refuse(
                Condition(
                    NOT_FOUND,
                    f"reply address {address!r} is gone: the receiver that asked for it "
                    "detached, or its connection closed",
                )
            )
            return
        drain = self._is_drain(link.connection)
        if SUBSCRIPTION_SEPARATOR in address and not drain:
            link.refuse(
                Condition(
                    UNAUTHORIZED,
                    f"{address!r} is a subscription queue: only a drain from another broker "
                    "(with a PrepareDrain token) may send to it",
                )
            )
            return
        if self.broker.find_queue(address) is None and address not in self.broker.topics:
            link.refuse(Condition(NOT_FOUND, f"no queue or topic {address!r} on this broker"))
            return
        producer = Producer(link, address, window=self._first_window(link))
        link.context = producer
        link.accept()
        self._top_up(producer)

    def _first_window(self, link: Link) -> int:
        """A new producer link's window: bounded by what messages of its max size weigh."""
        return first_window(
            messages=self.window, budget=PRODUCER_BYTES, max_message_size=link.max_message_size
        )

    def _attach_relay(self, link: Link) -> None:
        """A sender with no target address: an anonymous relay (`relay.py`), each message going
        where its `to` says. From now on this connection's messages ask which kind of link they
        came on; a connection without one never does."""
        if self.clients is not None:
            refusal = self.clients.relay_refusal(link)
            if refusal is not None:
                link.refuse(refusal)
                return
        relay = Relay(link, window=self._first_window(link))
        link.context = relay
        if self._named_message is None:
            self._named_message = self.on_message
            self.on_message = self._on_any_message  # type: ignore[method-assign,assignment]
        link.accept()
        self._grant(relay)  # no address yet whose room to wait for

    def _on_any_message(self, link: Link, delivery: Delivery) -> None:
        relay = link.context
        if type(relay) is not Relay:
            self._named_message(link, delivery)  # type: ignore[misc]
            return
        to = relay.destination(delivery, broker=self.broker, clients=self.clients)
        if isinstance(to, Condition):
            delivery.settle(Outcome.REJECTED, error=to)
            link.flow(1)  # that one weighs nothing here
            return
        relay.address = to  # what the credit now waits on (see `_top_up`)
        BrokerConnection.on_message(self, link, delivery, properties=delivery.properties)

    def _refused_address(self, link: Link, address: str) -> bool:
        """Refuses the link (the connection stays) when the address breaks the address rule;
        `<topic>::<name>` names a subscription queue here, and `_dynamic/...` a reply
        address, so they are allowed."""
        if dynamic_owner(address) is not None:
            return False
        problem = address_problem(address, subscription_queue=True)
        if problem is None:
            return False
        link.refuse(Condition(INVALID_FIELD, f"address is invalid: {problem}"))
        return True

    def _is_drain(self, conn: Connection) -> bool:
        if self._drain is None:
            token = conn.remote_properties.get(DRAIN_TOKEN_PROPERTY)
            self._drain = self.broker.drain_tokens.redeem(token)
            if self._drain:
                # Only a drain's messages carry a delivery-count to keep: its connection alone
                # takes the path that reads it.
                self.on_message = self._on_drained_message  # type: ignore[method-assign,assignment]
                log.info("drain connection", peer=conn.peer, container=self.container_id)
        return self._drain

    def _on_drained_message(self, link: Link, delivery: Delivery) -> None:
        try:
            count = codec.read_header(delivery.payload).delivery_count
        except (codec.CodecError, IndexError, ValueError):
            count = 0  # on_message refuses what cannot be decoded
        BrokerConnection.on_message(self, link, delivery, delivery_count=count)

    def _attach_consumer(self, link: Link) -> None:
        address = link.address
        source = link.source
        if source.dynamic or not address:
            link.refuse(Condition(NOT_IMPLEMENTED, "the broker needs a source address"))
            return
        if self._refused_address(link, address):
            return
        try:
            # JMS selector (source filter): parsed once here, refused with the parser's words
            selector = selector_of(source.filter)
        except SelectorError as error:
            link.refuse(Condition(INVALID_FIELD, str(error)))
            return
        subscription = None
        if address in self.broker.topics:
            durable = source.durable > 0 and source.expiry_policy == "never"
            if durable:
                identity = durable_identity(
                    container_id=self.container_id,
                    link_name=link.name,
                    shared="shared" in source.capabilities,
                )
            else:
                identity = f"{self.container_id}|{link.name}|{id(link):x}"
            try:
                subscribed = self.broker.subscribe(
                    address, identity=identity, durable=durable, selector=selector
                )
            except Conflict as error:
                link.refuse(Condition(RESOURCE_LOCKED, str(error)))
                return
            queue = subscribed.queue
            subscription = identity
            selector = None  # the subscription filters what its queue receives
        else:
            found = self.broker.find_queue(address)
            if found is None:
                link.refuse(Condition(NOT_FOUND, f"no queue or topic {address!r} on this broker"))
                return
            queue = found
        consumer = LinkConsumer(
            link,
            queue,
            browse=source.distribution_mode == "copy",
            subscription=subscription,
            traced=self.endpoint.traced,
        )
        queue.add_consumer(consumer, browse=consumer.browse, selector=selector)
        link.context = consumer
        link.accept()

    def on_link_detach(self, link: Link, *, closed: bool, error: Condition | None) -> None:
        context = link.context
        if isinstance(context, LinkConsumer):
            queue = context.queue
            queue.remove_consumer(context)
            if self._coordination is not None or self.endpoint.transactions.open:
                self.endpoint.transactions.consumer_gone(context)
            if context.subscription is not None:
                self._end_subscription(link, context, closed=closed)
            if self._dynamic and self._dynamic.get(queue.name) is False:
                if not queue.consumer_count:  # a reply address that lives with its link(s)
                    self._drop_dynamic(queue.name)
                return
            queue.dispatch(now_ms())  # what it held goes to the others
            self.endpoint.schedule_commit()
        elif isinstance(context, Producer):
            context.waiting = False
        elif isinstance(context, CoordinatorLink) and self._coordination is not None:
            self._coordination.end()  # its open transactions roll back

    def _end_subscription(self, link: Link, consumer: LinkConsumer, *, closed: bool) -> None:
        topic = link.address or ""
        sub = self.broker.topics.get(topic)
        found = sub.subscriptions.get(consumer.subscription or "") if sub else None
        if found is None:
            return
        if found.durable and not closed:
            # durable: keeps collecting while the subscriber is away, for ever or, when its
            # source asked for a timeout (s), that long after the last subscriber left
            if link.source.timeout > 0 and not found.queue.consumer_count:
                until = now_ms() + 1000 * link.source.timeout
                self.broker.lease_subscription(topic, found.identity, until_ms=until)
            return
        if found.queue.consumer_count:
            return  # a shared subscription still has other consumers
        self.broker.unsubscribe(topic, found.identity)

    # ------------------------------------------------------------------ producers

    def on_message(
        self,
        link: Link,
        delivery: Delivery,
        delivery_count: int = 0,
        *,
        properties: codec.Properties | None = None,
    ) -> None:
        """`properties`: the message's, when read already (a relayed message's, for its `to`)."""
        producer: Producer = link.context
        payload = delivery.payload
        try:
            durable, ttl, expiry, priority = message_facts(payload, properties=properties)
        except (codec.CodecError, IndexError, ValueError) as exc:
            delivery.settle(Outcome.REJECTED, error=Condition(DECODE_ERROR, str(exc)))
            self._top_up(producer)
            return
        settle: Callable[[], None] | None = None if delivery.pre_settled else delivery.settle
        if MARK in payload and not flagged_unsampled(payload):  # see hops.py
            settle = self._traced_settle(producer.address, payload, settle)
        try:
            owned = self.broker.publish(
                producer.address,
                payload=payload,
                durable=durable,
                ttl_ms=ttl,
                absolute_expiry_ms=expiry,
                on_owned=settle,
                delivery_count=delivery_count,
                priority=priority,
            )
        except NotFound as exc:
            delivery.settle(Outcome.REJECTED, error=Condition(NOT_FOUND, str(exc)))
            link.close(Condition(NOT_FOUND, str(exc)))
            return
        if not owned:
            self.endpoint.schedule_commit()
        elif settle is not None:
            settle()
        producer.taken_bytes += len(payload)
        producer.credit_left -= 1
        if producer.credit_left < producer.refill_below:
            self._top_up(producer)

    def _traced_settle(
        self, address: str, payload: bytes, settle: Callable[[], None] | None
    ) -> Callable[[], None] | None:
        """For a sampled message, the settlement also ends `broker.enqueue` (see hops.py)."""
        kind = "queue" if address in self.broker.queues else "topic"
        arrival = self.endpoint.traced.arrived(payload, address=address, address_type=kind)
        if arrival is None:
            return settle
        traced = self.endpoint.traced

        def owned() -> None:
            traced.owned(arrival)
            if settle is not None:
                settle()

        return owned

    def _top_up(self, producer: Producer) -> None:
        if not producer.link.is_open:
            return
        if self.broker.has_room(producer.address):
            self._grant(producer)
        elif not producer.waiting:
            # At the memory limit: no more credit; the producer waits, nothing is dropped.
            producer.waiting = True
            self.broker.when_room(lambda: self._room_freed(producer))

    def _grant(self, producer: Producer | Relay) -> None:
        """Tops the producer's credit up to its window, the window first resized to what its
        messages since the last top-up weighed (`enmasse.amqp.windows.window`). A window that
        shrank below the credit the producer still holds gives nothing until it is used."""
        link = producer.link
        taken = producer.granted - producer.credit_left
        if taken > 0:
            producer.window = window(
                messages=self.window,
                budget=PRODUCER_BYTES,
                taken=taken,
                taken_bytes=producer.taken_bytes,
            )
        producer.taken_bytes = 0
        producer.refill_below = max(1, producer.window // 2)
        credit = link.credit
        if credit < producer.window:
            link.flow(producer.window - credit)
            credit = producer.window
        producer.granted = producer.credit_left = credit

    def _room_freed(self, producer: Producer) -> None:
        producer.waiting = False
        # Room comes back inside a settlement: give credit after it, from the loop.
        self.endpoint.engine.call_soon(lambda: self._top_up(producer))

    # ------------------------------------------------------------------ consumers

    def on_link_credit(self, link: Link) -> None:
        consumer = link.context
        if isinstance(consumer, LinkConsumer):
            consumer.credit_left = link.credit
            if consumer.credit_left > 0:
                consumer.queue.dispatch(now_ms())
            if link.draining and link.drained():
                # The consumer asked for what there is now and no more (AMQP drain: a
                # receive-no-wait): it got it, and the credit left over goes back.
                consumer.credit_left = 0

    def on_outcome(self, link: Link, delivery: Delivery, outcome: Outcome) -> None:
        consumer: LinkConsumer = link.context
        queue = consumer.queue
        entry: Entry = delivery.context
        if outcome == OUTCOME_ACCEPTED:
            queue.settle(consumer, entry, ACCEPTED)
            if entry.journaled:
                self.endpoint.schedule_commit()  # the ack record
            return
        settlement = settlement_of(delivery, outcome)
        if (settlement is RELEASED or settlement is MODIFIED) and not entry.delivery_count:
            _no_longer_first_acquirer(queue, entry)  # back unchanged, but it was acquired
        if outcome == Outcome.MODIFIED and delivery.undeliverable_here:
            queue.refuse_here(consumer, entry, settlement)
        else:
            queue.settle(consumer, entry, settlement)
        queue.dispatch(now_ms())  # redeliver to whoever has credit
        self.endpoint.schedule_commit()  # dead letters may have moved

    def on_transactional_outcome(
        self, link: Link, delivery: Delivery, *, txn_id: bytes | None, outcome: Outcome
    ) -> None:
        """A consumer settled a delivery under a transaction: it stays acquired until the
        discharge (coordinator.py); without a coordinator on this connection, as the engine's."""
        consumer = link.context
        coordination = self._coordination or self._routed_coordination(txn_id)
        if coordination is None or not isinstance(consumer, LinkConsumer):
            super().on_transactional_outcome(link, delivery, txn_id=txn_id, outcome=outcome)
            return
        coordination.acquire(
            link,
            delivery,
            txn_id=txn_id,
            queue=consumer.queue,
            consumer=consumer,
            settlement=settlement_of(delivery, outcome),
        )

    def _routed_coordination(self, txn_id: bytes | None) -> Coordination | None:
        """A standard space's broker: a router passes its client's transactional disposition on
        the consumer's feed link, on the router's shared connection, while the transaction was
        declared on the router's own connection for that client's coordinator (the router
        checked that the client declared it): the acquisition joins that connection's
        transaction. Nobody else reaches a routers-only broker's port."""
        if not self.endpoint.settings.routers_only or txn_id is None:
            return None
        txn = self.endpoint.transactions.open.get(txn_id)
        owner = txn.owner if txn is not None else None
        return owner._coordination if isinstance(owner, BrokerConnection) else None


def _revoke(link: Link, error: Condition) -> None:
    """How a client access change closes a link (`ClientEndpoint`'s revoke)."""
    handler = link.connection.handler
    if isinstance(handler, BrokerConnection):
        handler.revoke(link, error)
