"""Multicast fan-out: one copy per consumer, and a slow consumer never stalls the others.

In: each multicast copy bound for one consumer, and that consumer's credit as it arrives. Out: the
copies to send now, in order. A consumer with credit gets its copy at once; one without credit has
its copies held in a bounded queue (`limit` copies, and `max_bytes` in all, though the newest
copy is always kept however large); beyond it the OLDEST copy is dropped and
counted (copies are pre-settled: the router already settled the producer's delivery, so a drop is
the documented multicast behaviour, reported in stats as `dropped`, never a hidden loss).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sized
from typing import Generic, TypeVar

Copy = TypeVar("Copy", bound=Sized)

DEFAULT_LIMIT = 1000
DEFAULT_MAX_BYTES = 16 * 1024 * 1024  # as much as a producer's window holds (`windows.py`)


class CopyQueue(Generic[Copy]):
    def __init__(self, *, limit: int = DEFAULT_LIMIT, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")
        self.limit = limit
        self.max_bytes = max_bytes
        self.dropped = 0
        self._held: deque[Copy] = deque()
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._held)

    def offer(self, copy: Copy, *, credit: int) -> list[Copy]:
        """Copies to send now (this one included when there is credit and nothing held)."""
        if credit > 0 and not self._held:
            return [copy]
        held = self._held
        held.append(copy)
        self._bytes += len(copy)
        while len(held) > self.limit or (self._bytes > self.max_bytes and len(held) > 1):
            self._bytes -= len(held.popleft())
            self.dropped += 1
        return self.take(credit=credit)

    def take(self, *, credit: int) -> list[Copy]:
        """Held copies to send now that `credit` is available, oldest first."""
        count = min(credit, len(self._held))
        copies = [self._held.popleft() for _ in range(count)]
        self._bytes -= sum(len(c) for c in copies)
        return copies
