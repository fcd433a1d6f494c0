"""TLS done by us, in memory, for listeners that also check passwords themselves (amqps + PLAIN),
and for outgoing connections that log in with our own SASL client (amqps + SCRAM).

What flows in: the ciphertext a client sent (`receive`) and the plaintext we answer (`send`:
our SASL frames, then proton's AMQP output). What flows out: the client's plaintext (its SASL
exchange, then AMQP for proton), the ciphertext to write to the socket (`take_output`), and a
`TlsFailure` naming what went wrong when the client is not speaking TLS we accept.

Why it is built so: the engine checks SASL PLAIN passwords with its own code (`sasl`), which
has to read the client's bytes before proton does. Under proton's TLS those bytes are ciphertext
until proton has decrypted them, and proton then runs its own (Cyrus) SASL on them: there is no
point between its TLS and its SASL layers where our code could sit. So on such listeners the
engine does TLS itself, with Python's `ssl` module in memory-BIO mode (`SSLContext.wrap_bio`):
socket bytes -> incoming BIO -> `SSLObject.read` -> our SASL -> proton (plain, no proton TLS on
that transport); proton's output -> `SSLObject.write` -> outgoing BIO -> socket. This is the same
OpenSSL proton uses, driven through a small, documented API, and no socket is handed to `ssl`:
the engine's loop keeps its non-blocking sockets, epoll and back-pressure as they are. The
alternatives cost more: a second proton transport used only for TLS (pumping bytes between two
transports and hiding proton's SASL layer from one) or a TLS-terminating thread per connection.
Listeners with TLS but without our SASL keep proton's TLS, and plain connections never come
here, so their per-read and per-flush work is what it was. An outgoing connection whose SASL is
ours (SCRAM) is in the same position as such a listener, from the other end: `client_context`
verifies the server as proton's client TLS does (`wire.client_tls`), and `TlsSession.start`
sends its hello. `mutual_tls` names the `Tls` of the internal links (the mesh, router -> broker,
a drain, the subscription service's attach): a process's own certificate directory.

Every message of such a connection passes here twice, so nothing is copied that need not be:
the engine feeds the socket's bytes in (`feed`, from its reused buffer), takes the plaintext out
a record at a time into another reused buffer (`read_into`), and hands proton's output to
`send` as a memoryview. Most of what remains is OpenSSL's own (on the bench machine a record
costs about 1.8 µs whatever its size, plus about 0.5 µs a KiB, either way).
"""

from __future__ import annotations

import contextlib
import ssl
from typing import TYPE_CHECKING

from enmasse.amqp.wire import Tls
from enmasse.common.certificates import TlsFiles

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer, WriteableBuffer

RECORD_SIZE = 16 * 1024  # a TLS record's plaintext at most: what one read_into() brings
_HEADER = 5  # a TLS record's header: type (1), version (2), length of what follows (2)
_LONGEST = RECORD_SIZE + 2048  # what a header may announce (TLS 1.2's limit; 1.3's is lower)


class TlsFailure(Exception):
    """The client's bytes are not a TLS session we accept (plain AMQP on the TLS port, a bad
    handshake, a certificate we cannot verify, a corrupt record)."""


def mutual_tls(files: TlsFiles) -> Tls:
    """A process's own certificate directory (`enmasse.common.certificates`: tls.crt, tls.key,
    ca.crt) as the `Tls` of its internal AMQP links: it presents tls.crt and trusts ca.crt alone,
    as a listener (a client certificate that CA signed is required) and as a client (the
    server's certificate is verified against it; not its name: every router shares one
    certificate, so the chain says "one of ours", and the mesh's secret which space)."""
    return Tls(cert_file=str(files.cert), key_file=str(files.key), ca_file=str(files.ca))


