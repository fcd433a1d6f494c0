"""A standard space's router and transactions: it cannot serve a transaction coordinator, so a
`$coordinator` attach (Qpid Proton's `Container.declare_transaction`) is refused with
amqp:not-implemented and words that say where transactions are served, instead of passing for
an anonymous producer whose Declare is never answered."""

from __future__ import annotations

import threading
from typing import Any

from enmasse.router.forwarding import TRANSACTIONS_REFUSED
from proton.handlers import MessagingHandler, TransactionHandler
from proton.reactor import Container

from tests.fixtures.router import RouterFleet


class Declarer(MessagingHandler, TransactionHandler):  # type: ignore[misc]
    def __init__(self, port: int) -> None:
        super().__init__()
        self.port = port
        self.refusal: tuple[str, str] | None = None
        self.declared = False

    def on_start(self, event: Any) -> None:
        self.conn = event.container.connect(f"127.0.0.1:{self.port}", reconnect=False)
        event.container.declare_transaction(self.conn, handler=self)

    def on_transaction_declared(self, event: Any) -> None:
        self.declared = True
        self.conn.close()

    def on_link_error(self, event: Any) -> None:
        condition = event.link.remote_condition
        self.refusal = (condition.name, condition.description)
        self.conn.close()


def test_a_coordinator_attach_is_refused_with_not_implemented(routers: RouterFleet) -> None:
    router = routers.start("r1")
    router.apply(routers.mesh_config(generation=1, addresses={"work": "anycast"}))
    client = Declarer(router.amqp_port)
    thread = threading.Thread(target=Container(client).run, daemon=True)
    thread.start()
    thread.join(30)
    assert not thread.is_alive(), "the proton client did not finish in 30s"
    assert not client.declared
    assert client.refusal == ("amqp:not-implemented", TRANSACTIONS_REFUSED)
    assert "brokered space" in TRANSACTIONS_REFUSED
