"""Scheduled delivery: messages stored now, visible to consumers from their due time on.

What flows in: entries whose message asked for a delivery time (`asks.py`: `x-opt-delivery-time`,
or `x-opt-delivery-delay` rewritten into one on arrival), the wall clock, and a way to run a
callback later on the broker's loop. What flows out: at each due time, the queues that have
entries falling due (the queue moves them into its ready structures, `Queue.release_due`, and
dispatches them).

Why it is built so:
- Each queue keeps its scheduled entries in a heap by (due time, id) of its own (`Scheduled`):
  they are out of every dispatch structure (state SCHEDULED), so consumers, browsers and the
  queue's depth never see them and dispatch pays nothing for them; they are in its bytes (memory
  is memory) and in the journal like any durable message, with the due time inside their bytes,
  so recovery schedules them again (`Broker.start`).
- One `Scheduler` per broker keeps a heap of (due time, queue) and ONE timer on the loop, armed
  for the earliest due time: a thousand scheduled messages cost one pending timer, not a
  thousand. A queue is pushed again when an earlier entry is scheduled or when it still holds
  entries after a release; stale heap items (a queue whose entries went meanwhile) cost one
  empty release each.
- TTL still applies: a scheduled entry sits in its queue's expiry heap like any other and is
  reaped at its deadline (lazy removal: the schedule heap skips entries no longer SCHEDULED).
- Without a loop (domain tests), nothing is armed: `Broker.release_due(now)` does by hand what
  the timer does.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterator
from typing import Generic, Protocol, TypeVar

from enmasse.broker.entry import SCHEDULED, Entry

Q = TypeVar("Q")  # a queue, as the broker knows it (only kept and handed back here)


class Scheduled:
    """One queue's scheduled entries, earliest first."""

    __slots__ = ("_heap",)

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, Entry]] = []

    def __len__(self) -> int:
        return sum(1 for _, _, entry in self._heap if entry.state is SCHEDULED)

    def push(self, entry: Entry, deliver_at: int) -> bool:
        """Adds an entry (already SCHEDULED); True when it is now the earliest."""
        heap = self._heap
        earliest = not heap or deliver_at < heap[0][0]
        heapq.heappush(heap, (deliver_at, entry.id, entry))
        return earliest

    def due(self, now_ms: int) -> list[Entry]:
        """Takes every entry whose time has come, in (due time, id) order."""
        heap = self._heap
        taken: list[Entry] = []
        while heap and heap[0][0] <= now_ms:
            entry = heapq.heappop(heap)[2]
            if entry.state is SCHEDULED:
                taken.append(entry)
        return taken

    def next_due(self) -> int:
        """The earliest due time still waiting (0: none)."""
        heap = self._heap
        while heap and heap[0][2].state is not SCHEDULED:
            heapq.heappop(heap)  # reaped, purged or drained meanwhile
        return heap[0][0] if heap else 0

    def take_all(self) -> list[Entry]:
        """Every entry still waiting, earliest first; the heap is left empty."""
        entries = [entry for _, _, entry in sorted(self._heap) if entry.state is SCHEDULED]
        self._heap.clear()
        return entries

    def __iter__(self) -> Iterator[Entry]:
        return (entry for _, _, entry in self._heap if entry.state is SCHEDULED)


class Timer(Protocol):
    def cancel(self) -> None: ...


CallLater = Callable[[float, Callable[[], object]], Timer]


class Scheduler(Generic[Q]):
    """When which queue has entries falling due; one loop timer for the earliest of them."""

    def __init__(self, *, clock: Callable[[], int]) -> None:
        self.call_later: CallLater | None = None  # set by the AMQP side: the broker's loop
        self.on_due: Callable[[int], object] = _nothing  # the broker releases what fell due
        self._clock = clock
        self._heap: list[tuple[int, int, Q]] = []
        self._order = itertools.count()
        self._timer: Timer | None = None
        self._armed_for = 0

    def wake(self, queue: Q, deliver_at: int) -> None:
        """`queue` has an entry due at `deliver_at` (ms since the epoch)."""
        heapq.heappush(self._heap, (deliver_at, next(self._order), queue))
        if self._timer is None or deliver_at < self._armed_for:
            self._arm(deliver_at)

    def due(self, now_ms: int) -> list[Q]:
        """The queues with something due by `now_ms`, each once; taken off the heap."""
        found: dict[Q, None] = {}
        heap = self._heap
        while heap and heap[0][0] <= now_ms:
            found[heapq.heappop(heap)[2]] = None
        return list(found)

    def rearm(self) -> None:
        """After a release: a timer for the earliest of whatever is left."""
        heap = self._heap
        if heap and (self._timer is None or heap[0][0] < self._armed_for):
            self._arm(heap[0][0])

    def use_loop(self, call_later: CallLater) -> None:
        """From now on timers run on this loop (what recovery scheduled is armed now)."""
        self.call_later = call_later
        self._timer = None
        self.rearm()

    def _arm(self, deliver_at: int) -> None:
        if self.call_later is None:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._armed_for = deliver_at
        delay = max(deliver_at - self._clock(), 0) / 1000
        self._timer = self.call_later(delay, self._fire)

    def _fire(self) -> None:
        self._timer = None
        self.on_due(self._clock())

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


def _nothing(_now: int) -> None:
    return None
