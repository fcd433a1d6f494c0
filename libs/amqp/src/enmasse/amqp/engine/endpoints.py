"""What handlers see of the engine (connections, links, deliveries); where connections come from.

What flows in: calls from a process's handlers (open a link, accept or refuse one, flow, send,
settle, close) and from the engine's dispatch (`events`), which builds these objects from
proton's events; `listen` and `connect` settings. What flows out: proton-c calls on the endpoints'
pointers, and `ConnectionHandler` calls, which the dispatch makes on each connection's handler.

Why it is built so: these are the per-message objects. A Delivery is made for every transfer and
sets only what differs from its class defaults; a Link keeps the engine's registries it writes
to per message (`_dirty`, `_sent`) on itself; sending, settling and reading a link's credit are one
`amqp_hotpath` call each, through module globals bound once below. Everything not per message
(attach, termini, conditions, open) still calls python-qpid-proton's cffi binding.

`Switchboard` is the engine's listen/connect: a listening socket and its settings (`Listener`),
the proton transport of each accepted connection set up from them (frame size, idle timeout,
proton's SASL and TLS, or our own through `security`), and dialling a peer. The engine these
objects run on is `EngineSide` here: what they need of `events.Engine`, so that this module
does not import the engine that builds on it.

Transactions (AMQP 1.0 §4.5) are the handler's: a transfer's state is read only when asked
(`Delivery.remote_state`), a received delivery can be settled with a state proton has no name
for (`settle_with_state`: Declared, TransactionalState), and a sent one settled from our side
(`settle_sent`: a transaction committed its outcome); a peer's transactional disposition comes
to `on_transactional_outcome`, settled or not. The other way round (a router relaying a client's
coordinator to a broker): a sent transfer can carry a state (`give_state`: TransactionalState),
a sender link can target a Coordinator (`Terminus.coordinator`), and the fields of a Declared
answer stay on the sent delivery (`state_fields`).

Lifetimes: `on_connection_close` is called exactly once per connection, whoever closed it and
however (clean close, peer's error, socket lost, garbage, idle timeout). `on_link_detach` is called
exactly once per link that was opened (accepted by us, or opened by us), before the connection's
close. Deliveries settle once; settling a delivery of a link or connection that has gone is a no-op.
"""

from __future__ import annotations

import errno
import itertools
import os
import select
import socket
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import cproton
import enmasse.amqp_hotpath as amqp_hotpath
import structlog
from cproton_ffi import ffi, lib
from enmasse.amqp import codec, sasl
from enmasse.amqp.engine.loop import Timer
from enmasse.amqp.throttle import LoginThrottle
from enmasse.amqp.tls import TlsSession, server_context
from enmasse.amqp.wire import (
    OUTCOME_ACCEPTED,
    Condition,
    Outcome,
    Terminus,
    Tls,
    client_tls,
    read_data,
    read_terminus,
    server_tls_domain,
    set_condition,
    symbols_of,
    write_data,
    write_open_fields,
    write_terminus,
)

__all__ = [
    "Connection",
    "ConnectionClosed",
    "ConnectionHandler",
    "Delivery",
    "EngineSide",
    "Link",
    "LinkClosed",
    "Listener",
    "Switchboard",
    "Terminus",
    "address_of",
]

log = structlog.get_logger("enmasse.amqp")

_NULL = ffi.NULL
_LINGER_SECONDS = 2.0
NO_SIZE_LIMIT = 1 << 62  # a receiving link's size ceiling when no limit is set

# Hot-path aliases: a module global is found faster than a module attribute.
_send = amqp_hotpath.send
_settle = amqp_hotpath.settle
_credit = amqp_hotpath.credit


def address_of(pointer: Any) -> int:
    """A proton pointer as the int that amqp_hotpath takes and hands back."""
    return int(ffi.cast("uintptr_t", pointer))


class EngineSide(Protocol):
    """What connections and links need of the engine they run on (`events.Engine`): its id,
    timers and end-of-turn queue, the registries its dispatch finds links and sent deliveries in,
    the connections to flush at the end of the turn, and how a connection given up on ends."""

    container_id: str
    _dirty: set[Connection]
    _links: dict[int, Link]
    _sent: dict[int, Delivery]

    def call_soon(self, fn: Callable[[], object]) -> None: ...

    def call_later(self, seconds: float, fn: Callable[[], object]) -> Timer: ...

    def _process_events(self) -> None: ...

    def _finalize(self, conn: Connection) -> None: ...


