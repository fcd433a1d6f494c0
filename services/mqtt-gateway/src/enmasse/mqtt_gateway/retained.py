"""Retained messages: the last retained PUBLISH of each topic, kept in a queue of the space and
handed to every new subscription whose filter matches its topic.

What flows in: a retained PUBLISH (after its sender link was granted: the user may send to the
topic), a SUBSCRIBE's filter with its MQTT 5 options (after its receiver was granted: the user
may receive from it). What flows out: an entry in the space's retained store (`mqtt/retained`
by default, a queue the space declares), old entries of the same topic taken off it, and for a
subscription the retained messages to PUBLISH to the client (retain flag set).

Why so: the gateway keeps nothing a crash could lose, so the store is a queue on a broker,
durable through its journal (a broker SIGKILLed and restarted still has it; any gateway
instance, before or after a restart, reads the same one). A queue keeps every entry, not a last
value per key, so each entry carries its topic and a stamp (`mqtt_topic`, `mqtt_stamp`: the
nanosecond clock of the gateway that stored it) as application properties: storing a new value
puts the new entry first, then takes (consumes) the entries of that topic with an older stamp;
an empty retained PUBLISH only takes them. Two gateways storing the same topic at once each
take what is older than their own, so the newest stamp is what stays; a reader that browses
while an old entry is not taken yet still picks the newest per topic (`newest`). Reading and
taking use a JMS selector on those properties, so the broker picks the entries. The retained
flag of a forwarded PUBLISH travels as the message annotation `x-opt-mqtt-retain`, for
subscribers that asked for retain-as-published.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import structlog
from enmasse.amqp import codec
from enmasse.amqp.engine import Delivery, Outcome
from enmasse.mqtt_gateway.mapping import RETAIN_ANNOTATION
from enmasse.mqtt_gateway.packets import CONTENT_TYPE, PAYLOAD_FORMAT, USER_PROPERTY, Publish
from enmasse.mqtt_gateway.store import Store, StoreUnavailable, quoted

log = structlog.get_logger("enmasse.mqtt_gateway")

RETAINED_ADDRESS = "mqtt/retained"
TOPIC, STAMP, QOS = "mqtt_topic", "mqtt_stamp", "mqtt_qos"

# The retain handling of a subscription's options (MQTT 5 3.8.3.1, bits 4-5).
SEND_ON_SUBSCRIBE, SEND_IF_NEW, DO_NOT_SEND = 0, 1, 2


@dataclass(frozen=True)
class Options:
    """What a SUBSCRIBE's options byte says about retained messages (3.1.1: all zero)."""

    retain_as_published: bool
    retain_handling: int

    @classmethod
    def of(cls, options: int) -> Options:
        return cls(retain_as_published=bool(options & 0x08), retain_handling=(options >> 4) & 0x03)

    def sends_on_subscribe(self, *, existed: bool) -> bool:
        """Whether the retained messages go to the client as this filter is subscribed."""
        if self.retain_handling == SEND_ON_SUBSCRIBE:
            return True
        return self.retain_handling == SEND_IF_NEW and not existed


@dataclass(frozen=True)
class Retained:
    """One retained message as read from the store."""

    topic: str
    payload: bytes
    qos: int
    stamp: int
    properties: dict[int, Any]


def entry_of(publish: Publish, *, topic: str, stamp: int) -> bytes:
    """The store's entry for a retained PUBLISH (durable, whatever its QoS)."""
    user = publish.properties.get(USER_PROPERTY)
    application: dict[str, Any] = dict(user) if user else {}
    application.update({TOPIC: topic, STAMP: stamp, QOS: publish.qos})
    fields = {}
    if CONTENT_TYPE in publish.properties:
        fields["content_type"] = publish.properties[CONTENT_TYPE]
    return codec.encode_message(
        publish.payload,
        durable=True,
        properties=fields or None,
        application_properties=application,
    )


def retained_of(payload: bytes) -> Retained | None:
    """A store entry read back; None for one that is not the gateway's (no topic or stamp)."""
    application = codec.read_application_properties(payload)
    topic, stamp = application.get(TOPIC), application.get(STAMP)
    if not isinstance(topic, str) or not isinstance(stamp, int):
        return None
    properties: dict[int, Any] = {}
    user = [(k, str(v)) for k, v in application.items() if k not in (TOPIC, STAMP, QOS)]
    if user:
        properties[USER_PROPERTY] = user
    content_type = codec.read_properties(payload).content_type
    if content_type:
        properties[CONTENT_TYPE] = str(content_type)
    body = codec.read_body(payload)
    data = bytes(body) if isinstance(body, bytes | bytearray | memoryview) else b""
    qos = application.get(QOS)
    return Retained(topic, data, qos if qos in (0, 1, 2) else 0, stamp, properties)


