"""The AMQP 1.0 engine every EnMasse-py message-plane process runs on: one epoll loop, one thread.

What flows in: bytes from sockets (listeners accept peers; `connect` dials out), calls from the
process's own code (send, flow, settle, close, timers) and callables handed over from other threads
(`call_soon_threadsafe`: the asyncio/gRPC admin thread). What flows out: calls on a
`ConnectionHandler` per connection (peer opened, link attached, message arrived, outcome
came back, credit changed, link detached, connection closed) and bytes to the sockets.

Why it is built so: a router or broker written on proton's reactor (Container + MessagingHandler)
spends most of its time creating Python wrapper objects and dispatching events, and tops out near
5,000 messages/s per process here. This engine drives proton-c's protocol engine directly on raw
pointers and never decodes a body (header and `to` are read lazily by `codec` only when asked).
Its per-message calls into proton go through `enmasse.amqp_hotpath`, a small C extension: the
cffi binding python-qpid-proton ships costs about 230 ns a call (it hands the GIL back and forth
and wraps every result), and a forwarded message needed 20-25 of them. Through amqp_hotpath one
call reads proton's event collector up to the next event a handler wants (a complete transfer
comes back received, advanced, and settled if it came pre-settled), one call sends, one settles,
and socket bytes go straight between the socket and proton's buffers. Pointers cross as ints;
everything that is not per message (attach, termini, conditions, SASL, TLS) still calls the cffi
binding. Figures (client to client, through a bare forwarder) are in bench/RESULTS.md.

Threading contract: everything here runs on the engine's thread. Build listeners and connections
before `run()` or from engine callbacks/timers; from any other thread, use
`call_soon_threadsafe(fn)` / `submit(fn) -> Future` (they wake the loop) or `stop()`.

Lifetimes: `on_connection_close` is called exactly once per connection, whoever closed it and
however (clean close, peer's error, socket lost, garbage, idle timeout). `on_link_detach` is called
exactly once per link that was opened (accepted by us, or opened by us), before the connection's
close. Deliveries settle once; settling a delivery of a link or connection that has gone is a no-op.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import ctypes
import errno
import functools
import gc
import heapq
import itertools
import os
import select
import socket
import ssl
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import cproton
import cproton_ffi
import enmasse.amqp_hotpath as amqp_hotpath
import structlog
from cproton_ffi import ffi, lib
from enmasse.amqp import codec, sasl
from enmasse.amqp.tls import TlsFailure, TlsSession, server_context
from enmasse.amqp.wire import (
    OUTCOME_ACCEPTED,
    OUTCOMES,
    Condition,
    Outcome,
    Terminus,
    Tls,
    client_tls,
    get_condition,
    read_data,
    read_terminus,
    server_tls_domain,
    set_condition,
    string_of,
    symbols_of,
    write_open_fields,
    write_terminus,
)

__all__ = [  # Outcome, Condition, Terminus and Tls live in `wire`; importable from here too
    "Condition",
    "Connection",
    "ConnectionClosed",
    "ConnectionHandler",
    "Delivery",
    "Engine",
    "Link",
    "LinkClosed",
    "Outcome",
    "Terminus",
    "Timer",
    "Tls",
    "settle_gc_for_message_loop",
]

T = TypeVar("T")

log = structlog.get_logger("enmasse.amqp")

_NULL = ffi.NULL
_RECV_CHUNK = 256 * 1024
_SEND_CHUNK = 256 * 1024
_READS_PER_WAKEUP = 8
_LINGER_SECONDS = 2.0


def settle_gc_for_message_loop() -> None:
    """Call once, after start-up, in a process whose main work is the engine loop (router, broker,
    bench clients).

    Every message makes a few short-lived objects (deliveries, payload bytes, tuples) that
    reference counting frees at once; with CPython's default threshold (a young-generation
    collection every 700 allocations) the cyclic collector still walks whatever a batch of
    deliveries holds at that moment: about 2,000 of the bench forwarder's 77,000 instructions
    per acked message (callgrind, 20,000 messages). Freezing what start-up made (modules,
    configuration) and collecting the young generation every 50,000 allocations keeps that to a
    few hundred, while cyclic garbage (a closed connection and its links) is still collected.
    """
    gc.freeze()
    gc.set_threshold(50_000, 20, 10)


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
        self._address = _address_of(ptr)  # what amqp_hotpath calls take; 0 once gone
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
    def is_open(self) -> bool:
        return self._opened and self._ptr is not None

    @property
    def remote_max_message_size(self) -> int:
        return lib.pn_link_remote_max_message_size(self._ptr) if self._ptr is not None else 0

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
        engine: Engine,
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
        self._address = _address_of(self._ptr)
        self._transport = lib.pn_transport()
        self._transport_address = _address_of(self._transport)
        self._links: dict[int, Link] = {}
        self._session: Any = None
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
        self._sasl: sasl.SaslServer | None = None  # our own SASL exchange, while it runs
        self._sasl_user: str | None = None
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


class Timer:
    """A callback scheduled on the engine thread; cancel() before it fires to drop it."""

    __slots__ = ("cancelled", "deadline", "fn")

    def __init__(self, deadline: float, fn: Callable[[], object]) -> None:
        self.deadline = deadline
        self.fn = fn
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


@dataclass
class _Listener:
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
    allow_anonymous: bool = False


class Engine:
    """One epoll loop over many AMQP connections. See the module docstring for the contract."""

    def __init__(self, *, container_id: str | None = None) -> None:
        self.container_id = container_id or f"enmasse-{uuid.uuid4().hex[:12]}"
        self._epoll = select.epoll()
        self._collector = lib.pn_collector()
        self._collector_address = _address_of(self._collector)
        self._listeners: dict[int, _Listener] = {}
        self._conns: dict[int, Connection] = {}  # by socket fd
        # By proton pointer, as the int address amqp_hotpath hands back.
        self._conn_by_ptr: dict[int, Connection] = {}
        self._links: dict[int, Link] = {}
        # Every delivery we sent and the peer has not settled, by pointer: an outcome's event
        # finds its delivery without asking proton for the delivery's link.
        self._sent: dict[int, Delivery] = {}
        self._dirty: set[Connection] = set()
        self._timers: list[tuple[float, int, Timer]] = []
        self._timer_seq = itertools.count()
        self._ready: deque[Callable[[], object]] = deque()
        self._threadsafe: deque[Callable[[], object]] = deque()
        self._wake_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._epoll.register(self._wake_fd, select.EPOLLIN)
        self._running = False
        self._stopping = False
        self._thread: threading.Thread | None = None
        # Where logins are checked (sasl.py): made at the first PLAIN login of a listener with an
        # authenticator, so that hashing a password holds up no other connection.
        self._login_checks: concurrent.futures.ThreadPoolExecutor | None = None
        # Plain connections read and write straight between socket and proton (amqp_hotpath);
        # these serve the ones whose bytes pass through our own SASL or TLS first.
        self._inbuf = ffi.new("char[]", _RECV_CHUNK)
        self._inview = ffi.buffer(self._inbuf)
        self._outbuf = ffi.new("char[]", _SEND_CHUNK)
        self._outview = ffi.buffer(self._outbuf)

    # -- public API --

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
        allow_anonymous: bool = False,
    ) -> int:
        """Listens for AMQP peers; returns the bound port (port=0 picks a free one).

        idle_timeout (seconds): peers silent for that long are dropped (and a socket that never
        completes the AMQP open within twice that). max_message_size (bytes, 0 = unlimited): a
        larger incoming message detaches its link with amqp:link:message-size-exceeded.
        sasl_mechanisms: space-separated, e.g. "PLAIN" with sasl_config_path/name pointing at a
        Cyrus SASL config (`<name>.conf` naming a sasldb) to check passwords. Cyrus reads the
        config path once per process, at the first incoming connection: every listener of a
        process must use the same path (the name may differ).
        properties / offered_capabilities go into our open frame (e.g. ("ANONYMOUS-RELAY",),
        which clients check before sending on a link without a target address).
        tls: serve AMQP over TLS (amqps) with this certificate; a listener is either plain or TLS.
        authenticator(user, password) -> bool: check SASL PLAIN passwords ourselves (no Cyrus;
        see `sasl`), offering ANONYMOUS too only if allow_anonymous; sasl_* are then unused.
        With tls too, the engine does the TLS itself (see `tls`): passwords travel encrypted.
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
        self._listeners[sock.fileno()] = _Listener(
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
            allow_anonymous=allow_anonymous,
        )
        self._epoll.register(sock.fileno(), select.EPOLLIN)
        bound: int = sock.getsockname()[1]
        return bound

    def stop_listening(self, port: int) -> None:
        """Closes the listener on `port`; established connections stay."""
        for fd, listener in list(self._listeners.items()):
            if listener.sock.getsockname()[1] == port:
                self._epoll.unregister(fd)
                self._close_listener(listener)
                del self._listeners[fd]

    def _close_listener(self, listener: _Listener) -> None:
        listener.sock.close()
        if listener.tls_domain is not None:
            lib.pn_ssl_domain_free(listener.tls_domain)  # transports keep their own reference
            listener.tls_domain = None

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
    ) -> Connection:
        """Dials a peer and opens an AMQP connection (SASL ANONYMOUS, or PLAIN with user/password).

        Returns at once; handler.on_connection_open follows, or on_connection_close with the
        error if the peer cannot be reached or refuses.
        """
        if not self._collector_address:
            raise ConnectionClosed("the engine has shut down")
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        err = sock.connect_ex((host, port))
        conn = Connection(self, sock, handler, incoming=False)
        conn.peer = f"{host}:{port}"
        t, c = conn._transport, conn._ptr
        if max_frame_size:
            lib.pn_transport_set_max_frame(t, max_frame_size)
        if idle_timeout:
            lib.pn_transport_set_idle_timeout(t, int(idle_timeout * 1000))
        if tls is not None:
            client_tls(t, tls, hostname or host)
        sasl = lib.pn_sasl(t)
        if user is not None:
            lib.pn_connection_set_user(c, user.encode())
            lib.pn_connection_set_password(c, (password or "").encode())
            lib.pn_sasl_allowed_mechs(sasl, b"PLAIN")
            lib.pn_sasl_set_allow_insecure_mechs(sasl, True)
        else:
            lib.pn_sasl_allowed_mechs(sasl, b"ANONYMOUS")
        lib.pn_connection_set_container(c, (container_id or self.container_id).encode())
        lib.pn_connection_set_hostname(c, (hostname or host).encode())
        write_open_fields(
            c, properties=properties, offered=offered_capabilities, desired=desired_capabilities
        )
        self._attach(conn)
        lib.pn_connection_open(c)
        if err not in (0, errno.EINPROGRESS):
            conn._io_error = Condition("proton:io", f"connect to {host}:{port}: {os.strerror(err)}")
            self.call_soon(conn._abort)
        else:
            self._epoll.modify(conn._fd, select.EPOLLIN | select.EPOLLOUT)
            conn._want_write = True
        return conn

    def call_later(self, seconds: float, fn: Callable[[], object]) -> Timer:
        """Runs fn on the engine thread after `seconds` (engine thread only)."""
        timer = Timer(time.monotonic() + seconds, fn)
        heapq.heappush(self._timers, (timer.deadline, next(self._timer_seq), timer))
        return timer

    def call_soon(self, fn: Callable[[], object]) -> None:
        """Runs fn on the engine thread at the end of this loop turn (engine thread only)."""
        self._ready.append(fn)

    def call_soon_threadsafe(self, fn: Callable[[], object]) -> None:
        """Runs fn on the engine thread, from any thread; wakes the loop."""
        self._threadsafe.append(fn)
        with contextlib.suppress(OSError):  # engine closed: nothing will run it
            os.eventfd_write(self._wake_fd, 1)

    def submit(self, fn: Callable[[], Any]) -> concurrent.futures.Future[Any]:
        """Runs fn on the engine thread, from any thread; the future gets its result or error.

        From asyncio (the admin/gRPC thread): `await asyncio.wrap_future(engine.submit(fn))`.
        """
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()

        def run() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                future.set_result(fn())
            except BaseException as err:
                future.set_exception(err)

        self.call_soon_threadsafe(run)
        return future

    async def call(self, fn: Callable[[], T]) -> T:
        """Runs fn on the engine thread and returns (or raises) what it did: the one way an asyncio
        caller (an admin servicer on its gRPC thread) reaches state the engine thread owns."""
        result: T = await asyncio.wrap_future(self.submit(fn))
        return result

    def run(self) -> None:
        """Runs the loop on this thread until stop()."""
        self._thread = threading.current_thread()
        self._running = True
        poll = self._epoll.poll
        try:
            while not self._stopping:
                for fd, events in poll(self._poll_timeout()):
                    conn = self._conns.get(fd)
                    if conn is not None:
                        try:
                            self._on_io(conn, events)
                        except Exception:
                            self._broken(conn)
                    elif fd == self._wake_fd:
                        self._drain_wakeups()
                    elif fd in self._listeners:
                        self._accept(self._listeners[fd])
                self._run_timers()
                self._run_ready()
                self._process_events()
                self._flush_dirty()
        finally:
            self._running = False
            self._shutdown()

    def run_in_thread(self, *, name: str = "amqp-engine") -> threading.Thread:
        """Starts run() on a daemon thread and returns it."""
        thread = threading.Thread(target=self.run, name=name, daemon=True)
        self._thread = thread
        thread.start()
        return thread

    def stop(self) -> None:
        """Ends run() (from any thread); sockets are closed without AMQP close frames."""
        self._stopping = True
        with contextlib.suppress(OSError):
            os.eventfd_write(self._wake_fd, 1)

    def shutdown(self, *, error: Condition | None = None, timeout: float = 2.0) -> None:
        """Closes every connection politely (close frames, with `error` if given), waits up to
        `timeout` for the peers' answers, then stops the loop. From any thread but the engine's;
        returns once the loop is told to stop (join the thread to wait for it)."""
        gone = threading.Event()

        def wait_gone() -> None:
            if self._conns:
                self.call_later(0.01, wait_gone)
            else:
                gone.set()

        def close_all() -> None:
            for listener in list(self._listeners.values()):
                self.stop_listening(listener.sock.getsockname()[1])
            for conn in list(self._conns.values()):
                conn.close(error)
            wait_gone()

        if self._running and not self._stopping:
            self.call_soon_threadsafe(close_all)
            gone.wait(timeout)
        self.stop()

    @property
    def connections(self) -> list[Connection]:
        return list(self._conns.values())

    # -- loop internals --

    def _poll_timeout(self) -> float:
        if self._ready or self._threadsafe or self._dirty:
            return 0
        timers = self._timers
        while timers and timers[0][2].cancelled:
            heapq.heappop(timers)
        if not timers:
            return 1.0
        return max(0.0, min(1.0, timers[0][0] - time.monotonic()))

    def _drain_wakeups(self) -> None:
        with contextlib.suppress(BlockingIOError):
            os.eventfd_read(self._wake_fd)

    def _run_timers(self) -> None:
        timers = self._timers
        if not timers:
            return
        now = time.monotonic()
        due = []
        while timers and timers[0][0] <= now:
            due.append(heapq.heappop(timers)[2])
        # Timers set by these callbacks wait for the next turn, however short their delay.
        for timer in due:
            if not timer.cancelled:
                self._guarded(timer.fn)

    def _run_ready(self) -> None:
        # Only what is queued now: a thread that keeps submitting must not starve the sockets.
        threadsafe = self._threadsafe
        for _ in range(len(threadsafe)):
            self._guarded(threadsafe.popleft())
        ready = self._ready
        for _ in range(len(ready)):
            self._guarded(ready.popleft())

    def _guarded(self, fn: Callable[[], object]) -> None:
        try:
            fn()
        except Exception:
            log.exception("engine callback failed", callback=repr(fn))

    def _accept(self, listener: _Listener) -> None:
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
        self, sock: socket.socket, addr: Any, handler: ConnectionHandler, listener: _Listener
    ) -> None:
        conn = Connection(
            self, sock, handler, incoming=True, max_message_size=listener.max_message_size
        )
        conn.peer = f"{addr[0]}:{addr[1]}"
        t = conn._transport
        lib.pn_transport_set_server(t)
        if listener.max_frame_size:
            lib.pn_transport_set_max_frame(t, listener.max_frame_size)
        if listener.idle_timeout:
            lib.pn_transport_set_idle_timeout(t, int(listener.idle_timeout * 1000))
            conn._open_timer = self.call_later(
                2 * listener.idle_timeout, lambda: self._open_expired(conn)
            )
        if listener.tls_domain is not None:
            cproton.pn_ssl_init(lib.pn_ssl(t), listener.tls_domain, None)
        if listener.authenticator is not None:
            # Our own SASL layer runs first (see sasl.py); proton then sees plain AMQP.
            conn._sasl = sasl.SaslServer(
                listener.authenticator, allow_anonymous=listener.allow_anonymous
            )
            conn._intake = functools.partial(self._sasl_step, conn)
            if listener.tls_context is not None:
                # ...and below it our own TLS (see tls.py), for the whole connection.
                conn._tls = TlsSession(listener.tls_context)
                conn._intake = functools.partial(self._tls_step, conn)
                conn._detour = True
        else:
            pn_sasl = lib.pn_sasl(t)
            if listener.sasl_config_path:
                lib.pn_sasl_config_path(pn_sasl, listener.sasl_config_path.encode())
            if listener.sasl_config_name:
                lib.pn_sasl_config_name(pn_sasl, listener.sasl_config_name.encode())
            lib.pn_sasl_allowed_mechs(pn_sasl, listener.sasl_mechanisms.encode())
            lib.pn_sasl_set_allow_insecure_mechs(pn_sasl, True)
        lib.pn_connection_set_container(conn._ptr, self.container_id.encode())
        write_open_fields(
            conn._ptr,
            properties=listener.properties,
            offered=listener.offered_capabilities,
            desired=(),
        )
        self._attach(conn)

    def _attach(self, conn: Connection) -> None:
        lib.pn_connection_collect(conn._ptr, self._collector)
        lib.pn_transport_bind(conn._transport, conn._ptr)
        self._conns[conn._fd] = conn
        self._conn_by_ptr[conn._address] = conn
        self._epoll.register(conn._fd, select.EPOLLIN)
        self._schedule_tick(conn)

    def _open_expired(self, conn: Connection) -> None:
        if not conn._remote_opened and not conn._finalized:
            conn._io_error = Condition(
                "amqp:resource-limit-exceeded", "no AMQP open from the peer in time"
            )
            conn._abort()

    def _schedule_tick(self, conn: Connection) -> None:
        if conn._finalized:
            return
        now_ms = int(time.monotonic() * 1000)
        deadline = lib.pn_transport_tick(conn._transport, now_ms)
        if conn._tick_timer is not None:
            conn._tick_timer.cancel()
            conn._tick_timer = None
        if deadline:
            conn._tick_timer = self.call_later(
                max(0.0, (deadline - now_ms) / 1000), lambda: self._tick(conn)
            )

    def _tick(self, conn: Connection) -> None:
        conn._tick_timer = None
        self._schedule_tick(conn)
        self._process_events()
        conn._touch()

    def _on_io(self, conn: Connection, events: int) -> None:
        if events & (select.EPOLLIN | select.EPOLLHUP | select.EPOLLERR):
            self._read(conn)
        if events & select.EPOLLOUT and not conn._finalized:
            if conn._want_write and not conn._remote_opened and not conn.incoming:
                err = conn._sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) if conn._sock else 0
                if err:
                    conn._io_error = Condition(
                        "proton:io", f"connect to {conn.peer}: {os.strerror(err)}"
                    )
                    conn._abort()
                    return
            self._dirty.add(conn)

    def _read(self, conn: Connection) -> None:
        if conn._intake is not None:
            self._read_through_intake(conn)
            return
        # proton takes at most a frame or so per read: read on while the socket has more, so a
        # large message is not one loop turn per frame (bounded, for fairness between peers).
        _, status = _read_socket(conn._transport_address, conn._fd, _READS_PER_WAKEUP)
        if status == _READ_INPUT_CLOSED:
            self._epoll.modify(conn._fd, select.EPOLLOUT if conn._want_write else 0)
            self._dirty.add(conn)
            return
        if status:
            if status != _READ_EOF:
                conn._io_error = Condition(
                    "proton:io", f"connection to {conn.peer} lost: {os.strerror(status)}"
                )
            lib.pn_transport_close_tail(conn._transport)
        self._process_events()
        self._dirty.add(conn)

    def _read_through_intake(self, conn: Connection) -> None:
        """_read for a connection whose bytes go to our own SASL or TLS before proton."""
        t = conn._transport
        if lib.pn_transport_capacity(t) < 0:
            self._epoll.modify(conn._fd, select.EPOLLOUT if conn._want_write else 0)
            self._dirty.add(conn)
            return
        sock = conn._sock
        assert sock is not None
        for _ in range(_READS_PER_WAKEUP):
            capacity = lib.pn_transport_capacity(t)
            if capacity <= 0:
                break
            wanted = min(capacity, _RECV_CHUNK)
            try:
                got = sock.recv_into(self._inview, wanted)
            except (BlockingIOError, InterruptedError):
                break
            except OSError as err:
                conn._io_error = Condition("proton:io", f"connection to {conn.peer} lost: {err}")
                got = 0
            if got and conn._intake is not None:
                conn._intake(bytes(self._inview[:got]))
            elif got:
                lib.pn_transport_push(t, self._inbuf, got)
            else:
                if conn._tls is not None and not conn._tls.established:
                    conn._io_error = conn._io_error or Condition(
                        "amqp:connection:framing-error", "connection closed in the TLS handshake"
                    )
                lib.pn_transport_close_tail(t)
                break
            if got < wanted:
                break
        self._process_events()
        self._dirty.add(conn)

    def _sasl_step(self, conn: Connection, data: bytes) -> None:
        exchange = conn._sasl
        assert exchange is not None
        self._sasl_went_on(conn, exchange, exchange.feed(data))

    def _sasl_went_on(self, conn: Connection, exchange: sasl.SaslServer, step: sasl.Step) -> None:
        if step.reply:
            conn._pre_output += step.reply
            conn._detour = True
        if step.check is not None:
            self._check_login(conn, exchange, *step.check)
            return
        if not step.done:
            return
        conn._sasl = None
        if conn._tls is None:
            conn._intake = None
        if step.error is not None:
            log.info("authentication refused", peer=conn.peer, reason=step.error)
            conn._io_error = Condition("amqp:unauthorized-access", step.error)
            conn._refused = True
            conn._detour = True
            return
        conn._sasl_user = step.user
        if step.rest:
            self._push_plain(conn, step.rest)

    def _check_login(
        self, conn: Connection, exchange: sasl.SaslServer, user: str, password: str
    ) -> None:
        """Runs the authenticator on a worker thread; its answer comes back to the loop."""
        assert exchange.authenticator is not None
        if self._login_checks is None:
            self._login_checks = concurrent.futures.ThreadPoolExecutor(
                max_workers=2, thread_name_prefix="amqp-login"
            )
        future = self._login_checks.submit(exchange.authenticator, user, password)
        answer = functools.partial(self._login_checked, conn, exchange, future)
        future.add_done_callback(lambda _: self.call_soon_threadsafe(answer))

    def _login_checked(
        self,
        conn: Connection,
        exchange: sasl.SaslServer,
        future: concurrent.futures.Future[bool],
    ) -> None:
        if conn._finalized or conn._sasl is not exchange:
            return  # the client went away meanwhile
        try:
            step = exchange.checked(bool(future.result()))
        except Exception as err:  # a broken authenticator denies; it does not crash the engine
            step = exchange.checked(False, failure=str(err))
        self._sasl_went_on(conn, exchange, step)
        self._process_events()
        self._dirty.add(conn)

    def _tls_step(self, conn: Connection, data: bytes) -> None:
        """Ciphertext from a connection with our own TLS: decrypted, it goes on to our SASL
        exchange while that runs, then to proton."""
        session = conn._tls
        if session is None or conn._refused:
            return  # refused: whatever else the client sends goes nowhere
        try:
            plain = session.receive(data)
        except TlsFailure as err:
            log.info("TLS refused", peer=conn.peer, reason=str(err))
            conn._io_error = Condition("amqp:connection:framing-error", str(err))
            conn._refused = True
            return
        if plain and conn._sasl is not None:
            self._sasl_step(conn, plain)
        elif plain:
            self._push_plain(conn, plain)
        if session.peer_closed:
            lib.pn_transport_close_tail(conn._transport)

    def _push_plain(self, conn: Connection, data: bytes) -> None:
        """Hands plaintext that did not come straight from the socket to proton, as much as it
        takes now; the rest waits in conn._backlog and is offered again shortly."""
        if conn._backlog:
            data, conn._backlog = conn._backlog + data, b""
        t = conn._transport
        buf = ffi.from_buffer(data)
        done = 0
        while done < len(data):
            pushed = lib.pn_transport_push(t, buf + done, len(data) - done)
            if pushed < 0:
                return  # the transport takes no more input; its own events say why
            if pushed == 0:
                break
            done += pushed
        if done < len(data):
            conn._backlog = data[done:]
            self.call_later(0.01, functools.partial(self._retry_backlog, conn))

    def _retry_backlog(self, conn: Connection) -> None:
        if conn._finalized or not conn._backlog:
            return
        self._push_plain(conn, b"")
        self._process_events()
        conn._touch()

    def _flush_dirty(self) -> None:
        dirty = self._dirty
        while dirty:
            conn = dirty.pop()
            try:
                self._flush(conn)
            except Exception:
                self._broken(conn)

    def _flush_pre_output(self, conn: Connection, sock: socket.socket) -> bool:
        """Sends our SASL bytes; True when proton's output may follow."""
        try:
            sent = sock.send(conn._pre_output)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:
            conn._pre_output = b""
            conn._abort()
            return False
        conn._pre_output = conn._pre_output[sent:]
        if conn._pre_output:
            if not conn._want_write:
                conn._want_write = True
                self._epoll.modify(conn._fd, select.EPOLLIN | select.EPOLLOUT)
            return False
        if conn._refused:
            conn._abort()  # the outcome is out; the connection ends with _io_error
            return False
        conn._detour = False
        return True

    def _flush_tls(self, conn: Connection, sock: socket.socket) -> None:
        """_flush for a connection with our own TLS: our SASL bytes, then proton's output,
        encrypted. Proton's output is taken only as fast as the socket takes the ciphertext,
        and only once the handshake and our SASL exchange are done."""
        session = conn._tls
        assert session is not None
        t = conn._transport
        if conn._pre_output:
            session.send(conn._pre_output)
            conn._pre_output = b""
        if conn._refused:
            session.close()
        while self._send_ciphertext(conn, sock, session):
            if conn._refused or conn._sasl is not None or not session.established:
                break
            pending = lib.pn_transport_pending(t)
            if pending < 0 and not session.closing:
                session.close()  # proton has written its last frame: close_notify follows it
                continue
            if pending <= 0:
                break
            n = min(pending, _SEND_CHUNK)
            lib.pn_transport_peek(t, self._outbuf, n)
            session.send(self._outview[:n])
            lib.pn_transport_pop(t, n)
        if conn._tls_output:
            self._want_write(conn, True)
            return
        if conn._refused:
            conn._abort()  # the refusal (SASL outcome, TLS alert) is out; ends with _io_error
            return
        if session.closing and not conn._head_shut:
            conn._head_shut = True
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_WR)
        if lib.pn_transport_closed(t):
            self._process_events()
            self._finalize(conn)
            return
        self._want_write(conn, False)

    def _send_ciphertext(self, conn: Connection, sock: socket.socket, session: TlsSession) -> bool:
        """Writes what TLS has for the socket; True when all of it went."""
        out = conn._tls_output + session.take_output()
        if not out:
            return True
        try:
            sent = sock.send(out)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError as err:
            conn._io_error = conn._io_error or Condition(
                "proton:io", f"connection to {conn.peer} lost: {err}"
            )
            conn._tls_output = b""
            conn._refused = True  # nothing more can be said: end it
            return False
        conn._tls_output = out[sent:]
        return not conn._tls_output

    def _want_write(self, conn: Connection, want_write: bool) -> None:
        if want_write != conn._want_write:
            conn._want_write = want_write
            mask = select.EPOLLOUT if want_write else 0
            if lib.pn_transport_capacity(conn._transport) >= 0:
                mask |= select.EPOLLIN
            self._epoll.modify(conn._fd, mask)

    def _broken(self, conn: Connection) -> None:
        """An engine bug surfaced on one connection: drop that one, keep serving the rest."""
        log.exception("connection failed inside the engine", peer=conn.peer)
        conn._io_error = Condition("amqp:internal-error", "internal error")
        self._guarded(conn._abort)

    def _flush(self, conn: Connection) -> None:
        if conn._finalized:
            return
        t = conn._transport
        sock = conn._sock
        assert sock is not None
        want_write = False
        if conn._detour:
            if conn._tls is not None:
                self._flush_tls(conn, sock)
                return
            if not self._flush_pre_output(conn, sock):
                return
        status = _write_socket(conn._transport_address, conn._fd)
        if status == _WRITE_BLOCKED:
            want_write = True
        elif status == _WRITE_HEAD_CLOSED:
            if not conn._head_shut:
                conn._head_shut = True
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_WR)
        elif status:
            conn._io_error = conn._io_error or Condition(
                "proton:io", f"connection to {conn.peer} lost: {os.strerror(status)}"
            )
            lib.pn_transport_close_head(t)
            lib.pn_transport_close_tail(t)
            self._process_events()
        if lib.pn_transport_closed(t):
            self._process_events()
            self._finalize(conn)
            return
        if want_write != conn._want_write:
            conn._want_write = want_write
            mask = select.EPOLLOUT if want_write else 0
            if lib.pn_transport_capacity(t) >= 0:
                mask |= select.EPOLLIN
            self._epoll.modify(conn._fd, mask)

    # -- proton events --

    def _process_events(self) -> None:
        # The hottest loop of the process: every transfer and every outcome passes here. The C
        # side (`amqp_hotpath.next_event`) reads proton's collector, skips what no handler wants,
        # receives complete transfers and pops each event before returning it, so this loop
        # only dispatches; an outcome finds its delivery by pointer in `_sent`.
        collector = self._collector_address
        if not collector:
            return  # shut down: the collector is gone
        links_get = self._links.get
        sent_get = self._sent.get
        next_event = _next_event
        while (record := next_event(collector)) is not None:
            kind = record[0]
            try:
                if kind == _TRANSFER:
                    # A complete transfer, received and advanced (dptr 0: it came pre-settled);
                    # handled here rather than in a method of its own: one call fewer a message.
                    link = links_get(record[1])
                    if link is None or not link._receiving:
                        continue
                    dptr, payload = record[2], record[3]
                    limit = link._max_message_size
                    if limit and len(payload) > limit:
                        self._refuse_size(link, len(payload))
                        continue
                    link._handler.on_message(link, Delivery(link, dptr or None, payload, not dptr))
                    if link._drain_asked and link.credit == 0:
                        link._drain_answered()  # the peer used up the credit: no flow will say so
                elif kind == _OUTCOME:
                    sent = sent_get(record[1])
                    if sent is not None:
                        self._on_update(sent, record[1], record[2])
                elif kind == _PARTIAL:
                    link = links_get(record[1])
                    if link is not None and link._receiving:
                        self._on_partial(link, record[2])
                else:
                    self._on_endpoint_event(kind, record[1], record[2])
            except Exception:
                log.exception("connection handler failed", event_type=kind)
                self._close_after_failure(kind, record[1])

    def _close_after_failure(self, kind: int, pointer: int) -> None:
        """A handler raised: close the connection the event was about (internal-error)."""
        if kind in (_TRANSFER, _PARTIAL):
            link = self._links.get(pointer)
            conn = link.connection if link is not None else None
        elif kind == _OUTCOME:
            sent = self._sent.get(pointer)
            conn = sent.link.connection if sent is not None else None
        else:
            conn = self._conn_by_ptr.get(pointer)
        if conn is not None:
            conn.close(Condition("amqp:internal-error", "internal error"))

    def _on_partial(self, link: Link, size: int) -> None:
        """Part of a large delivery: proton keeps its bytes until the last frame (one copy out,
        then); we only check the size so far, so an oversized message is refused early."""
        limit = link._max_message_size
        if limit and size > limit:
            self._refuse_size(link, size)

    def _refuse_size(self, link: Link, size: int) -> None:
        limit = link._max_message_size
        link.close(
            Condition(
                "amqp:link:message-size-exceeded",
                f"message of {size} bytes or more exceeds the limit of {limit} bytes",
            )
        )

    def _on_update(self, delivery: Delivery, dptr: int, state: int) -> None:
        """The peer settled (or gave a terminal state to) a delivery we sent."""
        if state == _PN_ACCEPTED:
            outcome = OUTCOME_ACCEPTED
        else:
            outcome = OUTCOMES.get(state, Outcome.NONE)
            if state == lib.PN_REJECTED or state == lib.PN_MODIFIED:
                remote = lib.pn_delivery_remote(ffi.cast("pn_delivery_t *", dptr))
                if state == lib.PN_REJECTED:
                    delivery.error = get_condition(lib.pn_disposition_condition(remote))
                else:
                    delivery.delivery_failed = bool(lib.pn_disposition_is_failed(remote))
                    delivery.undeliverable_here = bool(lib.pn_disposition_is_undeliverable(remote))
        link = delivery.link
        del self._sent[dptr]
        del link._unsettled[dptr]
        delivery.outcome = outcome
        delivery.settled = True
        delivery._ptr = None
        _settle(dptr, 0)
        link._dirty.add(link.connection)
        link._handler.on_outcome(link, delivery, outcome)

    def _on_endpoint_event(self, kind: int, conn_address: int, obj_address: int) -> None:
        """obj_address: the link (LINK_* events) or session (SESSION_*) the event is about."""
        if kind == _PN_LINK_FLOW:
            link = self._links.get(obj_address)
            if link is None:
                return
            if link.is_sender:
                link._credit_changed()
            elif link._drain_asked and link.credit == 0:
                link._drain_answered()  # the peer gave back what it did not use
            return
        conn = self._conn_by_ptr.get(conn_address)
        if conn is None or conn._finalized:
            return
        if kind == _PN_LINK_REMOTE_OPEN:
            self._on_link_remote_open(conn, obj_address)
        elif kind in (_PN_LINK_REMOTE_CLOSE, _PN_LINK_REMOTE_DETACH):
            link = self._links.get(obj_address)
            if link is not None:
                self._on_link_remote_end(link, closed=kind == _PN_LINK_REMOTE_CLOSE)
        elif kind == _PN_SESSION_REMOTE_OPEN:
            session = ffi.cast("pn_session_t *", obj_address)
            if lib.pn_session_state(session) & lib.PN_LOCAL_UNINIT:
                lib.pn_session_open(session)
        elif kind == _PN_SESSION_REMOTE_CLOSE:
            self._on_session_remote_close(conn, ffi.cast("pn_session_t *", obj_address))
        elif kind == _PN_CONNECTION_REMOTE_OPEN:
            self._on_connection_remote_open(conn)
        elif kind == _PN_CONNECTION_REMOTE_CLOSE:
            error = get_condition(lib.pn_connection_remote_condition(conn._ptr))
            if not lib.pn_connection_state(conn._ptr) & lib.PN_LOCAL_CLOSED:
                lib.pn_connection_close(conn._ptr)
            conn._touch()
            self._report_closed(conn, error)
        elif kind == _PN_TRANSPORT_ERROR:
            error = conn._io_error or get_condition(lib.pn_transport_condition(conn._transport))
            self._report_closed(conn, error)
        elif kind == _PN_TRANSPORT_CLOSED:
            conn._touch()
        conn._touch()

    def _on_connection_remote_open(self, conn: Connection) -> None:
        c = conn._ptr
        conn._remote_opened = True
        if conn._open_timer is not None:
            conn._open_timer.cancel()
            conn._open_timer = None
        conn.container_id = string_of(lib.pn_connection_remote_container(c))
        conn.remote_hostname = string_of(lib.pn_connection_remote_hostname(c))
        if conn.incoming and lib.pn_connection_state(c) & lib.PN_LOCAL_UNINIT:
            lib.pn_connection_open(c)
        self._schedule_tick(conn)  # the peer's idle timeout is known now
        if lib.pn_connection_state(c) & lib.PN_REMOTE_CLOSED:
            return  # open-then-close in one go is how a peer refuses: only the close is news
        conn.handler.on_connection_open(conn)

    def _on_link_remote_open(self, conn: Connection, link_address: int) -> None:
        link = self._links.get(link_address)
        if link is None:
            lptr = ffi.cast("pn_link_t *", link_address)
            if not lib.pn_link_state(lptr) & lib.PN_LOCAL_UNINIT:
                return
            link = Link(conn, lptr, peer_initiated=True)
            conn._links[link_address] = link
            self._links[link_address] = link
            if not (lib.pn_connection_state(conn._ptr) & lib.PN_LOCAL_ACTIVE):
                return
            conn.handler.on_link_attach(link)
            return
        # The peer answered one of ours; a null terminus means it refused (a detach follows).
        lptr = link._ptr
        remote = (
            lib.pn_link_remote_source(lptr) if link.is_receiver else lib.pn_link_remote_target(lptr)
        )
        if lib.pn_terminus_get_type(remote) == lib.PN_UNSPECIFIED:
            return
        if link.is_receiver:
            link.source = read_terminus(remote)
        else:
            link.target = read_terminus(remote)
        dynamic_address = string_of(lib.pn_terminus_get_address(remote))
        if dynamic_address is not None:
            link.address = dynamic_address
        conn.handler.on_link_open(link)

    def _on_link_remote_end(self, link: Link, *, closed: bool) -> None:
        lptr = link._ptr
        if lptr is None:
            return
        error = get_condition(lib.pn_link_remote_condition(lptr))
        if not lib.pn_link_state(lptr) & lib.PN_LOCAL_CLOSED:
            if closed:
                lib.pn_link_close(lptr)
            else:
                lib.pn_link_detach(lptr)
        self._forget_link(link)
        lib.pn_link_free(lptr)
        if link._opened:
            link.connection.handler.on_link_detach(link, closed=closed, error=error)

    def _forget_link(self, link: Link) -> None:
        address = link._address
        link._ptr = None
        link._address = 0
        sent = self._sent
        for dptr in link._unsettled:
            sent.pop(dptr, None)
        link.connection._links.pop(address, None)
        self._links.pop(address, None)

    def _on_session_remote_close(self, conn: Connection, session: Any) -> None:
        for link in list(conn._links.values()):
            if link._ptr is not None and lib.pn_link_session(link._ptr) == session:
                self._on_link_remote_end(link, closed=False)
        if not lib.pn_session_state(session) & lib.PN_LOCAL_CLOSED:
            lib.pn_session_close(session)
        if session == conn._session:
            conn._session = None

    def _report_closed(self, conn: Connection, error: Condition | None) -> None:
        if conn._reported:
            return
        conn._reported = True
        for link in list(conn._links.values()):
            self._forget_link(link)
            if link._opened:
                self._guarded(
                    functools.partial(conn.handler.on_link_detach, link, closed=False, error=error)
                )
        conn.handler.on_connection_close(conn, error)

    def _finalize(self, conn: Connection) -> None:
        if conn._finalized:
            return
        if not conn._reported:
            error = conn._io_error
            if error is None:
                error = get_condition(lib.pn_transport_condition(conn._transport))
            self._guarded(lambda: self._report_closed(conn, error))
        conn._finalized = True
        conn._intake = None  # a partial of an engine method holding conn: break the cycle
        for timer in (conn._tick_timer, conn._open_timer, conn._linger_timer):
            if timer is not None:
                timer.cancel()
        self._dirty.discard(conn)
        self._conns.pop(conn._fd, None)
        self._conn_by_ptr.pop(conn._address, None)
        if conn._sock is not None:
            with contextlib.suppress(OSError, ValueError):
                self._epoll.unregister(conn._fd)
            conn._sock.close()
            conn._sock = None
        lib.pn_transport_unbind(conn._transport)
        lib.pn_connection_release(conn._ptr)
        # Release frees the endpoints; the connection object itself (and the deliveries proton
        # pools in it, about 0.5 MB after a busy connection) goes with our reference: this
        # release + decref is proton's pn_connection_free, which the binding does not declare.
        lib.pn_decref(conn._ptr)
        lib.pn_decref(conn._transport)

    def _shutdown(self) -> None:
        for conn in list(self._conns.values()):
            conn._reported = True  # the process is going away: no callbacks on the way out
            self._finalize(conn)
        for listener in self._listeners.values():
            self._close_listener(listener)
        self._listeners.clear()
        self._process_events()
        if self._login_checks is not None:
            self._login_checks.shutdown(wait=False, cancel_futures=True)
        self._collector_address = 0
        lib.pn_collector_free(self._collector)
        self._epoll.close()
        os.close(self._wake_fd)


