"""Anycast balancing: which consumer gets the next delivery.

In: the targets of one address (local consumer links and, for consumers elsewhere in the mesh, the
link towards the next-hop router) and, per delivery, a credit test. Out: the target to send to, or
None when nobody can take it now.

Rule (Qpid Dispatch's): least outstanding (sent, not yet settled) first; among equals, round robin,
so three idle consumers with plenty of credit each get a third. A target may stand for several
consumers (the link towards another router that has three of them): its `weight` divides its
outstanding count and gives it that many turns in the rotation, so deliveries are balanced over
consumers, not over links. A target without credit is skipped: a slow consumer does not stall the
address. The balancer keeps the outstanding counts itself (`sent` / `settled`), so the proton side
only reports events.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Balancer(Generic[T]):
    def __init__(self) -> None:
        self._rotation: list[T] = []  # each target `weight` times
        self._outstanding: dict[T, int] = {}
        self._weight: dict[T, int] = {}
        self._next = 0

    def __len__(self) -> int:
        return len(self._outstanding)

    def __contains__(self, target: object) -> bool:
        return target in self._outstanding

    @property
    def targets(self) -> list[T]:
        return list(self._outstanding)

    def add(self, target: T, *, weight: int = 1) -> None:
        """Adds a target, or changes its weight (its outstanding count stays)."""
        weight = max(1, weight)
        if self._weight.get(target) == weight:
            return
        outstanding = self._outstanding.get(target, 0)
        self.remove(target)
        self._outstanding[target] = outstanding
        self._weight[target] = weight
        self._rotation.extend([target] * weight)

    def remove(self, target: T) -> None:
        if target not in self._outstanding:
            return
        before = self._rotation[: self._next].count(target)
        self._rotation = [t for t in self._rotation if t != target]
        self._next -= before
        if self._next >= len(self._rotation):
            self._next = 0
        del self._outstanding[target]
        del self._weight[target]

    def outstanding(self, target: T) -> int:
        return self._outstanding.get(target, 0)

    def choose(self, has_credit: Callable[[T], bool]) -> T | None:
        """The target with credit and the least outstanding per weight; ties: rotation order."""
        rotation = self._rotation
        if len(self._outstanding) == 1:
            only = rotation[0]
            return only if has_credit(only) else None
        best: T | None = None
        best_load = 0.0
        best_index = 0
        count = len(rotation)
        for step in range(count):
            index = (self._next + step) % count
            target = rotation[index]
            load = self._outstanding[target] / self._weight[target]
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
