"""The proton side of the router: one thin engine handler per kind of connection.

Engine events flow in (see `enmasse.amqp.engine.ConnectionHandler`); each handler only says
which kind of connection the event came from and passes it to the `Router` (`forwarding.py`), or
to its mesh side (`router.mesh_links`) or broker side (`router.broker_links`):

- `ClientHandler`: connections accepted on the client port (producers, consumers, RPC clients);
  it also tells `LostConnections` of their attaches and closes (the will service's notices);
- `MeshHandler`: connections between routers, accepted on the inter-router port or dialled by us;
- `BrokerHandler`: the connection this router dials to one broker of the space.

`RouterHandlers` makes them: main hands it to the `Router`, whose listeners, mesh side and broker
side ask it for a handler per connection. This module imports the core; the core and its sides
never import this module (they know the factory by the `forwarding.ConnectionHandlers` Protocol
and by the plain callables it hands them), so the two do not import each other.

The per-message events (`on_message`, `on_outcome`, `on_link_credit`) are the same for every kind
of connection: the link's own state (in `link.context`) says what it is.
"""

from __future__ import annotations

from enmasse.amqp.engine import (
    Condition,
    Connection,
    ConnectionHandler,
    Delivery,
    Link,
    Outcome,
)
from enmasse.router.forwarding import Router
from enmasse.router.lost_connections import LostConnections
from enmasse.router.points import ConnectionRole
from enmasse.router.transactions import Barrier
from enmasse.router.waypoints import BrokerSession


class _Deliveries(ConnectionHandler):
    """What every kind of router connection does with deliveries, outcomes and credit."""

    def __init__(self, router: Router) -> None:
        self.router = router
        # The two per-message events go straight to the router's methods: a forwarding method
        # of our own would be one Python call more per delivery and per outcome.
        self.on_message = router.message  # type: ignore[method-assign]
        self.on_outcome = router.outcome  # type: ignore[method-assign]

    def on_link_credit(self, link: Link) -> None:
        self.router.credit(link)


class ClientHandler(_Deliveries):
    def __init__(self, router: Router, *, lost: LostConnections) -> None:
        super().__init__(router)
        self.lost = lost  # the will service's connection notices (lost_connections.py)

    def on_connection_open(self, conn: Connection) -> None:
        self.router.open_connection(conn, role=ConnectionRole.NORMAL)

    def on_connection_close(self, conn: Connection, error: Condition | None) -> None:
        self.router.close_record(conn)
        self.lost.closed(conn, error)

    def on_session_begin(self, conn: Connection, *, held: int) -> Condition | None:
        return self.router.client_session(conn, held=held)

    def on_link_attach(self, link: Link) -> None:
        if not self.lost.attached(link):
            self.router.client_attach(link)

    def on_link_detach(self, link: Link, *, closed: bool, error: Condition | None) -> None:
        self.router.client_detach(link, closed=closed)

    def on_transactional_outcome(
        self, link: Link, delivery: Delivery, *, txn_id: bytes | None, outcome: Outcome
    ) -> None:
        """A consumer settled a delivery under a transaction (`transactions.py`)."""
        self.router.transactions.disposition(link, delivery, txn_id=txn_id, outcome=outcome)


class MeshHandler(_Deliveries):
    def __init__(self, router: Router, *, expected: str | None = None) -> None:
        super().__init__(router)
        self.expected = expected  # set when we dialled: the peer we meant to reach

    def on_connection_open(self, conn: Connection) -> None:
        peer = conn.container_id
        if self.expected is not None and peer != self.expected:
            conn.close(
                Condition(
                    "amqp:precondition-failed",
                    f"dialled router '{self.expected}' but '{peer}' answered",
                )
            )
            return
        self.router.mesh_links.neighbor_open(conn, peer_id=peer)

    def on_connection_close(self, conn: Connection, error: Condition | None) -> None:
        self.router.mesh_links.neighbor_closed(conn, expected=self.expected, error=error)

    def on_link_attach(self, link: Link) -> None:
        self.router.mesh_links.attach(link)

    def on_link_detach(self, link: Link, *, closed: bool, error: Condition | None) -> None:
        self.router.mesh_links.link_detached(link)


class BrokerHandler(_Deliveries):
    def __init__(self, router: Router, session: BrokerSession) -> None:
        super().__init__(router)
        self.session = session

    def on_connection_open(self, conn: Connection) -> None:
        self.router.broker_links.broker_open(self.session, conn)

    def on_connection_close(self, conn: Connection, error: Condition | None) -> None:
        self.router.broker_links.broker_closed(self.session, conn, error=error)

    def on_link_attach(self, link: Link) -> None:
        link.refuse(Condition("amqp:not-allowed", "a router takes no links from a broker"))

    def on_link_open(self, link: Link) -> None:
        self.router.broker_links.link_opened(link)

    def on_link_drained(self, link: Link) -> None:
        self.router.broker_links.feed_drained(link)

    def on_link_detach(self, link: Link, *, closed: bool, error: Condition | None) -> None:
        if type(link.context) is Barrier:  # a transaction's barrier (`transactions.py`)
            self.router.transactions.barrier_answered(link)
            return
        self.router.broker_links.link_detached(link, error=error)


class RouterHandlers:
    """Makes the engine handlers of one router's connections (`forwarding.ConnectionHandlers`)."""

    def __init__(self, router: Router) -> None:
        self.router = router
        self.lost = LostConnections()  # one per router: its clients' connection notices

    def client(self) -> ClientHandler:
        """For a connection accepted on the client port (or the amqps port)."""
        return ClientHandler(self.router, lost=self.lost)

    def mesh(self) -> MeshHandler:
        """For a connection accepted on the inter-router port."""
        return MeshHandler(self.router)

    def peer(self, router_id: str) -> MeshHandler:
        """For a connection this router dials to the router of that id."""
        return MeshHandler(self.router, expected=router_id)

    def broker(self, session: BrokerSession) -> BrokerHandler:
        """For the connection this router dials to the broker of that session."""
        return BrokerHandler(self.router, session)
