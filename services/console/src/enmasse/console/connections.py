"""Connections and links per router, as the connections page shows them: plain values, no network.

In: what each router of a space answers RouterAdmin's ListConnections and ListLinks with (its own
state, read between two engine events: nothing is counted on the message path for it), or
nothing when a router did not answer. Out: `RouterConnections` per router, each connection with
its container id, user, remote host:port, since when it is open and its links (address,
direction, credit, unsettled, delivered), and whether the page offers to close it.

What may be closed: a client's connection (role `normal`), or one link of it. The inter-router
and router -> broker connections, and the MQTT gateway's own (logged in as `$mqtt-store`, for
its stores and will notices), are the space's plumbing: shown but never offered, and refused if
asked for (`closable`): a tenant kicks its clients, not its mesh.

Who closed it: the client gets `amqp:connection:forced` (a link: `amqp:link:detach-forced`) with
`close_description`, which names the console, the address space and the closing token's
fingerprint (`token_fingerprint`: the first hex digits of the token's sha256, the digest the
config service stores for it, so an operator can tell whose token it was; the token itself is
never written anywhere). The audit event (audit.py) carries the same fingerprint.
"""

from __future__ import annotations

import datetime
import hashlib
from dataclasses import dataclass

from enmasse.resources.contracts import MQTT_STORE_USER
from enmasse.v1 import router_pb2

CLIENT = "normal"
"""ConnectionInfo.role of a client's connection (the others: inter-router, broker)."""
FINGERPRINT_DIGITS = 12


@dataclass(frozen=True)
class LinkView:
    name: str
    role: str
    """As the router says it (sender: router -> client; receiver): how a Close names the link."""
    direction: str
    """`from client` (the client sends: a receiver at the router) or `to client`."""
    address: str
    credit: int
    unsettled: int
    delivered: int


@dataclass(frozen=True)
class ConnectionView:
    router: str
    id: int
    container_id: str
    user: str
    remote: str
    role: str
    opened: str
    """When the router accepted it, UTC, to the second ("" when the router did not say)."""
    links: tuple[LinkView, ...]

    @property
    def closable(self) -> bool:
        return closable(role=self.role, user=self.user)

    @property
    def key(self) -> str:
        """How the page names it: `<router>/<id>` (ids are per router)."""
        return f"{self.router}/{self.id}"


@dataclass(frozen=True)
class RouterConnections:
    router: str
    connections: tuple[ConnectionView, ...]
    silent: bool = False
    """The router did not answer: its connections are not shown."""


def closable(*, role: str, user: str) -> bool:
    return role == CLIENT and user != MQTT_STORE_USER


def opened_at(milliseconds: int) -> str:
    if milliseconds <= 0:
        return ""
    moment = datetime.datetime.fromtimestamp(milliseconds / 1000, tz=datetime.UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC")


def link_view(link: router_pb2.LinkInfo) -> LinkView:
    return LinkView(
        name=link.name,
        role=link.role,
        direction="from client" if link.role == "receiver" else "to client",
        address=link.address,
        credit=link.credit,
        unsettled=link.unsettled,
        delivered=link.deliveries,
    )


def router_connections(
    *,
    router: str,
    connections: router_pb2.ConnectionList | None,
    links: router_pb2.LinkList | None,
) -> RouterConnections:
    """One router's answers as the page shows them: clients first, then the plumbing, each in
    the order the router accepted them."""
    if connections is None or links is None:
        return RouterConnections(router=router, connections=(), silent=True)
    by_connection: dict[int, list[LinkView]] = {}
    for link in links.links:
        by_connection.setdefault(link.connection_id, []).append(link_view(link))
    views = [
        ConnectionView(
            router=router,
            id=info.id,
            container_id=info.container_id,
            user=info.user,
            remote=info.remote,
            role=info.role,
            opened=opened_at(info.opened_at_ms),
            links=tuple(by_connection.get(info.id, ())),
        )
        for info in connections.connections
    ]
    views.sort(key=lambda view: (not view.closable, view.id))
    return RouterConnections(router=router, connections=tuple(views))


def token_fingerprint(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()[:FINGERPRINT_DIGITS]


def close_description(*, space: str, token: str) -> str:
    """What the closed client reads in its `amqp:connection:forced` condition."""
    return (
        f"closed from the EnMasse console by token {token_fingerprint(token)} "
        f"of address space '{space}'"
    )
