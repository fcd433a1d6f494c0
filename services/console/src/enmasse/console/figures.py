"""Live figures per address, from what the routers and brokers say: plain values, no network.

In: one `Sample` at a time of a space's data plane (data_plane.py): each router's `RouterStats`
and each broker's `ListAddressesResponse`, taken at a moment. Out: per address string, the
`Counts` of that moment (messages in and out, stored, consumers, producers) and, from two
samples, `figures`: the rates (messages per second in and out since the last sample) beside the
counts, which the space page shows and updates.

Whose figures: the counts of one moment are `enmasse.resources.address_figures`' (the routers'
traffic and links, the brokers' stored messages; in a brokered space the broker's own), the
numbers `enmasse stats` prints too, so the console and the CLI agree. A counter that went down
between two samples (a process restarted) gives no rate, not a negative one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from enmasse.resources.address_figures import Counts


@dataclass(frozen=True)
class Sample:
    at: float
    """time.monotonic() when it was taken."""
    counts: Mapping[str, Counts]
    """By address string."""
    silent: tuple[str, ...] = field(default=())
    """The routers and brokers that did not answer (their figures are missing from `counts`)."""


def _rate(now: int, before: int | None, seconds: float) -> float | None:
    if before is None or seconds <= 0 or now < before:
        return None
    return round((now - before) / seconds, 1)


def figures(*, previous: Sample | None, current: Sample) -> list[dict[str, Any]]:
    """Per address (sorted by address string): rates since `previous` (None on the first
    sample, or after a restart) and the counts now."""
    seconds = current.at - previous.at if previous is not None else 0.0
    out = []
    for address in sorted(current.counts):
        now = current.counts[address]
        before = previous.counts.get(address) if previous is not None else None
        out.append(
            {
                "address": address,
                "in_per_second": _rate(
                    now.deliveries_in, before.deliveries_in if before else None, seconds
                ),
                "out_per_second": _rate(
                    now.deliveries_out, before.deliveries_out if before else None, seconds
                ),
                "messages_in": now.deliveries_in,
                "messages_out": now.deliveries_out,
                "stored": now.stored,
                "consumers": now.consumers,
                "producers": now.producers,
            }
        )
    return out
