"""The MQTT codec and the mapping, pure: CONNECT of both levels read back, MQTT 5 properties
through PUBLISH and back, every way a packet is malformed named with its reason code, topic
filters sorted into served, refused (wildcards) and invalid."""

from __future__ import annotations

import struct

import pytest
from enmasse.amqp import codec
from enmasse.mqtt_gateway import mapping
from enmasse.mqtt_gateway.packets import (
    MQTT_3_1_1,
    MQTT_5,
    USER_PROPERTY,
    MalformedPacket,
    Publish,
    Subscribe,
    UnsupportedProtocol,
    decode,
    decode_connect,
    encode_publish,
)


def _string(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("!H", len(raw)) + raw


def _connect_body(level: int, *, flags: int = 0x02, tail: bytes = b"") -> bytes:
    properties = b"\x00" if level == MQTT_5 else b""
    return _string("MQTT") + bytes([level, flags]) + b"\x00\x3c" + properties + tail


def test_connect_of_both_levels_with_a_login() -> None:
    for level in (MQTT_3_1_1, MQTT_5):
        body = _connect_body(
            level, flags=0xC2, tail=_string("dev-1") + _string("alice") + _string("pw")
        )
        connect = decode_connect(0x10, body)
        assert (connect.level, connect.client_id, connect.username, connect.password) == (
            level,
            "dev-1",
            "alice",
            b"pw",
        )
        assert connect.clean_start
        assert connect.keep_alive == 60


def test_an_unknown_protocol_level_is_named() -> None:
    with pytest.raises(UnsupportedProtocol) as refused:
        decode_connect(0x10, _string("MQTT") + b"\x03\x02\x00\x3c" + _string("x"))
    assert refused.value.level == 3
    assert mapping.connack_code(mapping.UNSUPPORTED_VERSION, level=3) == 0x01


def test_publish_properties_go_round_and_map_onto_amqp() -> None:
    publish = Publish(
        topic="sensors/kitchen",
        payload=b"21.5",
        qos=1,
        packet_id=7,
        properties={0x03: "text/plain", 0x02: 30, USER_PROPERTY: [("site", "north")]},
    )
    raw = encode_publish(publish, level=MQTT_5)
    assert decode(raw[0], raw[2:], level=MQTT_5) == publish
    message = mapping.message_of(publish.payload, qos=1, properties=publish.properties)
    header = codec.read_header(message)
    assert (header.durable, header.ttl) == (True, 30_000)
    assert codec.read_properties(message).content_type == "text/plain"
    assert codec.read_application_properties(message) == {"site": "north"}
    assert mapping.payload_of(message) == b"21.5"
    assert mapping.payload_of(codec.encode_message("text")) == b"text"


@pytest.mark.parametrize(
    ("first", "body", "reason", "why"),
    [
        (0x36, _string("a") + b"\x00\x01", 0x81, "PUBLISH with QoS 3"),
        (0x30, b"\x00\x02\xff\xfe", 0x81, "ill-formed UTF-8"),
        (0x30, _string("a\x00b"), 0x81, "U+0000"),
        (0x32, _string("a") + b"\x00\x00", 0x81, "packet identifier 0"),
        (0x82, b"\x00\x01\x00", 0x82, "without a topic filter"),
        (0x82, b"\x00\x01\x00" + _string("a") + b"\x03", 0x81, "subscription options"),
        (0x80, b"\x00\x01\x00" + _string("a") + b"\x00", 0x81, "unexpected packet type 8"),
        (0x30, _string("a") + b"\x05\x63", 0x81, "properties run past"),
        (0x30, _string("a") + b"\x02\x7f\x00", 0x81, "unknown property 0x7F"),
        (0x10, b"", 0x82, "a second CONNECT"),
        (0xC0, b"\x00", 0x81, "left over"),
    ],
)
def test_malformed_packets_are_named(first: int, body: bytes, reason: int, why: str) -> None:
    with pytest.raises(MalformedPacket) as bad:
        decode(first, body, level=MQTT_5)
    assert why in str(bad.value)
    assert bad.value.reason == reason


def test_a_311_subscribe_has_no_properties() -> None:
    body = b"\x00\x05" + _string("a/b") + b"\x01"
    assert decode(0x82, body, level=MQTT_3_1_1) == Subscribe(5, [("a/b", 1)], {})


@pytest.mark.parametrize(
    ("topic_filter", "problem"),
    [
        ("sensors/kitchen", None),
        ("sensors/+", mapping.WILDCARDS_NOT_SUPPORTED),
        ("#", mapping.WILDCARDS_NOT_SUPPORTED),
        ("sensors/#/x", mapping.TOPIC_FILTER_INVALID),
        ("sensors/k+", mapping.TOPIC_FILTER_INVALID),
        ("", mapping.TOPIC_FILTER_INVALID),
        ("$share/g/sensors", 0x9E),
    ],
)
def test_topic_filters(topic_filter: str, problem: int | None) -> None:
    assert mapping.filter_problem(topic_filter) == problem
