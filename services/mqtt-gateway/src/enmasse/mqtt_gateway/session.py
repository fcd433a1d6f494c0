"""One MQTT client's connection through the gateway: CONNECT to DISCONNECT, on asyncio.

What flows in: the client's packets off its stream, and from its `Uplink` the router's answers
and the messages its subscriptions receive. What flows out: CONNACK, PUBACK, SUBACK, UNSUBACK,
PINGRESP and PUBLISH packets to the client, and AMQP sends, attaches and settlements to the
router.

Why so: the session holds no message of its own. A QoS 1 PUBLISH is acknowledged only once the
router accepted the AMQP transfer (so a PUBACK means the router network has it); a QoS 1
delivery to a subscriber is settled at the router only when the client's PUBACK comes back (so a
client that dies leaves it to the router, released, not lost). Bad input ends this client only:
a malformed packet closes it (MQTT 5: DISCONNECT 0x81 first), nothing else in the process sees
it. Order: packets are read and acted on one at a time, so sends to one address keep the order
they were published in; waiting for an outcome never holds up reading.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import Any

import structlog
from enmasse.amqp.engine import Condition, Delivery, Engine, Link, Outcome
from enmasse.mqtt_gateway import mapping
from enmasse.mqtt_gateway.packets import (
    MQTT_5,
    PROTOCOL_ERROR,
    RECEIVE_MAXIMUM,
    Connect,
    Disconnect,
    MalformedPacket,
    PingReq,
    PubAck,
    Publish,
    Subscribe,
    Unsubscribe,
    UnsupportedProtocol,
    decode,
    decode_connect,
    encode_connack,
    encode_disconnect,
    encode_pingresp,
    encode_puback,
    encode_publish,
    encode_suback,
    encode_unsuback,
    read_packet,
)
from enmasse.mqtt_gateway.uplink import Refused, Sent, Uplink

log = structlog.get_logger("enmasse.mqtt_gateway")

CONNECT_TIMEOUT = 10.0
"""Seconds a client has, once its socket is open, to send CONNECT."""

DELIVERY_WINDOW = 100
"""Messages a subscription may have on their way to the client (AMQP credit); MQTT 5's receive
maximum lowers it."""

HIGH_WATER = 256 * 1024
"""Bytes waiting in the socket's buffer above which the session stops giving its subscriptions
credit back until the client has read them: a slow reader holds back the router, not memory."""


@dataclass(frozen=True)
class RouterAddress:
    """Where the space's router takes clients, and the limits the gateway holds clients to."""

    host: str
    port: int
    max_packet_size: int = 1024 * 1024


@dataclass
class Subscription:
    """One topic filter the client subscribed to: an AMQP receiver on its address."""

    topic: str
    qos: int
    link: Link | None = None


@dataclass
class _Outbox:
    """QoS 1 PUBLISHes sent to the client and not yet acknowledged, by packet id."""

    unacked: dict[int, Delivery] = field(default_factory=dict)
    last_id: int = 0

    def next_id(self) -> int:
        for _ in range(65535):
            self.last_id = self.last_id % 65535 + 1
            if self.last_id not in self.unacked:
                return self.last_id
        raise RuntimeError("no free packet identifier")


