"""One MQTT client's connection through the gateway: CONNECT to DISCONNECT, on asyncio.

What flows in: the client's packets off its stream, and from its `Uplink` the router's answers
and the messages its subscriptions receive. What flows out: CONNACK, PUBACK, PUBREC, PUBREL,
PUBCOMP, SUBACK, UNSUBACK, PINGRESP and PUBLISH packets to the client, and AMQP sends, attaches
and settlements to the router.

Why so: the session holds no message of its own. A QoS 1 PUBLISH is acknowledged only once the
router accepted the AMQP transfer (so a PUBACK means the router network has it); a QoS 1
delivery to a subscriber is settled at the router only when the client's PUBACK comes back (so a
client that dies leaves it to the router, released, not lost). QoS 2 is the same with one more
step each way (`flow.py`: the packet ids held until PUBREL, so a resent PUBLISH is not forwarded
twice; an outbound delivery settled only on PUBCOMP). MQTT 5's limits are kept both ways: the
client's receive maximum bounds the QoS 1 and 2 PUBLISHes it has unacknowledged (and the credit
each subscription gives the router), the gateway's bounds the client's; a message over the
client's maximum packet size is not sent to it. Bad input ends this client only:
a malformed packet closes it (MQTT 5: DISCONNECT 0x81 first), nothing else in the process sees
it. Order: packets are read and acted on one at a time, so sends to one address keep the order
they were published in; waiting for an outcome never holds up reading. A persistent session
keeps nothing here either: its subscriptions are durable ones on the brokers and its record is
in a queue of the space (`persistence.py`), written before the SUBACK or UNSUBACK.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import uuid
from collections import deque
from dataclasses import dataclass
from typing import Any

import structlog
from enmasse.amqp.engine import Condition, Delivery, Engine, Link, Outcome
from enmasse.mqtt_gateway import filters, mapping, retained, wills
from enmasse.mqtt_gateway.flow import (
    PACKET_ID_NOT_FOUND,
    Flight,
    InboundAliases,
    Incoming,
    OutboundAliases,
    Outbox,
    Stage,
)
from enmasse.mqtt_gateway.packets import (
    MAXIMUM_PACKET_SIZE,
    MQTT_5,
    PROTOCOL_ERROR,
    RECEIVE_MAXIMUM,
    RETAIN_AVAILABLE,
    SERVER_KEEP_ALIVE,
    SESSION_EXPIRY,
    TOPIC_ALIAS,
    TOPIC_ALIAS_MAXIMUM,
    Connect,
    Disconnect,
    MalformedPacket,
    PingReq,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    Subscribe,
    Unsubscribe,
    UnsupportedProtocol,
    decode,
    decode_connect,
    encode_connack,
    encode_disconnect,
    encode_pingresp,
    encode_puback,
    encode_pubcomp,
    encode_publish,
    encode_pubrec,
    encode_pubrel,
    encode_suback,
    encode_unsuback,
    read_packet,
)
from enmasse.mqtt_gateway.persistence import (
    SESSION_TAKEN_OVER,
    Connected,
    Persistence,
    Sessions,
    SessionUnavailable,
    session_expiry,
)
from enmasse.mqtt_gateway.retained import RetainedStore
from enmasse.mqtt_gateway.store import StoreUnavailable
from enmasse.mqtt_gateway.uplink import Refused, Sent, Uplink
from enmasse.mqtt_gateway.wills import Wills

log = structlog.get_logger("enmasse.mqtt_gateway")

CONNECT_TIMEOUT = 10.0
"""Seconds a client has, once its socket is open, to send CONNECT."""

DELIVERY_WINDOW = 100
"""Messages a subscription may have on their way to the client (AMQP credit); MQTT 5's receive
maximum lowers it."""

INBOUND_WINDOW = 100
"""The gateway's receive maximum (MQTT 5 CONNACK): QoS 1 and 2 PUBLISHes a client may have
waiting for the router's outcome; one more is a protocol violation (DISCONNECT 0x93)."""

TOPIC_ALIASES = 16
"""The gateway's topic alias maximum (MQTT 5 CONNACK): aliases a client may set."""

