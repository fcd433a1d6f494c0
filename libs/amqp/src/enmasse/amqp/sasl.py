"""The server side of AMQP's SASL layer, done by us so that passwords are checked by our code.

What flows in: the first bytes a client sends (the SASL protocol header, then a sasl-init frame
with mechanism PLAIN or ANONYMOUS). What flows out: the bytes we answer (our SASL header, the
sasl-mechanisms frame, the sasl-outcome frame), the authenticated user, and whatever the client
sent after its sasl-init (its AMQP header and open: pipelining clients send them at once), which
the engine then hands to proton as plain AMQP.

Why it is built so: proton's own server-side SASL checks passwords through Cyrus SASL, i.e.
against a sasldb file of clear-text passwords that Cyrus reads once per process. EnMasse keeps
MessagingUser passwords as hashes in its store and changes them at run time, so a listener takes
an `authenticator(user, password) -> bool` instead, and the engine runs this small state machine
before proton sees a byte (AMQP 1.0 part 5.3: a five-frame exchange, nothing to negotiate beyond
the mechanism). Clients need nothing special: proton's client SASL (and ours) speak PLAIN.

A PLAIN password is not checked here: checking a hash costs tens of milliseconds, and on the
engine's thread it would hold up every other connection for that long. The exchange hands the
credentials out (`Step.check`), keeps what the client sends meanwhile, and ends when the engine
brings the authenticator's answer back (`checked`).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass

from enmasse.amqp import codec

SASL_HEADER = b"AMQP\x03\x01\x00\x00"
AMQP_HEADER = b"AMQP\x00\x01\x00\x00"
_FRAME = struct.Struct(">IBBH")
_SASL_MECHANISMS = 0x40
_SASL_INIT = 0x41
_SASL_OUTCOME = 0x44
OK, AUTH_FAILED, SYS_ERROR = 0, 1, 2
MAX_SASL_FRAME = 64 * 1024  # a sasl-init carries a user name and a password, not megabytes

Authenticator = Callable[[str, str], bool]
"""(user, password) -> True to let the client in. The engine calls it on a worker thread of its
own, so a slow check (scrypt: tens of milliseconds) holds up no other connection; it may be
called from two threads at once."""


@dataclass
class Step:
    """What the engine does after feeding bytes: send `reply`; when `check` is set, have the
    authenticator check these PLAIN credentials off the engine thread and hand its answer to
    `SaslServer.checked`; when `done`, pass `rest` to proton (succeeded) or close the connection
    with `error` (failed)."""

    reply: bytes = b""
    done: bool = False
    rest: bytes = b""
    user: str | None = None
    error: str | None = None
    check: tuple[str, str] | None = None


def _frame(body: bytes) -> bytes:
    return _FRAME.pack(8 + len(body), 2, 1, 0) + body


def mechanisms_frame(mechanisms: tuple[str, ...]) -> bytes:
    """sasl-mechanisms: the mechanisms we offer, as an array of symbols."""
    names = [m.encode("ascii") for m in mechanisms]
    elements = b"".join(bytes([len(n)]) + n for n in names)
    array = b"\xe0" + bytes([2 + len(elements), len(names)]) + b"\xa3" + elements
    return _frame(b"\x00\x53\x40" + b"\xc0" + bytes([1 + len(array), 1]) + array)


def outcome_frame(code: int) -> bytes:
    """sasl-outcome with `code` (0 ok, 1 authentication failed, 2 system error)."""
    return _frame(b"\x00\x53\x44\xc0\x03\x01\x50" + bytes([code]))


def parse_init(body: bytes) -> tuple[str, bytes]:
    """(mechanism, initial response) of a sasl-init frame body."""
    if body[:3] != b"\x00\x53\x41":
        raise codec.CodecError("expected a sasl-init frame")
    first, count, _end = codec._list_fields(body, 3)
    if count < 1:
        raise codec.CodecError("sasl-init without a mechanism")
    mechanism, pos = codec._read(body, first)
    response: object = b""
    if count >= 2:
        response, pos = codec._read(body, pos)
    if not isinstance(mechanism, str) or not isinstance(response, bytes | None):
        raise codec.CodecError("sasl-init fields have the wrong types")
    return mechanism, response or b""


def plain_credentials(response: bytes) -> tuple[str, str]:
    """PLAIN's initial response (RFC 4616): authzid NUL authcid NUL password -> (user, password)."""
    parts = response.split(b"\x00")
    if len(parts) != 3:
        raise codec.CodecError("malformed PLAIN response")
    return parts[1].decode(), parts[2].decode()


