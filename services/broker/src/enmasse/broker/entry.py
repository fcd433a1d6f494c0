"""One message as a queue holds it: the encoded AMQP bytes (never decoded) plus the few facts the
broker acts on, read once from the header section when the message arrived.

A topic publishes one entry per subscription queue; they share `id` and `payload` bytes (no copy).
`id` orders messages (FIFO, recovery) and keys the journal records of a durable message.
`priority` (AMQP header, 0-9, default 4; above 9 counts as 9) is set only on an entry whose
message asked for another priority than the default, so the common case pays nothing for it.
`group` (properties group-id) and `deliver_at` (a scheduled message's due time) likewise exist
only on the entries whose message asked for them (`asks.py`).
"""

from __future__ import annotations

import enum

from enmasse.amqp.codec import DEFAULT_PRIORITY  # AMQP 1.0 §3.2.1: without one, priority 4


class State(enum.IntEnum):
    READY = 0  # waiting in the queue
    IN_FLIGHT = 1  # sent to a consumer, not yet settled
    GONE = 2  # acknowledged, expired, dead-lettered, drained or deleted
    SCHEDULED = 3  # stored, not visible until its delivery time (schedule.py)


class Removal(enum.Enum):
    """Why an entry left its queue: what the broker does next depends on it."""

    ACKED = "acked"
    EXPIRED = "expired"
    DEAD_LETTERED = "dead-lettered"
    DRAINED = "drained"
    DELETED = "deleted"


# Python 3.11 finds an enum member through EnumType.__getattr__, about 100 ns a lookup, and a
# message meets a dozen of them on its way: the per-message paths use these module names (a
# global lookup, about 10 ns) for the same members.
READY, IN_FLIGHT, GONE = State.READY, State.IN_FLIGHT, State.GONE
SCHEDULED = State.SCHEDULED
ACKED, EXPIRED, DEAD_LETTERED = Removal.ACKED, Removal.EXPIRED, Removal.DEAD_LETTERED
DRAINED, DELETED = Removal.DRAINED, Removal.DELETED

TOP_PRIORITY = 9  # 0-9 are distinct levels; a higher priority counts as 9


class Entry:
    __slots__ = (
        "deliver_at",
        "delivery_count",
        "expires_at",
        "failed_attempts",
        "group",
        "id",
        "journaled",
        "payload",
        "priority",
        "refused_by",
        "state",
    )

    refused_by: set[object]  # a slot, set only on entries some consumer refused (see queue.py)
    priority: int  # a slot, set only when not DEFAULT_PRIORITY: read it with `priority_of`
    group: str  # a slot, set only on a message with a group-id (groups.py)
    deliver_at: int  # a slot, set only on a scheduled message: wall-clock ms (schedule.py)

    # Positional too: one Entry is made per message published, and keywords cost more.
    def __init__(
        self,
        id: int,
        payload: bytes,
        journaled: bool = False,
        expires_at: int = 0,
        delivery_count: int = 0,
    ) -> None:
        self.id = id
        self.payload = payload
        self.journaled = journaled  # durable header on a persistent queue: in the journal
        self.expires_at = expires_at  # wall-clock ms since the epoch; 0 = never
        self.delivery_count = delivery_count  # what the consumer sees in the header
        self.failed_attempts = 0  # modified(delivery-failed) outcomes: counts to the DLQ
        self.state = READY
        # `refused_by` (consumers that settled it modified + undeliverable-here) and `priority`
        # are left unset: only the few entries that need one get one, the others pay nothing.

    def __repr__(self) -> str:
        return f"Entry(id={self.id}, state={self.state.name}, delivery_count={self.delivery_count})"

    def expired(self, now_ms: int) -> bool:
        return 0 < self.expires_at <= now_ms


def priority_of(entry: Entry) -> int:
    """The entry's priority level, 0-9 (DEFAULT_PRIORITY unless its message asked for another)."""
    return getattr(entry, "priority", DEFAULT_PRIORITY)


def priority_level(priority: int) -> int:
    """A header priority as a queue level: 0-9, anything higher counts as 9."""
    return min(priority, TOP_PRIORITY)
