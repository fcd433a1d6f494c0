"""AMQP 1.0 message bytes without proton's Message class: build once, peek cheaply, rewrite.

What flows in: an encoded message (the `payload` of a delivery, exactly the bytes on the wire) or
the pieces of a new one. What flows out: a new payload (`encode_message`, `with_delivery_count`),
or a few fields read out of one (`read_header`, `read_properties`, `read_body`).

Why it is built so: routers and brokers forward messages they never need to understand. Decoding a
whole message through `proton.Message` costs tens of microseconds; the fields a router or broker
needs (durable, ttl, priority, delivery-count from the header; `to` and absolute-expiry-time from
the properties) sit in the first few dozen bytes. The readers here walk only those sections and
skip everything else by its encoded size, never touching the body. Senders in benches and tests
encode a payload once and send the same bytes many times.

A message is a sequence of described sections (AMQP 1.0 part 3.2), each `0x00` + descriptor +
value: header (0x70), delivery-annotations (0x71), message-annotations (0x72), properties (0x73),
application-properties (0x74), body: data (0x75) / amqp-sequence (0x76) / amqp-value (0x77),
footer (0x78).
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Mapping
from typing import Any, NamedTuple

HEADER = 0x70
DELIVERY_ANNOTATIONS = 0x71
MESSAGE_ANNOTATIONS = 0x72
PROPERTIES = 0x73
APPLICATION_PROPERTIES = 0x74
DATA = 0x75
AMQP_SEQUENCE = 0x76
AMQP_VALUE = 0x77
FOOTER = 0x78

DEFAULT_PRIORITY = 4


class CodecError(ValueError):
    """The bytes are not a well-formed AMQP message (truncated section, unknown format code)."""


class Header(NamedTuple):
    durable: bool = False
    priority: int = DEFAULT_PRIORITY
    ttl: int | None = None  # milliseconds
    first_acquirer: bool = False
    delivery_count: int = 0


class Properties(NamedTuple):
    message_id: Any = None
    user_id: bytes | None = None
    to: str | None = None
    subject: str | None = None
    reply_to: str | None = None
    correlation_id: Any = None
    content_type: str | None = None
    content_encoding: str | None = None
    absolute_expiry_time: int | None = None  # milliseconds since the epoch
    creation_time: int | None = None
    group_id: str | None = None
    group_sequence: int | None = None
    reply_to_group_id: str | None = None


NO_HEADER = Header()
NO_PROPERTIES = Properties()
_PROPERTY_FIELDS = Properties._fields

# --- reading ---------------------------------------------------------------------------------

_FIXED_WIDTH = {0x4: 0, 0x5: 1, 0x6: 2, 0x7: 4, 0x8: 8, 0x9: 16}
_SIZE_WIDTH = {0xA: 1, 0xB: 4, 0xC: 1, 0xD: 4, 0xE: 1, 0xF: 4}


def _skip(buf: bytes, pos: int) -> int:
    """Returns the position just past the value encoded at `pos`, reading only its size."""
    code = buf[pos]
    if code == 0x00:  # described: descriptor then value
        return _skip(buf, _skip(buf, pos + 1))
    pos += 1
    hi = code >> 4
    width = _FIXED_WIDTH.get(hi)
    if width is not None:
        end = pos + width
    elif hi in _SIZE_WIDTH:
        if _SIZE_WIDTH[hi] == 1:
            end = pos + 1 + buf[pos]
        else:
            end = pos + 4 + int.from_bytes(buf[pos : pos + 4], "big")
    else:
        raise CodecError(f"unknown AMQP format code 0x{code:02x} at offset {pos - 1}")
    if end > len(buf):
        raise CodecError(f"value at offset {pos - 1} runs past the end of the message")
    return end


def _read(buf: bytes, pos: int) -> tuple[Any, int]:
    """Decodes the primitive value at `pos` (compound values come back as their raw bytes)."""
    code = buf[pos]
    p = pos + 1
    if code == 0x40:
        return None, p
    if code == 0x41:
        return True, p
    if code == 0x42:
        return False, p
    if code in (0x43, 0x44):
        return 0, p
    if code == 0x56:
        return buf[p] != 0, p + 1
    if code in (0x50, 0x52, 0x53):
        return buf[p], p + 1
    if code in (0x51, 0x54, 0x55):
        return struct.unpack_from(">b", buf, p)[0], p + 1
    if code == 0x60:
        return struct.unpack_from(">H", buf, p)[0], p + 2
    if code == 0x61:
        return struct.unpack_from(">h", buf, p)[0], p + 2
    if code == 0x70:
        return struct.unpack_from(">I", buf, p)[0], p + 4
    if code == 0x71:
        return struct.unpack_from(">i", buf, p)[0], p + 4
    if code in (0x80, 0x83):
        return struct.unpack_from(">Q" if code == 0x80 else ">q", buf, p)[0], p + 8
    if code == 0x81:
        return struct.unpack_from(">q", buf, p)[0], p + 8
    if code == 0x82:
        return struct.unpack_from(">d", buf, p)[0], p + 8
    if code == 0x72:
        return struct.unpack_from(">f", buf, p)[0], p + 4
    if code == 0x98:
        return uuid.UUID(bytes=bytes(buf[p : p + 16])), p + 16
    if code in (0xA0, 0xA1, 0xA3, 0xB0, 0xB1, 0xB3):
        start = p + 1 if code < 0xB0 else p + 4
        end = _skip(buf, pos)
        raw = bytes(buf[start:end])
        return (raw if code in (0xA0, 0xB0) else raw.decode()), end
    end = _skip(buf, pos)
    return bytes(buf[pos:end]), end


def _list_fields(buf: bytes, pos: int) -> tuple[int, int, int]:
    """For the list encoded at `pos`: (position of its first item, item count, end position)."""
    code = buf[pos]
    if code == 0x45:
        return pos + 1, 0, pos + 1
    if code == 0xC0:
        return pos + 3, buf[pos + 2], pos + 2 + buf[pos + 1]
    if code == 0xD0:
        size = int.from_bytes(buf[pos + 1 : pos + 5], "big")
        count = int.from_bytes(buf[pos + 5 : pos + 9], "big")
        return pos + 9, count, pos + 5 + size
    raise CodecError(f"expected a list at offset {pos}, found format code 0x{code:02x}")


def _section_at(buf: bytes, pos: int) -> tuple[int, int] | None:
    """(section code, position of its value) of the section at `pos`; None past the end."""
    if pos >= len(buf):
        return None
    if buf[pos] != 0x00:
        raise CodecError(f"expected a described section at offset {pos}")
    code = buf[pos + 1]
    if code == 0x53:
        return buf[pos + 2], pos + 3
    if code == 0x80:
        return int.from_bytes(buf[pos + 2 : pos + 10], "big") & 0xFF, pos + 10
    raise CodecError(f"unsupported section descriptor 0x{code:02x} at offset {pos}")


def _find(buf: bytes, wanted: int) -> tuple[int, int] | None:
    """(section start, value position) of the first section `wanted`, or None."""
    pos = 0
    while True:
        found = _section_at(buf, pos)
        if found is None:
            return None
        code, value_pos = found
        if code == wanted:
            return pos, value_pos
        if code > wanted:
            return None
        pos = _skip(buf, value_pos)


def read_header(payload: bytes) -> Header:
    """The header section's fields, or the AMQP defaults when the message has no header."""
    if payload[:3] != b"\x00Sp":
        return NO_HEADER
    first, count, _end = _list_fields(payload, 3)
    values: list[Any] = []
    pos = first
    for _ in range(min(count, 5)):
        value, pos = _read(payload, pos)
        values.append(value)
    durable, priority, ttl, first_acquirer, delivery_count = (values + [None] * 5)[:5]
    return Header(
        durable=bool(durable),
        priority=DEFAULT_PRIORITY if priority is None else priority,
        ttl=ttl,
        first_acquirer=bool(first_acquirer),
        delivery_count=delivery_count or 0,
    )


