"""The will service, part of the gateway: each client's will kept in a queue of the space, and
published when the client is gone without saying goodbye.

What flows in: an MQTT client's will at CONNECT (after the router let its user attach a sender
to the will's topic), how its connection ended (DISCONNECT 0, DISCONNECT 0x04, or none), a
reconnect of the same client id; from the router (`$lwt`, `contracts.LOST_CONNECTIONS`) a notice
for each AMQP connection that had registered a will and ended, cleanly or not. What flows out:
an entry in the space's will queue (`mqtt/wills`, `contracts.WILL_ADDRESS`, a queue the space
declares), taken off it again on a clean end or a reconnect, or taken and published to the
will's address (and kept as that topic's retained message when the will says retain) once its
delay has passed.

Why so: the gateway keeps nothing a crash could lose. A will is on a broker from CONNECT on; the
delay runs as a timer in the gateway that served the client, and a gateway that restarts
looks for the wills it had stored under its id (`will_gateway`) and runs their delays again, so a
crash during a delay publishes them late, not never. Publishing takes the entry (consumed
unsettled), sends the will, then accepts the entry: at least once, and one gateway only (a
queue gives an entry to one consumer). The MQTT key is `mqtt:<client id>`; a reconnect with the
same id takes the stored wills of that key, so a will whose delay is still running anywhere
finds nothing to publish; an entry carries its connection's stamp too, so a delay running for
an old connection never publishes the will of a newer one.

An AMQP client registers a will with an ordinary message: it attaches a sender to the will
queue (which the router notes, at attach) and sends its will's body with the application
properties `will_client` (its own container id) and `will_address` (where the will goes;
`will_delay` seconds, `will_retain` optional). When that connection ends, the router sends a
notice on `$lwt` to the will services attached there: a clean close drops the will, a lost
connection publishes it. The will service listens on the router its gateway fronts.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass
from typing import Any

import structlog
from enmasse.amqp import codec
from enmasse.amqp.engine import Delivery, Outcome
from enmasse.mqtt_gateway.mapping import RETAIN_ANNOTATION
from enmasse.mqtt_gateway.packets import CONTENT_TYPE, USER_PROPERTY, Publish, Will
from enmasse.mqtt_gateway.retained import RetainedStore
from enmasse.mqtt_gateway.store import Store, StoreUnavailable, quoted
from enmasse.resources.contracts import (
    LOST_CLEAN,
    LOST_CONNECTIONS,
    LOST_CONTAINER,
    WILL_ADDRESS,
    WILL_CLIENT,
    WILL_TARGET,
)

log = structlog.get_logger("enmasse.mqtt_gateway")

WILL_DELAY_INTERVAL = 0x18  # MQTT 5 will property (3.1.3.2.2), seconds
QOS, RETAIN, DELAY, STAMP, GATEWAY = (
    "will_qos",
    "will_retain",
    "will_delay",
    "will_stamp",
    "will_gateway",
)
_OWN = frozenset({WILL_CLIENT, WILL_TARGET, QOS, RETAIN, DELAY, STAMP, GATEWAY})
WATCH_RETRY, WATCH_RETRY_MOST = 1.0, 30.0  # seconds between attempts (doubling)


def mqtt_key(client_id: str) -> str:
    """The key an MQTT client's wills are stored under."""
    return f"mqtt:{client_id}"


@dataclass(frozen=True)
class StoredWill:
    """One will as read back from the queue."""

    client: str
    address: str
    body: Any
    qos: int
    retain: bool
    delay: float
    stamp: int | None
    gateway: str | None
    content_type: str | None
    user: dict[str, Any]


def entry_of(will: Will, *, key: str, stamp: int, gateway: str) -> bytes:
    """The will queue's entry for an MQTT client's will."""
    user = will.properties.get(USER_PROPERTY)
    application: dict[str, Any] = dict(user) if user else {}
    application.update(
        {
            WILL_CLIENT: key,
            WILL_TARGET: will.topic,
            QOS: will.qos,
            RETAIN: will.retain,
            DELAY: int(will.properties.get(WILL_DELAY_INTERVAL, 0)),
            STAMP: stamp,
            GATEWAY: gateway,
        }
    )
    content_type = will.properties.get(CONTENT_TYPE)
    return codec.encode_message(
        will.payload,
        durable=True,
        properties={"content_type": content_type} if content_type else None,
        application_properties=application,
    )


