"""The tracing dashboard: the analytics tables -> one static HTML file with plotly charts.

What flows in: a `DashboardData` (the small tables of the job, as lists of plain dict rows, already
collected from Spark). What flows out: one self-contained HTML page: plotly.js is inlined once in
the head (no CDN: a viewer, like this machine, may reach nothing outside), every chart is a plotly
figure, an overview section (all spaces) comes first, then one section per address space with its
addresses. It opens from the file system, without a server; `enmasse dashboard` opens or serves it.

The grid has a fixed number of columns, not auto-fit: each chart's script runs while the page is
still being parsed and sizes the chart to its cell then; an auto-fit grid would give the first
chart of a section the whole row and squeeze it afterwards.

Pure: `render` touches no file and no Spark, so the page can be built from hand-made rows. Every
chart is a `<div class="chart">`; plotly marks the ones it drew with `js-plotly-plot`, which is how
the browser test tells drawn charts from empty boxes. A table with no rows shows a sentence saying
so, not an empty chart.
"""

from __future__ import annotations

import html
import itertools
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import plotly.graph_objects as go
from plotly.offline import get_plotlyjs

Row = Mapping[str, Any]

_HEIGHT = 340
_CONFIG = {"displaylogo": False, "displayModeBar": False, "responsive": True}
_STYLE = """
body { font-family: system-ui, sans-serif; margin: 0 2rem 2rem; color: #222; }
h1 { margin: 1.2rem 0 0.2rem; } h2 { border-bottom: 1px solid #ccc; margin-top: 2rem; }
.meta { color: #666; margin-bottom: 1rem; }
.grid { display: grid; grid-template-columns: repeat(2, minmax(0, 1fr)); gap: 1rem; }
@media (max-width: 1000px) { .grid { grid-template-columns: minmax(0, 1fr); } }
.chart { min-height: 340px; border: 1px solid #eee; overflow: hidden; min-width: 0; }
.empty { color: #888; font-style: italic; padding: 1rem; border: 1px dashed #ddd; }
"""


@dataclass
class DashboardData:
    """The rows each chart draws from (columns as in docs/tracing.md)."""

    throughput_space: Sequence[Row] = field(default_factory=list)
    throughput_address: Sequence[Row] = field(default_factory=list)
    latency_address: Sequence[Row] = field(default_factory=list)
    latency_type: Sequence[Row] = field(default_factory=list)
    hop_latency: Sequence[Row] = field(default_factory=list)
    errors: Sequence[Row] = field(default_factory=list)
    top_talkers: Sequence[Row] = field(default_factory=list)
    address_readiness: Sequence[Row] = field(default_factory=list)
    rpc_latency: Sequence[Row] = field(default_factory=list)
    title: str = "EnMasse tracing dashboard"
    summary: str = ""


@dataclass
class Page:
    html: str
    charts: int
    """How many plotly charts the page holds (the browser test expects that many drawn)."""


class _Builder:
    """Accumulates chart divs and counts them, so `render` reads as a list of sections."""

    def __init__(self) -> None:
        self.charts = 0
        self.parts: list[str] = []

    def heading(self, text: str) -> None:
        self.parts.append(f"<h2>{html.escape(text)}</h2>")

    def grid(self, items: Iterable[str]) -> None:
        self.parts.append(f'<div class="grid">{"".join(items)}</div>')

    def chart(self, figure: go.Figure | None, *, title: str, empty: str) -> str:
        if figure is None:
            return f'<div class="empty"><b>{html.escape(title)}</b>: {html.escape(empty)}</div>'
        self.charts += 1
        figure.update_layout(
            title=title, height=_HEIGHT, margin={"l": 60, "r": 20, "t": 50, "b": 60}
        )
        div = figure.to_html(
            full_html=False,
            include_plotlyjs=False,
            div_id=f"chart-{self.charts}",
            config=_CONFIG,
        )
        return f'<div class="chart">{div}</div>'


def render(data: DashboardData) -> Page:
    """The whole page for `data`."""
    page = _Builder()
    page.heading("All address spaces")
    page.grid(_overview(page, data))
    for space in _spaces(data):
        page.heading(f"Address space {space}")
        page.grid(_space_section(page, data, space))
    body = "\n".join(page.parts)
    document = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>{html.escape(data.title)}</title>
