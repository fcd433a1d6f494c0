"""Anycast balancing: which consumer gets the next delivery.

In: the targets of one address (local consumer links and, for consumers elsewhere in the mesh, the
link towards the next-hop router) and, per delivery, a credit test. Out: the target to send to, or
None when nobody can take it now.

Rule (Qpid Dispatch's): least outstanding (sent, not yet settled) first; among equals, round robin,
so three idle consumers with plenty of credit each get a third. A target without credit is skipped:
a slow consumer does not stall the address. The balancer keeps the outstanding counts itself
(`sent` / `settled`), so the proton side only reports events.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Balancer(Generic[T]):
    def __init__(self) -> None:
        self._targets: list[T] = []
        self._outstanding: dict[T, int] = {}
        self._next = 0

    def __len__(self) -> int:
        return len(self._targets)

    def __contains__(self, target: object) -> bool:
        return target in self._outstanding

    @property
    def targets(self) -> list[T]:
        return list(self._targets)

    def add(self, target: T) -> None:
        if target not in self._outstanding:
            self._targets.append(target)
            self._outstanding[target] = 0

    def remove(self, target: T) -> None:
        if target in self._outstanding:
            index = self._targets.index(target)
            del self._targets[index]
            del self._outstanding[target]
            if index < self._next:
                self._next -= 1
            if self._next >= len(self._targets):
                self._next = 0

    def outstanding(self, target: T) -> int:
        return self._outstanding.get(target, 0)

    def choose(self, has_credit: Callable[[T], bool]) -> T | None:
        """The target with credit and the fewest outstanding; ties: the next in rotation."""
        count = len(self._targets)
        if count == 1:
            only = self._targets[0]
            return only if has_credit(only) else None
        best: T | None = None
        best_load = 0
        best_index = 0
        for step in range(count):
            index = (self._next + step) % count
            target = self._targets[index]
            load = self._outstanding[target]
            if (best is None or load < best_load) and has_credit(target):
                best, best_load, best_index = target, load, index
                if load == 0:
                    break
        if best is not None:
            self._next = (best_index + 1) % count
        return best

    def sent(self, target: T) -> None:
        if target in self._outstanding:
            self._outstanding[target] += 1

    def settled(self, target: T) -> None:
        if self._outstanding.get(target, 0) > 0:
            self._outstanding[target] -= 1
