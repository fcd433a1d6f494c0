"""The gateway's own AMQP connection to the space's router, for what must outlive a client and
the gateway itself: retained messages and wills, kept in queues on the space's brokers.

What flows in (from asyncio): put a message on an address and wait for the broker's outcome;
read the messages of a queue that a JMS selector picks, browsing them (they stay) or taking
them (left unsettled until `settle`, so a gateway that dies half-way gives them back); watch
an address, a callback per message. What flows out: the outcome, the deliveries read, the
messages watched; `StoreUnavailable` with the router's condition when the store cannot be
reached (its address not declared in the space, the gateway's login refused, the router gone).

Why so: the gateway keeps nothing a crash could lose, so a retained message or a will lives in
a queue of the space, durable through its broker's journal, and the gateway only reads and
writes it. Reading uses two standard AMQP features the routers carry to the brokers: a selector
filter on the source (the broker picks the entries) and drain (the broker sends what it has,
then gives the credit back: `on_link_drained` says "that was all"). Each operation attaches a
link of its own and closes it when done: stores are touched on a retained PUBLISH, a SUBSCRIBE
and a CONNECT with a will, not per message, so simplicity wins over a cached link. The
connection is opened on first use and again after it was lost. Like `Uplink`, every AMQP call
runs on the gateway's one `Engine` thread and the answers come back with
`loop.call_soon_threadsafe`.
"""

from __future__ import annotations

import asyncio
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
from enmasse.amqp.selector import SELECTOR_FILTER_KEY, SELECTOR_FILTER_SYMBOL
from proton import Described, symbol

READ_BATCH = 500
"""Credit one drain asks for; a read drains again while the broker fills a whole batch."""

OPEN_TIMEOUT = 10.0
OPERATION_TIMEOUT = 10.0
"""Seconds a put or a read may take (a broker away, a router that holds the attach): then its
link is closed (what a take held goes back to the queue) and StoreUnavailable raised."""


class StoreUnavailable(Exception):
    """The store could not be reached or refused the operation; the text says why."""

    def __init__(self, condition: Condition | None, *, what: str) -> None:
        self.condition = condition
        detail = f"{condition.name}: {condition.description}" if condition else "closed"
        super().__init__(f"{what}: {detail}")


def selecting(address: str, selector: str, *, browse: bool) -> Terminus:
    """The source of a link that reads the entries of `address` that `selector` picks."""
    return Terminus(
        address=address,
        distribution_mode="copy" if browse else None,
        filter={SELECTOR_FILTER_KEY: Described(symbol(SELECTOR_FILTER_SYMBOL), selector)},
    )


def quoted(text: str) -> str:
    """A JMS selector string literal ('' is a quote)."""
    return "'" + text.replace("'", "''") + "'"


@dataclass
class _Put:
    message: bytes
    done: asyncio.Future[Outcome]
    sent: bool = False
    link: Link | None = None


@dataclass
class _Read:
    done: asyncio.Future[list[Delivery]]
    take: bool
    got: list[Delivery] = field(default_factory=list)
    this_round: int = 0
    link: Link | None = None


@dataclass
class _Watch:
    on_message: Callable[[bytes], None]
    ended: asyncio.Future[None]


