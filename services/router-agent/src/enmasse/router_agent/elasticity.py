"""Elastic routers: how many routers a space's load needs, between its plan's min and max.

What flows in: samples of a space's load, taken from its routers' own records (RouterAdmin
ListConnections: the client connections, and the deliveries their producers sent, whose growth
between two samples is the rate), and the plan's quotas (`min_routers`, `max_routers`, and the
load one router is meant to carry: `connections_per_router`, `deliveries_per_router` a second).
What flows out: the number of routers the space should run now (`Elasticity.routers`), which the
agent renders (workloads.py) and the runtime or Argo CD then starts or stops; a router stopped
redirects its clients first (the router's departure.py), so scaling down loses nothing.

Why so, with hysteresis: a count that follows every blip would start and stop routers, and move
clients, all day. So the count goes up one router at a time, only after the load has needed
more for `up_after` seconds; and down one at a time, only after the load would have fitted on
one router fewer, with room to spare (`DOWN_FILL`), for `down_after` seconds. Between the two
bands the count stays. Without a per-router figure in the plan the count is the plan's minimum,
as before. Pure: the caller gives the clock, so tests need no waiting.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from enmasse.v1 import resources_pb2, router_pb2

# Scaled down only when the load would fill one router fewer to at most this share of its
# figure: the gap between this and 1.0 is the band in which nothing changes.
DOWN_FILL = 0.7
UP_AFTER = 15.0  # seconds of load above what the routers carry before one more starts
DOWN_AFTER = 120.0  # seconds of load fitting on one fewer before one stops
CLIENT_ROLE = "normal"  # ConnectionInfo.role of a client's connection (not mesh, not broker)


@dataclass(frozen=True)
class Load:
    """A space's load at one moment, summed over its routers."""

    connections: int
    deliveries: int  # sent by its clients since their connections opened (a counter)
    at: float  # monotonic seconds


def load_of(answers: list[router_pb2.ConnectionList], *, at: float) -> Load:
    """The load the routers' connection lists show: clients only."""
    clients = [c for answer in answers for c in answer.connections if c.role == CLIENT_ROLE]
    return Load(connections=len(clients), deliveries=sum(c.deliveries_in for c in clients), at=at)


def needed(*, connections: int, rate: float, quotas: resources_pb2.Quotas) -> int:
    """Routers that carry this load at the plan's per-router figures (0 when it has none)."""
    wants = [0]
    if quotas.connections_per_router > 0:
        wants.append(math.ceil(connections / quotas.connections_per_router))
    if quotas.deliveries_per_router > 0:
        wants.append(math.ceil(rate / quotas.deliveries_per_router))
    return max(wants)


def fits_on(routers: int, *, connections: int, rate: float, quotas: resources_pb2.Quotas) -> bool:
    """True when `routers` would carry the load with room to spare (DOWN_FILL of each figure)."""
    if routers < 1:
        return False
    checks = []
    if quotas.connections_per_router > 0:
        checks.append(connections <= DOWN_FILL * quotas.connections_per_router * routers)
    if quotas.deliveries_per_router > 0:
        checks.append(rate <= DOWN_FILL * quotas.deliveries_per_router * routers)
    return all(checks)


def bounds(quotas: resources_pb2.Quotas) -> tuple[int, int]:
    """(min, max) routers of a plan: min_routers (at least one), max_routers (0: min)."""
    low = max(quotas.min_routers, 1)
    return low, max(quotas.max_routers, low)


def elastic(quotas: resources_pb2.Quotas) -> bool:
    """Whether load moves a space of this plan: a per-router figure and room above the min."""
    low, high = bounds(quotas)
    return high > low and (quotas.connections_per_router > 0 or quotas.deliveries_per_router > 0)


@dataclass
class Elasticity:
    """One space's router count, moved by its load samples."""

    routers: int
    up_after: float = UP_AFTER
    down_after: float = DOWN_AFTER
    _last: Load | None = None
    _above_since: float | None = None
    _below_since: float | None = None
    reason: str = ""

    def observe(self, load: Load, *, quotas: resources_pb2.Quotas) -> bool:
        """Takes a sample; True when the count changed (see `reason`)."""
        low, high = bounds(quotas)
        previous, self._last = self._last, load
        clamped = min(max(self.routers, low), high)
        if clamped != self.routers:  # the plan moved under us: follow it at once
            self.routers, self.reason = clamped, f"plan bounds {low}..{high}"
            self._above_since = self._below_since = None
            return True
        if previous is None or load.at <= previous.at:
            return False
        rate = max(0, load.deliveries - previous.deliveries) / (load.at - previous.at)
        wanted = needed(connections=load.connections, rate=rate, quotas=quotas)
        shrink = fits_on(self.routers - 1, connections=load.connections, rate=rate, quotas=quotas)
        return self._step(
            load,
            up=wanted > self.routers and self.routers < high,
            down=shrink and self.routers > low,
            rate=rate,
        )

    def _step(self, load: Load, *, up: bool, down: bool, rate: float) -> bool:
        now = load.at
        self._above_since = (self._above_since or now) if up else None
        self._below_since = (self._below_since or now) if down else None
        figures = f"{load.connections} client connections, {rate:.0f} deliveries/s"
        if self._above_since is not None and now - self._above_since >= self.up_after:
            self.routers += 1
            self.reason = f"load above {self.up_after:.0f} s ({figures})"
        elif self._below_since is not None and now - self._below_since >= self.down_after:
            self.routers -= 1
            self.reason = f"load fits on fewer for {self.down_after:.0f} s ({figures})"
        else:
            return False
        self._above_since = self._below_since = None
        return True