class ConnectionHandler:
    """What a process does with one connection's events. Subclass; every method is optional.

    One handler instance per connection (a listener calls its `handler_factory` per accepted
    socket). All methods run on the engine thread and must not block.
    """

    def on_connection_open(self, conn: Connection) -> None:
        """The peer's open arrived (conn.container_id, conn.remote_hostname, conn.user are set).
        Calling conn.close(Condition(...)) here refuses the connection."""

    def on_connection_close(self, conn: Connection, error: Condition | None) -> None:
        """The connection is over: closed by either side (error None when clean) or lost
        (peer killed, garbage bytes, idle timeout: error says which). Called exactly once."""

    def on_session_begin(self, conn: Connection, *, held: int) -> Condition | None:
        """The peer began a session on `conn`, which holds `held` others the peer began. None
        (the default) answers the begin; a Condition refuses it: the session is answered and
        ended at once with that error (the connection and its other sessions stay), and links
        the peer attaches on it are never announced."""
        return None

    def on_link_attach(self, link: Link) -> None:
        """The peer attached a link: call link.accept() or link.refuse(Condition(...)), now or
        later."""

    def on_link_open(self, link: Link) -> None:
        """The peer answered a link we opened (dynamic addresses are now in link.address)."""

    def on_link_detach(self, link: Link, *, closed: bool, error: Condition | None) -> None:
        """An opened link ended (closed=False: detached without closing, e.g. a durable subscriber
        going away, or its connection ended). Unsettled deliveries we sent on it are in
        link.unsettled: their outcomes will never come."""

    def on_link_credit(self, link: Link) -> None:
        """Credit on a sending link of ours changed: send up to link.credit deliveries."""

    def on_link_drained(self, link: Link) -> None:
        """A receiving link of ours that we asked to drain (link.drain) is drained: the peer
        sent what it had and gave back the rest of the credit (link.credit is 0)."""

    def on_message(self, link: Link, delivery: Delivery) -> None:
        """A complete delivery arrived on a receiving link of ours: settle it now or later."""

    def on_outcome(self, link: Link, delivery: Delivery, outcome: Outcome) -> None:
        """The peer settled a delivery we sent (delivery.context is what send() was given).
        For REJECTED, delivery.error holds the condition; for MODIFIED, delivery.delivery_failed
        and delivery.undeliverable_here."""

    def on_transactional_outcome(
        self, link: Link, delivery: Delivery, *, txn_id: bytes | None, outcome: Outcome
    ) -> None:
        """The peer gave a delivery we sent a transactional state (AMQP 1.0 §4.5.5): `outcome`
        under transaction `txn_id`, which counts only if that transaction commits.
        delivery.settled says whether the peer also settled it (no other outcome will come).
        Without transactions: a settled one ended without an outcome we take (NONE, as
        released); an unsettled one waits for its real outcome."""
        if delivery.settled:
            self.on_outcome(link, delivery, Outcome.NONE)


class Delivery:
    """One message transfer. Received: payload (bytes, never decoded) plus lazily read fields.
    Sent: context, and once the peer settles, outcome/error/modified flags."""

    # Class-level defaults: a delivery on the hot path sets only what differs (no __slots__,
    # so the rarely used fields cost nothing until set).
    context: Any = None
    outcome: Outcome | None = None
    error: Condition | None = None
    delivery_failed = False
    undeliverable_here = False
    # A sent delivery settled with a state the engine has no outcome for (a coordinator's
    # Declared): that state's fields, e.g. [txn-id]; its outcome reads NONE.
    state_fields: Any = None
    # A received delivery the router traces (sampled): its hop's trace, read back when the
    # consumer's outcome comes (`enmasse.router.hops`); None for every other delivery.
    trace: Any = None
    _header: codec.Header | None = None
    _properties: codec.Properties | None = None

    def __init__(self, link: Link, ptr: int | None, payload: bytes, pre_settled: bool) -> None:
        self.link = link
        self._ptr = ptr
        self.payload = payload
        self.pre_settled = pre_settled
        self.settled = pre_settled

    # -- lazily read message fields (received deliveries) --

    @property
    def header(self) -> codec.Header:
        if self._header is None:
            self._header = codec.read_header(self.payload)
        return self._header

    @property
    def durable(self) -> bool:
        return self.header.durable

    @property
    def ttl(self) -> int | None:
        """Milliseconds, from the header; None when the message does not expire by ttl."""
        return self.header.ttl

    @property
    def priority(self) -> int:
        return self.header.priority

    @property
    def delivery_count(self) -> int:
        return self.header.delivery_count

    @property
    def properties(self) -> codec.Properties:
        if self._properties is None:
            self._properties = codec.read_properties(self.payload)
        return self._properties

    @property
    def to(self) -> str | None:
        return self.properties.to

    @property
    def reply_to(self) -> str | None:
        return self.properties.reply_to

    @property
    def absolute_expiry_time(self) -> int | None:
        """Milliseconds since the epoch, from the properties section."""
        return self.properties.absolute_expiry_time

    # -- settling (received deliveries) --

    def settle(
        self,
        outcome: Outcome = Outcome.ACCEPTED,
        *,
        error: Condition | None = None,
        delivery_failed: bool = False,
        undeliverable_here: bool = False,
    ) -> None:
        """Tells the sender how this delivery ended and forgets it. No-op if already settled
        (pre-settled deliveries are) or if its link has gone."""
        if self.settled:
            return
        self.settled = True
        self.outcome = outcome
        ptr = self._ptr
        self._ptr = None
        link = self.link
        if link._ptr is None or ptr is None:
            return
        if outcome != OUTCOME_ACCEPTED:
            if outcome == Outcome.REJECTED and error is not None:
                local = lib.pn_delivery_local(ffi.cast("pn_delivery_t *", ptr))
                set_condition(lib.pn_disposition_condition(local), error)
            elif outcome == Outcome.MODIFIED:
                local = lib.pn_delivery_local(ffi.cast("pn_delivery_t *", ptr))
                lib.pn_disposition_set_failed(local, delivery_failed)
                lib.pn_disposition_set_undeliverable(local, undeliverable_here)
        _settle(ptr, outcome)
        link._dirty.add(link.connection)

    # -- delivery states the engine has no name for (transactions): rare paths, through cffi --

    def remote_state(self) -> tuple[int, Any]:
        """The state the peer gave this unsettled delivery and its fields: a transactional
        transfer reads (TRANSACTIONAL_STATE, [txn-id]); (0, None) for none, or once settled."""
        ptr = self._ptr
        if ptr is None or self.link._ptr is None:
            return 0, None
        dptr = ffi.cast("pn_delivery_t *", ptr)
        state = int(lib.pn_delivery_remote_state(dptr))
        if not state:
            return 0, None
        return state, read_data(lib.pn_disposition_data(lib.pn_delivery_remote(dptr)))

    def settle_with_state(self, state: int, fields: list[Any]) -> None:
        """Settles a received delivery with a state given by its code and fields: a
        coordinator's DECLARED [txn-id], a TRANSACTIONAL_STATE [txn-id, outcome]."""
        if self.settled:
            return
        self.settled = True
        ptr = self._ptr
        self._ptr = None
        link = self.link
        if link._ptr is None or ptr is None:
            return
        local = lib.pn_delivery_local(ffi.cast("pn_delivery_t *", ptr))
        write_data(lib.pn_disposition_data(local), fields)
        _settle(ptr, state)
        link._dirty.add(link.connection)

    def give_state(self, state: int, fields: list[Any]) -> None:
        """Gives a delivery WE just sent a state its transfer carries (a transactional send:
        TRANSACTIONAL_STATE [txn-id], AMQP 1.0 §4.4.1), as Proton's `Transaction.send` does;
        call it in the same turn as the send, before the transfer leaves."""
        ptr = self._ptr
        if self.settled or ptr is None or self.link._ptr is None:
            return
        dptr = ffi.cast("pn_delivery_t *", ptr)
        write_data(lib.pn_disposition_data(lib.pn_delivery_local(dptr)), fields)
        lib.pn_delivery_update(dptr, state)
        self.link._dirty.add(self.link.connection)

    def settle_sent(self, outcome: Outcome) -> None:
        """Settles a delivery WE sent, from our side, with `outcome` (a transaction that
        took it committed): the peer's own outcome, if one comes, is not waited for."""
        ptr = self._ptr
        if self.settled or ptr is None:
            return
        link = self.link
        link._unsettled.pop(ptr, None)
        link._sent.pop(ptr, None)
        self.settled = True
        self.outcome = outcome
        self._ptr = None
        if link._ptr is None:
            return
        _settle(ptr, outcome)
        link._dirty.add(link.connection)

    def __repr__(self) -> str:
        return f"<Delivery {len(self.payload)} B on {self.link.name!r} settled={self.settled}>"


