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
"""

from __future__ import annotations

import contextlib
import ssl

from enmasse.amqp.wire import Tls
from enmasse.common.certificates import TlsFiles

_READ_CHUNK = 256 * 1024


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

    def start(self) -> None:
        """The client's first handshake message, waiting in take_output()."""
        with contextlib.suppress(ssl.SSLWantReadError):
            self._ssl.do_handshake()

    def receive(self, ciphertext: bytes) -> bytes:
        """Takes what the socket delivered; returns the plaintext it completes (often b"" while
        the handshake runs). Handshake answers wait in take_output()."""
        self._incoming.write(ciphertext)
        if not self.established:
            try:
                self._ssl.do_handshake()
            except ssl.SSLWantReadError:
                return b""
            except ssl.SSLError as err:
                raise TlsFailure(f"TLS handshake failed: {_reason(err)}") from err
            self.established = True
        chunks = []
        while not self.peer_closed:
            try:
                chunk = self._ssl.read(_READ_CHUNK)
            except ssl.SSLWantReadError:
                break
            except ssl.SSLZeroReturnError:
                self.peer_closed = True
                break
            except ssl.SSLError as err:
                raise TlsFailure(f"TLS failed: {_reason(err)}") from err
            if not chunk:
                self.peer_closed = True
                break
            chunks.append(chunk)
        return b"".join(chunks)

    def send(self, plaintext: bytes) -> None:
        """Encrypts plaintext (only once established); the records wait in take_output()."""
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