HIGH_WATER = 256 * 1024
"""Bytes waiting in the socket's buffer above which the session stops giving its subscriptions
credit back until the client has read them: a slow reader holds back the router, not memory."""


@dataclass(frozen=True)
class RouterAddress:
    """Where the space's router takes clients, and the limits the gateway holds clients to."""

    host: str
    port: int
    max_packet_size: int = 1024 * 1024
    max_keep_alive: int = 0  # seconds; 0: the client's keep-alive stands, whatever it is


@dataclass
class Subscription:
    """One topic filter the client subscribed to: an AMQP receiver on its address."""

    topic: str
    qos: int
    link: Link | None = None
    pattern: filters.Pattern | None = None  # one address of a wildcard or shared filter


class Session:
    """Serves one client connection; `run()` returns when it has ended, whoever ended it."""

    def __init__(
        self,
        *,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        engine: Engine,
        router: RouterAddress,
        sessions: Sessions | None = None,
        connected: Connected | None = None,
        retained: RetainedStore | None = None,
        wills: Wills | None = None,
    ) -> None:
        self.sessions = sessions  # the space's session records (persistence.py); None: none kept
        self.persistence: Persistence | None = None
        self.connected = connected  # the gateway's client ids: one connection each
        self.retained = retained  # the space's retained messages (retained.py); None: not kept
        self.wills = wills  # the will service (wills.py); None: wills are not kept
        self.will: tuple[str, int, float] | None = None  # stored: (key, stamp, delay seconds)
        self.disconnect_reason: int | None = None  # None: the client sent no DISCONNECT
        self._retain_as_published: set[str] = set()  # topic filters subscribed with it
        self._retained_due: list[tuple[str, int]] = []  # (filter, granted QoS) after SUBACK
        self.reader = reader
        self.writer = writer
        self.engine = engine
        self.router = router
        self.level = 0  # not known before CONNECT: no DISCONNECT to a client of unknown level
        self.client_id = ""
        self.uplink: Uplink | None = None
        self.senders: dict[str, Link] = {}
        self.subscriptions: dict[str, Subscription] = {}
        self.wildcards = filters.Wildcards(
            new_member=lambda address, qos, pattern: Subscription(address, qos, pattern=pattern)
        )
        self.outbox = Outbox(limit=65535)
        self.incoming = Incoming(limit=65535)  # MQTT 5: INBOUND_WINDOW
        self.aliases_in = InboundAliases(maximum=0)
        self.aliases_out = OutboundAliases(maximum=0)
        self.window = DELIVERY_WINDOW
        self.max_outbound_packet: int | None = None  # the client's maximum packet size
        self.keep_alive = 0.0
        self._held: deque[tuple[Subscription, Delivery]] = deque()  # the client's outbox full
        self._pending: set[asyncio.Task[None]] = set()
        self._lost: asyncio.Event = asyncio.Event()
        self._owed: list[Delivery] = []  # settled, credit not yet given back (HIGH_WATER)

    async def run(self) -> None:
        peer = self.writer.get_extra_info("peername")
        try:
            if await self._connect():
                await self._serve()
        except MalformedPacket as error:
            log.info("mqtt client dropped", client=self.client_id, peer=peer, reason=str(error))
            if self.level >= MQTT_5:
                self.writer.write(encode_disconnect(error.reason, text=str(error)))
        except TimeoutError:  # silent past its keep-alive (or, before CONNECT, its first packet)
            if self.level >= MQTT_5:
                self.writer.write(
                    encode_disconnect(mapping.KEEP_ALIVE_TIMEOUT, text="keep alive timeout")
                )
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            await self._end()

    # -- CONNECT --

    async def _connect(self) -> bool:
        async with asyncio.timeout(CONNECT_TIMEOUT):
            first, body = await read_packet(self.reader, max_size=self.router.max_packet_size)
        try:
            connect = decode_connect(first, body)
        except UnsupportedProtocol as error:
            self.level = error.level
            self._refuse_connect(mapping.UNSUPPORTED_VERSION)
            return False
        self.level = connect.level
        self.client_id = connect.client_id
        granted = self._keep_alive(connect)
        self.keep_alive = granted * 1.5
        self._limits_of(connect)
        if connect.password is not None and connect.username is None:
            raise MalformedPacket("password without a user name")
        if not connect.client_id and not connect.clean_start:
            # Nothing to resume a session by (3.1.1 3.1.3-8; MQTT 5 would assign one, which
            # the gateway does not yet, so the client is told rather than silently given none).
            self._refuse_connect(mapping.CLIENT_ID_NOT_VALID)
            return False
        self.uplink = Uplink(engine=self.engine, on_delivery=self._deliver, on_lost=self._on_lost)
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT):
                await self.uplink.open(
                    host=self.router.host,
                    port=self.router.port,
                    container_id=f"mqtt/{connect.client_id}" if connect.client_id else "mqtt",
                    user=connect.username,
                    password=_password(connect),
                )
        except Refused as refused:
            log.info("mqtt login refused", user=connect.username, condition=str(refused))
            self._refuse_connect(mapping.login_refusal(refused.condition))
            return False
        except TimeoutError:
            log.warning("router did not answer the login", router=self.router.port)
            self._refuse_connect(mapping.SERVER_UNAVAILABLE)
            return False
        if self.connected is not None:  # logged in: it may take its client id over
            self.connected.claim(connect.client_id, self)
        self.persistence = Persistence(
            sessions=self.sessions, client_id=connect.client_id, expiry=session_expiry(connect)
        )
        try:
            resumed = await self.persistence.begin(
                clean_start=connect.clean_start, uplink=self.uplink
            )
        except SessionUnavailable as error:
            log.warning("session store unavailable", client=self.client_id, error=str(error))
            self._refuse_connect(mapping.SERVER_UNAVAILABLE)
            return False
        if not await self._keep_will(connect):
            return False
        limits = self._limits()
        if granted != connect.keep_alive:
            limits[SERVER_KEEP_ALIVE] = granted
        if self.persistence.expiry != session_expiry(connect):
            limits[SESSION_EXPIRY] = self.persistence.expiry  # no session store: none kept
        self.writer.write(
            encode_connack(
                level=self.level, code=0, properties=limits, session_present=resumed is not None
            )
        )
        log.info("mqtt client connected", client=self.client_id, user=connect.username)
        await self._resume(resumed or {})
        return True

    async def _resume(self, resumed: dict[str, int]) -> None:
        """A persistent session's subscriptions, attached again after the CONNACK: what their
        durable subscriptions kept while the client was away comes now. One refused now (the
        right or the address gone) stays in the session, without a link."""
        for topic, qos in resumed.items():
            try:
                await self._receive(topic, qos)
            except Refused as refused:
                log.info("subscription not resumed", client=self.client_id, why=str(refused))
                self.subscriptions[topic] = Subscription(topic, qos)

    async def _persist(self) -> None:
        """Writes the session's subscriptions to its record (a persistent session only)."""
        if self.persistence is None:
            return
        qos = {topic: subscription.qos for topic, subscription in self.subscriptions.items()}
        try:
            await self.persistence.save(qos)
        except SessionUnavailable as error:
            log.warning("session not recorded", client=self.client_id, error=str(error))

    def _keep_alive(self, connect: Connect) -> int:
        """The keep-alive the client is held to: its own, or (MQTT 5, which can tell the client
        in the CONNACK's server keep alive) --max-keep-alive when it asked for longer or none."""
        most = self.router.max_keep_alive
        if connect.level >= MQTT_5 and most and not 0 < connect.keep_alive <= most:
            return most
        return connect.keep_alive

    def _limits_of(self, connect: Connect) -> None:
        """The MQTT 5 limits of the CONNECT both ways (3.1.1 has none: the defaults stand)."""
        properties = connect.properties
        receive_maximum = properties.get(RECEIVE_MAXIMUM, 65535)
        if not receive_maximum or properties.get(MAXIMUM_PACKET_SIZE) == 0:
            raise MalformedPacket("receive maximum or maximum packet size 0", reason=PROTOCOL_ERROR)
        self.window = min(DELIVERY_WINDOW, receive_maximum)
        self.outbox.limit = receive_maximum
        self.max_outbound_packet = properties.get(MAXIMUM_PACKET_SIZE)
        self.aliases_out.maximum = properties.get(TOPIC_ALIAS_MAXIMUM, 0)
        if connect.level >= MQTT_5:
            self.incoming.limit = INBOUND_WINDOW
            self.aliases_in.maximum = TOPIC_ALIASES

    def _limits(self) -> dict[int, Any]:
        """What an MQTT 5 client is told of the gateway's limits. No maximum QoS: its absence
        means QoS 2 (the property may only say 0 or 1)."""
        return {
            RECEIVE_MAXIMUM: INBOUND_WINDOW,
            TOPIC_ALIAS_MAXIMUM: TOPIC_ALIASES,
            RETAIN_AVAILABLE: int(self.retained is not None),
            MAXIMUM_PACKET_SIZE: self.router.max_packet_size,
        }

    def _refuse_connect(self, reason: int) -> None:
        code = mapping.connack_code(reason, level=self.level)
        self.writer.write(encode_connack(level=min(self.level, MQTT_5), code=code))

    # -- after CONNECT --

    async def _serve(self) -> None:
        while not self._lost.is_set():
            async with asyncio.timeout(self.keep_alive or None):
                first, body = await read_packet(self.reader, max_size=self.router.max_packet_size)
            packet = decode(first, body, level=self.level)
            if isinstance(packet, Disconnect):
                if self.persistence is not None:
                    self.persistence.expire_after(packet.properties.get(SESSION_EXPIRY))
                self.disconnect_reason = packet.reason
                return
            await self._handle(packet)
            if self.writer.transport.get_write_buffer_size() > 64 * 1024:
                await self.writer.drain()

    async def _handle(self, packet: Any) -> None:
        if isinstance(packet, Publish):
            await self._publish(packet)
        elif isinstance(packet, PubAck | PubComp):
            self._acknowledged(packet)
        elif isinstance(packet, PubRec):
            self._received(packet)
        elif isinstance(packet, PubRel):
            self._released(packet)
        elif isinstance(packet, Subscribe):
            await self._subscribe(packet)
        elif isinstance(packet, Unsubscribe):
            await self._unsubscribe(packet)
        elif isinstance(packet, PingReq):
            self.writer.write(encode_pingresp())

    async def _publish(self, publish: Publish) -> None:
        address = mapping.address_of_topic(self.aliases_in.topic_of(publish))
        stage = self.incoming.duplicate(publish)
        if stage is not None:  # a QoS 2 resend before PUBREL: answered, never forwarded twice
            if stage is Stage.RECEIVED:
                assert publish.packet_id is not None
                self.writer.write(encode_pubrec(publish.packet_id, level=self.level))
            return
        qos = publish.qos
        if publish.packet_id is not None:
            self.incoming.admit(publish.packet_id)
        try:
            link = await self._sender(address)
        except Refused as refused:
            self._publish_failed(publish, refused.condition)
            return
        message = mapping.message_of(
            publish.payload, qos=qos, properties=publish.properties, retain=publish.retain
        )
        sent = self.uplink.send(link, message, settled=qos == 0) if self.uplink else None
        kept = self._retain(publish, address)
        if sent is not None and publish.packet_id is not None:
            self._spawn(self._acknowledge(publish, sent, kept))

    async def _sender(self, address: str) -> Link:
        link = self.senders.get(address)
        if link is None or not link.is_open:
            assert self.uplink is not None
            link = await self.uplink.attach_sender(address)
            self.senders[address] = link
        return link

    async def _acknowledge(
        self,
        publish: Publish,
        sent: asyncio.Future[Sent],
        kept: asyncio.Task[str | None] | None = None,
    ) -> None:
        try:
            result = await sent
        except Refused as refused:
            self._publish_failed(publish, refused.condition)
            return
        unkept = await asyncio.shield(kept) if kept is not None else None
        if unkept is not None:  # delivered, but not kept as the topic's retained message
            self._publish_failed(publish, Condition("amqp:internal-error", unkept))
            return
        reason = mapping.outcome_reason(result.outcome, result.error)
        packet_id = publish.packet_id
        assert packet_id is not None
        if reason:
            self._publish_failed(publish, result.error, reason=reason)
        elif publish.qos == 2:  # the id stays held until PUBREL: a resend is not forwarded
            self.incoming.stages[packet_id] = Stage.RECEIVED
            self.writer.write(encode_pubrec(packet_id, level=self.level))
        else:
            self.incoming.stages.pop(packet_id, None)
            self.writer.write(encode_puback(packet_id, level=self.level))

    def _released(self, pubrel: PubRel) -> None:
        """QoS 2 inbound, the end: the client let go of the message, the id is free again."""
        stage = self.incoming.stages.get(pubrel.packet_id)
        if stage is Stage.FORWARDING:
            raise MalformedPacket("PUBREL before PUBREC", reason=PROTOCOL_ERROR)
        self.incoming.stages.pop(pubrel.packet_id, None)
        reason = 0 if stage is not None else PACKET_ID_NOT_FOUND
        self.writer.write(encode_pubcomp(pubrel.packet_id, level=self.level, reason=reason))

    def _publish_failed(
        self, publish: Publish, condition: Condition | None, *, reason: int | None = None
    ) -> None:
        """A PUBLISH the router did not take. QoS 0: dropped (the client asked for no answer).
        QoS 1 and 2: MQTT 5 says why in the PUBACK or PUBREC (which ends a QoS 2 exchange: no
        PUBREL follows); 3.1.1 has neither negative, so the client is closed (it will publish
        again on its next connection)."""
        reason = reason if reason is not None else mapping.refusal_reason(condition)
        text = condition.description if condition is not None else "not delivered"
        log.info("mqtt publish refused", client=self.client_id, topic=publish.topic, why=text)
        if publish.packet_id is None:
            return
        self.incoming.stages.pop(publish.packet_id, None)
        if self.level >= MQTT_5:
            answer = encode_pubrec if publish.qos == 2 else encode_puback
            self.writer.write(
                answer(publish.packet_id, level=self.level, reason=reason, text=text or "")
            )
        else:
            self._lost.set()
            self.writer.close()

    async def _subscribe(self, subscribe: Subscribe) -> None:
        codes: list[int] = []
        reasons: list[str] = []
        for topic_filter, options in subscribe.filters:
            problem = mapping.filter_problem(topic_filter)
            if problem is not None:
                codes.append(mapping.suback_code(problem, level=self.level))
                continue
            granted = options & 0x03
            existed = topic_filter in self.subscriptions
            try:
                await self._receive(topic_filter, granted)
            except Refused as refused:
                reason = mapping.refusal_reason(refused.condition)
                codes.append(mapping.suback_code(reason, level=self.level))
                if refused.condition is not None and refused.condition.description:
                    reasons.append(refused.condition.description)
                continue
            codes.append(granted)
            self._want_retained(topic_filter, options, existed=existed)
        await self._persist()  # before the SUBACK: a subscription granted is one recorded
        self.writer.write(
            encode_suback(subscribe.packet_id, codes, level=self.level, text="; ".join(reasons))
        )
        self._send_retained()

    async def _receive(self, topic: str, qos: int) -> None:
        existing = self.subscriptions.get(topic)
        if existing is not None:
            existing.qos = qos  # a repeated SUBSCRIBE replaces the QoS, keeps the link
            self.wildcards.requalify(topic, qos)
            return
        assert self.uplink is not None
        if filters.needs_pattern(topic):  # through the router's pattern matching
            link = await self.wildcards.subscribe(self.uplink, topic, qos, window=self.window)
            self.subscriptions[topic] = Subscription(topic, qos, link=link)
            return
        subscription = Subscription(topic, qos)
        durable = self.persistence.link_of(topic) if self.persistence else {}
        subscription.link = await self.uplink.attach_receiver(
            topic, receiver=subscription, credit=self.window, **durable
        )
        self.subscriptions[topic] = subscription

    async def _unsubscribe(self, unsubscribe: Unsubscribe) -> None:
        codes = []
        for topic in unsubscribe.filters:
            subscription = self.subscriptions.pop(topic, None)
            self.wildcards.leave(self.uplink, topic)
            if subscription is not None and subscription.link is not None and self.uplink:
                self.uplink.detach(subscription.link)
            codes.append(0 if subscription is not None else mapping.NO_SUBSCRIPTION_EXISTED)
        await self._persist()  # before the UNSUBACK, as for SUBSCRIBE
        self.writer.write(encode_unsuback(unsubscribe.packet_id, codes, level=self.level))

    # -- from the router --

    def _deliver(self, subscription: Subscription, delivery: Delivery) -> None:
        """A message for one of the client's subscriptions: PUBLISH it at the granted QoS if the
        router wants an outcome for it or the message is durable (what QoS 1 and 2 become),
        else at QoS 0: a pre-settled, non-durable message was sent at most once."""
        if self._lost.is_set() or self.uplink is None:
            return
        if isinstance(subscription, filters.Pattern):  # the router: an address matches or not
            self.wildcards.announced(self.uplink, subscription, delivery)
            return
        if not self._subscribed(subscription):
            self.uplink.settle(delivery, Outcome.RELEASED, credit=0)
            return
        qos = subscription.qos if not delivery.pre_settled or delivery.durable else 0
        if qos and (self.outbox.full() or self._held):
            # The client's receive maximum: it waits here, unsettled at the router, which the
            # subscription's credit (at most that maximum) keeps from sending more.
            self._held.append((subscription, delivery))
            return
        self._publish_to_client(subscription, delivery, qos=qos)

    def _subscribed(self, subscription: Subscription) -> bool:
        """True while the client still holds the subscription a delivery came for."""
        if subscription.pattern is not None:
            return subscription.pattern.holds(subscription)
        return self.subscriptions.get(subscription.topic) is subscription

    def _publish_to_client(
        self, subscription: Subscription, delivery: Delivery, *, qos: int
    ) -> None:
        packet_id = self.outbox.next_id() if qos else None
        topic, alias = self.aliases_out.choose(subscription.topic)
        publish = Publish(
            topic=topic,
            payload=mapping.payload_of(delivery.payload),
            qos=qos,
            retain=self._retained_flag(subscription, delivery),
            packet_id=packet_id,
            properties={TOPIC_ALIAS: alias} if alias is not None else {},
        )
        packet = encode_publish(publish, level=self.level)
        if self.max_outbound_packet is not None and len(packet) > self.max_outbound_packet:
            self._too_large(subscription, delivery, size=len(packet))
            return
        self.writer.write(packet)
        self.aliases_out.remember(subscription.topic, alias)
        if packet_id is None:
            self._settle(delivery, Outcome.ACCEPTED)
        else:
            self.outbox.unacked[packet_id] = Flight(delivery, qos)

    def _too_large(self, subscription: Subscription, delivery: Delivery, *, size: int) -> None:
        """A message over the client's maximum packet size is not sent to it (MQTT 5 3.1.2.11.4:
        discarded). Settled MODIFIED with undeliverable-here: the message is not at fault, this
        client is, so a queue keeps it for another consumer (REJECTED would dead-letter it for
        everyone) and does not offer it to this link again."""
        log.info(
            "message over the client's maximum packet size not sent",
            client=self.client_id,
            topic=subscription.topic,
            size=size,
            maximum=self.max_outbound_packet,
        )
        self._settle(delivery, Outcome.MODIFIED, undeliverable_here=True)

    def _acknowledged(self, ack: PubAck | PubComp) -> None:
        """QoS 1's PUBACK or QoS 2's PUBCOMP: the client has the message; settled at the
        router (REJECTED for an MQTT 5 PUBACK with a failure reason)."""
        flight = self.outbox.unacked.get(ack.packet_id)
        if flight is None:
            return
        if not isinstance(ack, PubComp if flight.qos == 2 and flight.released else PubAck):
            return  # out of order (a PUBACK for QoS 2, a PUBCOMP before PUBREC): not the end
        del self.outbox.unacked[ack.packet_id]
        self._settle(flight.delivery, Outcome.ACCEPTED if ack.reason < 0x80 else Outcome.REJECTED)
        self._release_held()

    def _received(self, pubrec: PubRec) -> None:
        """QoS 2 outbound, step 2: the client has the message; PUBREL lets it forget the id. A
        PUBREC with a failure reason ends the exchange: the delivery is settled REJECTED."""
        flight = self.outbox.unacked.get(pubrec.packet_id)
        if flight is None or flight.qos != 2:
            self.writer.write(
                encode_pubrel(pubrec.packet_id, level=self.level, reason=PACKET_ID_NOT_FOUND)
            )
            return
        if pubrec.reason >= 0x80:
            del self.outbox.unacked[pubrec.packet_id]
            self._settle(flight.delivery, Outcome.REJECTED)
            self._release_held()
            return
        flight.released = True
        self.writer.write(encode_pubrel(pubrec.packet_id, level=self.level))

    def _release_held(self) -> None:
        """Room in the client's receive maximum again: the oldest held deliveries go out."""
        while self._held and not self.outbox.full() and self.uplink is not None:
            subscription, delivery = self._held.popleft()
            if not self._subscribed(subscription):
                self.uplink.settle(delivery, Outcome.RELEASED, credit=0)
                continue
            self._publish_to_client(subscription, delivery, qos=subscription.qos)

    def _settle(
        self, delivery: Delivery | None, outcome: Outcome, *, undeliverable_here: bool = False
    ) -> None:
        """Settles at the router and gives the link its credit back, unless the client is
        behind in reading: then the credit waits until its socket has drained. (None: a
        retained message from the store, which has nothing to settle.)"""
        assert self.uplink is not None
        if delivery is None:
            return
        if self.writer.transport.get_write_buffer_size() <= HIGH_WATER:
            self.uplink.settle(delivery, outcome, undeliverable_here=undeliverable_here)
            return
        self.uplink.settle(delivery, outcome, credit=0, undeliverable_here=undeliverable_here)
        if not self._owed:
            self._spawn(self._credit_after_drain())
        self._owed.append(delivery)

    async def _credit_after_drain(self) -> None:
        await self.writer.drain()
        owed, self._owed = self._owed, []
        if self.uplink is not None:
            for delivery in owed:
                self.uplink.flow(delivery.link, 1)

    def taken_over(self) -> None:
        """Another connection of the same client id logged in to this gateway: this one ends
        (MQTT 5: DISCONNECT 0x8E), as if the client had gone without a DISCONNECT."""
        log.info("mqtt session taken over", client=self.client_id)
        if self.level >= MQTT_5 and not self._lost.is_set():
            self.writer.write(encode_disconnect(SESSION_TAKEN_OVER, text="session taken over"))
        self._lost.set()
        self.writer.close()

    def _on_lost(self, condition: Condition | None) -> None:
        """The router closed the client's connection (it went away, or a rule change)."""
        log.info("router connection lost", client=self.client_id, condition=str(condition))
        if self.level >= MQTT_5 and not self._lost.is_set():
            self.writer.write(encode_disconnect(mapping.SERVER_UNAVAILABLE, text=str(condition)))
        self._lost.set()
        self.writer.close()

    # -- retained messages and wills (retained.py, wills.py) --

    def _retain(self, publish: Publish, address: str) -> asyncio.Task[str | None] | None:
        """A retained PUBLISH the router let the user send: kept as its topic's value (an
        empty one clears it). The task gives why it was not kept, or None."""
        if not publish.retain or self.retained is None:
            return None
        return self.retained.keep_soon(publish, topic=address)

    def _want_retained(self, topic_filter: str, options: int, *, existed: bool) -> None:
        """Notes what a granted filter asked for: retain-as-published, and (by its retain
        handling; never for a shared subscription, MQTT 5 4.8.2) the retained messages now."""
        if self.retained is None:
            return
        wanted = retained.Options.of(options if self.level >= MQTT_5 else 0)
        if wanted.retain_as_published:
            self._retain_as_published.add(topic_filter)
        else:
            self._retain_as_published.discard(topic_filter)
        if wanted.sends_on_subscribe(existed=existed) and not topic_filter.startswith("$share/"):
            self._retained_due.append((topic_filter, options & 0x03))

    def _send_retained(self) -> None:
        due, self._retained_due = self._retained_due, []
        if due:
            self._spawn(self._retained_to_client(due))

    async def _retained_to_client(self, due: list[tuple[str, int]]) -> None:
        """The retained messages of newly subscribed filters, after the SUBACK, retain set. At
        QoS 0 once the client's receive maximum is used up: they stay in the store anyway."""
        assert self.retained is not None
        for topic_filter, granted in due:
            try:
                found = await self.retained.matching(topic_filter)
            except StoreUnavailable as error:
                log.warning("retained messages not read", filter=topic_filter, why=str(error))
                continue
            for entry in found:
                publish = retained.publish_of(entry, granted=granted)
                qos = publish.qos if not self.outbox.full() else 0
                packet_id = self.outbox.next_id() if qos else None
                packet = encode_publish(
                    dataclasses.replace(publish, qos=qos, packet_id=packet_id), level=self.level
                )
                if self.max_outbound_packet is not None and len(packet) > self.max_outbound_packet:
                    continue  # over the client's maximum: not for this client (3.1.2.11.4)
                self.writer.write(packet)
                if packet_id is not None:
                    self.outbox.unacked[packet_id] = Flight(None, qos)

    def _retained_flag(self, subscription: Subscription, delivery: Delivery) -> bool:
        """The retain flag a forwarded message carries: its own for a filter subscribed with
        retain-as-published, else 0 (MQTT 5 3.3.1.3)."""
        if not self._retain_as_published:
            return False
        pattern = subscription.pattern
        topic_filter = pattern.topic_filter if pattern is not None else subscription.topic
        return topic_filter in self._retain_as_published and retained.was_retained(delivery.payload)

    async def _keep_will(self, connect: Connect) -> bool:
        """Before the CONNACK: the client's earlier wills are cancelled, and its will (if any)
        is stored, once the router let its user attach a sender to the will's topic (so a will
        goes nowhere its client could not publish). False: refused, the CONNACK sent."""
        will = connect.will
        if self.wills is None or (will is None and not connect.client_id):
            return True  # no will to keep, and none to cancel (no id to have left one under)
        key = wills.mqtt_key(connect.client_id or f"~{uuid.uuid4().hex}")
        if will is not None:
            try:
                await self._sender(mapping.address_of_topic(will.topic))
            except MalformedPacket:  # MQTT 5 3.1.3.3: a will topic that is no topic name
                self._refuse_connect(mapping.TOPIC_NAME_INVALID)
                return False
            except Refused as refused:
                self._refuse_connect(mapping.refusal_reason(refused.condition))
                return False
        try:
            stamp = await self.wills.connected(key, will)
        except StoreUnavailable as error:
            log.warning("will not stored", client=self.client_id, why=str(error))
            self._refuse_connect(mapping.SERVER_UNAVAILABLE)
            return False
        if will is not None and stamp is not None:
            delay = float(will.properties.get(wills.WILL_DELAY_INTERVAL, 0))
            self.will = (key, stamp, delay)
        return True

    def _will_ended(self) -> None:
        if self.wills is not None and self.will is not None:
            key, stamp, delay = self.will
            self.wills.ended(key, stamp=stamp, delay=delay, reason=self.disconnect_reason)

    # -- the end --

    def _spawn(self, coroutine: Any) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _end(self) -> None:
        self._lost.set()
        for task in list(self._pending):
            task.cancel()
        if self.connected is not None:
            self.connected.release(self.client_id, self)
        if self.persistence is not None:  # a session ending now: its links closed first
            self.persistence.let_go(self.subscriptions, uplink=self.uplink)
        self.wildcards.leave_all(self.uplink)  # shared groups: the last member ends the group
        self._will_ended()
        if self.uplink is not None:
            self.uplink.close()
        if self.persistence is not None:  # recorded once the links are detached
            with contextlib.suppress(SessionUnavailable, TimeoutError):
                async with asyncio.timeout(CONNECT_TIMEOUT):
                    await self.persistence.end(self.subscriptions)
        with contextlib.suppress(Exception):
            self.writer.close()
            await self.writer.wait_closed()


def _password(connect: Connect) -> str | None:
    if connect.password is None:
        return None if connect.username is None else ""
    try:
        return connect.password.decode("utf-8")
    except UnicodeDecodeError:
        return connect.password.decode("latin-1")  # never matches a stored password: refused