<style>{_STYLE}</style>
<script type="text/javascript">{get_plotlyjs()}</script>
</head><body>
<h1>{html.escape(data.title)}</h1>
<div class="meta">{html.escape(data.summary)}</div>
{body}
</body></html>
"""
    return Page(html=document, charts=page.charts)


def _spaces(data: DashboardData) -> list[str]:
    named = itertools.chain(
        data.throughput_address, data.latency_address, data.hop_latency, data.top_talkers
    )
    return sorted({str(row["space"]) for row in named if row.get("space")})


def _overview(page: _Builder, data: DashboardData) -> list[str]:
    return [
        page.chart(
            _throughput_bars(data.throughput_space, series="space", y="sent_per_s"),
            title="Messages sent per second, per address space",
            empty="no sampled sends",
        ),
        page.chart(
            _percentile_bars(data.latency_type, label="address_type"),
            title="End-to-end latency by address type (ms)",
            empty="no delivered messages",
        ),
        page.chart(
            _error_bars(data.errors),
            title="Errors and rejections by condition",
            empty="no errors or rejections",
        ),
        page.chart(
            _readiness_bars(data.address_readiness),
            title="Control plane: address create -> Active (ms)",
            empty="no address.create / address.phase spans",
        ),
        page.chart(
            _percentile_bars(data.rpc_latency, label="rpc_method"),
            title="Control plane: gRPC server latency per method (ms)",
            empty="no gRPC server spans",
        ),
    ]


def _space_section(page: _Builder, data: DashboardData, space: str) -> list[str]:
    def of_space(rows: Sequence[Row]) -> list[Row]:
        return [row for row in rows if row.get("space") == space]

    return [
        page.chart(
            _throughput_bars(of_space(data.throughput_address), series="address", y="sent_per_s"),
            title=f"{space}: messages sent per second, per address",
            empty="no sampled sends",
        ),
        page.chart(
            _percentile_bars(of_space(data.latency_address), label="address"),
            title=f"{space}: end-to-end latency per address (ms)",
            empty="no delivered messages",
        ),
        page.chart(
            _hop_bars(of_space(data.hop_latency)),
            title=f"{space}: per-hop latency, mean (ms)",
            empty="no hop spans",
        ),
        page.chart(
            _talker_bars(of_space(data.top_talkers)),
            title=f"{space}: top talkers (messages sent)",
            empty="no sends",
        ),
    ]


# --- figures (None when there is nothing to draw) ----------------------------------------------


def _throughput_bars(rows: Sequence[Row], *, series: str, y: str) -> go.Figure | None:
    """Messages/s per window, one stacked segment per `series` (space or address), so the bar's
    height is the total and a window with a single sample still reads clearly."""
    if not rows:
        return None
    by_series: dict[str, list[Row]] = defaultdict(list)
    for row in rows:
        by_series[str(row[series])].append(row)
    figure = go.Figure()
    for name, points in sorted(by_series.items()):
        points.sort(key=lambda r: r["window_start"])
        figure.add_trace(
            go.Bar(x=[p["window_start"] for p in points], y=[p[y] for p in points], name=name)
        )
    figure.update_layout(
        barmode="stack",
        xaxis={"title": "window start (UTC)", "type": "category"},
        yaxis_title="messages/s",
    )
    return figure


def _percentile_bars(rows: Sequence[Row], *, label: str) -> go.Figure | None:
    if not rows:
        return None
    labels = [str(row[label]) for row in rows]
    figure = go.Figure(
        [
            go.Bar(name=p, x=labels, y=[row[f"{p}_ms"] for row in rows])
            for p in ("p50", "p95", "p99")
        ]
    )
    figure.update_layout(barmode="group", yaxis_title="ms")
    return figure


def _hop_bars(rows: Sequence[Row]) -> go.Figure | None:
    if not rows:
        return None
    addresses = sorted({str(row["address"]) for row in rows})
    hops: dict[str, dict[str, float]] = defaultdict(dict)
    for row in rows:
        hops[str(row["hop"])][str(row["address"])] = row["mean_ms"]
    figure = go.Figure(
        [
            go.Bar(name=hop, x=addresses, y=[per_address.get(a, 0.0) for a in addresses])
            for hop, per_address in hops.items()
        ]
    )
    figure.update_layout(barmode="stack", yaxis_title="ms")
    return figure


def _error_bars(rows: Sequence[Row]) -> go.Figure | None:
    if not rows:
        return None
    totals: dict[str, int] = defaultdict(int)
    for row in rows:
        totals[str(row["condition"])] += int(row["count"])
    ordered = sorted(totals.items(), key=lambda item: (-item[1], item[0]))
    return go.Figure(
        go.Bar(x=[count for _, count in ordered], y=[c for c, _ in ordered], orientation="h")
    ).update_layout(xaxis_title="spans", yaxis={"autorange": "reversed"})


def _readiness_bars(rows: Sequence[Row]) -> go.Figure | None:
    ready = [row for row in rows if row.get("create_to_active_ms") is not None]
    if not ready:
        return None
    return go.Figure(
        go.Bar(
            x=[f"{row['space']}/{row['address']}" for row in ready],
            y=[row["create_to_active_ms"] for row in ready],
        )
    ).update_layout(yaxis_title="ms")


def _talker_bars(rows: Sequence[Row]) -> go.Figure | None:
    if not rows:
        return None
    ordered = sorted(rows, key=lambda row: row["rank"])
    return go.Figure(
        go.Bar(x=[str(row["client_id"]) for row in ordered], y=[row["messages"] for row in ordered])
    ).update_layout(yaxis_title="messages")