class Session:
    """Serves one client connection; `run()` returns when it has ended, whoever ended it."""

    def __init__(
        self,
        *,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        engine: Engine,
        router: RouterAddress,
    ) -> None:
        self.reader = reader
        self.writer = writer
        self.engine = engine
        self.router = router
        self.level = 0  # not known before CONNECT: no DISCONNECT to a client of unknown level
        self.client_id = ""
        self.uplink: Uplink | None = None
        self.senders: dict[str, Link] = {}
        self.subscriptions: dict[str, Subscription] = {}
        self.outbox = _Outbox()
        self.window = DELIVERY_WINDOW
        self.keep_alive = 0.0
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
        except (asyncio.IncompleteReadError, ConnectionError, TimeoutError):
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
        self.keep_alive = connect.keep_alive * 1.5
        self.window = min(DELIVERY_WINDOW, connect.properties.get(RECEIVE_MAXIMUM, 65535))
        if not self.window:
            raise MalformedPacket("receive maximum 0", reason=PROTOCOL_ERROR)
        if connect.password is not None and connect.username is None:
            raise MalformedPacket("password without a user name")
        if not connect.client_id and not connect.clean_start:
            # Nothing to resume a session by (3.1.1 3.1.3-8; MQTT 5 would assign one, but
            # sessions are not kept yet, so the client is told rather than silently given none).
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
        self.writer.write(encode_connack(level=self.level, code=0, properties=self._limits()))
        log.info("mqtt client connected", client=self.client_id, user=connect.username)
        return True

    def _limits(self) -> dict[int, Any]:
        """What an MQTT 5 client is told this gateway does not do (yet)."""
        return {
            0x24: 1,  # maximum QoS: 1
            0x25: 0,  # retain not available
            0x28: 0,  # wildcard subscriptions not available
            0x2A: 0,  # shared subscriptions not available
            0x27: self.router.max_packet_size,
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
                return
            await self._handle(packet)
            if self.writer.transport.get_write_buffer_size() > 64 * 1024:
                await self.writer.drain()

    async def _handle(self, packet: Any) -> None:
        if isinstance(packet, Publish):
            await self._publish(packet)
        elif isinstance(packet, PubAck):
            self._acknowledged(packet)
        elif isinstance(packet, Subscribe):
            await self._subscribe(packet)
        elif isinstance(packet, Unsubscribe):
            self._unsubscribe(packet)
        elif isinstance(packet, PingReq):
            self.writer.write(encode_pingresp())

    async def _publish(self, publish: Publish) -> None:
        address = mapping.address_of_topic(publish.topic)
        if publish.qos == 2:  # not served yet: an MQTT 5 CONNACK said maximum QoS 1
            raise MalformedPacket("QoS 2 is not supported", reason=mapping.QOS_NOT_SUPPORTED)
        qos = publish.qos
        try:
            link = await self._sender(address)
        except Refused as refused:
            self._publish_failed(publish, refused.condition)
            return
        message = mapping.message_of(publish.payload, qos=qos, properties=publish.properties)
        sent = self.uplink.send(link, message, settled=qos == 0) if self.uplink else None
        if sent is not None and publish.packet_id is not None:
            self._spawn(self._acknowledge(publish, sent))

    async def _sender(self, address: str) -> Link:
        link = self.senders.get(address)
        if link is None or not link.is_open:
            assert self.uplink is not None
            link = await self.uplink.attach_sender(address)
            self.senders[address] = link
        return link

    async def _acknowledge(self, publish: Publish, sent: asyncio.Future[Sent]) -> None:
        try:
            result = await sent
        except Refused as refused:
            self._publish_failed(publish, refused.condition)
            return
        reason = mapping.outcome_reason(result.outcome, result.error)
        if reason == 0:
            assert publish.packet_id is not None
            self.writer.write(encode_puback(publish.packet_id, level=self.level))
        else:
            self._publish_failed(publish, result.error, reason=reason)

    def _publish_failed(
        self, publish: Publish, condition: Condition | None, *, reason: int | None = None
    ) -> None:
        """A PUBLISH the router did not take. QoS 0: dropped (the client asked for no answer).
        QoS 1: MQTT 5 says why in the PUBACK; 3.1.1 has no negative PUBACK, so the client is
        closed (it will publish again on its next connection)."""
        reason = reason if reason is not None else mapping.refusal_reason(condition)
        text = condition.description if condition is not None else "not delivered"
        log.info("mqtt publish refused", client=self.client_id, topic=publish.topic, why=text)
        if publish.packet_id is None:
            return
        if self.level >= MQTT_5:
            self.writer.write(
                encode_puback(publish.packet_id, level=self.level, reason=reason, text=text or "")
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
            granted = min(options & 0x03, 1)
            try:
                await self._receive(topic_filter, granted)
            except Refused as refused:
                reason = mapping.refusal_reason(refused.condition)
                codes.append(mapping.suback_code(reason, level=self.level))
                if refused.condition is not None and refused.condition.description:
                    reasons.append(refused.condition.description)
                continue
            codes.append(granted)
        self.writer.write(
            encode_suback(subscribe.packet_id, codes, level=self.level, text="; ".join(reasons))
        )

    async def _receive(self, topic: str, qos: int) -> None:
        existing = self.subscriptions.get(topic)
        if existing is not None:
            existing.qos = qos  # a repeated SUBSCRIBE replaces the QoS, keeps the link
            return
        assert self.uplink is not None
        subscription = Subscription(topic, qos)
        subscription.link = await self.uplink.attach_receiver(
            topic, receiver=subscription, credit=self.window
        )
        self.subscriptions[topic] = subscription

    def _unsubscribe(self, unsubscribe: Unsubscribe) -> None:
        codes = []
        for topic in unsubscribe.filters:
            subscription = self.subscriptions.pop(topic, None)
            if subscription is not None and subscription.link is not None and self.uplink:
                self.uplink.detach(subscription.link)
            codes.append(0 if subscription is not None else mapping.NO_SUBSCRIPTION_EXISTED)
        self.writer.write(encode_unsuback(unsubscribe.packet_id, codes, level=self.level))

    # -- from the router --

    def _deliver(self, subscription: Subscription, delivery: Delivery) -> None:
        """A message for one of the client's subscriptions: PUBLISH it at the granted QoS if the
        router wants an outcome for it or the message is durable (what a QoS 1 PUBLISH becomes),
        else at QoS 0: a pre-settled, non-durable message was sent at most once."""
        if self._lost.is_set() or self.uplink is None:
            return
        if self.subscriptions.get(subscription.topic) is not subscription:
            self.uplink.settle(delivery, Outcome.RELEASED, credit=0)
            return
        qos = subscription.qos if not delivery.pre_settled or delivery.durable else 0
        packet_id = self.outbox.next_id() if qos else None
        publish = Publish(
            topic=subscription.topic,
            payload=mapping.payload_of(delivery.payload),
            qos=qos,
            packet_id=packet_id,
        )
        self.writer.write(encode_publish(publish, level=self.level))
        if packet_id is None:
            self._settle(delivery, Outcome.ACCEPTED)
        else:
            self.outbox.unacked[packet_id] = delivery

    def _acknowledged(self, puback: PubAck) -> None:
        delivery = self.outbox.unacked.pop(puback.packet_id, None)
        if delivery is not None:
            self._settle(delivery, Outcome.ACCEPTED if puback.reason < 0x80 else Outcome.REJECTED)

    def _settle(self, delivery: Delivery, outcome: Outcome) -> None:
        """Settles at the router and gives the link its credit back, unless the client is
        behind in reading: then the credit waits until its socket has drained."""
        assert self.uplink is not None
        if self.writer.transport.get_write_buffer_size() <= HIGH_WATER:
            self.uplink.settle(delivery, outcome)
            return
        self.uplink.settle(delivery, outcome, credit=0)
        if not self._owed:
            self._spawn(self._credit_after_drain())
        self._owed.append(delivery)

    async def _credit_after_drain(self) -> None:
        await self.writer.drain()
        owed, self._owed = self._owed, []
        if self.uplink is not None:
            for delivery in owed:
                self.uplink.flow(delivery.link, 1)

    def _on_lost(self, condition: Condition | None) -> None:
        """The router closed the client's connection (it went away, or a rule change)."""
        log.info("router connection lost", client=self.client_id, condition=str(condition))
        if self.level >= MQTT_5 and not self._lost.is_set():
            self.writer.write(encode_disconnect(mapping.SERVER_UNAVAILABLE, text=str(condition)))
        self._lost.set()
        self.writer.close()

    # -- the end --

    def _spawn(self, coroutine: Any) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _end(self) -> None:
        self._lost.set()
        for task in list(self._pending):
            task.cancel()
        if self.uplink is not None:
            self.uplink.close()
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