class Link:
    """A link on a connection. is_sender means WE send on it (the peer receives).

    address: what the peer asked for (the source of a link we send on, the target of a link we
    receive on), or what we asked for on links we opened. source / target: the termini.
    context: free for the handler (routing state, queue...).
    """

    __slots__ = (
        "_address",
        "_assembly",
        "_dirty",
        "_drain_asked",
        "_engine",
        "_handler",
        "_max_message_size",
        "_next_tag",
        "_opened",
        "_ptr",
        "_receiving",
        "_sent",
        "_size_ceiling",
        "_unsettled",
        "address",
        "connection",
        "context",
        "is_sender",
        "name",
        "peer_initiated",
        "source",
        "target",
    )

    def __init__(self, connection: Connection, ptr: Any, *, peer_initiated: bool) -> None:
        self.connection = connection
        self._ptr = ptr
        self._address = address_of(ptr)  # what amqp_hotpath calls take; 0 once gone
        self.name: str = ffi.string(lib.pn_link_name(ptr)).decode()
        self.is_sender: bool = bool(lib.pn_link_is_sender(ptr))
        self.peer_initiated = peer_initiated
        self.context: Any = None
        self._opened = False
        self._receiving = False  # a receiving link that takes transfers (open, not closing)
        self._drain_asked = False  # receiver: we asked the peer to drain; it has not yet
        self._unsettled: dict[int, Delivery] = {}
        self._next_tag = 1
        self._engine = connection.engine
        self._dirty = connection.engine._dirty
        self._sent = connection.engine._sent
        self._handler = connection.handler
        self._max_message_size = connection._max_message_size if not self.is_sender else 0
        # What the per-transfer check compares a transfer's size with: the limit (or none), -1
        # while a large delivery is taken in chunks or thrown away (`large.py`).
        self._size_ceiling = self._max_message_size or NO_SIZE_LIMIT
        self._assembly: Any = None  # a `large.Assembly` while one is under way
        if peer_initiated:
            self.source = read_terminus(lib.pn_link_remote_source(ptr))
            self.target = read_terminus(lib.pn_link_remote_target(ptr))
        else:
            self.source = read_terminus(lib.pn_link_source(ptr))
            self.target = read_terminus(lib.pn_link_target(ptr))
        self.address: str | None = self.source.address if self.is_sender else self.target.address

    @property
    def is_receiver(self) -> bool:
        return not self.is_sender

    @property
    def credit(self) -> int:
        return _credit(self._address) if self._address else 0

    @property
    def queued(self) -> int:
        """Deliveries sent on this link that proton still buffers (not yet written out)."""
        return lib.pn_link_queued(self._ptr) if self._ptr is not None else 0

    @property
    def unsettled(self) -> list[Delivery]:
        """Deliveries we sent that the peer has not settled yet, in send order."""
        return list(self._unsettled.values())

    @property
    def in_flight(self) -> int:
        """Deliveries of this link, either way, that are not settled yet on our side (proton's
        count: one call, for checks such as a router's leaving, never per message)."""
        return lib.pn_link_unsettled(self._ptr) if self._ptr is not None else 0

    @property
    def is_open(self) -> bool:
        return self._opened and self._ptr is not None

    @property
    def remote_max_message_size(self) -> int:
        return lib.pn_link_remote_max_message_size(self._ptr) if self._ptr is not None else 0

    @property
    def max_message_size(self) -> int:
        """The largest delivery this link takes (we receive on it): the listener's limit, or
        the tighter one `limit_message_size` set; 0: no limit."""
        return self._max_message_size

    @property
    def draining(self) -> bool:
        """The peer asked us (sender) to use up or give back its credit (AMQP drain)."""
        return self._ptr is not None and bool(lib.pn_link_get_drain(self._ptr))

    def drained(self) -> int:
        """Sender: we have nothing more to send now; gives back the remaining credit if the peer
        asked to drain. Returns the credit given back."""
        if self._ptr is None:
            return 0
        given_back: int = lib.pn_link_drained(self._ptr)
        if given_back:
            self._dirty.add(self.connection)
        return given_back

    def drain(self, credit: int) -> None:
        """Receiver: grants credit, asks the peer to send what it has and give back the rest;
        the handler's on_link_drained follows once it has. Later flow() calls ask no drain."""
        if self._ptr is not None:
            lib.pn_link_drain(self._ptr, credit)
            self._drain_asked = True
            self._dirty.add(self.connection)

    def set_dynamic_address(self, address: str) -> None:
        """Before accept(): the address we create for a peer that asked for a dynamic node."""
        if self.is_sender:
            self.source.address = address
        else:
            self.target.address = address
        self.address = address

    def limit_message_size(self, limit: int) -> None:
        """Before accept(), on a link we receive on: `limit` is advertised as the link's
        max-message-size, and a larger delivery is rejected with amqp:link:message-size-exceeded
        (the link goes on), when that is tighter than the listener's limit (0: no change). The
        check is the one every receiving link already has: nothing more per message."""
        if not self.is_sender and limit > 0:
            current = self._max_message_size
            self._max_message_size = min(current, limit) if current else limit
            self._size_ceiling = self._max_message_size

    def accept(self) -> None:
        """Answers the peer's attach: mirrors its termini (with a dynamic address if set)."""
        ptr = self._ptr
        if ptr is None or self._opened:
            return
        lib.pn_terminus_copy(lib.pn_link_source(ptr), lib.pn_link_remote_source(ptr))
        lib.pn_terminus_copy(lib.pn_link_target(ptr), lib.pn_link_remote_target(ptr))
        own = lib.pn_link_source(ptr) if self.is_sender else lib.pn_link_target(ptr)
        if self.address is not None and lib.pn_terminus_is_dynamic(own):
            lib.pn_terminus_set_address(own, self.address.encode())
        if self._max_message_size:
            lib.pn_link_set_max_message_size(ptr, self._max_message_size)
        lib.pn_link_set_snd_settle_mode(ptr, lib.pn_link_remote_snd_settle_mode(ptr))
        lib.pn_link_open(ptr)
        self._opened = True
        self._receiving = not self.is_sender
        self.connection._touch()
        if self.is_sender and lib.pn_link_credit(ptr) > 0:
            # Credit arrived with the attach, before we said yes: its event was not passed on.
            self.connection.engine.call_soon(self._credit_changed)

    def refuse(self, error: Condition) -> None:
        """Answers the peer's attach with no: attach with a null terminus, detach with error."""
        ptr = self._ptr
        if ptr is None or self._opened:
            return
        if self.is_sender:
            lib.pn_terminus_copy(lib.pn_link_target(ptr), lib.pn_link_remote_target(ptr))
            lib.pn_terminus_set_type(lib.pn_link_source(ptr), lib.PN_UNSPECIFIED)
        else:
            lib.pn_terminus_copy(lib.pn_link_source(ptr), lib.pn_link_remote_source(ptr))
            lib.pn_terminus_set_type(lib.pn_link_target(ptr), lib.PN_UNSPECIFIED)
        lib.pn_link_open(ptr)
        set_condition(lib.pn_link_condition(ptr), error)
        lib.pn_link_close(ptr)
        self.connection._touch()

    def flow(self, credit: int) -> None:
        """Gives the peer `credit` more deliveries to send us on this receiving link."""
        if self._ptr is not None and credit > 0:
            if self._drain_asked:
                self._end_drain()
            lib.pn_link_flow(self._ptr, credit)
            self.connection._touch()

    def send(
        self,
        payload: bytes,
        *,
        settled: bool = False,
        context: Any = None,
        tag: bytes | None = None,
    ) -> Delivery:
        """Sends one encoded message. settled=True sends it pre-settled (no outcome will come).

        Use only within link.credit: proton buffers sends beyond credit until the peer grants more.
        """
        address = self._address
        if not address:
            raise LinkClosed(f"link {self.name!r} is closed")
        if tag is None:
            dptr = _send(address, self._next_tag, payload, settled)
            self._next_tag += 1
        else:
            dptr = _send(address, tag, payload, settled)
        if settled:
            delivery = Delivery(self, None, payload, True)
        else:
            delivery = Delivery(self, dptr, payload, False)
            self._unsettled[dptr] = delivery
            self._sent[dptr] = delivery
        if context is not None:
            delivery.context = context
        self._dirty.add(self.connection)
        return delivery

    def send_settled(self, payload: bytes) -> None:
        """`send(payload, settled=True)` that keeps nothing: no Delivery is made, none returned.

        For forwarding pre-settled messages (at most once: no outcome will come), where the
        Delivery object would cost more than the rest of the send.
        """
        address = self._address
        if not address:
            raise LinkClosed(f"link {self.name!r} is closed")
        _send(address, self._next_tag, payload, True)
        self._next_tag += 1
        self._dirty.add(self.connection)

    def close(self, error: Condition | None = None) -> None:
        """Closes the link (detach with closed=true), with an error condition if given."""
        self._end(error, close=True)

    def detach(self, error: Condition | None = None) -> None:
        """Detaches without closing (durable subscriptions survive a detach)."""
        self._end(error, close=False)

    def _end(self, error: Condition | None, *, close: bool) -> None:
        ptr = self._ptr
        if ptr is None or lib.pn_link_state(ptr) & lib.PN_LOCAL_CLOSED:
            return
        self._receiving = False
        if error is not None:
            set_condition(lib.pn_link_condition(ptr), error)
        if close:
            lib.pn_link_close(ptr)
        else:
            lib.pn_link_detach(ptr)
        self.connection._touch()

    def _end_drain(self) -> None:
        """Later flows ask no drain (proton keeps the flag on the link until told)."""
        self._drain_asked = False
        if self._ptr is not None:
            lib.pn_link_set_drain(self._ptr, False)

    def _drain_answered(self) -> None:
        self._end_drain()
        self._handler.on_link_drained(self)

    def _credit_changed(self) -> None:
        if self._opened and self._ptr is not None and self.is_sender:
            self.connection.handler.on_link_credit(self)

    def __repr__(self) -> str:
        role = "sender" if self.is_sender else "receiver"
        return f"<Link {self.name!r} {role} address={self.address!r}>"


