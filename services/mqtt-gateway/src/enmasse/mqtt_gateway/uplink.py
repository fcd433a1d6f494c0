"""One MQTT client's AMQP connection to the space's router, logged in as the client's user.

What flows in (from the client's asyncio session): open with the MQTT user name and password,
attach a sender or a receiver to an address, send an encoded message, settle a delivery, close.
What flows out: awaitables that resolve with the router's answer (the connection opened or the
login refused, the link attached or refused with its AMQP condition, the outcome of an
unsettled send), and each message a receiver gets, handed to the session's `on_delivery`.

Why so: the gateway checks no password itself. It logs in to the router as the client's user
(SCRAM, or ANONYMOUS for a client that gave no user name), so the router's SASL decides who gets
in and its MessagingUser rules decide where that user may send (PUBLISH) and receive from
(SUBSCRIBE), exactly as for an AMQP client; a refusal comes back as the AMQP condition the
router gave. Every AMQP call runs on the gateway's one `Engine` thread (its threading contract);
the session runs on asyncio. `Uplink` is the bridge: calls go over with
`engine.call_soon_threadsafe`, answers come back with `loop.call_soon_threadsafe`, and nothing
else is shared between the two threads.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from enmasse.amqp.engine import (
    Condition,
    Connection,
    ConnectionHandler,
    Delivery,
    Engine,
    Link,
    Outcome,
    Terminus,
)
from enmasse.amqp.sasl import CLIENT_MECHANISMS

QOS0_BACKLOG = 1_000
"""QoS 0 messages an address may hold back while the router gives no credit; more are dropped
(at most once: the client asked for no guarantee, and the gateway keeps no unbounded buffer)."""


class Refused(Exception):
    """The router said no: to the login, an attach, or by closing a link or the connection."""

    def __init__(self, condition: Condition | None, *, what: str) -> None:
        self.condition = condition
        super().__init__(f"{what}: {condition}" if condition else f"{what}: closed")


@dataclass(frozen=True)
class Sent:
    """How an unsettled send ended: the outcome and, for REJECTED, the router's condition."""

    outcome: Outcome | None
    error: Condition | None = None


@dataclass
class _Endpoint:
    """A link of ours and what waits on it; lives on the engine thread."""

    opened: asyncio.Future[Link]
    receiver: Any = None  # the session's subscription, for a receiving link
    backlog: deque[tuple[bytes, asyncio.Future[Sent] | None]] = field(default_factory=deque)


