"""MQTT control packets, 3.1.1 (protocol level 4) and 5.0 (level 5): bytes in, packets out, back.

What flows in: one packet's type-and-flags byte and its body (the bytes after the remaining length,
which `read_packet` takes off an asyncio stream). What flows out: a `Connect`, `Publish`,
`Subscribe`, ... dataclass, or `MalformedPacket` carrying the MQTT 5 reason code the client is told
before it is dropped; and for the gateway's answers (CONNACK, PUBLISH, PUBACK, PUBREC, PUBREL,
PUBCOMP, SUBACK, UNSUBACK, PINGRESP, DISCONNECT) the bytes to write.

Why hand-written: no packet codec on the package index serves both versions. `mqtt5` (Rust,
sans-io) and `moat-lib-mqtt` (a sans-io fork of mqttproto) read MQTT 5 only and refuse level 4;
`amqtt` reads 3.1.1 only, from its own stream adapters, and brings a broker's dependencies
(typer, transitions, a pinned websockets); `mqttproto` itself is not on the index this project
installs from. The two versions differ only by MQTT 5's properties and reason codes, so one
codec with the protocol level as a parameter is shorter than two libraries glued together.

Only what a server reads is decoded (CONNECT, PUBLISH, PUBACK, PUBREC, PUBREL, PUBCOMP,
SUBSCRIBE, UNSUBSCRIBE, PINGREQ, DISCONNECT); only what it writes is encoded (and PUBLISH, which
both sides send, both ways). Every string is strict UTF-8 without U+0000
(MQTT 1.5.4): anything else is a malformed packet.
"""

from __future__ import annotations

import asyncio
import struct
from dataclasses import dataclass, field
from typing import Any

MQTT_3_1_1 = 4
MQTT_5 = 5

CONNECT, CONNACK, PUBLISH, PUBACK = 1, 2, 3, 4
PUBREC, PUBREL, PUBCOMP = 5, 6, 7
SUBSCRIBE, SUBACK, UNSUBSCRIBE, UNSUBACK = 8, 9, 10, 11
PINGREQ, PINGRESP, DISCONNECT, AUTH = 12, 13, 14, 15

MALFORMED = 0x81
PROTOCOL_ERROR = 0x82
PACKET_TOO_LARGE = 0x95

# MQTT 5 property identifiers by the type of their value (MQTT 5, 2.2.2.2).
_BYTE_PROPERTIES = frozenset({0x01, 0x17, 0x19, 0x24, 0x25, 0x28, 0x29, 0x2A})
_U16_PROPERTIES = frozenset({0x13, 0x21, 0x22, 0x23})
_U32_PROPERTIES = frozenset({0x02, 0x11, 0x18, 0x27})
_VARINT_PROPERTIES = frozenset({0x0B})
_STRING_PROPERTIES = frozenset({0x03, 0x08, 0x12, 0x15, 0x1A, 0x1C, 0x1F})
_BINARY_PROPERTIES = frozenset({0x09, 0x16})
USER_PROPERTY = 0x26
REASON_STRING = 0x1F
CONTENT_TYPE = 0x03
MESSAGE_EXPIRY = 0x02
RESPONSE_TOPIC = 0x08
CORRELATION_DATA = 0x09
PAYLOAD_FORMAT = 0x01
RECEIVE_MAXIMUM = 0x21
TOPIC_ALIAS_MAXIMUM = 0x22
TOPIC_ALIAS = 0x23
SERVER_KEEP_ALIVE = 0x13
SESSION_EXPIRY = 0x11
MAXIMUM_PACKET_SIZE = 0x27
WILDCARD_AVAILABLE = 0x28
SHARED_AVAILABLE = 0x2A
RETAIN_AVAILABLE = 0x25
MAXIMUM_QOS = 0x24

Properties = dict[int, Any]  # identifier -> value; USER_PROPERTY -> list of (name, value)


class MalformedPacket(ValueError):
    """The client sent what MQTT forbids; `reason` is the MQTT 5 reason code to close with."""

    def __init__(self, text: str, *, reason: int = MALFORMED) -> None:
        super().__init__(text)
        self.reason = reason


@dataclass(frozen=True)
class Will:
    topic: str
    payload: bytes
    qos: int
    retain: bool
    properties: Properties


@dataclass(frozen=True)
class Connect:
    level: int
    client_id: str
    clean_start: bool
    keep_alive: int
    username: str | None
    password: bytes | None
    will: Will | None
    properties: Properties


@dataclass(frozen=True)
class Publish:
    topic: str
    payload: bytes
    qos: int
    retain: bool = False
    dup: bool = False
    packet_id: int | None = None
    properties: Properties = field(default_factory=dict)