def read_properties(payload: bytes) -> Properties:
    """The properties section's fields (to, reply-to, absolute-expiry-time...), body untouched."""
    found = _find(payload, PROPERTIES)
    if found is None:
        return NO_PROPERTIES
    first, count, _end = _list_fields(payload, found[1])
    values: list[Any] = []
    pos = first
    for _ in range(min(count, len(_PROPERTY_FIELDS))):
        value, pos = _read(payload, pos)
        values.append(value)
    return Properties(*values)


def read_body(payload: bytes) -> Any:
    """The body: bytes for a data section, the decoded value for a primitive amqp-value."""
    pos = 0
    while True:
        found = _section_at(payload, pos)
        if found is None:
            return None
        code, value_pos = found
        if code in (DATA, AMQP_VALUE):
            return _read(payload, value_pos)[0]
        pos = _skip(payload, value_pos)


def read_application_properties(payload: bytes) -> dict[str, Any]:
    """The application-properties map (string keys, primitive values)."""
    return _read_map_section(payload, APPLICATION_PROPERTIES, "application-properties")


def read_message_annotations(payload: bytes) -> dict[str, Any]:
    """The message-annotations map (symbol keys as str): where intermediaries put trace context."""
    return _read_map_section(payload, MESSAGE_ANNOTATIONS, "message-annotations")