class LinkClosed(Exception):
    """send() on a link that has ended."""


class ConnectionClosed(Exception):
    """Opening a link on a connection that has ended."""


class Connection:
    """One AMQP connection (one socket, one proton transport), incoming or outgoing."""

    def __init__(
        self,
        engine: EngineSide,
        sock: socket.socket,
        handler: ConnectionHandler,
        *,
        incoming: bool,
        max_message_size: int = 0,
    ) -> None:
        self.engine = engine
        self.handler = handler
        self.incoming = incoming
        self.context: Any = None
        self.peer = ""
        self._sock: socket.socket | None = sock
        self._fd = sock.fileno()
        self._max_message_size = max_message_size
        self._ptr = lib.pn_connection()
        self._address = address_of(self._ptr)
        self._transport = lib.pn_transport()
        self._transport_address = address_of(self._transport)
        self._links: dict[int, Link] = {}
        self._session: Any = None  # the one we begin for the links we open
        self._peer_sessions: set[int] = set()  # those the peer began and we answered, by pointer
        self._link_names = itertools.count(1)
        self._remote_opened = False
        self._reported = False
        self._finalized = False
        self._want_write = False
        self._head_shut = False
        self._tick_timer: Timer | None = None
        self._open_timer: Timer | None = None
        self._linger_timer: Timer | None = None
        self._io_error: Condition | None = None
        # From here to _backlog: our own SASL and TLS, whose steps are security.Guard's.
        # Our own SASL exchange while it runs: a listener's (server) or our SCRAM login (client).
        self._sasl: sasl.SaslServer | sasl.SaslClient | None = None
        self._sasl_user: str | None = None
        self._throttle: LoginThrottle | None = None  # its listener's failed logins
        self._pre_output = b""  # SASL bytes that must reach the peer before proton's
        self._refused = False  # SASL (or our TLS) said no: close once _pre_output is out
        # Where the socket's bytes go before proton (our SASL, our TLS); None: straight in.
        self._intake: Callable[[bytes], None] | None = None
        # _flush leaves its straight path (SASL bytes to send, a refusal, our TLS): one test
        # per flush, so plain connections pay nothing for the others.
        self._detour = False
        self._tls: TlsSession | None = None  # our own TLS (listeners with an authenticator)
        self._tls_output = b""  # ciphertext the socket has not taken yet
        self._backlog = b""  # plaintext proton had no room for yet
        self.container_id: str | None = None
        self.remote_hostname: str | None = None

    # -- public --

    @property
    def user(self) -> str | None:
        """The authenticated user (SASL), 'anonymous' for ANONYMOUS."""
        if self._sasl_user is not None:
            return self._sasl_user
        if self._finalized:
            return None
        raw = lib.pn_transport_get_user(self._transport)
        return ffi.string(raw).decode() if raw != _NULL else None

    @property
    def closed(self) -> bool:
        return self._reported

    @property
    def encrypted(self) -> bool:
        """True once TLS is up on this connection (proton's, or ours on amqps + PLAIN)."""
        if self._finalized:
            return False
        if self._tls is not None:
            return self._tls.established
        return bool(lib.pn_transport_is_encrypted(self._transport))

    @property
    def remote_properties(self) -> dict[str, Any]:
        """The properties map of the peer's open frame (keys as str)."""
        if self._finalized:
            return {}
        found = read_data(lib.pn_connection_remote_properties(self._ptr))
        return {str(k): v for k, v in found.items()} if isinstance(found, dict) else {}

    @property
    def remote_offered_capabilities(self) -> tuple[str, ...]:
        if self._finalized:
            return ()
        return symbols_of(read_data(lib.pn_connection_remote_offered_capabilities(self._ptr)))

    @property
    def remote_desired_capabilities(self) -> tuple[str, ...]:
        if self._finalized:
            return ()
        return symbols_of(read_data(lib.pn_connection_remote_desired_capabilities(self._ptr)))

    @property
    def links(self) -> list[Link]:
        return list(self._links.values())

    def open_sender(
        self,
        address: str | None,
        *,
        name: str | None = None,
        target: Terminus | None = None,
        settled: bool = False,
    ) -> Link:
        """Attaches a link we send on to `address` (None: anonymous relay, per-message `to`)."""
        ptr = lib.pn_sender(self._ensure_session(), self._link_name(name, address))
        write_terminus(lib.pn_link_target(ptr), target or Terminus(address=address))
        lib.pn_terminus_set_address(lib.pn_link_source(ptr), self.engine.container_id.encode())
        if settled:
            lib.pn_link_set_snd_settle_mode(ptr, lib.PN_SND_SETTLED)
        return self._open_link(ptr)

    def open_receiver(
        self,
        address: str | None,
        *,
        name: str | None = None,
        source: Terminus | None = None,
        credit: int = 0,
    ) -> Link:
        """Attaches a link we receive on from `address` (source.dynamic asks for a new node)."""
        ptr = lib.pn_receiver(self._ensure_session(), self._link_name(name, address))
        write_terminus(lib.pn_link_source(ptr), source or Terminus(address=address))
        lib.pn_terminus_set_address(lib.pn_link_target(ptr), self.engine.container_id.encode())
        link = self._open_link(ptr)
        if credit:
            link.flow(credit)
        return link

    def close(self, error: Condition | None = None) -> None:
        """Closes the connection (with an error condition if given); handlers hear of it once."""
        if self._finalized or lib.pn_connection_state(self._ptr) & lib.PN_LOCAL_CLOSED:
            return
        if error is not None:
            set_condition(lib.pn_connection_condition(self._ptr), error)
        if not lib.pn_connection_state(self._ptr) & lib.PN_LOCAL_ACTIVE:
            lib.pn_connection_open(self._ptr)
        lib.pn_connection_close(self._ptr)
        self._touch()
        # A peer that never answers our close must not hold the socket forever.
        self._linger_timer = self.engine.call_later(_LINGER_SECONDS, self._abort)

    def __repr__(self) -> str:
        side = "in" if self.incoming else "out"
        return f"<Connection {side} {self.peer} container={self.container_id!r}>"

    # -- engine side --

    def _touch(self) -> None:
        self.engine._dirty.add(self)

    def _link_name(self, name: str | None, address: str | None) -> bytes:
        if name is None:
            name = f"{self.engine.container_id}-{address or 'anonymous'}-{next(self._link_names)}"
        return name.encode()

    def _ensure_session(self) -> Any:
        if self._reported or self._finalized:
            raise ConnectionClosed(f"connection to {self.peer} is closed")
        if self._session is None:
            self._session = lib.pn_session(self._ptr)
            lib.pn_session_open(self._session)
        return self._session

    def _open_link(self, ptr: Any) -> Link:
        link = Link(self, ptr, peer_initiated=False)
        self._links[link._address] = link
        self.engine._links[link._address] = link
        lib.pn_link_open(ptr)
        link._opened = True
        link._receiving = not link.is_sender
        self._touch()
        return link

    def _abort(self) -> None:
        """Gives up on the peer: ends the transport both ways, so the connection finalizes."""
        if self._finalized:
            return
        lib.pn_transport_close_tail(self._transport)
        lib.pn_transport_close_head(self._transport)
        self.engine._process_events()
        self.engine._finalize(self)

    def _open_expired(self) -> None:
        """A listener's idle timeout passed twice and the peer has not opened AMQP: drop it."""
        if not self._remote_opened and not self._finalized:
            self._io_error = Condition(
                "amqp:resource-limit-exceeded", "no AMQP open from the peer in time"
            )
            self._abort()