@dataclass(frozen=True)
class PubAck:
    packet_id: int
    reason: int = 0


@dataclass(frozen=True)
class PubRec:
    """QoS 2, step 1: the receiver has the message (a reason of 0x80 or more: it refused it)."""

    packet_id: int
    reason: int = 0


@dataclass(frozen=True)
class PubRel:
    """QoS 2, step 2: the sender lets go of the message; the receiver may forget the id."""

    packet_id: int
    reason: int = 0


@dataclass(frozen=True)
class PubComp:
    """QoS 2, step 3: the receiver forgot the id; the exchange is complete."""

    packet_id: int
    reason: int = 0


@dataclass(frozen=True)
class Subscribe:
    packet_id: int
    filters: list[tuple[str, int]]  # (topic filter, options byte: QoS in the low two bits)
    properties: Properties


@dataclass(frozen=True)
class Unsubscribe:
    packet_id: int
    filters: list[str]


@dataclass(frozen=True)
class PingReq:
    pass


@dataclass(frozen=True)
class Disconnect:
    reason: int = 0
    # MQTT 5: session expiry, reason string; not compared (a DISCONNECT is known by its reason)
    properties: Properties = field(default_factory=dict, compare=False)


Packet = (
    Connect
    | Publish
    | PubAck
    | PubRec
    | PubRel
    | PubComp
    | Subscribe
    | Unsubscribe
    | PingReq
    | Disconnect
)

# The acknowledgements: packet type -> (the flags it must carry, its dataclass).
_ACKS: dict[int, tuple[int, type[PubAck | PubRec | PubRel | PubComp]]] = {
    PUBACK: (0, PubAck),
    PUBREC: (0, PubRec),
    PUBREL: (0x02, PubRel),
    PUBCOMP: (0, PubComp),
}


# -- reading ---------------------------------------------------------------------------------


class _Reader:
    """A cursor over one packet's body; every read past its end is a malformed packet."""

    def __init__(self, body: bytes) -> None:
        self.body = body
        self.pos = 0

    def remaining(self) -> int:
        return len(self.body) - self.pos

    def take(self, n: int) -> bytes:
        if n > self.remaining():
            raise MalformedPacket("packet ends early")
        chunk = self.body[self.pos : self.pos + n]
        self.pos += n
        return chunk

    def byte(self) -> int:
        return self.take(1)[0]

    def u16(self) -> int:
        value: int = struct.unpack("!H", self.take(2))[0]
        return value

    def u32(self) -> int:
        value: int = struct.unpack("!I", self.take(4))[0]
        return value

    def varint(self) -> int:
        value, shift = 0, 0
        for _ in range(4):
            digit = self.byte()
            value |= (digit & 0x7F) << shift
            if not digit & 0x80:
                return value
            shift += 7
        raise MalformedPacket("variable byte integer longer than four bytes")

    def binary(self) -> bytes:
        return self.take(self.u16())

    def string(self) -> str:
        return utf8(self.binary())

    def properties(self, level: int) -> Properties:
        if level < MQTT_5:
            return {}
        length = self.varint()
        end = self.pos + length
        if end > len(self.body):
            raise MalformedPacket("properties run past the packet")
        found: Properties = {}
        while self.pos < end:
            identifier = self.varint()
            value = self._property_value(identifier)
            if identifier == USER_PROPERTY:
                found.setdefault(USER_PROPERTY, []).append(value)
            elif identifier in found and identifier != 0x0B:
                raise MalformedPacket(f"property 0x{identifier:02X} given twice", reason=0x82)
            else:
                found[identifier] = value
        if self.pos != end:
            raise MalformedPacket("properties run past their length")
        return found

    def _property_value(self, identifier: int) -> Any:
        if identifier in _BYTE_PROPERTIES:
            return self.byte()
        if identifier in _U16_PROPERTIES:
            return self.u16()
        if identifier in _U32_PROPERTIES:
            return self.u32()
        if identifier in _VARINT_PROPERTIES:
            return self.varint()
        if identifier in _STRING_PROPERTIES:
            return self.string()
        if identifier in _BINARY_PROPERTIES:
            return self.binary()
        if identifier == USER_PROPERTY:
            return (self.string(), self.string())
        raise MalformedPacket(f"unknown property 0x{identifier:02X}")

    def done(self) -> None:
        if self.remaining():
            raise MalformedPacket(f"{self.remaining()} bytes left over at the end of the packet")