_PN_DELIVERY = lib.PN_DELIVERY
_PN_LINK_FLOW = lib.PN_LINK_FLOW
_PN_LINK_REMOTE_OPEN = lib.PN_LINK_REMOTE_OPEN
_PN_LINK_REMOTE_CLOSE = lib.PN_LINK_REMOTE_CLOSE
_PN_LINK_REMOTE_DETACH = lib.PN_LINK_REMOTE_DETACH
_PN_SESSION_REMOTE_OPEN = lib.PN_SESSION_REMOTE_OPEN
_PN_SESSION_REMOTE_CLOSE = lib.PN_SESSION_REMOTE_CLOSE
_PN_CONNECTION_REMOTE_OPEN = lib.PN_CONNECTION_REMOTE_OPEN
_PN_CONNECTION_REMOTE_CLOSE = lib.PN_CONNECTION_REMOTE_CLOSE
_PN_TRANSPORT_ERROR = lib.PN_TRANSPORT_ERROR
_PN_TRANSPORT_CLOSED = lib.PN_TRANSPORT_CLOSED
_ENDPOINT_EVENTS = frozenset(
    (
        _PN_LINK_FLOW,
        _PN_LINK_REMOTE_OPEN,
        _PN_LINK_REMOTE_CLOSE,
        _PN_LINK_REMOTE_DETACH,
        _PN_SESSION_REMOTE_OPEN,
        _PN_SESSION_REMOTE_CLOSE,
        _PN_CONNECTION_REMOTE_OPEN,
        _PN_CONNECTION_REMOTE_CLOSE,
        _PN_TRANSPORT_ERROR,
        _PN_TRANSPORT_CLOSED,
    )
)


