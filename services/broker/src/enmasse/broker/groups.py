"""Message groups: every message with one group-id goes to one consumer while that consumer lives.

What flows in: the queue's decisions while it dispatches a grouped queue (`Queue` with
`_groups` set, from the first entry that carried a group-id): "this consumer took the first
message of a group" (`assign`), "this entry belongs to another consumer's group" (`park`),
"this consumer left" (`release`). What flows out: who owns a group (`owner_of`), the entries
parked for a consumer in id order (`next_parked`), and, when a consumer leaves, its parked
entries to put back in the queue (they go to the next consumer that takes the group's oldest).

Why it is built so:
- Sticky assignment, as Artemis and ActiveMQ do it: a group is assigned when its first message
  is dispatched, to the consumer the round robin was serving (one with credit), and stays with
  it until it detaches; then its groups are free and its unsettled messages come back to the
  queue (in id order, before anything newer) and go, with the rest of the group, to whoever
  takes the oldest of them next.
- A grouped entry met by another consumer in the ready stream is parked with the group's owner
  (a heap by queue key, so a group's messages leave in the order they were enqueued, and an
  entry its owner gives back slots in before the newer ones). A consumer without credit holds
  its parked entries back: they are never given to another consumer, and the ready stream
  behind them keeps flowing to the others. Each entry is parked at most once per owner.
- Ungrouped messages in a grouped queue go to whoever's turn it is, as in any queue.
- The assignment lives as long as its consumer: one dict item per group it took. No group is
  ever closed early (AMQP has no end-of-group marker; Artemis's `JMSXGroupSeq = -1` has no AMQP
  counterpart).
- This module holds no AMQP and no queue logic: unit tests drive it with plain objects.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from typing import Generic, TypeVar

from enmasse.broker.entry import READY, Entry

C = TypeVar("C")  # a consumer, as the queue knows it (hashed by identity)


class Groups(Generic[C]):
    """Group -> owner, and the entries parked for each owner, heap-ordered by queue key."""

    __slots__ = ("_owned", "_owners", "_parked")

    def __init__(self) -> None:
        self._owners: dict[str, C] = {}
        self._owned: dict[C, set[str]] = {}
        self._parked: dict[C, list[tuple[int, Entry]]] = {}

    def owner_of(self, group: str) -> C | None:
        return self._owners.get(group)

    def assign(self, group: str, consumer: C) -> None:
        """The group's messages go to `consumer` from now on (it took the group's oldest)."""
        self._owners[group] = consumer
        self._owned.setdefault(consumer, set()).add(group)

    def groups_of(self, consumer: C) -> set[str]:
        return set(self._owned.get(consumer, ()))

    def park(self, consumer: C, key: int, entry: Entry) -> None:
        """Keeps a READY entry of one of `consumer`'s groups for it alone."""
        heapq.heappush(self._parked.setdefault(consumer, []), (key, entry))

    def has_parked(self, consumer: C) -> bool:
        return bool(self._parked.get(consumer))

    def next_parked(self, consumer: C) -> Entry | None:
        """The oldest entry parked for `consumer` that is still READY, taken; None if none."""
        parked = self._parked.get(consumer)
        while parked:
            entry = heapq.heappop(parked)[1]
            if entry.state is READY:
                return entry
        return None

    def release(self, consumer: C) -> list[tuple[int, Entry]]:
        """`consumer` left: its groups are free; returns its parked entries (still READY)."""
        for group in self._owned.pop(consumer, ()):
            if self._owners.get(group) is consumer:
                del self._owners[group]
        parked = self._parked.pop(consumer, [])
        return [item for item in parked if item[1].state is READY]

    def parked(self) -> Iterator[tuple[int, Entry]]:
        """Every parked entry still READY (snapshots, purges, drains)."""
        for items in self._parked.values():
            yield from (item for item in items if item[1].state is READY)

    def take_parked(self) -> list[Entry]:
        """Every parked entry still READY, in key order; nothing stays parked."""
        taken = sorted(self.parked(), key=_by_key)
        for items in self._parked.values():
            items.clear()
        return [entry for _, entry in taken]

    @property
    def assigned(self) -> int:
        return len(self._owners)


def group_of(entry: Entry) -> str | None:
    return getattr(entry, "group", None)


def _by_key(item: tuple[int, Entry]) -> int:
    return item[0]
