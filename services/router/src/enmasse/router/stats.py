"""Counters the router keeps per address and per connection, read by RouterAdmin.GetStats.

Plain integers bumped on the engine thread; the admin thread reads a snapshot taken on the engine
thread (through call_soon_threadsafe), so no locks are needed and counts are never torn.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class AddressCounters:
    deliveries_in: int = 0
    deliveries_out: int = 0
    accepted: int = 0
    rejected: int = 0
    released: int = 0
    modified: int = 0
    dropped: int = 0

    def count_outcome(self, outcome: str) -> None:
        """`outcome`: accepted, rejected, released or modified (the AMQP outcome's name)."""
        if outcome == "accepted":
            self.accepted += 1
        elif outcome == "rejected":
            self.rejected += 1
        elif outcome == "released":
            self.released += 1
        else:
            self.modified += 1


@dataclass
class ConnectionCounters:
    deliveries_in: int = 0
    deliveries_out: int = 0
