"""Persistent MQTT sessions: what of a session outlives its connection, and where it lives.

What flows in: a client's CONNECT (its client id, clean start and MQTT 5 session expiry, or
3.1.1's clean session flag), its subscriptions as they change, the end of its connection. What
flows out: whether a session is present (CONNACK), the subscriptions to resume, the AMQP name and
source a persistent subscription attaches with, and session records written to and read from the
space's sessions queue through the gateway's own `Store` connection.

Why so: the gateway keeps nothing a crash could lose, and a client may come back through any
instance of it. So a persistent session's subscriptions are durable subscriptions on the
brokers: the receiver is named `mqtt:<filter>` on the client's AMQP connection (container id
`mqtt/<client id>`, the same from every gateway) with a durable source that lives as long as
the session may (its expiry interval, capped by `--max-session-expiry`, is the source's
timeout: the broker ends a subscription whose client did not come back in time, so a client
that never returns leaves nothing behind), which is how any AMQP client gets a durable topic
subscription (no admin step: the routers name the broker link after container id and link
name, so the broker resumes the same subscription whichever router and gateway the client comes
through). What the topic publishes while the client is away waits in that subscription on the
broker; a connection that ends (or a gateway that dies) only detaches the links, which keeps it.
(An MQTT 5 DISCONNECT that lengthens the interval does not lengthen the broker's lease: the
links were attached with the interval of the CONNECT.)

The rest of the session, its filters with their QoS and its expiry, is a record: a durable
message in the sessions queue (`--sessions-address`) with the client id and a revision as
application properties. A CONNECT reads the client's records with a selector (browsing: they
stay); the newest revision wins. Each change puts a new record first and then takes and accepts
the older ones, so a crash between the two leaves an extra record, never none. The record says
when the session ended (0 while connected); a session whose end plus its expiry has passed is
expired: the next CONNECT of that client id removes its durable subscriptions (attached and
closed: the broker drops a durable subscription whose link is closed, not detached) and its
records, as a clean start does. A gateway that dies leaves its clients' records at "connected",
so such a session does not expire until the client comes back.

Two connections of one client id may overlap (it reconnects, maybe through another gateway,
before the old connection's end was handled). So a connection's end is recorded only after its
AMQP connection closed (its links detached) and only if no newer record appeared meanwhile, and
a clean start that finds the session still connected waits, bounded, for that end first: a
broker keeps a durable subscription whose link is closed while another consumer still holds it.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

import structlog
from enmasse.amqp import codec
from enmasse.amqp.engine import Outcome, Terminus
from enmasse.mqtt_gateway.packets import (
    MQTT_5,
    PROTOCOL_ERROR,
    SESSION_EXPIRY,
    Connect,
    MalformedPacket,
)
from enmasse.mqtt_gateway.store import Store, StoreUnavailable, quoted
from enmasse.mqtt_gateway.uplink import Refused, Uplink

log = structlog.get_logger("enmasse.mqtt_gateway")

NEVER = 0xFFFFFFFF
"""A session expiry interval that never expires (MQTT 5 3.1.2.11.2; 3.1.1's clean session 0)."""

CLIENT = "mqtt_client"
REVISION = "mqtt_revision"
"""The record's application properties: what a selector picks a client's records by."""

LINK_PREFIX = "mqtt:"

TAKEOVER_WAIT = 3.0
TAKEOVER_POLL = 0.1
"""Seconds a clean start waits, at most, for the connection its record says is still on to
end (and how often it looks): a gateway that died never records the end, so it is bounded."""


@dataclass(frozen=True)
class SessionRecord:
    """One persistent session as it is written in the sessions queue."""

    client_id: str
    expiry: int  # seconds after the end of the connection; NEVER
    subscriptions: dict[str, int] = field(default_factory=dict)  # topic filter -> granted QoS
    ended_ms: int = 0  # when its last connection ended; 0: connected (or its gateway died)
    revision: int = 0


@dataclass(frozen=True)
class Gone:
    """The receiver of a durable subscription being removed: no subscription of the session,
    so a delivery that still arrives is released."""

    topic: str


def session_expiry(connect: Connect) -> int:
    """Seconds the session outlives the connection: MQTT 5's property (default 0), or for
    3.1.1 never with clean session 0 and at once with clean session 1."""
    if connect.level >= MQTT_5:
        expiry: int = connect.properties.get(SESSION_EXPIRY, 0)
        return expiry
    return 0 if connect.clean_start else NEVER


def expired(record: SessionRecord, *, now_ms: int) -> bool:
    """Whether the session ended longer ago than its expiry interval."""
    if not record.ended_ms or record.expiry == NEVER:
        return False
    return now_ms >= record.ended_ms + record.expiry * 1000


def durable_name(topic_filter: str) -> str:
    """The AMQP link name of a persistent subscription: the same from any gateway."""
    return LINK_PREFIX + topic_filter


def durable_source(address: str, *, expiry: int = NEVER) -> Terminus:
    """A durable source: the broker keeps the subscription while detached, for ever (`NEVER`)
    or `expiry` seconds after the client left (the source's timeout: the broker's lease on it),
    so a client that never comes back leaves nothing behind on the broker."""
    timeout = expiry if 0 < expiry < NEVER else 0
    return Terminus(address=address, durable=2, expiry_policy="never", timeout=timeout)


def encode_record(record: SessionRecord) -> bytes:
    body = {
        "client": record.client_id,
        "expiry": record.expiry,
        "subscriptions": record.subscriptions,
        "ended_ms": record.ended_ms,
    }
    return codec.encode_message(
        json.dumps(body, sort_keys=True),
        durable=True,
        application_properties={CLIENT: record.client_id, REVISION: record.revision},
    )


def decode_record(payload: bytes) -> SessionRecord | None:
    """The record a message holds; None for one that is not a record (logged, then skipped)."""
    try:
        revision = codec.read_application_properties(payload)[REVISION]
        body = json.loads(codec.read_body(payload))
        return SessionRecord(
            client_id=str(body["client"]),
            expiry=int(body["expiry"]),
            subscriptions={str(k): int(v) for k, v in body["subscriptions"].items()},
            ended_ms=int(body["ended_ms"]),
            revision=int(revision),
        )
    except (KeyError, TypeError, ValueError, AttributeError, codec.CodecError) as error:
        log.warning("session record unreadable, skipped", error=str(error))
        return None


def newest(records: list[SessionRecord]) -> SessionRecord | None:
    return max(records, key=lambda record: record.revision, default=None)


def next_revision(previous: int) -> int:
    """Later than the previous record's even if this gateway's clock is behind its writer's."""
    return max(time.time_ns(), previous + 1)


class Sessions:
    """The session records of the space, in the queue `address`, through the gateway's `Store`."""

    def __init__(self, *, store: Store, address: str, max_expiry: int = NEVER) -> None:
        self.store = store
        self.address = address
        # The longest a session outlives its connection (`--max-session-expiry`): a 3.1.1
        # session otherwise never ends; MQTT 5 clients are told the granted interval.
        self.max_expiry = max_expiry

    async def load(self, client_id: str) -> SessionRecord | None:
        deliveries = await self.store.read(
            self.address, selector=f"{CLIENT} = {quoted(client_id)}", take=False
        )
        records = [decode_record(d.payload) for d in deliveries]
        return newest([r for r in records if r is not None and r.client_id == client_id])

    async def save(self, record: SessionRecord) -> None:
        """Puts `record` (its revision set by the caller), then removes the older ones."""
        await self.store.put(self.address, encode_record(record))
        await self._remove(record.client_id, below=record.revision)

    async def forget(self, client_id: str, *, below: int) -> None:
        await self._remove(client_id, below=below)

    async def _remove(self, client_id: str, *, below: int) -> None:
        selector = f"{CLIENT} = {quoted(client_id)} AND {REVISION} < {below}"
        taken = await self.store.read(self.address, selector=selector, take=True)
        self.store.settle(taken, Outcome.ACCEPTED)


SESSION_TAKEN_OVER = 0x8E
"""MQTT 5's DISCONNECT reason for a connection whose client id connected again."""


class Holder(Protocol):
    """A connection holding a client id (the session): told when another one takes it."""

    def taken_over(self) -> None: ...


class Connected:
    """The client ids connected to this gateway: a CONNECT with an id already connected here
    ends the older connection (MQTT 3.1.4-2; MQTT 5 DISCONNECT 0x8E). Across gateway instances
    nothing tells the older one: the session's record and `end` keep the newer one's state."""

    def __init__(self) -> None:
        self._holders: dict[str, Holder] = {}

    def claim(self, client_id: str, holder: Holder) -> None:
        if not client_id:
            return
        older = self._holders.get(client_id)
        self._holders[client_id] = holder
        if older is not None and older is not holder:
            older.taken_over()

    def release(self, client_id: str, holder: Holder) -> None:
        if self._holders.get(client_id) is holder:
            del self._holders[client_id]


class SessionUnavailable(Exception):
    """The sessions queue could not be read or written: the client is told the server is
    unavailable (it asked for a session the gateway cannot promise to keep)."""


class Persistence:
    """One client connection's side of its session: what CONNECT finds, what changes write."""

    def __init__(self, *, sessions: Sessions | None, client_id: str, expiry: int) -> None:
        self.sessions = sessions
        self.client_id = client_id
        self.asked = expiry
        # Without a sessions queue no session is kept: MQTT 5 clients are told (expiry 0).
        self.expiry = min(expiry, sessions.max_expiry) if sessions is not None else 0
        self.durable = False  # this connection's subscriptions are durable ones
        self.revision = 0

    @property
    def granted_expiry(self) -> int:
        return self.expiry

    def link_of(self, topic_filter: str) -> dict[str, Any]:
        """How a subscription's receiver attaches: named and durable in a persistent session."""
        if not self.durable:
            return {}
        return {
            "name": durable_name(topic_filter),
            "source": durable_source(topic_filter, expiry=self.expiry),
        }

    async def begin(self, *, clean_start: bool, uplink: Uplink) -> dict[str, int] | None:
        """At CONNECT: the subscriptions of the session resumed (None: no session present).
        A clean start, or an expired session, removes what the client had."""
        if self.sessions is None:
            return None
        try:
            found = await self.sessions.load(self.client_id)
        except StoreUnavailable as error:
            if clean_start and not self.expiry:
                # Asks for no session: it goes on without one; an old one stays till later.
                log.warning("session store unavailable", client=self.client_id, error=str(error))
                return None
            raise SessionUnavailable(str(error)) from error
        if found is not None and clean_start and not found.ended_ms:
            found = await self._taken_over(found)
        now_ms = int(time.time() * 1000)
        resumed: dict[str, int] | None = None
        if found is not None:
            self.revision = found.revision
            if clean_start or expired(found, now_ms=now_ms):
                await self._remove_subscriptions(found.subscriptions, uplink=uplink)
                await self._forget()
            else:
                resumed = dict(found.subscriptions)
                self.durable = True
        if self.expiry:
            self.durable = True
            await self.save(resumed or {})
        return resumed

    def expire_after(self, expiry: int | None) -> None:
        """MQTT 5's DISCONNECT may set the session expiry anew (MQTT 5 3.14.2.2.2): 0 ends the
        session with this connection; a session the CONNECT gave none may not get one."""
        if expiry is None:
            return
        if not self.asked and expiry:
            raise MalformedPacket(
                "session expiry set on DISCONNECT after none on CONNECT", reason=PROTOCOL_ERROR
            )
        if self.sessions is not None:
            self.expiry = expiry

    async def save(self, subscriptions: dict[str, int], *, ended: bool = False) -> None:
        """Writes the session as it is now (a persistent one only)."""
        if self.sessions is None or not self.expiry:
            return
        record = SessionRecord(
            client_id=self.client_id,
            expiry=self.expiry,
            subscriptions=dict(subscriptions),
            ended_ms=int(time.time() * 1000) if ended else 0,
            revision=next_revision(self.revision),
        )
        try:
            await self.sessions.save(record)
        except StoreUnavailable as error:
            raise SessionUnavailable(str(error)) from error
        self.revision = record.revision  # the newest this connection wrote (`end` compares)

    async def _taken_over(self, found: SessionRecord) -> SessionRecord | None:
        """A clean start while the record says the session is connected (through another
        gateway, or one that died): waits, a bounded while, for that connection to end, so
        its links are detached before the subscriptions are closed (a broker keeps one that
        still has a consumer) and its last record does not come after this one's."""
        assert self.sessions is not None
        deadline = time.monotonic() + TAKEOVER_WAIT
        while not found.ended_ms and time.monotonic() < deadline:
            await asyncio.sleep(TAKEOVER_POLL)
            try:
                again = await self.sessions.load(self.client_id)
            except StoreUnavailable as error:
                raise SessionUnavailable(str(error)) from error
            if again is None:
                return None
            found = again
        return found

    def let_go(self, subscriptions: dict[str, Any], *, uplink: Uplink | None) -> None:
        """Before the connection closes: a durable session that ends with it (expiry 0) has
        its subscriptions' links closed, which makes the brokers drop them (a connection that
        merely closes would only detach them)."""
        if not self.durable or self.expiry or uplink is None:
            return
        for subscription in subscriptions.values():
            if subscription.link is not None:
                uplink.detach(subscription.link)

    async def end(self, subscriptions: dict[str, Any]) -> None:
        """After the connection closed: a persistent session is recorded as ended (its
        durable subscriptions stay, detached); one with expiry 0 is forgotten. Unless another
        connection of the client took the session over meanwhile (its record is newer)."""
        if not self.durable or self.sessions is None:
            return
        try:
            current = await self.sessions.load(self.client_id)
        except StoreUnavailable as error:
            raise SessionUnavailable(str(error)) from error
        if current is None or current.revision != self.revision:
            log.info("session taken over: its end not recorded", client=self.client_id)
            return
        if self.expiry:
            await self.save({topic: s.qos for topic, s in subscriptions.items()}, ended=True)
        else:
            await self._forget()

    async def _remove_subscriptions(self, filters: dict[str, int], *, uplink: Uplink) -> None:
        for topic_filter in filters:
            try:
                link = await uplink.attach_receiver(
                    topic_filter,
                    receiver=Gone(topic_filter),
                    credit=0,
                    name=durable_name(topic_filter),
                    source=durable_source(topic_filter),
                )
            except Refused as refused:  # the address is gone, and its subscriptions with it
                log.info("old subscription not removed", filter=topic_filter, why=str(refused))
                continue
            uplink.detach(link)

    async def _forget(self) -> None:
        assert self.sessions is not None
        self.revision = next_revision(self.revision)
        try:
            await self.sessions.forget(self.client_id, below=self.revision)
        except StoreUnavailable as error:
            raise SessionUnavailable(str(error)) from error
