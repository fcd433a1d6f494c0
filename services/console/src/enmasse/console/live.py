"""Watch events in, server-sent events out: how an address page stays live.

In: the config service's `WatchEvent`s for the addresses of one space (ADDED for each address
there, SYNCED, then every change). Out: SSE frames (`text/event-stream`) the page's script
(static/console.js) applies to its table: `address` with the address's view (added or
changed), `removed` with its name, `synced` once the initial list is through, `figures` every
few seconds when the console sees the data plane (figures.py), and a comment now and then so
proxies and the browser keep the connection. Pure: the ASGI layer (app.py) pumps
events through `frame_of`.
"""

from __future__ import annotations

import json
from typing import Any

from enmasse.console.views import address_view
from enmasse.v1 import config_pb2

KEEPALIVE = ": keepalive\n\n"
KEEPALIVE_SECONDS = 15.0


def sse_frame(event: str, data: object) -> str:
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


def frame_of(event: config_pb2.WatchEvent) -> str | None:
    """The SSE frame of one address event; None for what the page does not show (PROGRESS,
    another kind)."""
    kind = event.object.WhichOneof("kind")
    if event.type == config_pb2.WatchEvent.SYNCED:
        return sse_frame("synced", {"revision": event.revision})
    if kind != "address":
        return None
    if event.type == config_pb2.WatchEvent.DELETED:
        return sse_frame("removed", {"name": event.object.address.metadata.name})
    if event.type in (config_pb2.WatchEvent.ADDED, config_pb2.WatchEvent.MODIFIED):
        return sse_frame("address", address_view(event.object.address).as_json())
    return None


def figures_frame(figures: list[dict[str, Any]], *, silent: tuple[str, ...]) -> str:
    """The space's live figures now (figures.figures), and who did not answer."""
    return sse_frame("figures", {"figures": figures, "silent": list(silent)})


def refusal_frame(message: str) -> str:
    """The stream ended because the API refused or went away: the page says so."""
    return sse_frame("failed", {"message": message})