def newest(entries: list[Retained]) -> list[Retained]:
    """The newest entry of each topic, empty payloads (a clearing not yet done) left out."""
    latest: dict[str, Retained] = {}
    for entry in entries:
        known = latest.get(entry.topic)
        if known is None or entry.stamp > known.stamp:
            latest[entry.topic] = entry
    return [e for e in sorted(latest.values(), key=lambda e: e.topic) if e.payload]


def matches(topic_filter: str, topic: str) -> bool:
    """MQTT topic matching (4.7): `+` one level, `#` this level and all below; a filter that
    starts with a wildcard does not match a topic that starts with `$`."""
    if topic.startswith("$") and topic_filter[:1] in ("+", "#"):
        return False
    levels = topic.split("/")
    wanted = topic_filter.split("/")
    for i, level in enumerate(wanted):
        if level == "#":
            return True
        if i >= len(levels) or (level != "+" and level != levels[i]):
            return False
    return len(wanted) == len(levels)


def selector_of_filter(topic_filter: str) -> str:
    """The selector that picks a filter's entries on the broker: the topic itself, or for a
    wildcard filter its literal prefix (LIKE), which `matches` then narrows down."""
    head = topic_filter.split("+", 1)[0].split("#", 1)[0]
    if head == topic_filter:
        return f"{TOPIC} = {quoted(topic_filter)}"
    escaped = head.replace("!", "!!").replace("%", "!%").replace("_", "!_")
    return f"{TOPIC} LIKE {quoted(escaped + '%')} ESCAPE '!'"


def older_than(topic: str, stamp: int) -> str:
    """The selector of a topic's entries a newer one replaces."""
    return f"{TOPIC} = {quoted(topic)} AND {STAMP} < {stamp}"


def publish_of(entry: Retained, *, granted: int) -> Publish:
    """The PUBLISH a subscriber gets for a retained message: retain set, at the lower of its
    QoS and the subscription's (MQTT 3.3.1.3, 3.8.4)."""
    properties = dict(entry.properties)
    properties.pop(PAYLOAD_FORMAT, None)
    return Publish(
        topic=entry.topic,
        payload=entry.payload,
        qos=min(entry.qos, granted),
        retain=True,
        properties=properties,
    )


def was_retained(message: bytes) -> bool:
    """Whether a forwarded message was published retained: the retain flag a subscription with
    retain-as-published gets (MQTT 5 3.3.1.3; every other subscription gets 0)."""
    return bool(codec.read_message_annotations(message).get(RETAIN_ANNOTATION))


class RetainedStore:
    """The space's retained messages, through the gateway's `Store` connection."""

    def __init__(self, store: Store, *, address: str = RETAINED_ADDRESS) -> None:
        self.store = store
        self.address = address
        self._keeping: set[asyncio.Task[str | None]] = set()

    def keep_soon(self, publish: Publish, *, topic: str) -> asyncio.Task[str | None]:
        """`keep` as a task of the store's own, so a client that publishes retained at QoS 0
        and disconnects at once still has it kept; the task gives why it failed, or None."""
        task = asyncio.get_running_loop().create_task(self._keep_or_why(publish, topic=topic))
        self._keeping.add(task)
        task.add_done_callback(self._keeping.discard)
        return task

    async def _keep_or_why(self, publish: Publish, *, topic: str) -> str | None:
        try:
            await self.keep(publish, topic=topic)
        except StoreUnavailable as error:
            log.warning("retained message not kept", topic=topic, why=str(error))
            return str(error)
        return None

    async def keep(self, publish: Publish, *, topic: str) -> None:
        """Stores a retained PUBLISH as its topic's value, or clears it (empty payload)."""
        stamp = time.time_ns()
        if publish.payload:
            await self.store.put(self.address, entry_of(publish, topic=topic, stamp=stamp))
        replaced = await self.store.read(self.address, selector=older_than(topic, stamp), take=True)
        self.store.settle(replaced, Outcome.ACCEPTED)

    async def matching(self, topic_filter: str) -> list[Retained]:
        """The retained messages whose topics the filter matches, newest per topic."""
        deliveries: list[Delivery] = await self.store.read(
            self.address, selector=selector_of_filter(topic_filter), take=False
        )
        entries = [retained_of(d.payload) for d in deliveries]
        return newest([e for e in entries if e is not None and matches(topic_filter, e.topic)])
