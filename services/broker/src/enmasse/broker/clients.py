"""A brokered space's broker as the space's client endpoint: who may log in, and what each may do.

What flows in: the `ClientAccess` the storage-controller pushes over BrokerAdmin
(`SetClientAccess`: the space's MessagingUsers with their scrypt hashes, SCRAM keys and rules,
the plan's login policy and its limits on one client endpoint), and, on the engine thread, each
client connection as it opens and each link as it attaches. What flows out: the access in force,
which the client listener's authenticator (`ClientEndpoint.logins`) reads at every login; for a
connection its `Permissions`, or the refusal that closes it (amqp:resource-limit-exceeded: too
many connections, or too many of one user's); for a session the peer begins, the refusal that
ends it (too many sessions on the connection, the router's words) or None; for an attach the
refusal of the link (too many links on the connection; amqp:unauthorized-access when the
user's rules do not allow it, the connection staying up) or None; and, when a push changes
users' rules, the live links that lost their right, which the connection handlers close with
the same amqp:unauthorized-access.

A dynamic reply address (a temporary queue, `_dynamic/...`) is decided as a router decides its
own: anyone may send to one (request/response needs that: the reply goes where `reply-to`
says); only the connection that made it (`claim`) may receive from it, whatever the user's
rules, with the router's words ("...: a reply address belongs to the connection that made it").

Why it is built so:
- the decisions are the routers', from the libraries: `enmasse.resources.permissions` (rules,
  browsing needs `view` or `recv`, the refusal's words: "user 'sender' may not recv from 'pq'"),
  `enmasse.resources.client_access` (pushed users validated as a whole, as a router validates its
  RouterConfig's) and `enmasse.amqp.logins` (SCRAM-SHA-512/256, PLAIN over TLS, ANONYMOUS and
  PLAIN without TLS only where the plan allows them; the engine throttles failed logins per peer
  and per user); only the counting of this broker's own connections and links is here;
- the access lives in memory only: a broker starts with `NO_ACCESS` (no users, no anonymous), so
  every login fails until the storage-controller pushes; it asks each broker which version it
  holds (`ListAddresses.client_access_version`) and pushes again to one that restarted. A client
  endpoint never falls back to letting clients in unchecked;
- everything is decided once per connection and once per link, and a smaller message size limit
  is set on the link at attach, where the engine checks every receiving link's size anyway; the
  broker's per-message path is untouched but on an anonymous-relay link (no target address, each
  message's `to` naming its address, `relay.py`), where each new `to` is decided once
  (`send_refusal`) and kept on the link until the next push (`generation`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

import structlog
from enmasse.amqp.engine import Condition, Connection, Link
from enmasse.amqp.logins import UserLogins
from enmasse.common.passwords import ScramKeys
from enmasse.resources.authorization import RECV, SEND, Rule
from enmasse.resources.client_access import UserError, client_users_from_proto
from enmasse.resources.contracts import dynamic_owner
from enmasse.resources.permissions import Permissions, browses, logged_in_as
from enmasse.v1 import broker_pb2

log = structlog.get_logger(__name__)

UNAUTHORIZED: Final = "amqp:unauthorized-access"
LIMIT_EXCEEDED: Final = "amqp:resource-limit-exceeded"
CLOSING: Final = Condition("amqp:connection:forced", "the connection is being closed")


class AccessError(ValueError):
    """A pushed ClientAccess that does not hold together; the message says what is wrong."""


@dataclass(frozen=True)
class ClientLimits:
    """The space plan's limits on one client endpoint; 0: no limit."""

    max_connections: int = 0
    max_connections_per_user: int = 0
    max_links_per_connection: int = 0
    max_sessions_per_connection: int = 0
    max_message_size: int = 0


@dataclass(frozen=True)
class ClientAccess:
    """Who may log in to this broker and what each user may do (a `logins.LoginSource`)."""

    version: str = ""
    space: str = ""
    users: dict[str, str] = field(default_factory=dict)  # username -> stored scrypt hash
    rules: dict[str, tuple[Rule, ...]] = field(default_factory=dict)  # username -> its rules
    scram: dict[str, dict[str, ScramKeys]] = field(default_factory=dict)  # -> mechanism -> keys
    allow_anonymous: bool = False
    allow_plain_without_tls: bool = False
    limits: ClientLimits = ClientLimits()