def stored_of(payload: bytes) -> StoredWill | None:
    """An entry read back; None without a client or an address (not a will)."""
    application = codec.read_application_properties(payload)
    client, address = application.get(WILL_CLIENT), application.get(WILL_TARGET)
    if not isinstance(client, str) or not isinstance(address, str) or not address:
        return None
    qos, delay, stamp = application.get(QOS, 1), application.get(DELAY, 0), application.get(STAMP)
    content_type = codec.read_properties(payload).content_type
    return StoredWill(
        client=client,
        address=address,
        body=codec.read_body(payload),
        qos=qos if qos in (0, 1, 2) else 1,
        retain=application.get(RETAIN) is True,
        delay=float(delay) if isinstance(delay, int | float) and delay > 0 else 0.0,
        stamp=stamp if isinstance(stamp, int) else None,
        gateway=application.get(GATEWAY) if isinstance(application.get(GATEWAY), str) else None,
        content_type=str(content_type) if content_type else None,
        user={k: v for k, v in application.items() if k not in _OWN},
    )


def message_of(will: StoredWill) -> bytes:
    """The message a will becomes at its address: its body, durable unless QoS 0, its retain
    flag as the gateway's retain annotation."""
    body = will.body
    if isinstance(body, bytearray | memoryview):
        body = bytes(body)
    return codec.encode_message(
        body if isinstance(body, bytes | str) or body is None else str(body),
        durable=will.qos > 0,
        properties={"content_type": will.content_type} if will.content_type else None,
        application_properties=will.user or None,
        message_annotations={RETAIN_ANNOTATION: True} if will.retain else None,
    )


def selector_of(key: str, stamp: int | None = None) -> str:
    """The selector of a client's wills (of one connection's, given its stamp)."""
    own = f"{WILL_CLIENT} = {quoted(key)}"
    return own if stamp is None else f"{own} AND {STAMP} = {stamp}"


def notice_of(payload: bytes) -> tuple[str, bool] | None:
    """A `$lwt` notice read: (container id, closed cleanly), or None if it is not one."""
    application = codec.read_application_properties(payload)
    container = application.get(LOST_CONTAINER)
    if not isinstance(container, str):
        return None
    return container, application.get(LOST_CLEAN) is True


def is_clean(reason: int | None) -> bool:
    """Whether a connection's end drops its will: a DISCONNECT with reason 0 (0x04 asks for the
    will; no DISCONNECT at all is a lost connection)."""
    return reason == 0


