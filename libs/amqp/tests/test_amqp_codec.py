"""The codec against proton's own Message encoder/decoder: what we write proton reads back, what
proton writes we read, and header rewrites keep every other byte.
"""

from __future__ import annotations

import uuid

import pytest
from enmasse.amqp import codec
from proton import Message


def proton_encoded(**fields: object) -> bytes:
    return Message(**fields).encode()


def test_encoded_message_decodes_in_proton():
    payload = codec.encode_message(
        b"\x00\x01body",
        durable=True,
        ttl=2500,
        priority=9,
        to="orders",
        reply_to="replies",
        properties={"message_id": 42, "subject": "s", "content_type": "application/octet-stream"},
        application_properties={"tenant": "acme", "n": 7, "ok": True, "ratio": 0.5},
        message_annotations={"x-opt-route": "r1"},
    )
    message = Message()
    message.decode(payload)
    assert message.body == b"\x00\x01body"
    assert (message.durable, message.ttl, message.priority) == (True, 2.5, 9)
    assert (message.address, message.reply_to, message.id, message.subject) == (
        "orders",
        "replies",
        42,
        "s",
    )
    assert message.content_type == "application/octet-stream"
    assert message.properties == {"tenant": "acme", "n": 7, "ok": True, "ratio": 0.5}
    assert message.annotations == {"x-opt-route": "r1"}


def test_string_body_is_an_amqp_value():
    message = Message()
    message.decode(codec.encode_message("héllo"))
    assert message.body == "héllo"
    assert codec.read_body(codec.encode_message("héllo")) == "héllo"


def test_header_fields_read_from_proton_messages():
    payload = proton_encoded(body="x", durable=True, ttl=3.0, priority=1, delivery_count=4)
    assert codec.read_header(payload) == codec.Header(
        durable=True, priority=1, ttl=3000, first_acquirer=False, delivery_count=4
    )


def test_message_without_header_has_defaults():
    assert codec.read_header(codec.encode_message(b"x")) == codec.Header()
    assert codec.read_header(codec.encode_message(b"x")).priority == 4


def test_properties_read_past_annotations_without_touching_the_body():
    payload = proton_encoded(
        body="b" * 10_000,
        address="a/b",
        reply_to="r",
        expiry_time=1700000000.5,
        correlation_id=uuid.UUID(int=5),
        annotations={"x-opt-a": 1},
        instructions={"x-opt-b": "c"},
    )
    props = codec.read_properties(payload)
    assert props.to == "a/b"
    assert props.reply_to == "r"
    assert props.absolute_expiry_time == 1700000000500
    assert props.correlation_id == uuid.UUID(int=5)


def test_large_lists_and_bodies_use_32_bit_encodings():
    long_to = "t" * 300
    payload = codec.encode_message(
        b"z" * 70_000, to=long_to, application_properties={"k": "v" * 300}
    )
    assert codec.read_properties(payload).to == long_to
    assert codec.read_application_properties(payload) == {"k": "v" * 300}
    assert codec.read_body(payload) == b"z" * 70_000
    message = Message()
    message.decode(payload)
    assert message.address == long_to


def test_delivery_count_rewrite_keeps_the_rest():
    original = codec.encode_message(b"keep me", durable=True, ttl=100, to="q")
    rewritten = codec.with_delivery_count(original, 3)
    assert codec.read_header(rewritten) == codec.Header(durable=True, ttl=100, delivery_count=3)
    assert codec.read_properties(rewritten).to == "q"
    assert codec.read_body(rewritten) == b"keep me"
    message = Message()
    message.decode(rewritten)
    assert message.delivery_count == 3
    # Handed out again, it has been acquired before: first-acquirer goes false.
    acquired = codec.with_header(original, codec.Header(durable=True, first_acquirer=True))
    assert codec.read_header(codec.with_delivery_count(acquired, 1)) == codec.Header(
        durable=True, first_acquirer=False, delivery_count=1
    )
    # A message with no header gets one.
    bare = codec.encode_message(b"bare")
    assert codec.read_header(codec.with_delivery_count(bare, 1)).delivery_count == 1
    assert codec.with_delivery_count(bare, 1).endswith(bare)


def test_truncated_message_is_a_precise_error():
    payload = codec.encode_message(b"x" * 100, to="somewhere")
    with pytest.raises(codec.CodecError, match="runs past the end"):
        codec.read_body(payload[:-10])
    with pytest.raises(codec.CodecError, match="expected a described section at offset 0"):
        codec.read_properties(b"\x41garbage")


def test_unknown_property_name_is_refused():
    with pytest.raises(ValueError, match="unknown message properties: colour"):
        codec.encode_message(b"x", properties={"colour": "red"})


def test_with_message_annotations_sets_and_removes_keeping_everything_else() -> None:
    original = codec.encode_message(
        "body",
        durable=True,
        message_annotations={"keep": "me", "drop": 1},
        properties={"message_id": "m1"},
        application_properties={"k": "v"},
    )
    changed = codec.with_message_annotations(original, {"drop": None, "x-opt-delivery-time": 5})
    assert codec.read_message_annotations(changed) == {"keep": "me", "x-opt-delivery-time": 5}
    assert codec.read_header(changed).durable
    assert codec.read_properties(changed).message_id == "m1"
    assert codec.read_application_properties(changed) == {"k": "v"}
    assert codec.read_body(changed) == "body"
    # Without a message-annotations section, one is put after the header.
    plain = codec.encode_message("body", durable=True)
    added = codec.with_message_annotations(plain, {"x-opt-delivery-time": 7})
    assert codec.read_message_annotations(added) == {"x-opt-delivery-time": 7}
    assert codec.read_header(added).durable
    assert codec.read_body(added) == "body"
    # Removing the last annotation removes the section.
    assert codec.with_message_annotations(added, {"x-opt-delivery-time": None}) == plain