@dataclass
class Listener:
    """A listening socket and what the connections it accepts get."""

    sock: socket.socket
    handler_factory: Callable[[], ConnectionHandler]
    max_frame_size: int | None
    idle_timeout: float | None
    max_message_size: int
    sasl_mechanisms: str
    sasl_config_path: str | None
    sasl_config_name: str | None
    properties: dict[str, Any] | None = None
    offered_capabilities: tuple[str, ...] = ()
    tls_domain: Any = None
    tls_context: ssl.SSLContext | None = None  # our own TLS: with an authenticator (see tls.py)
    authenticator: sasl.Authenticator | None = None
    throttle: LoginThrottle | None = None  # failed logins on this listener (with authenticator)

    def close(self) -> None:
        self.sock.close()
        if self.tls_domain is not None:
            lib.pn_ssl_domain_free(self.tls_domain)  # transports keep their own reference
            self.tls_domain = None


class Switchboard:
    """The engine's listen, stop_listening and connect, and the connections its listeners accept.

    The engine hands over its listener table and epoll (the loop waits on the listening sockets),
    `attach` (a new connection joins the engine's registries and the loop), `admit` (our own
    SASL, and TLS below it, for listeners with an authenticator: `security.Guard`) and `dial`
    (our own SASL client, and TLS below it, for connections that log in with SCRAM: the Guard).
    """

    def __init__(
        self,
        engine: EngineSide,
        *,
        listeners: dict[int, Listener],
        epoll: select.epoll,
        attach: Callable[[Connection], None],
        admit: Callable[[Connection, Listener], None],
        dial: Callable[..., None],
    ) -> None:
        self._engine = engine
        self._listeners = listeners
        self._epoll = epoll
        self._attach = attach
        self._admit = admit
        self._dial = dial

    def listen(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        handler_factory: Callable[[], ConnectionHandler],
        max_frame_size: int | None = None,
        idle_timeout: float | None = None,
        max_message_size: int = 0,
        sasl_mechanisms: str = "ANONYMOUS",
        sasl_config_path: str | None = None,
        sasl_config_name: str | None = None,
        properties: dict[str, Any] | None = None,
        offered_capabilities: tuple[str, ...] = (),
        tls: Tls | None = None,
        authenticator: sasl.Authenticator | None = None,
        throttle: LoginThrottle | None = None,
    ) -> int:
        """Listens for AMQP peers; returns the bound port (port=0 picks a free one).

        idle_timeout (seconds): peers silent for that long are dropped (and a socket that never
        completes the AMQP open within twice that). max_message_size (bytes, 0 = unlimited): a
        larger incoming message is rejected with amqp:link:message-size-exceeded (its link goes
        on).
        sasl_mechanisms: space-separated, e.g. "PLAIN" with sasl_config_path/name pointing at a
        Cyrus SASL config (`<name>.conf` naming a sasldb) to check passwords. Cyrus reads the
        config path once per process, at the first incoming connection: every listener of a
        process must use the same path (the name may differ).
        properties / offered_capabilities go into our open frame (e.g. ("ANONYMOUS-RELAY",),
        which clients check before sending on a link without a target address).
        tls: serve AMQP over TLS (amqps) with this certificate; a listener is either plain or TLS.
        authenticator: check logins ourselves (no Cyrus; see `sasl`): it says which mechanisms
        each connection is offered (SCRAM, PLAIN, ANONYMOUS) and knows the users; sasl_* are then
        unused. With tls too, the engine does the TLS itself (see `tls`): passwords travel
        encrypted. throttle: the listener's count of failed logins (`throttle`; default: a
        `LoginThrottle()` of its own), which backs off and then turns away failing peers and users.
        """
        tls_domain = tls_context = None
        if tls is not None and authenticator is not None:
            tls_context = server_context(tls)
        elif tls is not None:
            tls_domain = server_tls_domain(tls)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(1024)
        sock.setblocking(False)
        self._listeners[sock.fileno()] = Listener(
            sock=sock,
            handler_factory=handler_factory,
            max_frame_size=max_frame_size,
            idle_timeout=idle_timeout,
            max_message_size=max_message_size,
            sasl_mechanisms=sasl_mechanisms,
            sasl_config_path=sasl_config_path,
            sasl_config_name=sasl_config_name,
            properties=properties,
            offered_capabilities=offered_capabilities,
            tls_domain=tls_domain,
            tls_context=tls_context,
            authenticator=authenticator,
            throttle=(throttle or LoginThrottle()) if authenticator is not None else None,
        )
        self._epoll.register(sock.fileno(), select.EPOLLIN)
        bound: int = sock.getsockname()[1]
        return bound

    def stop_listening(self, port: int) -> None:
        """Closes the listener on `port`; established connections stay."""
        for fd, listener in list(self._listeners.items()):
            if listener.sock.getsockname()[1] == port:
                self._epoll.unregister(fd)
                listener.close()
                del self._listeners[fd]

    def close(self) -> None:
        """Closes every listener (the engine is shutting down)."""
        for listener in self._listeners.values():
            listener.close()
        self._listeners.clear()

    def connect(
        self,
        *,
        host: str,
        port: int,
        handler: ConnectionHandler,
        container_id: str | None = None,
        user: str | None = None,
        password: str | None = None,
        hostname: str | None = None,
        idle_timeout: float | None = None,
        max_frame_size: int | None = None,
        properties: dict[str, Any] | None = None,
        offered_capabilities: tuple[str, ...] = (),
        desired_capabilities: tuple[str, ...] = (),
        tls: Tls | None = None,
        mechanisms: tuple[str, ...] | None = None,
    ) -> Connection:
        """Dials a peer and opens an AMQP connection (SASL ANONYMOUS, or PLAIN with user/password).

        mechanisms: log in with our own SASL client instead of proton's, taking the first of
        these the peer offers (e.g. `sasl.CLIENT_MECHANISMS`: SCRAM-SHA-512, SCRAM-SHA-256,
        PLAIN); with tls too, the engine does the TLS itself.
        Returns at once; handler.on_connection_open follows, or on_connection_close with the
        error if the peer cannot be reached or refuses.
        """
        if self._epoll.closed:
            raise ConnectionClosed("the engine has shut down")
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        err = sock.connect_ex((host, port))
        conn = Connection(self._engine, sock, handler, incoming=False)
        conn.peer = f"{host}:{port}"
        t, c = conn._transport, conn._ptr
        if max_frame_size:
            lib.pn_transport_set_max_frame(t, max_frame_size)
        if idle_timeout:
            lib.pn_transport_set_idle_timeout(t, int(idle_timeout * 1000))
        if mechanisms is not None:
            # Our own SASL client (and TLS under it): proton's transport sees plain AMQP.
            login = sasl.SaslClient(mechanisms=mechanisms, user=user or "", password=password or "")
            self._dial(conn, login, tls=tls, hostname=hostname or host)
        elif tls is not None:
            client_tls(t, tls, hostname or host)
        if mechanisms is None:
            pn_sasl = lib.pn_sasl(t)
            if user is not None:
                lib.pn_connection_set_user(c, user.encode())
                lib.pn_connection_set_password(c, (password or "").encode())
                lib.pn_sasl_allowed_mechs(pn_sasl, b"PLAIN")
                lib.pn_sasl_set_allow_insecure_mechs(pn_sasl, True)
            else:
                lib.pn_sasl_allowed_mechs(pn_sasl, b"ANONYMOUS")
        lib.pn_connection_set_container(c, (container_id or self._engine.container_id).encode())
        lib.pn_connection_set_hostname(c, (hostname or host).encode())
        write_open_fields(
            c, properties=properties, offered=offered_capabilities, desired=desired_capabilities
        )
        self._attach(conn)
        lib.pn_connection_open(c)
        if err not in (0, errno.EINPROGRESS):
            conn._io_error = Condition("proton:io", f"connect to {host}:{port}: {os.strerror(err)}")
            self._engine.call_soon(conn._abort)
        else:
            self._epoll.modify(conn._fd, select.EPOLLIN | select.EPOLLOUT)
            conn._want_write = True
        return conn

    def accept(self, listener: Listener) -> None:
        """Takes the peers waiting on a listening socket (at most 64 a turn)."""
        for _ in range(64):
            try:
                sock, addr = listener.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as err:
                log.warning("accept failed", error=str(err))
                return
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            try:
                handler = listener.handler_factory()
            except Exception:
                log.exception("handler factory failed; dropping connection")
                sock.close()
                continue
            self._serve(sock, addr, handler, listener)

    def _serve(
        self, sock: socket.socket, addr: Any, handler: ConnectionHandler, listener: Listener
    ) -> None:
        conn = Connection(
            self._engine, sock, handler, incoming=True, max_message_size=listener.max_message_size
        )
        conn.peer = f"{addr[0]}:{addr[1]}"
        t = conn._transport
        lib.pn_transport_set_server(t)
        if listener.max_frame_size:
            lib.pn_transport_set_max_frame(t, listener.max_frame_size)
        if listener.idle_timeout:
            lib.pn_transport_set_idle_timeout(t, int(listener.idle_timeout * 1000))
            conn._open_timer = self._engine.call_later(
                2 * listener.idle_timeout, conn._open_expired
            )
        if listener.tls_domain is not None:
            cproton.pn_ssl_init(lib.pn_ssl(t), listener.tls_domain, None)
        if listener.authenticator is not None:
            self._admit(conn, listener)  # our own SASL (and TLS) before proton: security.Guard
        else:
            pn_sasl = lib.pn_sasl(t)
            if listener.sasl_config_path:
                lib.pn_sasl_config_path(pn_sasl, listener.sasl_config_path.encode())
            if listener.sasl_config_name:
                lib.pn_sasl_config_name(pn_sasl, listener.sasl_config_name.encode())
            lib.pn_sasl_allowed_mechs(pn_sasl, listener.sasl_mechanisms.encode())
            lib.pn_sasl_set_allow_insecure_mechs(pn_sasl, True)
        lib.pn_connection_set_container(conn._ptr, self._engine.container_id.encode())
        write_open_fields(
            conn._ptr,
            properties=listener.properties,
            offered=listener.offered_capabilities,
            desired=(),
        )
        self._attach(conn)
