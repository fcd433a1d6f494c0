"""The trace views' data: the analytics job's tables, read without Spark, for a token's spaces.

What flows in: the folder `enmasse-analytics` writes (`<var>/analytics` by default; the batch job
rewrites it once per run, `--live` refreshes it every few seconds) and the names of the address
spaces the admin API has just shown the user's token. What flows out: per (space, address) its
end-to-end latency, its per-hop latency and its throughput, plus when the tables were refreshed
and whether that is too long ago to call live (`Freshness`), with the command that makes or
refreshes them.

The tables are Parquet folders (docs/tracing.md §4: `latency_address`, `hop_latency`,
`throughput_address`), read with pyarrow; the filter on `space` is pushed into the read, so a
tenant's page never holds another tenant's row, and a row without a space (a span nobody
labelled) is nobody's. In live mode `<folder>/<table>` is a link moved on at every refresh: it is
resolved once per read (`enmasse.analytics.live.table_path`'s rule) and the copy it names stays
whole until the refresh after next, so a read sees one refresh or the next, never half of one.

Reading is blocking file work: the web layer runs `read` in a worker thread.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from enmasse.common import tracing

LATENCY, HOPS, THROUGHPUT = "latency_address", "hop_latency", "throughput_address"
SUCCESS_MARKER = "_SUCCESS"
"""Spark writes it last into a table's folder: its time is when that copy was complete."""
STALE_SECONDS = 60.0
"""Older tables are shown as stale: `--live` refreshes them every few seconds of traffic."""
LATENCY_FIGURES = ("mean_ms", "p50_ms", "p95_ms", "p99_ms", "max_ms")
RECENT_WINDOWS = 12
"""Throughput windows kept per address for its own page (2 minutes at the default 10 s)."""
MAKE_TABLES = "enmasse-analytics"
KEEP_TABLES_LIVE = "enmasse-analytics --live"

HOP_ORDER = (
    tracing.SPAN_WAYPOINT,
    tracing.SPAN_ENQUEUE,
    tracing.SPAN_QUEUE_RESIDENCE,
    tracing.SPAN_DEQUEUE,
    tracing.SPAN_ROUTE,
    tracing.SPAN_ROUTER_DELIVER,
    tracing.SPAN_DELIVER,
    tracing.SPAN_SETTLE,
)
"""The hops in the order a message meets them (store-and-forward; a direct address skips the
broker's); a hop name the console does not know goes last."""
HOP_STAGES = {
    tracing.SPAN_WAYPOINT: "producer → router → broker: the router forwards it to the broker",
    tracing.SPAN_ENQUEUE: "router → broker: stored (and fsynced when durable), settled",
    tracing.SPAN_QUEUE_RESIDENCE: "in the broker's queue, waiting for a consumer",
    tracing.SPAN_DEQUEUE: "broker → router: picked and sent on the consumer's link",
    tracing.SPAN_ROUTE: "router → consumer: forwarded on the consumer's link",
    tracing.SPAN_ROUTER_DELIVER: "router ↔ consumer: handed on until its outcome came back",
    tracing.SPAN_DELIVER: "consumer: received, handed to the application",
    tracing.SPAN_SETTLE: "consumer: the application's outcome, settled",
}


@dataclass(frozen=True)
class Latency:
    """End-to-end latency of the address's delivered sampled messages (ms)."""

    messages: int
    mean_ms: float
    p50_ms: float
    p95_ms: float
    p99_ms: float
    max_ms: float


@dataclass(frozen=True)
class Hop:
    name: str
    stage: str
    spans: int
    mean_ms: float
    p50_ms: float
    p95_ms: float
    p99_ms: float
    bar_percent: float
    """The hop's mean as a share of the address's slowest hop's mean: the width of its bar."""


@dataclass(frozen=True)
class Window:
    start: datetime
    sent: int
    delivered: int
    sent_per_s: float


@dataclass(frozen=True)
class Throughput:
    """Sampled messages: at sampling ratio r, divide by r for the traffic (docs/tracing.md)."""

    sent: int
    delivered: int
    bytes_sent: int
    latest: Window
    """The newest window: its `sent_per_s` is the address's current rate."""
    recent: tuple[Window, ...]
    """The last `RECENT_WINDOWS` windows, oldest first."""


@dataclass(frozen=True)
class AddressTraces:
    space: str
    address: str
    address_type: str
    latency: Latency | None
    hops: tuple[Hop, ...]
    throughput: Throughput | None


@dataclass(frozen=True)
class Freshness:
    folder: Path | None
    """The analytics folder the console reads (None: it was given none)."""
    refreshed: float | None
    """When the oldest of the tables was written (Unix s); None when there are none."""
    age_seconds: float | None

    @property
    def absent(self) -> bool:
        return self.refreshed is None

    @property
    def stale(self) -> bool:
        return self.age_seconds is not None and self.age_seconds > STALE_SECONDS

    @property
    def refreshed_at(self) -> str:
        if self.refreshed is None:
            return ""
        return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.refreshed))

    @property
    def age(self) -> str:
        return _duration(self.age_seconds or 0.0)

    @property
    def notice(self) -> str:
        """What the page says about the tables when they are missing or old ("" when live)."""
        if self.folder is None:
            return (
                "This console reads no trace tables: start enmasse-console with --var-dir "
                "(or --analytics-dir)."
            )
        if self.absent:
            return (
                f"No trace tables yet in {self.folder}: run `{MAKE_TABLES}` (once) or "
                f"`{KEEP_TABLES_LIVE}` (kept within seconds of the traffic)."
            )
        if self.stale:
            return (
                f"These tables are {self.age} old: run `{MAKE_TABLES}` again, or "
                f"`{KEEP_TABLES_LIVE}` to keep them within seconds of the traffic."
            )
        return ""


