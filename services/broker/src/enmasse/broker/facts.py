"""What the broker reads from a message on arrival: durable, ttl, absolute-expiry-time, priority.

What flows in: the encoded message bytes of a delivery. What flows out: (durable, ttl ms or None,
absolute expiry ms or None, priority as sent: 4 when the header has none).

Why it is its own module: this runs once per message on the producer path, and a general decoder
(`enmasse.amqp.codec.read_header` / `read_properties`) spends a few microseconds walking
every field. The shapes producers actually send are few: no header, or a small list header
(`0x00 0x53 0x70 0xc0 size count ...`) with durable / priority / ttl in their one- or
five-byte encodings, followed by the body or by the properties. Those are read here by offset;
anything else (annotations before the properties, wide lists, unusual encodings) falls back to the
codec, so the answer is always the codec's answer, only faster for the common case.
"""

from __future__ import annotations

from enmasse.amqp import codec

Facts = tuple[bool, int | None, int | None, int]

DEFAULT_PRIORITY = codec.DEFAULT_PRIORITY
_NO_FACTS: Facts = (False, None, None, DEFAULT_PRIORITY)
_HEADER = b"\x00Sp"
_SECTION = b"\x00S"
_PROPERTIES = 0x73
_BEFORE_PROPERTIES = (0x71, 0x72)  # delivery- and message-annotations
_MAY_CARRY_EXPIRY = frozenset((_PROPERTIES, *_BEFORE_PROPERTIES))


def message_facts(payload: bytes, *, properties: codec.Properties | None = None) -> Facts:
    """(durable, ttl, absolute_expiry_time, priority) of an encoded message; raises
    codec.CodecError. `properties`: the message's, when the caller read them already (a relayed
    message's, for its `to`), so they are not decoded twice."""
    if payload[:3] != _HEADER:
        if payload[:2] == _SECTION and payload[2] not in _MAY_CARRY_EXPIRY:
            return _NO_FACTS  # the commonest shape: no header, the body next
        return _expiry_after(
            payload, 0, durable=False, ttl=None, priority=DEFAULT_PRIORITY, properties=properties
        )
    code = payload[3]
    if code == 0x45:  # empty list: every header field is its default
        return _expiry_after(
            payload, 4, durable=False, ttl=None, priority=DEFAULT_PRIORITY, properties=properties
        )
    if code != 0xC0:
        return _slow(payload, properties)
    end = 5 + payload[4]
    count = payload[5]
    pos = 6
    durable = False
    ttl = None
    priority = DEFAULT_PRIORITY
    if count >= 1:
        flag = payload[pos]
        if flag == 0x41:
            durable = True
        elif flag not in (0x40, 0x42):
            return _slow(payload, properties)
        pos += 1
    if count >= 2:
        code = payload[pos]
        if code == 0x40:
            pos += 1
        elif code == 0x50:
            priority = payload[pos + 1]
            pos += 2
        else:
            return _slow(payload, properties)
    if count >= 3:
        kind = payload[pos]
        if kind == 0x52:
            ttl = payload[pos + 1]
        elif kind == 0x70:
            ttl = int.from_bytes(payload[pos + 1 : pos + 5], "big")
        elif kind == 0x43:
            ttl = 0
        elif kind != 0x40:
            return _slow(payload, properties)
    return _expiry_after(
        payload, end, durable=durable, ttl=ttl or None, priority=priority, properties=properties
    )


def _expiry_after(
    payload: bytes,
    pos: int,
    *,
    durable: bool,
    ttl: int | None,
    priority: int,
    properties: codec.Properties | None,
) -> Facts:
    """Reads absolute-expiry-time only when a properties section can be there."""
    if payload[pos : pos + 2] == _SECTION and payload[pos + 2] not in _MAY_CARRY_EXPIRY:
        return durable, ttl, None, priority
    expiry = _properties(payload, properties).absolute_expiry_time or None
    return durable, ttl, expiry, priority


def _slow(payload: bytes, properties: codec.Properties | None) -> Facts:
    header = codec.read_header(payload)
    expiry = _properties(payload, properties).absolute_expiry_time
    return header.durable, header.ttl or None, expiry or None, header.priority


def _properties(payload: bytes, known: codec.Properties | None) -> codec.Properties:
    return known if known is not None else codec.read_properties(payload)
