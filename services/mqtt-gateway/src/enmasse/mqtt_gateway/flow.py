"""What one MQTT connection remembers between packets: packet ids in flight both ways, the QoS 2
exchanges, and the topic aliases.

What flows in: the client's PUBLISH, PUBACK, PUBREC, PUBREL and PUBCOMP as the session reads them,
and the deliveries the session is about to PUBLISH to the client. What flows out: whether a PUBLISH
is new or a duplicate, the delivery an acknowledgement completes, the topic (and alias) a PUBLISH
carries, or a `MalformedPacket` with the MQTT 5 reason the client is closed with.

Why so: QoS 2 is exactly once *at the gateway*. An inbound QoS 2 PUBLISH is forwarded once, and its
packet id stays in `Incoming` from the PUBLISH until the client's PUBREL, so a PUBLISH resent with
the same id in between (DUP after a lost PUBREC) is answered, not forwarded again (MQTT 5 4.3.3).
An outbound QoS 2 delivery stays unsettled at the router until the client's PUBCOMP, so the router
network, not the gateway, holds the message until the exchange is over. This state is in memory,
per connection: a client that reconnects starts with none (a persistent session keeps its
subscriptions on the brokers, `persistence.py`, not these packet ids). The receive maximums
bound both directions: `Incoming.limit` is the gateway's own (in its CONNACK), `Outbox.limit`
the client's (in its CONNECT).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from enmasse.amqp.engine import Delivery
from enmasse.mqtt_gateway.packets import PROTOCOL_ERROR, TOPIC_ALIAS, MalformedPacket, Publish

RECEIVE_MAXIMUM_EXCEEDED = 0x93
TOPIC_ALIAS_INVALID = 0x94
PACKET_ID_NOT_FOUND = 0x92


class Stage(Enum):
    """Where an inbound QoS 1 or 2 PUBLISH is."""

    FORWARDING = "forwarding"  # sent to the router, its outcome not back yet
    RECEIVED = "received"  # QoS 2: accepted by the router and PUBREC sent; waits for PUBREL


@dataclass
class Incoming:
    """The client's QoS 1 and 2 PUBLISHes the gateway has not finished with, by packet id."""

    limit: int
    stages: dict[int, Stage] = field(default_factory=dict)

    def duplicate(self, publish: Publish) -> Stage | None:
        """The stage of a QoS 2 PUBLISH whose id is still held (a resend: not to forward)."""
        if publish.qos != 2 or publish.packet_id is None:
            return None
        return self.stages.get(publish.packet_id)

    def admit(self, packet_id: int) -> None:
        """Takes a new PUBLISH in flight, or closes a client that sends more than it was told."""
        if packet_id not in self.stages and len(self.stages) >= self.limit:
            raise MalformedPacket(
                f"more than {self.limit} QoS 1 and 2 PUBLISHes unacknowledged",
                reason=RECEIVE_MAXIMUM_EXCEEDED,
            )
        self.stages[packet_id] = Stage.FORWARDING


@dataclass
class Flight:
    """A QoS 1 or 2 PUBLISH the gateway sent the client: the router's delivery it settles."""

    delivery: Delivery | None  # None: a retained message, read from the store (nothing to settle)
    qos: int
    released: bool = False  # QoS 2: PUBREC came, PUBREL sent; waits for PUBCOMP


@dataclass
class Outbox:
    """QoS 1 and 2 PUBLISHes sent to the client and not yet acknowledged, by packet id; at most
    `limit` at once (the client's receive maximum)."""

    limit: int
    unacked: dict[int, Flight] = field(default_factory=dict)
    last_id: int = 0

    def full(self) -> bool:
        return len(self.unacked) >= self.limit

    def next_id(self) -> int:
        for _ in range(65535):
            self.last_id = self.last_id % 65535 + 1
            if self.last_id not in self.unacked:
                return self.last_id
        raise RuntimeError("no free packet identifier")


@dataclass
class InboundAliases:
    """The topic aliases the client set, up to the maximum the gateway's CONNACK gave."""

    maximum: int
    topics: dict[int, str] = field(default_factory=dict)

    def topic_of(self, publish: Publish) -> str:
        """The PUBLISH's topic: its own (remembered under its alias, if it has one), or the one
        its alias stands for."""
        alias = publish.properties.get(TOPIC_ALIAS)
        if alias is None:
            return publish.topic
        if not 0 < alias <= self.maximum:
            raise MalformedPacket(
                f"topic alias {alias} outside 1..{self.maximum}", reason=TOPIC_ALIAS_INVALID
            )
        if publish.topic:
            self.topics[alias] = publish.topic
            return publish.topic
        topic = self.topics.get(alias)
        if topic is None:
            raise MalformedPacket(f"topic alias {alias} was never set", reason=PROTOCOL_ERROR)
        return topic


@dataclass
class OutboundAliases:
    """The aliases the gateway gives topics it PUBLISHes, up to the client's maximum. The first
    topics sent keep theirs for the connection (first-N): a subscriber's topics are its few
    literal subscriptions, so replacing aliases would rarely pay for its bookkeeping."""

    maximum: int
    by_topic: dict[str, int] = field(default_factory=dict)

    def choose(self, topic: str) -> tuple[str, int | None]:
        """What a PUBLISH of `topic` carries: (topic name, alias): the topic and a new alias,
        an empty name and the known alias, or the topic alone once the aliases are used up."""
        alias = self.by_topic.get(topic)
        if alias is not None:
            return "", alias
        if len(self.by_topic) < self.maximum:
            return topic, len(self.by_topic) + 1
        return topic, None

    def remember(self, topic: str, alias: int | None) -> None:
        """Called once a PUBLISH that set `alias` was written: from then on the client has it."""
        if alias is not None:
            self.by_topic.setdefault(topic, alias)