@dataclass(frozen=True)
class TraceTables:
    freshness: Freshness
    addresses: Mapping[tuple[str, str], AddressTraces] = field(default_factory=dict)
    """By (space, AMQP address), for the spaces asked for only."""

    def of_space(self, space: str) -> list[AddressTraces]:
        return [self.addresses[key] for key in sorted(self.addresses) if key[0] == space]


def read(folder: Path | None, *, spaces: Collection[str], now: float | None = None) -> TraceTables:
    """The tables' rows of `spaces` (the ones the API showed the token), and their freshness."""
    try:
        return _read(folder, spaces=spaces, now=now)
    except FileNotFoundError:
        # Two live refreshes between resolving a link and reading its copy removed the copy:
        # the links name newer ones now.
        return _read(folder, spaces=spaces, now=now)


def _read(folder: Path | None, *, spaces: Collection[str], now: float | None) -> TraceTables:
    if folder is None:
        return TraceTables(freshness=Freshness(folder=None, refreshed=None, age_seconds=None))
    paths = {name: _table_path(folder, name) for name in (LATENCY, HOPS, THROUGHPUT)}
    if paths[LATENCY] is None:
        return TraceTables(freshness=Freshness(folder=folder, refreshed=None, age_seconds=None))
    refreshed = min(_written_at(path) for path in paths.values() if path is not None)
    age = max(0.0, (time.time() if now is None else now) - refreshed)
    freshness = Freshness(folder=folder, refreshed=refreshed, age_seconds=age)
    wanted = sorted(spaces)
    rows = {name: _rows(path, spaces=wanted) for name, path in paths.items()}
    return TraceTables(
        freshness=freshness,
        addresses=_by_address(latency=rows[LATENCY], hops=rows[HOPS], throughput=rows[THROUGHPUT]),
    )


def _table_path(folder: Path, name: str) -> Path | None:
    """The table's current copy: a live refresh's link resolved once, or the batch job's folder."""
    link = folder / name
    return link.resolve() if link.exists() else None


def _written_at(path: Path) -> float:
    marker = path / SUCCESS_MARKER
    return (marker if marker.exists() else path).stat().st_mtime


def _rows(path: Path | None, *, spaces: list[str]) -> list[dict[str, Any]]:
    if path is None or not spaces:
        return []
    rows: list[dict[str, Any]] = pq.read_table(path, filters=[("space", "in", spaces)]).to_pylist()
    return rows


def _by_address(
    *,
    latency: Iterable[Mapping[str, Any]],
    hops: Iterable[Mapping[str, Any]],
    throughput: Iterable[Mapping[str, Any]],
) -> dict[tuple[str, str], AddressTraces]:
    types: dict[tuple[str, str], str] = {}
    latencies: dict[tuple[str, str], Latency] = {}
    for row in latency:
        key = _key(row, types)
        latencies[key] = Latency(
            messages=int(row["messages"]),
            **{name: float(row[name] or 0.0) for name in LATENCY_FIGURES},
        )
    hop_rows: dict[tuple[str, str], list[Mapping[str, Any]]] = defaultdict(list)
    for row in hops:
        hop_rows[_key(row, types)].append(row)
    window_rows: dict[tuple[str, str], list[Mapping[str, Any]]] = defaultdict(list)
    for row in throughput:
        window_rows[_key(row, types)].append(row)
    return {
        key: AddressTraces(
            space=key[0],
            address=key[1],
            address_type=address_type,
            latency=latencies.get(key),
            hops=_hops(hop_rows.get(key, [])),
            throughput=_throughput(window_rows.get(key, [])),
        )
        for key, address_type in types.items()
    }


def _key(row: Mapping[str, Any], types: dict[tuple[str, str], str]) -> tuple[str, str]:
    key = (str(row["space"]), str(row["address"] or ""))
    types.setdefault(key, str(row.get("address_type") or ""))
    return key


def _hops(rows: list[Mapping[str, Any]]) -> tuple[Hop, ...]:
    def order(row: Mapping[str, Any]) -> tuple[int, str]:
        name = str(row["hop"])
        return (HOP_ORDER.index(name) if name in HOP_ORDER else len(HOP_ORDER), name)

    slowest = max((float(row["mean_ms"] or 0.0) for row in rows), default=0.0)
    return tuple(
        Hop(
            name=str(row["hop"]),
            stage=HOP_STAGES.get(str(row["hop"]), ""),
            spans=int(row["spans"]),
            mean_ms=float(row["mean_ms"] or 0.0),
            p50_ms=float(row["p50_ms"] or 0.0),
            p95_ms=float(row["p95_ms"] or 0.0),
            p99_ms=float(row["p99_ms"] or 0.0),
            bar_percent=round(100 * float(row["mean_ms"] or 0.0) / slowest, 1) if slowest else 0.0,
        )
        for row in sorted(rows, key=order)
    )


def _throughput(rows: list[Mapping[str, Any]]) -> Throughput | None:
    if not rows:
        return None
    windows = sorted(
        (
            Window(
                start=row["window_start"],
                sent=int(row["sent"]),
                delivered=int(row["delivered"]),
                sent_per_s=float(row["sent_per_s"] or 0.0),
            )
            for row in rows
        ),
        key=lambda window: window.start,
    )
    return Throughput(
        sent=sum(int(row["sent"]) for row in rows),
        delivered=sum(int(row["delivered"]) for row in rows),
        bytes_sent=sum(int(row["bytes_sent"]) for row in rows),
        latest=windows[-1],
        recent=tuple(windows[-RECENT_WINDOWS:]),
    )


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.0f} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.0f} h"
    return f"{seconds / 86400:.0f} days"