def utf8(raw: bytes) -> str:
    """A UTF-8 string as MQTT allows it (well formed, no U+0000), else a malformed packet."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise MalformedPacket(f"ill-formed UTF-8 string: {error.reason}") from None
    if "\x00" in text:
        raise MalformedPacket("UTF-8 string holds U+0000")
    return text


async def read_packet(reader: asyncio.StreamReader, *, max_size: int) -> tuple[int, bytes]:
    """The next packet's first byte and body off the stream (IncompleteReadError at EOF).

    A remaining length over `max_size` is refused before its bytes are read."""
    first = (await reader.readexactly(1))[0]
    length, shift = 0, 0
    for _ in range(4):
        digit = (await reader.readexactly(1))[0]
        length |= (digit & 0x7F) << shift
        if not digit & 0x80:
            break
        shift += 7
    else:
        raise MalformedPacket("remaining length longer than four bytes")
    if length > max_size:
        raise MalformedPacket(
            f"packet of {length} bytes exceeds the maximum of {max_size}", reason=PACKET_TOO_LARGE
        )
    return first, await reader.readexactly(length)


def decode_connect(first: int, body: bytes) -> Connect:
    """The CONNECT packet, which must come first: it says which protocol level the rest uses."""
    if first != CONNECT << 4:
        raise MalformedPacket("the first packet must be CONNECT", reason=PROTOCOL_ERROR)
    r = _Reader(body)
    name = r.string()
    level = r.byte()
    if name != "MQTT" or level not in (MQTT_3_1_1, MQTT_5):
        raise UnsupportedProtocol(level)
    flags = r.byte()
    if flags & 0x01:
        raise MalformedPacket("CONNECT reserved flag set")
    keep_alive = r.u16()
    properties = r.properties(level)
    client_id = r.string()
    will = None
    if flags & 0x04:
        will_properties = r.properties(level)
        will_qos = (flags >> 3) & 0x03
        if will_qos == 3:
            raise MalformedPacket("will QoS 3")
        will = Will(r.string(), r.binary(), will_qos, bool(flags & 0x20), will_properties)
    elif flags & 0x38:
        raise MalformedPacket("will QoS or retain without a will")
    username = r.string() if flags & 0x80 else None
    password = r.binary() if flags & 0x40 else None
    r.done()
    return Connect(
        level=level,
        client_id=client_id,
        clean_start=bool(flags & 0x02),
        keep_alive=keep_alive,
        username=username,
        password=password,
        will=will,
        properties=properties,
    )


class UnsupportedProtocol(Exception):
    """CONNECT named a protocol or level this gateway does not speak (CONNACK 0x01 / 0x84)."""

    def __init__(self, level: int) -> None:
        super().__init__(f"unsupported protocol level {level}")
        self.level = level


def decode(first: int, body: bytes, *, level: int) -> Packet:
    """Any packet after CONNECT, at the connection's protocol level."""
    kind, flags = first >> 4, first & 0x0F
    r = _Reader(body)
    if kind == PUBLISH:
        return _publish(flags, r, level)
    if kind in _ACKS and flags == _ACKS[kind][0]:
        packet_id = r.u16()
        reason = r.byte() if level >= MQTT_5 and r.remaining() else 0
        if r.remaining():
            r.properties(level)
        return _ACKS[kind][1](packet_id, reason)
    if kind == SUBSCRIBE and flags == 0x02:
        return _subscribe(r, level)
    if kind == UNSUBSCRIBE and flags == 0x02:
        packet_id = r.u16()
        r.properties(level)
        filters = [r.string()]
        while r.remaining():
            filters.append(r.string())
        return Unsubscribe(packet_id, filters)
    if kind == PINGREQ and flags == 0:
        r.done()
        return PingReq()
    if kind == DISCONNECT and flags == 0:
        reason = r.byte() if level >= MQTT_5 and r.remaining() else 0
        properties = r.properties(level) if level >= MQTT_5 and r.remaining() else {}
        return Disconnect(reason, properties)
    if kind == CONNECT:
        raise MalformedPacket("a second CONNECT", reason=PROTOCOL_ERROR)
    if kind == AUTH:
        raise MalformedPacket("AUTH, but CONNECT named no authentication method", reason=0x82)
    raise MalformedPacket(f"unexpected packet type {kind} with flags 0x{flags:X}")


def _publish(flags: int, r: _Reader, level: int) -> Publish:
    qos = (flags >> 1) & 0x03
    if qos == 3:
        raise MalformedPacket("PUBLISH with QoS 3")
    topic = r.string()
    packet_id = r.u16() if qos else None
    if packet_id == 0:
        raise MalformedPacket("PUBLISH with packet identifier 0")
    properties = r.properties(level)
    return Publish(
        topic=topic,
        payload=r.take(r.remaining()),
        qos=qos,
        retain=bool(flags & 0x01),
        dup=bool(flags & 0x08),
        packet_id=packet_id,
        properties=properties,
    )


