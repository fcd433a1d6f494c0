"""The connections page's pure part: routers' ListConnections and ListLinks answers as the page
shows them, which connections it offers to close, and what a closed client is told. No network:
the inputs are RouterAdmin's own messages."""

from __future__ import annotations

import hashlib

from enmasse.console.connections import (
    LinkView,
    close_description,
    opened_at,
    router_connections,
    token_fingerprint,
)
from enmasse.v1 import router_pb2

OPENED_MS = 1_764_075_845_123  # 2025-11-25 13:04:05.123 UTC


def _answers() -> tuple[router_pb2.ConnectionList, router_pb2.LinkList]:
    connections = router_pb2.ConnectionList(
        connections=[
            router_pb2.ConnectionInfo(
                id=1, container_id="r2", remote="127.0.0.1:9", role="inter-router"
            ),
            router_pb2.ConnectionInfo(
                id=4,
                container_id="shop-app",
                remote="127.0.0.1:40000",
                role="normal",
                user="app",
                opened_at_ms=OPENED_MS,
            ),
            router_pb2.ConnectionInfo(
                id=3, container_id="anon", remote="127.0.0.1:40001", role="normal"
            ),
            router_pb2.ConnectionInfo(
                id=2,
                container_id="shop-mqtt-gateway/store",
                remote="127.0.0.1:40002",
                role="normal",
                user="$mqtt-store",
            ),
        ]
    )
    links = router_pb2.LinkList(
        links=[
            router_pb2.LinkInfo(
                connection_id=4,
                name="in",
                role="receiver",
                address="orders",
                credit=250,
                unsettled=2,
                deliveries=17,
            ),
            router_pb2.LinkInfo(
                connection_id=4, name="out", role="sender", address="calls", credit=10, deliveries=3
            ),
        ]
    )
    return connections, links


def test_clients_come_first_with_their_links_and_only_they_may_be_closed() -> None:
    connections, links = _answers()
    shown = router_connections(router="r1", connections=connections, links=links)
    assert (shown.router, shown.silent) == ("r1", False)
    assert [(c.key, c.container_id, c.closable) for c in shown.connections] == [
        ("r1/3", "anon", True),
        ("r1/4", "shop-app", True),
        ("r1/1", "r2", False),
        ("r1/2", "shop-mqtt-gateway/store", False),  # the MQTT gateway's own
    ]
    app = shown.connections[1]
    assert (app.user, app.remote, app.role) == ("app", "127.0.0.1:40000", "normal")
    assert app.opened == "2025-11-25 13:04:05 UTC"
    assert app.links == (
        LinkView(
            name="in",
            role="receiver",
            direction="from client",
            address="orders",
            credit=250,
            unsettled=2,
            delivered=17,
        ),
        LinkView(
            name="out",
            role="sender",
            direction="to client",
            address="calls",
            credit=10,
            unsettled=0,
            delivered=3,
        ),
    )
    assert shown.connections[0].links == ()
    assert shown.connections[0].opened == ""  # a router that did not say when


def test_a_router_that_did_not_answer_is_named_silent() -> None:
    shown = router_connections(router="r2", connections=None, links=None)
    assert (shown.router, shown.connections, shown.silent) == ("r2", (), True)


def test_the_closed_client_reads_who_closed_it_never_the_token() -> None:
    token = "s3cret-token-value"
    digest = hashlib.sha256(token.encode()).hexdigest()
    assert token_fingerprint(token) == digest[:12]
    description = close_description(space="shop", token=token)
    assert description == (
        f"closed from the EnMasse console by token {digest[:12]} of address space 'shop'"
    )
    assert token not in description


def test_open_since_is_utc_to_the_second() -> None:
    assert opened_at(0) == ""
    assert opened_at(OPENED_MS) == "2025-11-25 13:04:05 UTC"
