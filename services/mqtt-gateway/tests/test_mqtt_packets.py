"""The MQTT codec and the mapping, pure: CONNECT of both levels read back, MQTT 5 properties
through PUBLISH and back, the QoS 2 acknowledgements both ways, topic aliases, every way a
packet is malformed named with its reason code, topic filters sorted into served (wildcards
and shared ones too) and invalid."""

from __future__ import annotations

import struct

import pytest
from enmasse.amqp import codec
from enmasse.mqtt_gateway import mapping
from enmasse.mqtt_gateway.flow import InboundAliases, OutboundAliases
from enmasse.mqtt_gateway.packets import (
    MQTT_3_1_1,
    MQTT_5,
    TOPIC_ALIAS,
    USER_PROPERTY,
    MalformedPacket,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    Subscribe,
    UnsupportedProtocol,
    decode,
    decode_connect,
    encode_pubcomp,
    encode_publish,
    encode_pubrec,
    encode_pubrel,
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
        ("sensors/+", None),
        ("#", None),
        ("sensors/#/x", mapping.TOPIC_FILTER_INVALID),
        ("sensors/k+", mapping.TOPIC_FILTER_INVALID),
        ("", mapping.TOPIC_FILTER_INVALID),
        ("$share/g/sensors", None),
        ("$share/g/sensors/+", None),
        ("$share/g/sensors/k#", mapping.TOPIC_FILTER_INVALID),
        ("$share/g/", mapping.TOPIC_FILTER_INVALID),  # no filter
        ("$share//sensors", mapping.TOPIC_FILTER_INVALID),  # no group
        ("$share/g+/sensors", mapping.TOPIC_FILTER_INVALID),  # a wildcard in the group
    ],
)
def test_topic_filters(topic_filter: str, problem: int | None) -> None:
    assert mapping.filter_problem(topic_filter) == problem


@pytest.mark.parametrize("level", [MQTT_3_1_1, MQTT_5], ids=["3.1.1", "5"])
def test_the_qos2_acknowledgements_go_round(level: int) -> None:
    def back(packet: bytes) -> object:
        return decode(packet[0], packet[2:], level=level)

    assert back(encode_pubrec(7, level=level)) == PubRec(7)
    assert encode_pubrel(7, level=level)[0] == 0x62  # PUBREL's flags are 0b0010
    assert back(encode_pubrel(7, level=level)) == PubRel(7)
    assert back(encode_pubcomp(7, level=level)) == PubComp(7)
    refused = encode_pubrec(7, level=level, reason=0x87, text="no")
    assert back(refused) == (PubRec(7, 0x87) if level == MQTT_5 else PubRec(7))
    with pytest.raises(MalformedPacket):
        decode(0x60, b"\x00\x07", level=level)  # a PUBREL without its flags


def test_topic_aliases_both_ways() -> None:
    inbound = InboundAliases(maximum=2)
    aliased = Publish("a/b", b"", 0, properties={TOPIC_ALIAS: 2})
    assert inbound.topic_of(aliased) == "a/b"
    assert inbound.topic_of(Publish("", b"", 0, properties={TOPIC_ALIAS: 2})) == "a/b"
    for alias, reason in ((0, 0x94), (3, 0x94)):
        with pytest.raises(MalformedPacket) as error:
            inbound.topic_of(Publish("a", b"", 0, properties={TOPIC_ALIAS: alias}))
        assert error.value.reason == reason
    with pytest.raises(MalformedPacket) as error:
        inbound.topic_of(Publish("", b"", 0, properties={TOPIC_ALIAS: 1}))
    assert error.value.reason == 0x82  # never set
    outbound = OutboundAliases(maximum=1)
    assert outbound.choose("x") == ("x", 1)
    assert outbound.choose("x") == ("x", 1)  # not remembered until the PUBLISH was written
    outbound.remember("x", 1)
    assert outbound.choose("x") == ("", 1)
    assert outbound.choose("y") == ("y", None)  # the client allows one