def _subscribe(r: _Reader, level: int) -> Subscribe:
    packet_id = r.u16()
    properties = r.properties(level)
    filters: list[tuple[str, int]] = []
    while r.remaining():
        topic_filter = r.string()
        options = r.byte()
        reserved = 0xC0 if level >= MQTT_5 else 0xFC
        if options & reserved or options & 0x03 == 3:
            raise MalformedPacket(f"subscription options 0x{options:02X}")
        filters.append((topic_filter, options))
    if not filters:
        raise MalformedPacket("SUBSCRIBE without a topic filter", reason=PROTOCOL_ERROR)
    return Subscribe(packet_id, filters, properties)


# -- writing ---------------------------------------------------------------------------------


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        digit, n = n & 0x7F, n >> 7
        out.append(digit | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _string(text: str) -> bytes:
    raw = text.encode("utf-8")
    return struct.pack("!H", len(raw)) + raw


def _binary(raw: bytes) -> bytes:
    return struct.pack("!H", len(raw)) + raw


def _properties(properties: Properties) -> bytes:
    out = bytearray()
    for identifier, value in properties.items():
        if identifier == USER_PROPERTY:
            for name, text in value:
                out += _varint(USER_PROPERTY) + _string(name) + _string(text)
            continue
        out += _varint(identifier)
        if identifier in _BYTE_PROPERTIES:
            out.append(value)
        elif identifier in _U16_PROPERTIES:
            out += struct.pack("!H", value)
        elif identifier in _U32_PROPERTIES:
            out += struct.pack("!I", value)
        elif identifier in _VARINT_PROPERTIES:
            out += _varint(value)
        elif identifier in _STRING_PROPERTIES:
            out += _string(value)
        else:
            out += _binary(value)
    return _varint(len(out)) + bytes(out)


def _packet(first: int, body: bytes) -> bytes:
    return bytes([first]) + _varint(len(body)) + body


def encode_connack(
    *, level: int, code: int, properties: Properties | None = None, session_present: bool = False
) -> bytes:
    body = bytes([1 if session_present else 0, code])
    if level >= MQTT_5:
        body += _properties(properties or {})
    return _packet(CONNACK << 4, body)


def encode_publish(packet: Publish, *, level: int) -> bytes:
    flags = (packet.qos << 1) | (0x08 if packet.dup else 0) | (0x01 if packet.retain else 0)
    body = _string(packet.topic)
    if packet.qos:
        assert packet.packet_id is not None
        body += struct.pack("!H", packet.packet_id)
    if level >= MQTT_5:
        body += _properties(packet.properties)
    return _packet((PUBLISH << 4) | flags, body + packet.payload)


def encode_puback(packet_id: int, *, level: int, reason: int = 0, text: str = "") -> bytes:
    return _ack(PUBACK << 4, packet_id, level=level, reason=reason, text=text)


def encode_pubrec(packet_id: int, *, level: int, reason: int = 0, text: str = "") -> bytes:
    return _ack(PUBREC << 4, packet_id, level=level, reason=reason, text=text)


def encode_pubrel(packet_id: int, *, level: int, reason: int = 0) -> bytes:
    return _ack((PUBREL << 4) | 0x02, packet_id, level=level, reason=reason)


def encode_pubcomp(packet_id: int, *, level: int, reason: int = 0) -> bytes:
    return _ack(PUBCOMP << 4, packet_id, level=level, reason=reason)


def _ack(first: int, packet_id: int, *, level: int, reason: int = 0, text: str = "") -> bytes:
    """PUBACK, PUBREC, PUBREL or PUBCOMP: the id, and in MQTT 5 a reason unless it is success."""
    body = struct.pack("!H", packet_id)
    if level >= MQTT_5 and (reason or text):
        body += bytes([reason]) + _properties({REASON_STRING: text} if text else {})
    return _packet(first, body)


def encode_suback(packet_id: int, codes: list[int], *, level: int, text: str = "") -> bytes:
    body = struct.pack("!H", packet_id)
    if level >= MQTT_5:
        body += _properties({REASON_STRING: text} if text else {})
    return _packet(SUBACK << 4, body + bytes(codes))


def encode_unsuback(packet_id: int, codes: list[int], *, level: int) -> bytes:
    body = struct.pack("!H", packet_id)
    if level >= MQTT_5:
        body += _properties({}) + bytes(codes)
    return _packet(UNSUBACK << 4, body)


def encode_pingresp() -> bytes:
    return _packet(PINGRESP << 4, b"")


def encode_disconnect(reason: int, *, text: str = "") -> bytes:
    """MQTT 5 only: 3.1.1 has no server DISCONNECT (the server just closes)."""
    return _packet(DISCONNECT << 4, bytes([reason]) + _properties({REASON_STRING: text}))
