"""Our own SASL and TLS in front of proton, for listeners that check passwords with our code.

What flows in: the bytes a connection's socket brings while its listener has an `authenticator`
(`Switchboard` hands such a connection to `Guard.admit`): ciphertext when the listener serves amqps
too, else plaintext. What flows out: SASL frames (the mechanisms, the outcome) and TLS records to
the socket; the authenticated user on the connection; and, once the login is done, plain AMQP
bytes into proton's transport, and proton's output (encrypted, with TLS) to the socket. A refused
login or a failed handshake ends the connection, after the refusal has reached the peer.

Why it is built so: proton checks PLAIN passwords only through Cyrus SASL and a sasldb; a listener
with an authenticator checks them with our code (`sasl`), so our SASL layer must see the bytes
before proton does; with amqps too, the TLS under it must be ours as well (`tls`: an in-memory
session), or the password would reach our SASL layer still encrypted. Checking a password may
hash it for a while, so the check runs on a small pool of login threads and its answer comes
back to the loop (`call_soon_threadsafe`): no other connection waits for it.

A connection pays for this only while it needs it: the engine's read and flush test one
attribute each (`conn._intake`, `conn._detour`) and take the straight amqp_hotpath path when
they are unset, which they are for every other connection and, without TLS, once the login is
done. The state of the exchange lives on the Connection (`_sasl`, `_tls`, `_pre_output`, ...);
the steps live here.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import select
import socket
from collections.abc import Callable

import structlog
from cproton_ffi import ffi, lib
from enmasse.amqp import sasl
from enmasse.amqp.engine.endpoints import Connection, Listener
from enmasse.amqp.engine.loop import READS_PER_WAKEUP, Timer
from enmasse.amqp.tls import TlsFailure, TlsSession
from enmasse.amqp.wire import Condition

__all__ = ["Guard"]

log = structlog.get_logger("enmasse.amqp")

_RECV_CHUNK = 256 * 1024
_SEND_CHUNK = 256 * 1024


class Guard:
    """The SASL and TLS steps of the connections an engine admits through our own security.

    The engine hands over what the steps touch besides the connection: its epoll (a connection
    waits to write), its set of connections to flush, its event processing and finalization, and
    its timers and cross-thread queue (a backlog retried, a login checked on another thread).
    """

    def __init__(
        self,
        *,
        epoll: select.epoll,
        dirty: set[Connection],
        process_events: Callable[[], None],
        finalize: Callable[[Connection], None],
        call_later: Callable[[float, Callable[[], object]], Timer],
        call_soon_threadsafe: Callable[[Callable[[], object]], None],
    ) -> None:
        self._epoll = epoll
        self._dirty = dirty
        self._process_events = process_events
        self._finalize = finalize
        self._call_later = call_later
        self._call_soon_threadsafe = call_soon_threadsafe
        # Where logins are checked (sasl.py): made at the first PLAIN login of a listener with an
        # authenticator, so that hashing a password holds up no other connection.
        self._login_checks: concurrent.futures.ThreadPoolExecutor | None = None
        # Plain connections read and write straight between socket and proton (amqp_hotpath);
        # these serve the ones whose bytes pass through our own SASL or TLS first.
        self._inbuf = ffi.new("char[]", _RECV_CHUNK)
        self._inview = ffi.buffer(self._inbuf)
        self._outbuf = ffi.new("char[]", _SEND_CHUNK)
        self._outview = ffi.buffer(self._outbuf)

    def admit(self, conn: Connection, listener: Listener) -> None:
        """A connection accepted by a listener with an authenticator: our own SASL layer runs
        first (see sasl.py); proton then sees plain AMQP."""
        assert listener.authenticator is not None
        conn._sasl = sasl.SaslServer(
            listener.authenticator, allow_anonymous=listener.allow_anonymous
        )
        conn._intake = functools.partial(self._sasl_step, conn)
        if listener.tls_context is not None:
            # ...and below it our own TLS (see tls.py), for the whole connection.
            conn._tls = TlsSession(listener.tls_context)
            conn._intake = functools.partial(self._tls_step, conn)
            conn._detour = True

    def close(self) -> None:
        """The engine is shutting down: logins still being checked are dropped."""
        if self._login_checks is not None:
            self._login_checks.shutdown(wait=False, cancel_futures=True)

    def read(self, conn: Connection) -> None:
        """`Engine._read` for a connection whose bytes go to our SASL or TLS before proton."""
        t = conn._transport
        if lib.pn_transport_capacity(t) < 0:
            self._epoll.modify(conn._fd, select.EPOLLOUT if conn._want_write else 0)
            self._dirty.add(conn)
            return
        sock = conn._sock
        assert sock is not None
        for _ in range(READS_PER_WAKEUP):
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

    def flush_pre_output(self, conn: Connection, sock: socket.socket) -> bool:
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

    def flush_tls(self, conn: Connection, sock: socket.socket) -> None:
        """`Engine._flush` for a connection with our own TLS: our SASL bytes, then proton's output,
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
        future.add_done_callback(lambda _: self._call_soon_threadsafe(answer))

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
            self._call_later(0.01, functools.partial(self._retry_backlog, conn))

    def _retry_backlog(self, conn: Connection) -> None:
        if conn._finalized or not conn._backlog:
            return
        self._push_plain(conn, b"")
        self._process_events()
        conn._touch()