NO_ACCESS = ClientAccess()
"""What a broker holds until its first push: nobody logs in."""


def access_from_proto(message: broker_pb2.ClientAccess) -> ClientAccess:
    """Validates a pushed ClientAccess as a whole; raises AccessError naming what is wrong."""
    if not message.version:
        raise AccessError("a client access needs a version")
    limits = message.limits
    for name in (
        "max_connections",
        "max_connections_per_user",
        "max_links_per_connection",
        "max_sessions_per_connection",
        "max_message_size",
    ):
        if getattr(limits, name) < 0:
            raise AccessError(f"limit {name} must be >= 0, got {getattr(limits, name)}")
    try:
        users = client_users_from_proto(message.users)
    except UserError as error:
        raise AccessError(str(error)) from None
    return ClientAccess(
        version=message.version,
        space=message.space,
        users=users.hashes,
        rules=users.rules,
        scram=users.scram,
        allow_anonymous=message.allow_anonymous,
        allow_plain_without_tls=message.allow_plain_without_tls,
        limits=ClientLimits(
            max_connections=limits.max_connections,
            max_connections_per_user=limits.max_connections_per_user,
            max_links_per_connection=limits.max_links_per_connection,
            max_sessions_per_connection=limits.max_sessions_per_connection,
            max_message_size=limits.max_message_size,
        ),
    )


Revoke = Callable[[Link, Condition], None]
"""Ends what a live link is to the broker and closes it with the condition (the handler's)."""
IsQueue = Callable[[str], bool]
"""Whether an address is a queue here (a queue or a subscription's): what a `copy` consumer
browses; a topic's `copy` subscriber gets every message, as any subscriber."""