def _address_of(pointer: Any) -> int:
    """A proton pointer as the int that amqp_hotpath takes and hands back."""
    return int(ffi.cast("uintptr_t", pointer))


def _bind_hotpath() -> None:
    """Hands amqp_hotpath the addresses of proton's functions, from the library the cffi
    binding loaded (the same proton-c both sides call), and the endpoint events we handle."""
    loaded = ctypes.CDLL(cproton_ffi.__file__)
    addresses = {
        name: ctypes.cast(getattr(loaded, name), ctypes.c_void_p).value or 0
        for name in amqp_hotpath.FUNCTIONS
    }
    amqp_hotpath.bind(addresses, _ENDPOINT_EVENTS)


_bind_hotpath()

# Hot-path aliases: a module global is found faster than a module attribute.
_next_event = amqp_hotpath.next_event
_send = amqp_hotpath.send
_settle = amqp_hotpath.settle
_credit = amqp_hotpath.credit
_read_socket = amqp_hotpath.read
_write_socket = amqp_hotpath.write
_TRANSFER = amqp_hotpath.TRANSFER
_PARTIAL = amqp_hotpath.PARTIAL
_OUTCOME = amqp_hotpath.OUTCOME
_READ_EOF = amqp_hotpath.READ_EOF
_READ_INPUT_CLOSED = amqp_hotpath.READ_INPUT_CLOSED
_WRITE_BLOCKED = amqp_hotpath.WRITE_BLOCKED
_WRITE_HEAD_CLOSED = amqp_hotpath.WRITE_HEAD_CLOSED
_PN_ACCEPTED = lib.PN_ACCEPTED
