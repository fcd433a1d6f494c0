"""Connection notices for the will service: which clients that registered a will have gone.

What flows in (from `handlers.ClientHandler`, at attach and at close, never per message): a
sender a client attaches to the space's will queue (`contracts.WILL_ADDRESS`), which marks its
connection; a receiver attached to `$lwt` (`contracts.LOST_CONNECTIONS`), which is a will
service listening; the end of a client connection. What flows out: for a marked connection
that ended, one message on a `$lwt` receiver with the application properties `container` (the
connection's container id, the key its will was stored under) and `clean` (closed without an
error: the will is dropped; otherwise lost: the will is published).

Why so: the router is the only one that sees an AMQP client's connection end, and the will
service (the MQTT gateway, `wills.py` there) keeps the wills durably in a queue; this is the
hook between the two, kept off the message path (attach and close only). A notice is sent
pre-settled on one of the listeners in turn (proton holds it until the listener gives credit);
with none attached, up to `BACKLOG` notices wait here for the first. So a notice is at most
once: lost with a router that dies before a will service took it (the will stays stored).
Only a connection with full access (anonymous, or a user whose rules allow receiving from
everything) or the MQTT gateway's store identity (`contracts.MQTT_STORE_USER`) may listen, since
the notices name other clients.
"""

from __future__ import annotations

from collections import deque

from enmasse.amqp import codec
from enmasse.amqp.engine import Condition, Connection, Link
from enmasse.resources.authorization import RECV, allows_everything
from enmasse.resources.contracts import (
    LOST_CLEAN,
    LOST_CONNECTIONS,
    LOST_CONTAINER,
    MQTT_STORE_USER,
    WILL_ADDRESS,
)
from enmasse.resources.permissions import Permissions
from enmasse.router.points import ConnectionRecord

BACKLOG = 1_000
UNAUTHORIZED = "amqp:unauthorized-access"


class LostConnections:
    """The `$lwt` listeners of one router and the client connections with a will."""

    def __init__(self) -> None:
        self.listeners: list[Link] = []
        self.with_will: set[Connection] = set()
        self.waiting: deque[bytes] = deque(maxlen=BACKLOG)
        self._turn = 0

    def attached(self, link: Link) -> bool:
        """A client attached `link`: True when it is a `$lwt` listener, taken here (nothing
        else sees it). A sender to the will queue marks its connection (False: it goes on to
        the router as any producer)."""
        if link.is_sender and link.address == LOST_CONNECTIONS:
            self._listen(link)
            return True
        if not link.is_sender and link.address == WILL_ADDRESS:
            self.with_will.add(link.connection)
        return False

    def _listen(self, link: Link) -> None:
        record = link.connection.context
        permissions = record.permissions if isinstance(record, ConnectionRecord) else None
        if permissions is None or not _full_access(permissions):
            who = permissions.who if permissions is not None else "this connection"
            link.refuse(Condition(UNAUTHORIZED, f"{who} may not receive from '{LOST_CONNECTIONS}'"))
            return
        link.context = self
        link.accept()
        self.listeners.append(link)
        while self.waiting:
            link.send_settled(self.waiting.popleft())

    def closed(self, conn: Connection, error: Condition | None) -> None:
        """A client connection ended: its listeners go, and a notice if it had a will."""
        if self.listeners:
            self.listeners = [link for link in self.listeners if link.connection is not conn]
        if conn not in self.with_will:
            return
        self.with_will.discard(conn)
        notice = codec.encode_message(
            None,
            application_properties={
                LOST_CONTAINER: conn.container_id or "",
                LOST_CLEAN: error is None,
            },
        )
        listener = self._next_listener()
        if listener is None:
            self.waiting.append(notice)
        else:
            listener.send_settled(notice)

    def _next_listener(self) -> Link | None:
        self.listeners = [link for link in self.listeners if link.is_open]
        if not self.listeners:
            return None
        self._turn = (self._turn + 1) % len(self.listeners)
        return self.listeners[self._turn]


def _full_access(permissions: Permissions) -> bool:
    # The MQTT gateway's store identity is a listener by name: its rules allow its store
    # queues alone, and a MessagingUser cannot take its username (`mqtt_stores`).
    return (
        permissions.user is None
        or permissions.user == MQTT_STORE_USER
        or allows_everything(permissions.rules, RECV)
    )