class Wills:
    """The wills of the space, through the gateway's `Store` connection."""

    def __init__(
        self,
        store: Store,
        *,
        retained: RetainedStore | None,
        gateway: str,
        address: str = WILL_ADDRESS,
    ) -> None:
        self.store = store
        self.retained = retained
        self.gateway = gateway
        self.address = address
        self.started = time.time_ns()  # wills stamped before: of connections that died with us
        self._timers: dict[str, asyncio.Task[None]] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    # -- an MQTT client's will --

    async def connected(self, key: str, will: Will | None) -> int | None:
        """A client connected: its earlier wills are dropped (a reconnect cancels a will whose
        delay runs), and its new one stored. Returns the new will's stamp (None: no will);
        raises StoreUnavailable when the will could not be stored."""
        if will is None:  # nothing to order the cancel before: not awaited
            self._stop_timer(key)
            self._spawn(self._drop(key, None))
            return None
        await self.cancel(key)
        stamp = time.time_ns()
        entry = entry_of(will, key=key, stamp=stamp, gateway=self.gateway)
        await self.store.put(self.address, entry)
        return stamp

    def ended(self, key: str, *, stamp: int, delay: float, reason: int | None) -> None:
        """A client with a will has gone: dropped on a clean DISCONNECT, else published once
        `delay` seconds have passed."""
        if is_clean(reason):
            self._spawn(self._drop(key, stamp))
        else:
            self._due(key, stamp=stamp, delay=delay)

    async def cancel(self, key: str) -> None:
        self._stop_timer(key)
        taken = await self.store.read(self.address, selector=selector_of(key), take=True)
        self.store.settle(taken, Outcome.ACCEPTED)

    async def _drop(self, key: str, stamp: int | None) -> None:
        with contextlib.suppress(StoreUnavailable):
            taken = await self.store.read(self.address, selector=selector_of(key, stamp), take=True)
            self.store.settle(taken, Outcome.ACCEPTED)

    def _stop_timer(self, key: str) -> None:
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()

    def _due(self, key: str, *, stamp: int | None, delay: float) -> None:
        self._stop_timer(key)
        timer = asyncio.get_running_loop().create_task(self._after(key, stamp, delay))
        self._timers[key] = timer

        def forget(done: asyncio.Task[None]) -> None:
            if self._timers.get(key) is done:
                del self._timers[key]

        timer.add_done_callback(forget)

    async def _after(self, key: str, stamp: int | None, delay: float) -> None:
        """The will delay, then the will; tried again (doubling pauses) while the store cannot
        be reached, until published or cancelled (a reconnect, the gateway stopping)."""
        await asyncio.sleep(delay)
        pause = WATCH_RETRY
        while True:
            try:
                await self.publish(key, stamp)
                return
            except StoreUnavailable as error:
                log.warning("will not published yet", client=key, why=str(error))
            await asyncio.sleep(pause)
            pause = min(pause * 2, WATCH_RETRY_MOST)

    async def publish(self, key: str, stamp: int | None = None) -> int:
        """Takes a client's wills (one connection's, given its stamp) and publishes them;
        returns how many. An entry is accepted only once its will was sent."""
        taken: list[Delivery] = await self.store.read(
            self.address, selector=selector_of(key, stamp), take=True
        )
        published = 0
        try:
            for delivery in taken:
                will = stored_of(delivery.payload)
                if will is None:
                    continue
                await self._send(will)
                published += 1
        except BaseException:
            self.store.settle(taken, Outcome.RELEASED)  # stays stored for the next attempt
            raise
        self.store.settle(taken, Outcome.ACCEPTED)
        log.info("will published", client=key, wills=published)
        return published

    async def _send(self, will: StoredWill) -> None:
        await self.store.put(will.address, message_of(will))
        if will.retain and self.retained is not None:
            payload = will.body if isinstance(will.body, bytes) else str(will.body or "").encode()
            await self.retained.keep(
                Publish(topic=will.address, payload=payload, qos=will.qos, retain=True),
                topic=will.address,
            )

    # -- after a restart, and AMQP clients --

    async def recover(self) -> int:
        """The wills this gateway had stored (its clients' connections ended with it): each
        published after its delay, unless its client reconnects first. Returns how many."""
        mine = f"{GATEWAY} = {quoted(self.gateway)} AND {STAMP} < {self.started}"
        found = await self.store.read(self.address, selector=mine, take=False)
        wills = [w for w in (stored_of(d.payload) for d in found) if w is not None]
        for will in wills:
            self._due(will.client, stamp=will.stamp, delay=will.delay)
        return len(wills)

    async def run(self) -> None:
        """`recover` (again until the store answers), then follows the router's `$lwt`
        notices, attaching again after a loss; until cancelled."""
        pause = WATCH_RETRY
        while True:
            try:
                log.info("wills recovered", wills=await self.recover())
                break
            except StoreUnavailable as error:
                # doubling: each attempt is a login (a SCRAM proof), not free for either side
                log.info("wills not recovered yet", why=str(error), next_in=pause)
            await asyncio.sleep(pause)
            pause = min(pause * 2, WATCH_RETRY_MOST)
        pause = WATCH_RETRY
        while True:
            try:
                await self.store.watch(LOST_CONNECTIONS, self._notice)
                pause = WATCH_RETRY
            except StoreUnavailable as error:
                log.info("not following connection notices", why=str(error))
                pause = min(pause * 2, WATCH_RETRY_MOST)
            await asyncio.sleep(pause)

    def _notice(self, payload: bytes) -> None:
        notice = notice_of(payload)
        if notice is None:
            return
        container, clean = notice
        if clean:
            self._spawn(self._drop(container, None))
        else:
            self._spawn(self._lost(container))

    async def _lost(self, key: str) -> None:
        """An AMQP client's connection was lost: its wills go out after the longest delay."""
        with contextlib.suppress(StoreUnavailable):
            found = await self.store.read(self.address, selector=selector_of(key), take=False)
            wills = [w for w in (stored_of(d.payload) for d in found) if w is not None]
            if wills:
                self._due(key, stamp=None, delay=max(w.delay for w in wills))

    def _spawn(self, coroutine: Any) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def stop(self) -> None:
        for task in [*self._timers.values(), *self._tasks]:
            task.cancel()
        for task in [*self._timers.values(), *self._tasks]:
            with contextlib.suppress(BaseException):
                await task
