"""Our own SASL and TLS in front of proton, for listeners that check logins with our code and for
connections that log in with our SASL client (SCRAM).

What flows in: the bytes a connection's socket brings while its listener has an `authenticator`
(`Switchboard` hands such a connection to `Guard.admit`), or while our client logs in
(`Guard.dial`): ciphertext with TLS, else plaintext. What flows out: SASL frames and TLS records
to the socket; the authenticated user on the connection; and, once the login is done, plain AMQP
bytes into proton's transport, and proton's output (encrypted, with TLS) to the socket. A refused
login or a failed handshake ends the connection, after the refusal has reached the peer.

Why it is built so: proton checks PLAIN passwords only through Cyrus SASL and a sasldb; a listener
with an authenticator checks them with our code (`sasl`), so our SASL layer must see the bytes
before proton does; with amqps too, the TLS under it must be ours as well (`tls`: an in-memory
session), or the password would reach our SASL layer still encrypted.

Who waits for what: a SCRAM login is a few HMACs over stored keys and is decided here, on the
engine thread. A PLAIN password is first offered to the authenticator's memory (`recall`: a
remembered login is an HMAC, answered at once, queued behind nothing); otherwise it is hashed,
which takes tens of milliseconds, on a login thread, and the answer comes back to the loop
(`call_soon_threadsafe`): no other connection waits for it. Before any of that the listener's
`LoginThrottle` (`throttle`) has its say: a peer or user that failed too often is turned away
before anything is checked, one that failed lately waits a back-off (a timer, not a thread). Two
lanes keep failures away from good logins: a peer's first check goes to the two trusted login
threads, but a check from a peer or for a user that failed lately, or from a peer with a check
already running, goes to one doubtful thread with a short bounded queue (full: turned away), so
a flood of wrong passwords never holds both trusted threads.

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
from collections import Counter
from collections.abc import Callable

import structlog
from cproton_ffi import ffi, lib
from enmasse.amqp import sasl
from enmasse.amqp.engine.endpoints import Connection, Listener
from enmasse.amqp.engine.loop import READS_PER_WAKEUP, Timer
from enmasse.amqp.throttle import LoginThrottle, peer_host
from enmasse.amqp.tls import RECORD_SIZE, TlsFailure, TlsSession, client_context
from enmasse.amqp.wire import Condition, Tls

__all__ = ["Guard"]

log = structlog.get_logger("enmasse.amqp")

_RECV_CHUNK = 256 * 1024
_SEND_CHUNK = 256 * 1024
_PLAIN_CHUNK = 256 * 1024  # plaintext decrypted for proton at most per push (whole records)
TRUSTED_LOGIN_THREADS = 2
DOUBTFUL_QUEUE = 8  # doubtful PLAIN checks waiting or running at once; more are turned away
_QUEUE_FULL = "too many doubtful logins waiting to be checked; try again later"


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
        # Where PLAIN passwords are hashed and checked: made at the first such login, so that
        # hashing holds up no other connection; logins that failed lately get a lane of their own.
        self._login_checks: concurrent.futures.ThreadPoolExecutor | None = None
        self._doubtful_checks: concurrent.futures.ThreadPoolExecutor | None = None
        self._doubtful_pending = 0
        self._trusted_peers: Counter[str] = Counter()  # peer host -> its checks on trusted lane
        # Plain connections read and write straight between socket and proton (amqp_hotpath);
        # these serve the ones whose bytes pass through our own SASL or TLS first.
        # With TLS, bytes pass through these buffers as memoryviews (no bytes object per read,
        # record or flush): ciphertext from the socket, plaintext decrypted for proton, and
        # proton's output on its way to be encrypted.
        self._inbuf = ffi.new("char[]", _RECV_CHUNK)
        self._inview = ffi.buffer(self._inbuf)
        self._inmem = memoryview(self._inview)
        self._plainbuf = ffi.new("char[]", _PLAIN_CHUNK)
        self._plainmem = memoryview(ffi.buffer(self._plainbuf))
        self._outbuf = ffi.new("char[]", _SEND_CHUNK)
        self._outmem = memoryview(ffi.buffer(self._outbuf))

    def admit(self, conn: Connection, listener: Listener) -> None:
        """A connection accepted by a listener with an authenticator: our own SASL layer runs
        first (see sasl.py); proton then sees plain AMQP."""
        assert listener.authenticator is not None
        encrypted = listener.tls_context is not None
        conn._sasl = sasl.SaslServer(listener.authenticator, encrypted=encrypted)
        conn._throttle = listener.throttle or LoginThrottle()
        conn._intake = functools.partial(self._sasl_step, conn)
        if listener.tls_context is not None:
            # ...and below it our own TLS (see tls.py), for the whole connection.
            conn._tls = TlsSession(listener.tls_context)
            conn._intake = functools.partial(self._tls_step, conn)
            conn._detour = True

    def dial(
        self, conn: Connection, login: sasl.SaslClient, *, tls: Tls | None, hostname: str
    ) -> None:
        """An outgoing connection that logs in with our SASL client: it speaks first (the SASL
        header, after the TLS handshake with tls); proton's output waits until the login is done."""
        conn._sasl = login
        conn._pre_output = login.start
        conn._intake = functools.partial(self._sasl_step, conn)
        conn._detour = True
        if tls is not None:
            conn._tls = TlsSession(client_context(tls), server_hostname=hostname)
            conn._tls.start()
            conn._intake = functools.partial(self._tls_step, conn)

    def close(self) -> None:
        """The engine is shutting down: logins still being checked are dropped."""
        for pool in (self._login_checks, self._doubtful_checks):
            if pool is not None:
                pool.shutdown(wait=False, cancel_futures=True)

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
            if conn._tls is not None:
                # Ciphertext goes to the TLS session, not into proton's buffer: one read takes
                # what a plain connection's READS_PER_WAKEUP reads into proton would (a turn as
                # large, not larger: in a larger one the clients wait), at a read's cost.
                wanted = min(capacity * READS_PER_WAKEUP, _RECV_CHUNK)
            try:
                got = sock.recv_into(self._inview, wanted)
            except (BlockingIOError, InterruptedError):
                break
            except OSError as err:
                conn._io_error = Condition("proton:io", f"connection to {conn.peer} lost: {err}")
                got = 0
            if got and conn._tls is not None:
                self._tls_step(conn, self._inmem[:got])
            elif got and conn._intake is not None:
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
            if got < wanted or conn._tls is not None:
                break  # with TLS, that one read was the turn's share
        self._process_events()
        self._dirty.add(conn)

    def flush_pre_output(self, conn: Connection, sock: socket.socket) -> bool:
        """Sends our SASL bytes; True when proton's output may follow."""
        try:
            sent = sock.send(conn._pre_output) if conn._pre_output else 0
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError as err:
            conn._pre_output = b""
            conn._io_error = conn._io_error or Condition(
                "proton:io", f"connection to {conn.peer} lost: {err}"
            )
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
        if isinstance(conn._sasl, sasl.SaslClient):
            return False  # our client is logging in: proton's AMQP header waits for the outcome
        conn._detour = False
        return True

    def flush_tls(self, conn: Connection, sock: socket.socket) -> None:
        """`Engine._flush` for a connection with our own TLS: our SASL bytes, then proton's output,
        encrypted. Proton's output is taken only as fast as the socket takes the ciphertext,
        and only once the handshake and our SASL exchange are done."""
        session = conn._tls
        assert session is not None
        t = conn._transport
        if conn._pre_output and session.established:
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
            session.send(self._outmem[:n])
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

    def _sasl_went_on(
        self, conn: Connection, exchange: sasl.SaslServer | sasl.SaslClient, step: sasl.Step
    ) -> None:
        if step.reply:
            conn._pre_output += step.reply
            conn._detour = True
        if isinstance(exchange, sasl.SaslServer):
            if step.check is not None:
                self._plain_login(conn, exchange, *step.check)
                return
            if step.gate is not None:
                self._scram_login(conn, exchange, step.gate)
                return
            if step.wrong and conn._throttle is not None:
                conn._throttle.failed(peer=peer_host(conn.peer), user=exchange.user or "")
        if not step.done:
            return
        conn._sasl = None
        if conn._tls is None:
            conn._intake = None
        if step.error is not None:
            what = "authentication refused" if conn.incoming else "our login refused"
            # A flood is turned away by the thousand: its failures were logged, the rest is noise.
            (log.debug if step.turned_away else log.info)(what, peer=conn.peer, reason=step.error)
            conn._io_error = Condition("amqp:unauthorized-access", step.error)
            conn._refused = True
            conn._detour = True
            return
        conn._sasl_user = step.user
        if step.rest:
            self._push_plain(conn, step.rest)

    # -- deciding a login: the throttle, a remembered password, a lane ----------------------------

    def _plain_login(
        self, conn: Connection, exchange: sasl.SaslServer, user: str, password: str
    ) -> None:
        """A PLAIN login: remembered (answered now), turned away, or checked on a lane."""
        assert conn._throttle is not None
        peer = peer_host(conn.peer)
        try:
            remembered = exchange.authenticator.recall(user, password)
        except Exception:  # a broken memory is no answer: the full check decides
            log.exception("recalling a login failed", peer=conn.peer)
            remembered = None
        verdict = conn._throttle.verdict(peer=peer, user=user, cheap=remembered is not None)
        if verdict.refusal is not None:
            self._decided(conn, exchange, exchange.turned_away(verdict.refusal))
            return
        if remembered is not None:
            answer = functools.partial(self._answer_plain, conn, exchange, remembered)
            self._after(verdict.delay, answer)
            return
        doubtful = verdict.doubtful or self._trusted_peers[peer] > 0
        if doubtful and self._doubtful_pending >= DOUBTFUL_QUEUE:
            self._decided(conn, exchange, exchange.turned_away(_QUEUE_FULL))
            return
        if doubtful:
            self._doubtful_pending += 1
        else:
            self._trusted_peers[peer] += 1
        check = functools.partial(
            self._check_login, conn, exchange, user, password, peer=peer, doubtful=doubtful
        )
        self._after(verdict.delay, check)

    def _scram_login(self, conn: Connection, exchange: sasl.SaslServer, user: str) -> None:
        """A SCRAM login, at its gate: turned away, or on (after the back-off) to the proof."""
        assert conn._throttle is not None
        verdict = conn._throttle.verdict(peer=peer_host(conn.peer), user=user, cheap=True)
        if verdict.refusal is not None:
            self._decided(conn, exchange, exchange.turned_away(verdict.refusal))
            return
        self._after(verdict.delay, functools.partial(self._scram_go_on, conn, exchange))

    def _scram_go_on(self, conn: Connection, exchange: sasl.SaslServer) -> None:
        if conn._finalized or conn._sasl is not exchange:
            return  # the client went away meanwhile
        self._decided(conn, exchange, exchange.go_on())

    def _after(self, delay: float, fn: Callable[[], None]) -> None:
        if delay > 0:
            self._call_later(delay, fn)
        else:
            fn()

    def _answer_plain(self, conn: Connection, exchange: sasl.SaslServer, allowed: bool) -> None:
        if conn._finalized or conn._sasl is not exchange:
            return
        self._decided(conn, exchange, exchange.checked(allowed))

    def _decided(self, conn: Connection, exchange: sasl.SaslServer, step: sasl.Step) -> None:
        self._sasl_went_on(conn, exchange, step)
        self._process_events()
        self._dirty.add(conn)

    def _check_login(
        self,
        conn: Connection,
        exchange: sasl.SaslServer,
        user: str,
        password: str,
        *,
        peer: str,
        doubtful: bool,
    ) -> None:
        """Runs the authenticator on a login thread; its answer comes back to the loop."""
        if conn._finalized or conn._sasl is not exchange:
            self._lane_freed(peer=peer, doubtful=doubtful)
            return  # the client went away during the back-off
        if doubtful:
            if self._doubtful_checks is None:
                self._doubtful_checks = concurrent.futures.ThreadPoolExecutor(
                    max_workers=1, thread_name_prefix="amqp-login-doubtful"
                )
            pool = self._doubtful_checks
        else:
            if self._login_checks is None:
                self._login_checks = concurrent.futures.ThreadPoolExecutor(
                    max_workers=TRUSTED_LOGIN_THREADS, thread_name_prefix="amqp-login"
                )
            pool = self._login_checks
        future = pool.submit(exchange.authenticator.check, user, password)
        answer = functools.partial(self._login_checked, conn, exchange, future, peer, doubtful)
        future.add_done_callback(lambda _: self._call_soon_threadsafe(answer))

    def _lane_freed(self, *, peer: str, doubtful: bool) -> None:
        if doubtful:
            self._doubtful_pending -= 1
            return
        self._trusted_peers[peer] -= 1
        if self._trusted_peers[peer] <= 0:
            del self._trusted_peers[peer]

    def _login_checked(
        self,
        conn: Connection,
        exchange: sasl.SaslServer,
        future: concurrent.futures.Future[bool],
        peer: str,
        doubtful: bool,
    ) -> None:
        self._lane_freed(peer=peer, doubtful=doubtful)
        if conn._finalized or conn._sasl is not exchange:
            return  # the client went away meanwhile
        try:
            step = exchange.checked(bool(future.result()))
        except Exception as err:  # a broken authenticator denies; it does not crash the engine
            step = exchange.checked(False, failure=str(err))
        self._decided(conn, exchange, step)

    def _tls_step(self, conn: Connection, data: bytes | memoryview) -> None:
        """Ciphertext from a connection with our own TLS: decrypted, it goes on to our SASL
        exchange while that runs (a record at a time), then to proton (all the whole records
        there are, in one push)."""
        session = conn._tls
        if session is None or conn._refused:
            return  # refused: whatever else the client sends goes nowhere
        plain = self._plainmem
        try:
            session.feed(data)
            while not conn._refused:
                if conn._sasl is not None:  # the login, a record at a time
                    got = session.read_into(plain, RECORD_SIZE)
                    if got:
                        self._sasl_step(conn, bytes(plain[:got]))
                elif got := self._decrypt(session):
                    self._push_decrypted(conn, got)
                if not got:
                    break
        except TlsFailure as err:
            log.info("TLS refused", peer=conn.peer, reason=str(err))
            conn._io_error = Condition("amqp:connection:framing-error", str(err))
            conn._refused = True
            return
        if session.peer_closed:
            lib.pn_transport_close_tail(conn._transport)

    def _decrypt(self, session: TlsSession) -> int:
        """Decrypts the whole records waiting, one after another into self._plainbuf (as many
        as fit): one push to proton for them all. Returns the plaintext's size."""
        plain = self._plainmem
        size = 0
        while size <= _PLAIN_CHUNK - RECORD_SIZE:
            got = session.read_into(plain[size:], RECORD_SIZE)
            if not got:
                break
            size += got
        return size

    def _push_decrypted(self, conn: Connection, size: int) -> None:
        """Hands the plaintext in self._plainbuf to proton, straight from the buffer; what
        proton has no room for yet joins conn._backlog (`_push_plain`)."""
        if conn._backlog:
            self._push_plain(conn, bytes(self._plainmem[:size]))
            return
        t = conn._transport
        done = 0
        while done < size:
            pushed = lib.pn_transport_push(t, self._plainbuf + done, size - done)
            if pushed < 0:
                return  # the transport takes no more input; its own events say why
            if pushed == 0:
                break
            done += pushed
        if done < size:
            self._push_plain(conn, bytes(self._plainmem[done:size]))

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