def server_context(tls: Tls) -> ssl.SSLContext:
    """The SSL context of a listener: its certificate, and the CA its clients' certificates must
    chain to when `tls.ca_file` is set. A bad file is a ValueError at listen() time."""
    if not (tls.cert_file and tls.key_file):
        raise ValueError("a TLS listener needs cert_file and key_file")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(tls.cert_file, tls.key_file, tls.password)
    except (OSError, ssl.SSLError) as err:
        raise ValueError(
            f"cannot load TLS certificate {tls.cert_file} / key {tls.key_file}: {err}"
        ) from err
    if tls.ca_file:
        try:
            context.load_verify_locations(tls.ca_file)
        except (OSError, ssl.SSLError) as err:
            raise ValueError(f"cannot load CA file {tls.ca_file}: {err}") from err
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def client_context(tls: Tls) -> ssl.SSLContext:
    """The SSL context of an outgoing connection, verifying the server as `wire.Tls` says: against
    ca_file (and its name with verify_hostname), or not at all without ca_file."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        if tls.cert_file and tls.key_file:
            context.load_cert_chain(tls.cert_file, tls.key_file, tls.password)
        if tls.ca_file:
            context.load_verify_locations(tls.ca_file)
            context.verify_mode = ssl.CERT_REQUIRED
            context.check_hostname = tls.verify_hostname
    except (OSError, ssl.SSLError) as err:
        raise ValueError(f"cannot load TLS files: {err}") from err
    return context


def _reason(err: ssl.SSLError) -> str:
    verify = getattr(err, "verify_message", None)
    if verify:
        return f"certificate verify failed: {verify}"
    return (err.reason or str(err)).lower().replace("_", " ")


class TlsSession:
    """One connection's TLS, without a socket: bytes in, bytes out. The server's side, or with
    `server_hostname` the client's (which speaks first: `start`)."""

    def __init__(self, context: ssl.SSLContext, *, server_hostname: str | None = None) -> None:
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        client = server_hostname is not None
        self._ssl = context.wrap_bio(
            self._incoming, self._outgoing, server_side=not client, server_hostname=server_hostname
        )
        self.established = False  # the handshake is done: application data may flow
        self.peer_closed = False  # the client sent close_notify: no more data will come
        self.closing = False  # our close_notify is queued: nothing more will be sent
        # Where the client's records end, in ciphertext offsets since the start (see _track):
        # read_into() asks OpenSSL only when a whole record is there to decrypt.
        self._fed = 0  # ciphertext fed so far
        self._next_header = 0  # where the next record's header starts
        self._complete = 0  # the end of the last whole record fed
        self._header = b""  # the start of a header the last feed ended inside of
        self._garbled = False  # a header announced too much: OpenSSL is to say so at once

    def start(self) -> None:
        """The client's first handshake message, waiting in take_output()."""
        with contextlib.suppress(ssl.SSLWantReadError):
            self._ssl.do_handshake()

    def receive(self, ciphertext: bytes) -> bytes:
        """Takes what the socket delivered; returns the plaintext it completes (often b"" while
        the handshake runs). Handshake answers wait in take_output()."""
        self.feed(ciphertext)
        buffer = bytearray(RECORD_SIZE)
        chunks = []
        while got := self.read_into(buffer, RECORD_SIZE):
            chunks.append(bytes(buffer[:got]))
        return b"".join(chunks)

    def feed(self, ciphertext: bytes | memoryview) -> None:
        """Takes what the socket delivered (it is copied, so the caller may reuse the buffer);
        read_into() decrypts it."""
        self._incoming.write(ciphertext)
        self._track(ciphertext)

    def _track(self, data: bytes | memoryview) -> None:
        """Follows the record headers through the ciphertext just fed, so that `_complete`
        says where the last whole record ends. Every TLS version frames its records alike."""
        start = self._fed
        end = self._fed = start + len(data)
        while self._next_header + _HEADER <= end:
            self._complete = self._next_header  # the record before this header is whole
            at = self._next_header - start  # negative: the header began in an earlier feed
            if at >= 0:
                length = data[at + 3] << 8 | data[at + 4]
            else:
                header = self._header + bytes(data[: at + _HEADER])
                length = header[3] << 8 | header[4]
            if length > _LONGEST:
                self._garbled = True  # no TLS; read_into() lets OpenSSL refuse it
                return
            self._next_header += _HEADER + length
        if self._next_header <= end:  # the last record whose header we know is whole too
            self._complete = self._next_header
        if self._next_header >= end:
            self._header = b""  # the feed ended on a boundary or inside a record's body
        elif self._next_header >= start:
            self._header = bytes(data[self._next_header - start :])
        else:
            self._header += bytes(data)

    def read_into(self, buffer: WriteableBuffer, size: int) -> int:
        """Decrypts what feed() brought into buffer, at most size bytes (a writable buffer that
        the caller reuses); returns how many bytes, 0 when nothing more is there until more
        ciphertext comes (or the client closed: peer_closed). Runs the handshake first; its
        answers wait in take_output(). Call again until it returns 0: a record at a time.

        Why so: the hot path of a TLS connection. Decrypting into the caller's buffer makes no
        bytes object per record (a read of n bytes allocates n first), and OpenSSL is asked
        only when a whole record waits (`_track`): a socket read often ends inside a record,
        and asking then costs an exception (SSLWantReadError) each time."""
        if not self.established and not self._handshake():
            return 0
        if self.peer_closed:
            return 0
        # OpenSSL takes from the BIO no further than the record it reads (no read-ahead): if
        # it took all the whole records, what is left is the start of one at most.
        taken = self._fed - self._incoming.pending
        if taken >= self._complete and not self._garbled and not self._ssl.pending():
            return 0
        try:
            # With a buffer, read() returns the count (typeshed says bytes).
            got: int = self._ssl.read(size, buffer)  # type: ignore[assignment]
        except ssl.SSLWantReadError:
            return 0  # a record not complete yet
        except ssl.SSLZeroReturnError:
            got = 0
        except ssl.SSLError as err:
            raise TlsFailure(f"TLS failed: {_reason(err)}") from err
        if not got:
            self.peer_closed = True  # close_notify
        return got

    def _handshake(self) -> bool:
        """Takes the handshake a step on; True once it is done."""
        try:
            self._ssl.do_handshake()
        except ssl.SSLWantReadError:
            return False
        except ssl.SSLError as err:
            raise TlsFailure(f"TLS handshake failed: {_reason(err)}") from err
        self.established = True
        return True

    def send(self, plaintext: ReadableBuffer) -> None:
        """Encrypts plaintext (any buffer, e.g. a memoryview of proton's output: it is not kept),
        only once established; the records wait in take_output()."""
        if not self.closing:
            self._ssl.write(plaintext)

    def take_output(self) -> bytes:
        """Ciphertext to write to the socket, in order (handshake, records, close_notify)."""
        return self._outgoing.read()

    def close(self) -> None:
        """Queues our close_notify (once); we do not wait for the client's."""
        if self.closing:
            return
        self.closing = True
        # close_notify lands in the outgoing BIO; the client's answer is not awaited.
        with contextlib.suppress(ssl.SSLWantReadError, ssl.SSLError):
            self._ssl.unwrap()