class Store(ConnectionHandler):
    """One AMQP connection of the gateway's own. Methods without a leading underscore run on
    the asyncio loop; `on_*` and `_`-methods on the engine thread."""

    def __init__(
        self,
        *,
        engine: Engine,
        host: str,
        port: int,
        container_id: str,
        user: str | None = None,
        password: str | None = None,
    ) -> None:
        self.engine = engine
        self.host, self.port = host, port
        self.container_id = container_id
        self.user, self.password = user, password
        self.loop = asyncio.get_running_loop()
        self._connection: Connection | None = None
        self._opened: asyncio.Future[None] | None = None
        self._closing = False

    # -- asyncio side --

    async def put(self, address: str, message: bytes) -> None:
        """Sends a durable message unsettled; returns once the broker ACCEPTED it."""
        await self._ensure()
        done: asyncio.Future[Outcome] = self.loop.create_future()
        put = _Put(message, done)
        self.engine.call_soon_threadsafe(lambda: self._attach_sender(address, put))
        outcome = await self._within(put, what=f"put on {address}")
        if outcome is not Outcome.ACCEPTED:
            raise StoreUnavailable(None, what=f"{address} settled the message {outcome}")

    async def read(self, address: str, *, selector: str, take: bool) -> list[Delivery]:
        """The entries of `address` the selector picks, oldest first. `take`: consumed, left
        unsettled until `settle` (else browsed: they stay, nothing to settle)."""
        await self._ensure()
        done: asyncio.Future[list[Delivery]] = self.loop.create_future()
        source = selecting(address, selector, browse=not take)
        read = _Read(done, take=take)
        self.engine.call_soon_threadsafe(lambda: self._attach_receiver(source, read))
        got: list[Delivery] = await self._within(read, what=f"read of {address}")
        return got

    async def _within(self, operation: _Put | _Read, *, what: str) -> Any:
        """The operation's answer, or StoreUnavailable after OPERATION_TIMEOUT (its link
        closed: a take's entries go back to the queue)."""
        try:
            async with asyncio.timeout(OPERATION_TIMEOUT):
                return await operation.done
        except TimeoutError:
            self.engine.call_soon_threadsafe(lambda: _close(operation.link))
            raise StoreUnavailable(None, what=f"no answer to the {what}") from None

    def settle(self, deliveries: list[Delivery], outcome: Outcome) -> None:
        """Ends a `take`: settles what it read and closes its link (RELEASED gives them back)."""

        def settle() -> None:
            links = {id(d.link): d.link for d in deliveries}
            for delivery in deliveries:
                delivery.settle(outcome)
            for link in links.values():
                link.close()

        self.engine.call_soon_threadsafe(settle)

    async def watch(self, address: str, on_message: Callable[[bytes], None]) -> None:
        """Receives from `address` (each message accepted once `on_message` was called) until
        the link or the connection ends; raises StoreUnavailable then."""
        await self._ensure()
        ended: asyncio.Future[None] = self.loop.create_future()
        watch = _Watch(on_message, ended)
        self.engine.call_soon_threadsafe(
            lambda: self._attach_receiver(Terminus(address=address), watch, credit=100)
        )
        await ended

    def close(self) -> None:
        self._closing = True
        self.engine.call_soon_threadsafe(self._close)

    async def _ensure(self) -> None:
        if self._opened is None or (self._opened.done() and self._opened.exception()):
            self._opened = self.loop.create_future()
            self.engine.call_soon_threadsafe(self._dial)
        try:
            async with asyncio.timeout(OPEN_TIMEOUT):
                await asyncio.shield(self._opened)
        except TimeoutError:
            unanswered = "the router did not answer the store's login"
            raise StoreUnavailable(None, what=unanswered) from None

    # -- engine side --

    def _dial(self) -> None:
        self._connection = self.engine.connect(
            host=self.host,
            port=self.port,
            handler=self,
            container_id=self.container_id,
            user=self.user,
            password=self.password if self.user is not None else None,
            mechanisms=CLIENT_MECHANISMS if self.user is not None else None,
        )

    def _close(self) -> None:
        if self._connection is not None:
            self._connection.close()

    def _answer(
        self, future: asyncio.Future[Any] | None, value: Any = None, *, error: Any = None
    ) -> None:
        def resolve() -> None:
            if future is None or future.done():
                return
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(value)

        self.loop.call_soon_threadsafe(resolve)

    def _live(self, operation: Any) -> Connection | None:
        connection = self._connection
        if connection is None or connection.closed:
            future = operation.ended if isinstance(operation, _Watch) else operation.done
            self._answer(future, error=StoreUnavailable(None, what="store connection"))
            return None
        return connection

    def _attach_sender(self, address: str, put: _Put) -> None:
        connection = self._live(put)
        if connection is not None:
            put.link = connection.open_sender(address)
            put.link.context = put

    def _attach_receiver(self, source: Terminus, operation: Any, *, credit: int = 0) -> None:
        connection = self._live(operation)
        if connection is not None:
            link = connection.open_receiver(source.address, source=source, credit=credit)
            link.context = operation
            if isinstance(operation, _Read):
                operation.link = link

    def on_connection_open(self, conn: Connection) -> None:
        self._answer(self._opened)

    def on_connection_close(self, conn: Connection, error: Condition | None) -> None:
        lost = StoreUnavailable(error, what="store connection")
        self._answer(self._opened, error=lost)
        for link in conn.links:
            self._fail(link, lost)
        if self._opened is not None:
            # The next operation dials again (the router restarted, or a login was refused).
            opened = self._opened

            def forget() -> None:
                if self._opened is opened and opened.done():
                    self._opened = None

            self.loop.call_soon_threadsafe(forget)

    def on_link_open(self, link: Link) -> None:
        operation = link.context
        if isinstance(operation, _Read):
            link.drain(READ_BATCH)
        elif isinstance(operation, _Put):
            self._pump(link)

    def on_link_credit(self, link: Link) -> None:
        if isinstance(link.context, _Put):
            self._pump(link)

    def _pump(self, link: Link) -> None:
        put: _Put = link.context
        if not put.sent and link.credit > 0:
            put.sent = True
            link.send(put.message, settled=False, context=put)

    def on_outcome(self, link: Link, delivery: Delivery, outcome: Outcome) -> None:
        put = link.context
        if isinstance(put, _Put):
            self._answer(put.done, outcome)
            link.close()

    def on_message(self, link: Link, delivery: Delivery) -> None:
        operation = link.context
        if isinstance(operation, _Read):
            operation.got.append(delivery)
            operation.this_round += 1
        elif isinstance(operation, _Watch):
            self.loop.call_soon_threadsafe(operation.on_message, delivery.payload)
            delivery.settle(Outcome.ACCEPTED)
            link.flow(1)

    def on_link_drained(self, link: Link) -> None:
        read = link.context
        if not isinstance(read, _Read):
            return
        if read.this_round >= READ_BATCH:  # a full batch: there may be more
            read.this_round = 0
            link.drain(READ_BATCH)
            return
        self._answer(read.done, read.got)
        if not read.take or not read.got:  # a take with nothing to settle ends here too
            link.close()

    def on_link_detach(self, link: Link, *, closed: bool, error: Condition | None) -> None:
        self._fail(link, StoreUnavailable(error, what=f"store link {link.address or ''}"))

    def _fail(self, link: Link, error: StoreUnavailable) -> None:
        operation = link.context
        if isinstance(operation, _Watch):
            self._answer(operation.ended, error=error)
        elif isinstance(operation, _Put | _Read):
            self._answer(operation.done, error=error)


def _close(link: Link | None) -> None:
    if link is not None:
        link.close()