class Uplink(ConnectionHandler):
    """The AMQP side of one MQTT connection. Methods without a leading underscore run on the
    asyncio loop; `on_*` and `_`-methods run on the engine thread."""

    def __init__(
        self,
        *,
        engine: Engine,
        on_delivery: Callable[[Any, Delivery], None],
        on_lost: Callable[[Condition | None], None],
    ) -> None:
        self.engine = engine
        self.loop = asyncio.get_running_loop()
        self._on_delivery = on_delivery
        self._on_lost = on_lost
        self._opened: asyncio.Future[None] = self.loop.create_future()
        self._connection: Connection | None = None
        self._closing = False

    # -- asyncio side --

    async def open(
        self, *, host: str, port: int, container_id: str, user: str | None, password: str | None
    ) -> None:
        """Dials the router and logs in; raises Refused with the router's condition."""

        def dial() -> None:
            self._connection = self.engine.connect(
                host=host,
                port=port,
                handler=self,
                container_id=container_id,
                user=user,
                password=password if user is not None else None,
                mechanisms=CLIENT_MECHANISMS if user is not None else None,
            )

        self.engine.call_soon_threadsafe(dial)
        await self._opened

    async def attach_sender(self, address: str) -> Link:
        opened: asyncio.Future[Link] = self.loop.create_future()
        endpoint = _Endpoint(opened)
        self.engine.call_soon_threadsafe(lambda: self._attach(endpoint, address, sender=True))
        return await opened

    async def attach_receiver(
        self,
        address: str,
        *,
        receiver: Any,
        credit: int,
        name: str | None = None,
        source: Terminus | None = None,
    ) -> Link:
        """A receiving link; `name` and `source` for a persistent session's durable
        subscription (persistence.py), else the engine's own name and a plain source."""
        opened: asyncio.Future[Link] = self.loop.create_future()
        endpoint = _Endpoint(opened, receiver=receiver)
        self.engine.call_soon_threadsafe(
            lambda: self._attach(
                endpoint, address, sender=False, credit=credit, name=name, source=source
            )
        )
        return await opened

    def send(self, link: Link, message: bytes, *, settled: bool) -> asyncio.Future[Sent] | None:
        """Queues a message on a sending link, in order; unsettled: a future of its outcome."""
        sent = None if settled else self.loop.create_future()
        self.engine.call_soon_threadsafe(lambda: self._send(link, message, sent))
        return sent

    def settle(
        self,
        delivery: Delivery,
        outcome: Outcome,
        *,
        credit: int = 1,
        undeliverable_here: bool = False,
    ) -> None:
        """Settles a received delivery and gives its link `credit` more (MODIFIED with
        `undeliverable_here`: not to be offered to this link again)."""

        def settle() -> None:
            delivery.settle(
                outcome, delivery_failed=undeliverable_here, undeliverable_here=undeliverable_here
            )
            if credit:
                delivery.link.flow(credit)

        self.engine.call_soon_threadsafe(settle)

    def flow(self, link: Link, credit: int) -> None:
        self.engine.call_soon_threadsafe(lambda: link.flow(credit))

    def detach(self, link: Link) -> None:
        self.engine.call_soon_threadsafe(link.close)

    def close(self) -> None:
        """Closes the AMQP connection: what the client had not acknowledged goes back to the
        router as released, which gives it to another consumer."""
        self._closing = True
        self.engine.call_soon_threadsafe(self._close)

    # -- engine side --

    def _close(self) -> None:
        if self._connection is not None:
            self._connection.close()

    def _answer(self, future: asyncio.Future[Any], value: Any = None, *, error: Any = None) -> None:
        def resolve() -> None:
            if future.done():
                return
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(value)

        self.loop.call_soon_threadsafe(resolve)

    def _attach(
        self,
        endpoint: _Endpoint,
        address: str,
        *,
        sender: bool,
        credit: int = 0,
        name: str | None = None,
        source: Terminus | None = None,
    ) -> None:
        connection = self._connection
        if connection is None or connection.closed:
            self._answer(endpoint.opened, error=Refused(None, what="router connection"))
            return
        link = (
            connection.open_sender(address)
            if sender
            else connection.open_receiver(address, name=name, source=source, credit=credit)
        )
        link.context = endpoint

    def _send(self, link: Link, message: bytes, sent: asyncio.Future[Sent] | None) -> None:
        endpoint: _Endpoint = link.context
        if not link.is_open:
            if sent is not None:
                self._answer(sent, error=Refused(None, what="link closed"))
            return
        if sent is None and len(endpoint.backlog) >= QOS0_BACKLOG:
            return
        endpoint.backlog.append((message, sent))
        self._pump(link)

    def _pump(self, link: Link) -> None:
        endpoint: _Endpoint = link.context
        while endpoint.backlog and link.credit > 0:
            message, sent = endpoint.backlog.popleft()
            link.send(message, settled=sent is None, context=sent)

    def on_connection_open(self, conn: Connection) -> None:
        self._answer(self._opened)

    def on_connection_close(self, conn: Connection, error: Condition | None) -> None:
        if not self._opened.done():
            self._answer(self._opened, error=Refused(error, what="login refused"))
        elif not self._closing:
            self.loop.call_soon_threadsafe(self._on_lost, error)

    def on_link_open(self, link: Link) -> None:
        self._answer(link.context.opened, link)

    def on_link_detach(self, link: Link, *, closed: bool, error: Condition | None) -> None:
        endpoint: _Endpoint = link.context
        refused = Refused(error, what="attach refused")
        self._answer(endpoint.opened, error=refused)
        for _message, sent in endpoint.backlog:
            if sent is not None:
                self._answer(sent, error=refused)
        endpoint.backlog.clear()
        for delivery in link.unsettled:
            if isinstance(delivery.context, asyncio.Future):
                self._answer(delivery.context, error=refused)

    def on_link_credit(self, link: Link) -> None:
        self._pump(link)

    def on_message(self, link: Link, delivery: Delivery) -> None:
        receiver = link.context.receiver
        self.loop.call_soon_threadsafe(self._on_delivery, receiver, delivery)

    def on_outcome(self, link: Link, delivery: Delivery, outcome: Outcome) -> None:
        if isinstance(delivery.context, asyncio.Future):
            self._answer(delivery.context, Sent(outcome, delivery.error))
