"""The settlement ledger: which producer delivery a downstream outcome settles.

In: every unsettled delivery the router sends on (to a consumer, a neighbour router or a broker),
recorded with the producer delivery it carries. Out: on an outcome, the producer delivery to settle
with it; when an outgoing link goes away (consumer detached, connection lost, router killed), every
producer delivery still riding on it, in the order they were sent, so the router can re-route them
(the producer sent them unsettled and another consumer exists) or settle them RELEASED. Nothing
unsettled is ever dropped silently.

Entries are keyed by the outgoing delivery itself, never by position: consumers settle out of order,
and an outcome must reach the producer whose delivery it was.
"""

from __future__ import annotations

from typing import Generic, TypeVar

Link = TypeVar("Link")
Out = TypeVar("Out")
In = TypeVar("In")


class SettlementLedger(Generic[Link, Out, In]):
    def __init__(self) -> None:
        self._by_link: dict[Link, dict[Out, In]] = {}

    def __len__(self) -> int:
        return sum(len(entries) for entries in self._by_link.values())

    def record(self, *, link: Link, sent: Out, carries: In) -> None:
        self._by_link.setdefault(link, {})[sent] = carries

    def settle(self, *, link: Link, sent: Out) -> In | None:
        """The producer delivery `sent` carried; None when unknown (already settled or released)."""
        entries = self._by_link.get(link)
        if entries is None:
            return None
        return entries.pop(sent, None)

    def unsettled_on(self, link: Link) -> int:
        return len(self._by_link.get(link, {}))

    def release_link(self, link: Link) -> list[In]:
        """Forgets the link; returns the producer deliveries it still carried, oldest first."""
        return list(self._by_link.pop(link, {}).values())