class SaslServer:
    """One connection's SASL exchange, fed with the client's bytes as they arrive."""

    def __init__(self, authenticator: Authenticator | None, *, allow_anonymous: bool) -> None:
        self.authenticator = authenticator
        self.allow_anonymous = allow_anonymous
        self.mechanisms = (("PLAIN",) if authenticator else ()) + (
            ("ANONYMOUS",) if allow_anonymous else ()
        )
        self.buffer = b""
        self.header_seen = False
        self._checking: tuple[str, bytes] | None = None  # (user, what followed the sasl-init)

    def feed(self, data: bytes) -> Step:
        if self._checking is not None:
            # A pipelining client's AMQP header and open, while its password is being checked.
            user, rest = self._checking
            self._checking = (user, rest + data)
            return Step()
        self.buffer += data
        if not self.header_seen:
            if len(self.buffer) < len(SASL_HEADER):
                return Step()
            if self.buffer[:8] != SASL_HEADER:
                # Plain AMQP (or garbage) where authentication is required: say we speak SASL.
                return Step(reply=SASL_HEADER, done=True, error="SASL is required")
            self.header_seen = True
            self.buffer = self.buffer[8:]
            return self._init(reply=SASL_HEADER + mechanisms_frame(self.mechanisms))
        return self._init(reply=b"")

    def _init(self, *, reply: bytes) -> Step:
        if len(self.buffer) < 8:
            return Step(reply=reply)
        size, doff, frame_type, _channel = _FRAME.unpack_from(self.buffer)
        if frame_type != 1 or size < 8 or size > MAX_SASL_FRAME or doff < 2:
            return Step(reply=reply, done=True, error="malformed SASL frame")
        if len(self.buffer) < size:
            return Step(reply=reply)
        body, rest = self.buffer[doff * 4 : size], self.buffer[size:]
        self.buffer = b""
        try:
            mechanism, response = parse_init(body)
            if mechanism == "PLAIN" and self.authenticator is not None:
                user, password = plain_credentials(response)
                self._checking = (user, rest)
                return Step(reply=reply, check=(user, password))
        except (codec.CodecError, UnicodeDecodeError, IndexError) as err:
            return Step(reply=reply + outcome_frame(SYS_ERROR), done=True, error=str(err))
        if mechanism == "ANONYMOUS" and self.allow_anonymous:
            return Step(reply=reply + outcome_frame(OK), done=True, rest=rest, user="anonymous")
        return Step(reply=reply + outcome_frame(AUTH_FAILED), done=True, error=_failed(mechanism))

    def checked(self, allowed: bool, *, failure: str | None = None) -> Step:
        """Ends the exchange with the authenticator's answer to `Step.check` (`failure`: it
        raised, which denies: a broken authenticator does not let anyone in)."""
        assert self._checking is not None, "checked() without a check asked"
        user, rest = self._checking
        self._checking = None
        if failure is not None:
            error = f"authenticator failed: {failure}"
            return Step(reply=outcome_frame(SYS_ERROR), done=True, error=error)
        if not allowed:
            return Step(reply=outcome_frame(AUTH_FAILED), done=True, error=_failed("PLAIN"))
        return Step(reply=outcome_frame(OK), done=True, rest=rest, user=user)


def _failed(mechanism: str) -> str:
    return f"Authentication failed [mech={mechanism}]"
