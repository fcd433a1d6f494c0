"""What a message asks of its queue beyond the header facts: a delivery time, a group.

What flows in: the encoded bytes of a message as it arrives (or as the journal gives it back at
start), and the wall clock. What flows out: None for a message that asks for neither (the common
case), or an `Asks`: the bytes to store (a relative delay rewritten as an absolute time), the
wall-clock ms before which no consumer may see it (0: at once), and its group-id (None: none).

- Scheduled delivery, the convention Artemis and Azure Service Bus use: the message-annotation
  `x-opt-delivery-time` (ms since the epoch) or `x-opt-delivery-delay` (ms from arrival). A delay
  is rewritten on arrival into `x-opt-delivery-time` in the stored bytes, before the journal sees
  them, so a restart keeps the due time the message was given, not a new one. With both, the
  absolute time wins (as in Artemis). A time already past means "at once".
- Message groups: the properties' `group-id` (AMQP 1.0 §3.2.4). A group's messages are handed to
  one consumer, in the order they were enqueued (`group-sequence` order as sent); groups.py
  keeps the assignment.

Why it is its own module and walks bytes: this runs once per message on the producer path. One
walk over the section codes (header, delivery-annotations, message-annotations, properties; each
skipped by its encoded size) tells whether there is anything to read: a message-annotations map
that contains the bytes `x-opt-delivery-`, or a properties list long enough to hold a group-id
(the 11th field: clients trim trailing nulls, so a message without one stops short of it). Only
then does the codec decode anything. An encoding the walk does not know (a section descriptor
as a ulong, say) takes the codec's general path, so the answer is always the codec's.
"""

from __future__ import annotations

import time
from typing import NamedTuple

from enmasse.amqp import codec

DELIVERY_TIME = "x-opt-delivery-time"
DELIVERY_DELAY = "x-opt-delivery-delay"
_SCHEDULING = b"x-opt-delivery-"
_GROUP_ID_FIELD = 10  # properties: message-id, user-id, to, ..., creation-time, group-id
_HEADER = b"\x00Sp"
_DELIVERY_ANNOTATIONS = b"\x00Sq"
_MESSAGE_ANNOTATIONS = b"\x00Sr"
_PROPERTIES = b"\x00Ss"


PROPERTIES_CODE = b"\x73"
"""The last section that can ask for something is the properties (0x73): a message whose first
section code (its third byte) is above it has no header, annotations nor properties and asks
for nothing. The producer path checks `payload[2:3] > PROPERTIES_CODE` first (a cached one-byte
slice and one compare) and calls `asks_of` only for the others. A section descriptor written as
a ulong has 0x00 there: `asks_of` reads it."""


class Asks(NamedTuple):
    payload: bytes  # what to store and deliver (a delay rewritten as a time)
    deliver_at: int  # wall-clock ms; 0: deliverable at once
    group: str | None


def asks_of(payload: bytes, *, now: int | None = None) -> Asks | None:
    """What this message asks for, or None when nothing. `now` (ms since the epoch) turns a
    delay into a time; read from the clock when not given. Bytes that do not decode ask for
    nothing (the handler refuses them before this runs; a domain test may store any bytes)."""
    try:
        # The commonest shapes, inline: an optional small header list, then the
        # application-properties or the body (nothing to read), or a small properties list
        # too short to hold a group-id.
        pos = 0
        if payload[2] == 0x70 and payload[1] == 0x53:
            code = payload[3]
            pos = 4 if code == 0x45 else 5 + payload[4] if code == 0xC0 else 0
        if (pos or payload[2] != 0x70) and payload[pos + 1] == 0x53:
            section = payload[pos + 2]
            if section >= 0x74:
                return None
            if section == 0x73:
                code = payload[pos + 3]
                if code == 0x45 or (code == 0xC0 and payload[pos + 5] <= _GROUP_ID_FIELD):
                    return None
        return _walk(payload, now)
    except (codec.CodecError, IndexError, ValueError):
        return None


def _walk(payload: bytes, now: int | None) -> Asks | None:
    pos = _past(payload, 0, _HEADER)
    pos = _past(payload, pos, _DELIVERY_ANNOTATIONS)
    if pos < 0:
        return _slow(payload, now=now)
    scheduling = False
    if payload[pos : pos + 3] == _MESSAGE_ANNOTATIONS:
        end = _past(payload, pos, _MESSAGE_ANNOTATIONS)
        if end < 0:
            return _slow(payload, now=now)
        scheduling = payload.find(_SCHEDULING, pos, end) >= 0
        pos = end
    grouped = False
    if payload[pos : pos + 3] == _PROPERTIES:
        count = _list_count(payload, pos + 3)
        if count < 0:
            return _slow(payload, now=now)
        grouped = count > _GROUP_ID_FIELD
    elif payload[pos : pos + 2] == b"\x00\x80":
        return _slow(payload, now=now)  # a section descriptor as a ulong: the codec reads it
    if not scheduling and not grouped:
        return None
    return _read(payload, now=now, scheduling=scheduling, grouped=grouped)


def _read(payload: bytes, *, now: int | None, scheduling: bool, grouped: bool) -> Asks | None:
    deliver_at = 0
    if scheduling:
        now = now if now is not None else int(time.time() * 1000)
        annotations = codec.read_message_annotations(payload)
        at = annotations.get(DELIVERY_TIME)
        delay = annotations.get(DELIVERY_DELAY)
        if isinstance(at, int) and at > 0:
            deliver_at = at
        elif isinstance(delay, int) and delay > 0:
            deliver_at = now + delay
            payload = codec.with_message_annotations(
                payload, {DELIVERY_DELAY: None, DELIVERY_TIME: deliver_at}
            )
        if deliver_at <= now:
            deliver_at = 0  # already due: at once
    group = codec.read_properties(payload).group_id if grouped else None
    if not deliver_at and group is None:
        return None
    return Asks(payload, deliver_at, group)


def _slow(payload: bytes, *, now: int | None) -> Asks | None:
    return _read(payload, now=now, scheduling=True, grouped=True)


def _past(payload: bytes, pos: int, section: bytes) -> int:
    """The position after the section at `pos` when it is `section` (pos when it is another
    one); -1 when its value is an encoding this walk does not skip."""
    if pos < 0 or payload[pos : pos + 3] != section:
        return pos
    code = payload[pos + 3]
    if code == 0x45:
        return pos + 4
    if code in (0xC0, 0xC1):
        return pos + 5 + payload[pos + 4]
    if code in (0xD0, 0xD1):
        return pos + 8 + int.from_bytes(payload[pos + 4 : pos + 8], "big")
    return -1


def _list_count(payload: bytes, pos: int) -> int:
    """The item count of the list at `pos`; -1 when it is not a list."""
    code = payload[pos]
    if code == 0x45:
        return 0
    if code == 0xC0:
        return payload[pos + 2]
    if code == 0xD0:
        return int.from_bytes(payload[pos + 5 : pos + 9], "big")
    return -1
