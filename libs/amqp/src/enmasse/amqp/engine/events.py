"""The engine: the AMQP side of each loop turn, and the one object a process builds.

What flows in: socket readiness from the loop (`loop.Loop`, which `Engine` extends), proton's
events, read from its collector by `amqp_hotpath.next_event`, and the public calls a process
makes (listen, connect, shutdown; the loop's call_soon/call_later/submit/call/run/stop). What
flows out: socket bytes into proton and out (`amqp_hotpath.read`/`write`), and the calls on each
connection's `ConnectionHandler`: peer opened, session begun, link attached, message arrived,
outcome came back, credit changed, link detached, connection closed.

Why it is built so: this is the hottest code of a router or broker: every transfer and every
outcome passes through `_process_events`, every socket read through `_read` and every write
through `_flush`. Those functions call each other as methods of one object, bind what they use
to locals, and reach proton through amqp_hotpath (one C call reads the collector up to the next
event a handler wants; a complete transfer comes back received and advanced), with no Python
frame between the loop and a handler that does not have to be there. What is not per message is
composed around them: listen/connect and the accepted connections' set-up are a `Switchboard`
(`endpoints`), our own SASL and TLS a `Guard` (`security`); the engine holds one of each, and a
connection that does not use our SASL or TLS never reaches the guard. A large delivery is
taken out of proton in chunks and joined once, and one over a receiving link's size limit is
thrown away as it comes and rejected with amqp:link:message-size-exceeded for its sender alone
(`large`): the one size comparison per transfer is all either costs the hot path.

This module also binds amqp_hotpath to proton-c, once, at import: the C extension gets the
addresses of proton's functions from the library python-qpid-proton's cffi binding loaded.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import select
import socket
import threading
import time
import uuid
from typing import Any

import cproton_ffi
import enmasse.amqp_hotpath as amqp_hotpath
import structlog
from cproton_ffi import ffi, lib
from enmasse.amqp.engine import large
from enmasse.amqp.engine.endpoints import (
    Connection,
    Delivery,
    Link,
    Listener,
    Switchboard,
    address_of,
)
from enmasse.amqp.engine.loop import READS_PER_WAKEUP, Loop
from enmasse.amqp.engine.security import Guard
from enmasse.amqp.wire import (
    DECLARED,
    OUTCOME_ACCEPTED,
    OUTCOMES,
    TRANSACTIONAL_STATE,
    Condition,
    Outcome,
    get_condition,
    read_data,
    read_terminus,
    set_condition,
    string_of,
    transactional_fields,
)

__all__ = ["Engine"]

log = structlog.get_logger("enmasse.amqp")


class Engine(Loop[Connection, Listener]):
    """One epoll loop over many AMQP connections. See the package docstring for the contract.

    Public: `listen`, `stop_listening`, `connect` (the switchboard's, see `endpoints`),
    `shutdown`, `connections`, and the loop's `call_later`, `call_soon`, `call_soon_threadsafe`,
    `submit`, `call`, `run`, `run_in_thread`, `stop`.
    """

    def __init__(self, *, container_id: str | None = None) -> None:
        super().__init__()
        self.container_id = container_id or f"enmasse-{uuid.uuid4().hex[:12]}"
        self._collector = lib.pn_collector()
        self._collector_address = address_of(self._collector)
        # By proton pointer, as the int address amqp_hotpath hands back.
        self._conn_by_ptr: dict[int, Connection] = {}
        self._links: dict[int, Link] = {}
        # Every delivery we sent and the peer has not settled, by pointer: an outcome's event
        # finds its delivery without asking proton for the delivery's link.
        self._sent: dict[int, Delivery] = {}
        self._guard = Guard(
            epoll=self._epoll,
            dirty=self._dirty,
            process_events=self._process_events,
            finalize=self._finalize,
            call_later=self.call_later,
            call_soon_threadsafe=self.call_soon_threadsafe,
        )
        self._switchboard = Switchboard(
            self,
            listeners=self._listeners,
            epoll=self._epoll,
            attach=self._attach,
            admit=self._guard.admit,
            dial=self._guard.dial,
        )
        self.listen = self._switchboard.listen
        self.stop_listening = self._switchboard.stop_listening
        self.connect = self._switchboard.connect

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

    # -- the loop's hooks: connections come and go --

    def _accept(self, listener: Listener) -> None:
        self._switchboard.accept(listener)

    def _attach(self, conn: Connection) -> None:
        lib.pn_connection_collect(conn._ptr, self._collector)
        lib.pn_transport_bind(conn._transport, conn._ptr)
        self._conns[conn._fd] = conn
        self._conn_by_ptr[conn._address] = conn
        self._epoll.register(conn._fd, select.EPOLLIN)
        self._schedule_tick(conn)

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

    # -- socket bytes: amqp_hotpath between socket and proton (our own SASL/TLS: Guard) --

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
        if conn._intake is not None:  # our own SASL or TLS first: only such connections
            self._guard.read(conn)
            return
        # proton takes at most a frame or so per read: read on while the socket has more, so a
        # large message is not one loop turn per frame (bounded, for fairness between peers).
        _, status = _read_socket(conn._transport_address, conn._fd, READS_PER_WAKEUP)
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

    def _flush_dirty(self) -> None:
        dirty = self._dirty
        while dirty:
            conn = dirty.pop()
            try:
                self._flush(conn)
            except Exception:
                self._broken(conn)

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
                self._guard.flush_tls(conn, sock)
                return
            if not self._guard.flush_pre_output(conn, sock):
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
                    if len(payload) > link._size_ceiling:
                        whole = large.completed(link, dptr, payload)
                        if whole is None:
                            continue  # refused: over the link's size limit
                        payload = whole
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
                        large.on_partial(link, record[2])
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

    def _on_update(self, delivery: Delivery, dptr: int, state: int) -> None:
        """The peer settled (or gave a terminal state to) a delivery we sent."""
        if state == TRANSACTIONAL_STATE:
            self._on_transactional_update(delivery, dptr)
            return
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
            elif state == DECLARED:  # a coordinator's answer (a router relays it): keep its id
                remote = lib.pn_delivery_remote(ffi.cast("pn_delivery_t *", dptr))
                delivery.state_fields = read_data(lib.pn_disposition_data(remote))
        link = delivery.link
        del self._sent[dptr]
        del link._unsettled[dptr]
        delivery.outcome = outcome
        delivery.settled = True
        delivery._ptr = None
        _settle(dptr, 0)
        link._dirty.add(link.connection)
        link._handler.on_outcome(link, delivery, outcome)

    def _on_transactional_update(self, delivery: Delivery, dptr: int) -> None:
        """A transactional state on a delivery we sent: its outcome waits for the transaction
        (the handler holds it). If the peer settled it too, it is forgotten as any settled one."""
        pointer = ffi.cast("pn_delivery_t *", dptr)
        fields = read_data(lib.pn_disposition_data(lib.pn_delivery_remote(pointer)))
        txn_id, outcome = transactional_fields(fields)
        link = delivery.link
        if lib.pn_delivery_settled(pointer):
            del self._sent[dptr]
            del link._unsettled[dptr]
            delivery.settled = True
            delivery._ptr = None
            _settle(dptr, 0)
            link._dirty.add(link.connection)
        link._handler.on_transactional_outcome(link, delivery, txn_id=txn_id, outcome=outcome)

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
            self._on_session_remote_open(conn, obj_address)
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

    def _on_session_remote_open(self, conn: Connection, session_address: int) -> None:
        """The peer began a session (or answered one of ours): its handler says yes or no."""
        session = ffi.cast("pn_session_t *", session_address)
        if not lib.pn_session_state(session) & lib.PN_LOCAL_UNINIT:
            return  # the peer's answer to ours
        error = None
        if lib.pn_connection_state(conn._ptr) & lib.PN_LOCAL_ACTIVE:  # not one being closed
            error = conn.handler.on_session_begin(conn, held=len(conn._peer_sessions))
        lib.pn_session_open(session)
        if error is None:
            conn._peer_sessions.add(session_address)
            return
        set_condition(lib.pn_session_condition(session), error)
        lib.pn_session_close(session)

    def _on_link_remote_open(self, conn: Connection, link_address: int) -> None:
        link = self._links.get(link_address)
        if link is None:
            lptr = ffi.cast("pn_link_t *", link_address)
            if not lib.pn_link_state(lptr) & lib.PN_LOCAL_UNINIT:
                return
            if lib.pn_session_state(lib.pn_link_session(lptr)) & lib.PN_LOCAL_CLOSED:
                return  # attached on a session we refused: it ends with the session
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
        """The peer ended a session: its links end with it, we answer the end and free it, as
        a link (proton keeps it until our end is written; a connection that begins and ends
        sessions in a loop holds none of them after)."""
        conn._peer_sessions.discard(address_of(session))
        for link in list(conn._links.values()):
            if link._ptr is not None and lib.pn_link_session(link._ptr) == session:
                self._on_link_remote_end(link, closed=False)
        if not lib.pn_session_state(session) & lib.PN_LOCAL_CLOSED:
            lib.pn_session_close(session)
        if session == conn._session:
            conn._session = None
        lib.pn_session_free(session)

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
        conn._intake = None  # a partial of a Guard method holding conn: break the cycle
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
        self._switchboard.close()
        self._process_events()
        self._guard.close()
        self._collector_address = 0
        lib.pn_collector_free(self._collector)
        self._close_loop()


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
_settle = amqp_hotpath.settle
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
