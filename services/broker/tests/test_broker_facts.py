"""The producer-path fast reader gives exactly the codec's answer, for every shape we can make."""

from __future__ import annotations

import itertools

import pytest
from enmasse.amqp import codec
from enmasse.broker.facts import message_facts


def codec_answer(payload: bytes) -> tuple[bool, int | None, int | None, int]:
    header = codec.read_header(payload)
    expiry = codec.read_properties(payload).absolute_expiry_time
    return header.durable, header.ttl or None, expiry or None, header.priority


SHAPES = list(
    itertools.product(
        [False, True],  # durable
        [None, 0, 5, 255, 256, 70_000, 2**31],  # ttl
        [4, 9, 0],  # priority (default and not)
        [None, 1_700_000_000_000],  # absolute expiry
        [None, {"k": "v"}],  # message annotations (before the properties)
        [None, "reply"],  # another property
        [b"x" * 10, b"y" * 300, "text"],  # body
    )
)


@pytest.mark.parametrize(
    ("durable", "ttl", "priority", "expiry", "annotations", "reply_to", "body"), SHAPES
)
def test_fast_reader_matches_the_codec(
    durable: bool,
    ttl: int | None,
    priority: int,
    expiry: int | None,
    annotations: dict | None,
    reply_to: str | None,
    body: bytes | str,
) -> None:
    payload = codec.encode_message(
        body,
        durable=durable,
        ttl=ttl,
        priority=priority,
        reply_to=reply_to,
        properties={"absolute_expiry_time": expiry} if expiry else None,
        message_annotations=annotations,
    )
    assert message_facts(payload) == codec_answer(payload)


def test_headerless_and_header_only_messages() -> None:
    bare = codec.encode_message(b"x")
    assert message_facts(bare) == (False, None, None, 4)
    header_only_durable = codec.encode_header(codec.Header(durable=True)) + bare
    assert message_facts(header_only_durable) == (True, None, None, 4)
