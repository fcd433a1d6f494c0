"""What MQTT means on the router network: topics as addresses, payloads as messages, AMQP
answers as MQTT reason codes.

What flows in: an MQTT topic or topic filter, a PUBLISH, an AMQP delivery's payload, an AMQP
condition or outcome. What flows out: the address of the space, the encoded AMQP message, the
payload of a PUBLISH, the reason code (MQTT 5) or return code (3.1.1) the client is told.

Why so: a topic is an address of the space, verbatim (`sensors/kitchen` is the address
`sensors/kitchen`, of whatever type the space gives it), so MQTT and AMQP clients meet at the same
names. QoS 0 becomes a pre-settled transfer, QoS 1 and 2 an unsettled, durable one (QoS 2's
exactly-once is kept by the gateway's packet-id state, `flow.py`: AMQP has no QoS to carry); a
subscriber gets a delivery at its granted QoS when the router wants an outcome for it or the
message is durable, else (pre-settled and not durable: sent at most once) at QoS 0. A topic
filter with `+` or `#`, and a shared one (`$share/group/filter`), is matched by the router
against the space's multicast and topic addresses, those created later included (`filters.py`).
"""

from __future__ import annotations

from typing import Any

from enmasse.amqp import codec
from enmasse.amqp.engine import Condition, Outcome
from enmasse.mqtt_gateway.filters import share_of, share_problem
from enmasse.mqtt_gateway.packets import (
    CONTENT_TYPE,
    CORRELATION_DATA,
    MESSAGE_EXPIRY,
    MQTT_5,
    RESPONSE_TOPIC,
    USER_PROPERTY,
    MalformedPacket,
    Properties,
)

# MQTT 5 reason codes the gateway gives (MQTT 5, 2.4).
UNSPECIFIED = 0x80
NOT_AUTHORIZED = 0x87
BAD_CREDENTIALS = 0x86
SERVER_UNAVAILABLE = 0x88
TOPIC_FILTER_INVALID = 0x8F
TOPIC_NAME_INVALID = 0x90
PACKET_TOO_LARGE = 0x95
QUOTA_EXCEEDED = 0x97
UNSUPPORTED_VERSION = 0x84
NO_SUBSCRIPTION_EXISTED = 0x11
CLIENT_ID_NOT_VALID = 0x85
KEEP_ALIVE_TIMEOUT = 0x8D

RETAIN_ANNOTATION = "x-opt-mqtt-retain"
"""The message annotation that carries a PUBLISH's retain flag through the router network, for
subscribers that asked for retain-as-published (`retained.py`)."""

# CONNACK return codes of MQTT 3.1.1 for the MQTT 5 reasons a login can fail with (3.2.2.3).
_CONNACK_3_1_1 = {
    UNSUPPORTED_VERSION: 0x01,
    CLIENT_ID_NOT_VALID: 0x02,
    SERVER_UNAVAILABLE: 0x03,
    QUOTA_EXCEEDED: 0x03,
    BAD_CREDENTIALS: 0x04,
    NOT_AUTHORIZED: 0x05,
}

# AMQP conditions -> MQTT 5 reasons, for a refused login, attach or delivery.
_CONDITION_REASONS = {
    "amqp:unauthorized-access": NOT_AUTHORIZED,
    "amqp:resource-limit-exceeded": QUOTA_EXCEEDED,
    "amqp:link:message-size-exceeded": PACKET_TOO_LARGE,
    "amqp:not-found": TOPIC_NAME_INVALID,
}


def connack_code(reason: int, *, level: int) -> int:
    """The CONNACK code for a refusal: the MQTT 5 reason itself, or its 3.1.1 return code."""
    return reason if level >= MQTT_5 else _CONNACK_3_1_1.get(reason, 0x03)


def login_refusal(condition: Condition | None) -> int:
    """The MQTT 5 reason for a router that would not let the client's user in."""
    if condition is None:
        return SERVER_UNAVAILABLE
    if condition.name == "amqp:unauthorized-access":
        return BAD_CREDENTIALS
    if condition.name == "amqp:resource-limit-exceeded":
        return QUOTA_EXCEEDED
    return SERVER_UNAVAILABLE


def refusal_reason(condition: Condition | None) -> int:
    """The MQTT 5 reason for a refused attach or a rejected delivery."""
    if condition is None:
        return UNSPECIFIED
    return _CONDITION_REASONS.get(condition.name, UNSPECIFIED)


def outcome_reason(outcome: Outcome | None, condition: Condition | None) -> int:
    """0 for ACCEPTED; else the failure reason a PUBACK carries."""
    if outcome is Outcome.ACCEPTED:
        return 0
    if outcome is Outcome.REJECTED:
        return refusal_reason(condition)
    return UNSPECIFIED  # released, modified or never settled: not delivered


def address_of_topic(topic: str) -> str:
    """The address a PUBLISH goes to: the topic itself, which must name one address."""
    if not topic:
        raise MalformedPacket("empty topic name", reason=TOPIC_NAME_INVALID)
    if "+" in topic or "#" in topic:
        raise MalformedPacket(f"topic name {topic!r} holds a wildcard", reason=TOPIC_NAME_INVALID)
    return topic


def filter_problem(topic_filter: str) -> int | None:
    """Why a topic filter cannot be subscribed to (an MQTT 5 reason), or None when it can."""
    if share_problem(topic_filter):
        return TOPIC_FILTER_INVALID
    topic_filter = share_of(topic_filter)[1]
    if not topic_filter:
        return TOPIC_FILTER_INVALID
    levels = topic_filter.split("/")
    for i, level in enumerate(levels):
        misplaced_hash = "#" in level and (level != "#" or i != len(levels) - 1)
        if ("+" in level and level != "+") or misplaced_hash:
            return TOPIC_FILTER_INVALID
    return None


def suback_code(reason: int, *, level: int) -> int:
    """A SUBACK entry for a refused filter: the MQTT 5 reason, or 3.1.1's one failure code."""
    return reason if level >= MQTT_5 else 0x80


def message_of(payload: bytes, *, qos: int, properties: Properties, retain: bool = False) -> bytes:
    """The AMQP message a PUBLISH becomes: the payload as a data section, durable from QoS 1,
    and the MQTT 5 properties that have an AMQP field (expiry -> ttl, content type, response
    topic -> reply-to, correlation data, user properties -> application properties)."""
    expiry = properties.get(MESSAGE_EXPIRY)
    fields: dict[str, Any] = {}
    if CONTENT_TYPE in properties:
        fields["content_type"] = properties[CONTENT_TYPE]
    if CORRELATION_DATA in properties:
        fields["correlation_id"] = properties[CORRELATION_DATA]
    user = properties.get(USER_PROPERTY)
    return codec.encode_message(
        payload,
        durable=qos > 0,
        ttl=expiry * 1000 if expiry is not None else None,
        reply_to=properties.get(RESPONSE_TOPIC),
        properties=fields or None,
        application_properties=dict(user) if user else None,
        message_annotations={RETAIN_ANNOTATION: True} if retain else None,
    )


def payload_of(message: bytes) -> bytes:
    """The PUBLISH payload of an AMQP message: a data section as is, text as UTF-8, nothing as
    empty, any other value as its text."""
    body = codec.read_body(message)
    if body is None:
        return b""
    if isinstance(body, bytes | bytearray | memoryview):
        return bytes(body)
    return str(body).encode("utf-8")