class ClientEndpoint:
    """The access in force and the client connections it let in (engine thread only, but for
    `access`, which the login threads read whole: it is replaced, never changed)."""

    def __init__(self, *, revoke: Revoke, is_queue: IsQueue) -> None:
        self.access = NO_ACCESS
        self._revoke = revoke
        self._is_queue = is_queue
        self._connections: dict[Connection, Permissions] = {}
        self._reply_owners: dict[str, Connection] = {}  # dynamic address -> who made it
        self.generation = 0  # one more at every push: what relay links decided is stale then

    def logins(self) -> UserLogins:
        """The client listener's authenticator, over whatever access is in force at a login."""
        return UserLogins(lambda: self.access)

    # ------------------------------------------------------------------ connections

    def admit(self, conn: Connection) -> Permissions | Condition:
        """A logged-in connection opened: what it may do, or why it is turned away."""
        user = logged_in_as(conn.user, configured=self.access.users)
        refusal = self._over_connection_limits(user)
        if refusal is not None:
            return Condition(LIMIT_EXCEEDED, refusal)
        permissions = self._permissions(user)
        self._connections[conn] = permissions
        return permissions

    def forget(self, conn: Connection) -> None:
        self._connections.pop(conn, None)

    def claim(self, address: str, conn: Connection) -> None:
        """`conn` made the dynamic address: it alone may receive from it."""
        self._reply_owners[address] = conn

    def release(self, address: str) -> None:
        """The dynamic address is gone."""
        self._reply_owners.pop(address, None)

    def _over_connection_limits(self, user: str | None) -> str | None:
        limits = self.access.limits
        if limits.max_connections and len(self._connections) >= limits.max_connections:
            return f"too many connections: this broker allows {limits.max_connections}"
        per_user = limits.max_connections_per_user
        if user and per_user:
            held = sum(1 for p in self._connections.values() if p.user == user)
            if held >= per_user:
                return f"too many connections for user '{user}': this broker allows {per_user}"
        return None

    def _permissions(self, user: str | None) -> Permissions:
        return Permissions(user=user, rules=self.access.rules.get(user, ()) if user else ())

    def session_refusal(self, *, held: int) -> Condition | None:
        """Why a client may not begin one more session on a connection holding `held` it
        began, or None (the router's condition and words)."""
        limit = self.access.limits.max_sessions_per_connection
        if limit and held >= limit:
            return Condition(
                LIMIT_EXCEEDED,
                f"too many sessions: this connection holds {held}, the space's limit is {limit}",
            )
        return None

    # ------------------------------------------------------------------ links

    def attach_refusal(self, link: Link, address: str) -> Condition | None:
        """Why the peer may not attach `link` to `address`, or None (and the link then takes
        messages up to the plan's size only)."""
        permissions = self._connections.get(link.connection)
        if permissions is None:
            return CLOSING  # pipelined behind an open that was turned away
        over = self._over_link_limit(link)
        if over is not None:
            return over
        refusal = self._refusal(link, address, permissions)
        if refusal is not None:
            return Condition(UNAUTHORIZED, refusal)
        link.limit_message_size(self.access.limits.max_message_size)
        return None

    def relay_refusal(self, link: Link) -> Condition | None:
        """Why the peer may not attach `link` as an anonymous relay (no target address), or
        None: its messages are then checked per `to` (`send_refusal`)."""
        if link.connection not in self._connections:
            return CLOSING
        over = self._over_link_limit(link)
        if over is not None:
            return over
        link.limit_message_size(self.access.limits.max_message_size)
        return None

    def send_refusal(self, conn: Connection, to: str) -> str | None:
        """Why `conn`'s user may not send a message to `to` on a relay link, or None. A reply
        address: anyone may send to it."""
        permissions = self._connections.get(conn)
        if permissions is None:
            return CLOSING.description
        if dynamic_owner(to) is not None or permissions.may(SEND, to):
            return None
        return permissions.refusal(SEND, to)

    def _over_link_limit(self, link: Link) -> Condition | None:
        limit = self.access.limits.max_links_per_connection
        if limit and sum(1 for other in link.connection.links if other.is_open) >= limit:
            return Condition(
                LIMIT_EXCEEDED, f"too many links on this connection: this broker allows {limit}"
            )
        return None

    def _refusal(self, link: Link, address: str, permissions: Permissions) -> str | None:
        """Why the user may not do what `link` does at `address`: a link the broker receives on
        sends to it; one the broker sends on receives from it, or browses it. A reply address:
        anyone may send to it, only the connection that made it may receive from it."""
        reply = dynamic_owner(address) is not None
        if not link.is_sender:
            if reply or permissions.may(SEND, address):
                return None
            return permissions.refusal(SEND, address)
        if reply:
            if self._reply_owners.get(address) is link.connection:
                return None
            return (
                f"{permissions.refusal(RECV, address)}: a reply address belongs to the "
                "connection that made it"
            )
        return permissions.receive_refusal(
            address,
            browse=browses(link.source.distribution_mode),
            is_queue=lambda: self._is_queue(address),
        )

    # ------------------------------------------------------------------ a new push

    def apply(self, access: ClientAccess) -> int:
        """Puts `access` in force (the next login and attach read it) and closes the live links
        of users whose rules it changed that lost their right; returns how many it closed."""
        previous, self.access = self.access, access
        self.generation += 1
        old, new = previous.rules, access.rules
        changed = {user for user in old.keys() | new.keys() if old.get(user) != new.get(user)}
        lost: list[tuple[Link, Condition]] = []
        for conn, permissions in list(self._connections.items()):
            user = permissions.user
            if user is None or user not in changed:
                continue
            permissions = self._permissions(user)
            self._connections[conn] = permissions
            lost += self._lost_links(conn, permissions)
        for link, error in lost:
            self._revoke(link, error)
        log.info(
            "client access applied",
            space=access.space,
            version=access.version,
            users=len(access.users),
            links_closed=len(lost),
        )
        return len(lost)

    def _lost_links(
        self, conn: Connection, permissions: Permissions
    ) -> list[tuple[Link, Condition]]:
        """The live links of `conn` that `permissions` no longer allow, each with its refusal."""
        lost = []
        for link in conn.links:
            if link.is_open and link.address is not None:
                refusal = self._refusal(link, link.address, permissions)
                if refusal is not None:
                    lost.append((link, Condition(UNAUTHORIZED, refusal)))
        return lost