def _map_header(payload: bytes, value_pos: int, what: str) -> tuple[int, int]:
    """(count of keys and values, position of the first key) of the map encoded at value_pos."""
    code = payload[value_pos]
    if code == 0xC1:
        return payload[value_pos + 2], value_pos + 3
    if code == 0xD1:
        return int.from_bytes(payload[value_pos + 5 : value_pos + 9], "big"), value_pos + 9
    raise CodecError(f"{what} is not a map (format code 0x{code:02x})")


def _read_map_section(payload: bytes, section: int, what: str) -> dict[str, Any]:
    found = _find(payload, section)
    if found is None:
        return {}
    count, pos = _map_header(payload, found[1], what)
    result: dict[str, Any] = {}
    for _ in range(count // 2):
        key, pos = _read(payload, pos)
        value, pos = _read(payload, pos)
        result[str(key)] = value
    return result


# --- writing ---------------------------------------------------------------------------------


def _enc(value: Any) -> bytes:
    """Encodes one primitive value in its smallest AMQP form."""
    if value is None:
        return b"\x40"
    if value is True:
        return b"\x41"
    if value is False:
        return b"\x42"
    if isinstance(value, int):
        if -128 <= value <= 127:
            return b"\x55" + struct.pack(">b", value)
        return b"\x81" + struct.pack(">q", value)
    if isinstance(value, float):
        return b"\x82" + struct.pack(">d", value)
    if isinstance(value, str):
        raw = value.encode()
        return (b"\xa1" + bytes([len(raw)]) if len(raw) < 256 else b"\xb1" + _u32(len(raw))) + raw
    if isinstance(value, bytes | bytearray | memoryview):
        raw = bytes(value)
        return (b"\xa0" + bytes([len(raw)]) if len(raw) < 256 else b"\xb0" + _u32(len(raw))) + raw
    if isinstance(value, uuid.UUID):
        return b"\x98" + value.bytes
    raise TypeError(f"cannot encode {type(value).__name__} as an AMQP primitive")


def _u32(n: int) -> bytes:
    return n.to_bytes(4, "big")


def _uint(value: int | None) -> bytes:
    if value is None:
        return b"\x40"
    if value == 0:
        return b"\x43"
    if value < 256:
        return b"\x52" + bytes([value])
    return b"\x70" + _u32(value)


def _timestamp(value: int | None) -> bytes:
    return b"\x40" if value is None else b"\x83" + struct.pack(">q", value)


def _symbol(value: str) -> bytes:
    raw = value.encode("ascii")
    return (b"\xa3" + bytes([len(raw)]) if len(raw) < 256 else b"\xb3" + _u32(len(raw))) + raw


def _list(items: list[bytes]) -> bytes:
    while items and items[-1] == b"\x40":  # trailing nulls are implied
        items.pop()
    if not items:
        return b"\x45"
    body = b"".join(items)
    if len(body) + 1 < 256 and len(items) < 256:
        return b"\xc0" + bytes([len(body) + 1, len(items)]) + body
    return b"\xd0" + _u32(len(body) + 4) + _u32(len(items)) + body


def _map(entries: list[tuple[bytes, bytes]]) -> bytes:
    body = b"".join(k + v for k, v in entries)
    count = len(entries) * 2
    if len(body) + 1 < 256 and count < 256:
        return b"\xc1" + bytes([len(body) + 1, count]) + body
    return b"\xd1" + _u32(len(body) + 4) + _u32(count) + body


def encode_header(header: Header) -> bytes:
    """The header section for these fields (empty bytes when every field is its default)."""
    if header == NO_HEADER:
        return b""
    items = [
        b"\x41" if header.durable else b"\x40",
        b"\x40" if header.priority == DEFAULT_PRIORITY else b"\x50" + bytes([header.priority]),
        _uint(header.ttl),
        b"\x41" if header.first_acquirer else b"\x40",
        _uint(header.delivery_count) if header.delivery_count else b"\x40",
    ]
    return b"\x00Sp" + _list(items)


def encode_message(
    body: bytes | str | None,
    *,
    durable: bool = False,
    ttl: int | None = None,
    priority: int = DEFAULT_PRIORITY,
    to: str | None = None,
    reply_to: str | None = None,
    properties: Mapping[str, Any] | None = None,
    application_properties: Mapping[str, Any] | None = None,
    message_annotations: Mapping[str, Any] | None = None,
) -> bytes:
    """Encodes a message once; senders reuse the bytes for every send.

    `body` bytes become a data section, a str or None an amqp-value. `ttl` is in milliseconds.
    `properties` sets other fields of the properties section by name (message_id, subject,
    correlation_id, content_type, absolute_expiry_time, creation_time, group_id, ...).
    """
    parts = [encode_header(Header(durable=durable, priority=priority, ttl=ttl))]
    if message_annotations:
        entries = [(_symbol(k), _enc(v)) for k, v in message_annotations.items()]
        parts.append(b"\x00Sr" + _map(entries))
    fields = dict(properties or {})
    if to is not None:
        fields["to"] = to
    if reply_to is not None:
        fields["reply_to"] = reply_to
    if fields:
        unknown = set(fields) - set(_PROPERTY_FIELDS)
        if unknown:
            raise ValueError(f"unknown message properties: {', '.join(sorted(unknown))}")
        parts.append(
            b"\x00Ss" + _list([_property(name, fields.get(name)) for name in _PROPERTY_FIELDS])
        )
    if application_properties:
        entries = [(_enc(str(k)), _enc(v)) for k, v in application_properties.items()]
        parts.append(b"\x00St" + _map(entries))
    if isinstance(body, bytes | bytearray | memoryview):
        parts.append(b"\x00Su" + _enc(bytes(body)))
    else:
        parts.append(b"\x00Sw" + _enc(body))
    return b"".join(parts)


def _property(name: str, value: Any) -> bytes:
    if value is None:
        return b"\x40"
    if name in ("absolute_expiry_time", "creation_time"):
        return _timestamp(value)
    if name == "group_sequence":
        return b"\x70" + _u32(value)
    if name in ("to", "reply_to", "reply_to_group_id", "group_id", "subject"):
        return _enc(str(value))
    if name in ("content_type", "content_encoding"):
        return _symbol(value)
    if name == "user_id":
        return _enc(bytes(value))
    if name in ("message_id", "correlation_id") and isinstance(value, int) and value >= 0:
        return b"\x80" + struct.pack(">Q", value)
    return _enc(value)


def with_header(payload: bytes, header: Header) -> bytes:
    """The same message with its header section replaced by `header` (rest of the bytes reused)."""
    rest = payload
    if payload[:3] == b"\x00Sp":
        rest = payload[_skip(payload, 3) :]
    return encode_header(header) + rest


def with_delivery_count(payload: bytes, delivery_count: int) -> bytes:
    """The same message with the header's delivery-count set and first-acquirer false: what a
    broker does on redelivery (an earlier delivery acquired it, AMQP 1.0 §3.2.1)."""
    header = read_header(payload)._replace(delivery_count=delivery_count, first_acquirer=False)
    return with_header(payload, header)


def with_message_annotations(payload: bytes, changes: Mapping[str, Any]) -> bytes:
    """The same message with these message-annotations set (a None value removes the key):
    every other annotation and every other section is kept byte for byte (a broker rewriting
    `x-opt-delivery-delay` into `x-opt-delivery-time`). New keys are symbols; int values longs."""
    found = _find(payload, MESSAGE_ANNOTATIONS)
    kept: list[tuple[bytes, bytes]] = []
    if found is None:
        start = end = _after_header_and_delivery_annotations(payload)
    else:
        start, value_pos = found
        end = _skip(payload, value_pos)
        count, pos = _map_header(payload, value_pos, "message-annotations")
        for _ in range(count // 2):
            key, key_end = _read(payload, pos)
            value_end = _skip(payload, key_end)
            if str(key) not in changes:
                kept.append((payload[pos:key_end], payload[key_end:value_end]))
            pos = value_end
    for key, value in changes.items():
        if value is not None:
            encoded = b"\x81" + struct.pack(">q", value) if isinstance(value, int) else _enc(value)
            kept.append((_symbol(key), encoded))
    section = b"\x00Sr" + _map(kept) if kept else b""
    return payload[:start] + section + payload[end:]


def _after_header_and_delivery_annotations(payload: bytes) -> int:
    pos = 0
    while True:
        found = _section_at(payload, pos)
        if found is None or found[0] > DELIVERY_ANNOTATIONS:
            return pos
        pos = _skip(payload, found[1])
