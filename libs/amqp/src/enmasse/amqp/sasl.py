"""AMQP's SASL layer, done by us: the server side of listeners that check logins with our code,
and the client side of connections that log in with SCRAM.

What flows in, server side: the first bytes a client sends (the SASL protocol header, a
sasl-init frame naming SCRAM-SHA-512, SCRAM-SHA-256, PLAIN or ANONYMOUS, and for SCRAM a
sasl-response), and an `Authenticator` that says which mechanisms a connection is offered and
knows the users. What flows out: the bytes we answer (our SASL header, sasl-mechanisms, for SCRAM a
sasl-challenge, sasl-outcome), the authenticated user, and whatever the client sent after its
last SASL frame (its AMQP header and open: pipelining clients send them at once), which the
engine then hands to proton as plain AMQP. The client side (`SaslClient`) is the mirror image.

Why it is built so: proton's own server-side SASL checks passwords through Cyrus SASL, i.e.
against a sasldb file of clear-text passwords that Cyrus reads once per process. EnMasse keeps
MessagingUser credentials as a scrypt hash and salted SCRAM keys in its store and changes them at
run time, so a listener takes an `Authenticator` instead, and the engine runs this small state
machine before proton sees a byte (AMQP 1.0 part 5.3; SCRAM per RFC 5802/7677 with `scramp`, the
client-first message in the sasl-init, server-first in a sasl-challenge, client-final in a
sasl-response, server-final in the successful outcome's additional-data).

What a mechanism costs decides where it runs: SCRAM's server side is a few HMACs over stored keys,
so it runs here, on the engine thread; a PLAIN password is checked against a scrypt hash (tens of
milliseconds), which would hold up every other connection, so the exchange hands the credentials
out (`Step.check`), keeps what the client sends meanwhile, and ends when the engine brings the
authenticator's answer back (`checked`). Before either goes on, the engine asks its login throttle
(`throttle`): a SCRAM login waits at `Step.gate` until the engine says `go_on` or `turned_away`.
A user SCRAM does not know is answered with decoy keys, so the exchange fails at the proof, as for
a wrong password, and does not tell who exists.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import scramp
from enmasse.amqp import codec
from enmasse.common.passwords import SCRAM_ITERATIONS, SCRAM_MECHANISMS, ScramKeys

SASL_HEADER = b"AMQP\x03\x01\x00\x00"
AMQP_HEADER = b"AMQP\x00\x01\x00\x00"
_FRAME = struct.Struct(">IBBH")
_SASL_MECHANISMS = 0x40
_SASL_INIT = 0x41
_SASL_CHALLENGE = 0x42
_SASL_RESPONSE = 0x43
_SASL_OUTCOME = 0x44
OK, AUTH_FAILED, SYS_ERROR, SYS_PERM, SYS_TEMP = 0, 1, 2, 3, 4
MAX_SASL_FRAME = 64 * 1024  # SASL frames carry a name, a password or a nonce, not megabytes
PLAIN, ANONYMOUS = "PLAIN", "ANONYMOUS"
CLIENT_MECHANISMS = (*SCRAM_MECHANISMS, PLAIN)  # what a client with a password takes, best first

PasswordCheck = Callable[[str, str], bool]
"""(user, password) -> True to let the client in; may be slow (scrypt)."""


class Authenticator(Protocol):
    """Who may log in on a listener. `check` runs on a login thread of the engine's (it may take
    tens of milliseconds, and may be called from two threads at once); everything else runs on
    the engine thread and must be cheap."""

    def mechanisms(self, *, encrypted: bool) -> tuple[str, ...]:
        """What a new connection is offered, best first (`encrypted`: it came over TLS)."""
        ...

    def recall(self, user: str, password: str) -> bool | None:
        """A PLAIN answer without hashing (a remembered login), or None: `check` must say."""
        ...

    def check(self, user: str, password: str) -> bool:
        """The full PLAIN check."""
        ...

    def scram_keys(self, mechanism: str, user: str) -> ScramKeys | None:
        """The user's stored keys for a SCRAM mechanism; None when it has none."""
        ...


@dataclass(frozen=True)
class Passwords:
    """An `Authenticator` over a password check (and SCRAM keys, if `scram` knows them), with a
    fixed policy: the inter-router secret, tests. PLAIN is offered over TLS, and without it only
    when `allow_plain_without_tls`; ANONYMOUS only when `allow_anonymous`."""

    check: PasswordCheck
    scram: Callable[[str, str], ScramKeys | None] | None = None  # (mechanism, user) -> keys
    allow_anonymous: bool = False
    allow_plain_without_tls: bool = False

    def mechanisms(self, *, encrypted: bool) -> tuple[str, ...]:
        return offered(
            scram=self.scram is not None,
            plain=encrypted or self.allow_plain_without_tls,
            anonymous=self.allow_anonymous,
        )

    def recall(self, user: str, password: str) -> bool | None:
        return None

    def scram_keys(self, mechanism: str, user: str) -> ScramKeys | None:
        return self.scram(mechanism, user) if self.scram is not None else None


def offered(*, scram: bool, plain: bool, anonymous: bool) -> tuple[str, ...]:
    """The mechanism list of a listener, best first."""
    return (
        (SCRAM_MECHANISMS if scram else ())
        + ((PLAIN,) if plain else ())
        + ((ANONYMOUS,) if anonymous else ())
    )


@dataclass
class Step:
    """What the engine does after feeding bytes: send `reply`; when `check` is set, have the
    authenticator check these PLAIN credentials off the engine thread and hand its answer to
    `SaslServer.checked`; when `gate` is set (the user a SCRAM login names), ask the throttle and
    call `go_on` or `turned_away`; when `done`, pass `rest` to proton (succeeded) or close the
    connection with `error` (failed; `wrong`: a password or proof was checked and was wrong,
    which the throttle counts; `turned_away`: refused before any check)."""

    reply: bytes = b""
    done: bool = False
    rest: bytes = b""
    user: str | None = None
    error: str | None = None
    check: tuple[str, str] | None = None
    gate: str | None = None
    wrong: bool = False
    turned_away: bool = False


class SaslError(ValueError):
    """Bytes that are not the SASL frame expected."""


# -- frames ---------------------------------------------------------------------------------------


def _frame(body: bytes) -> bytes:
    return _FRAME.pack(8 + len(body), 2, 1, 0) + body


def _performative(code: int, fields: list[bytes]) -> bytes:
    return _frame(b"\x00\x53" + bytes([code]) + codec._list(fields))


def mechanisms_frame(mechanisms: tuple[str, ...]) -> bytes:
    """sasl-mechanisms: the mechanisms we offer, as an array of symbols."""
    names = [m.encode("ascii") for m in mechanisms]
    elements = b"".join(bytes([len(n)]) + n for n in names)
    array = b"\xe0" + bytes([2 + len(elements), len(names)]) + b"\xa3" + elements
    return _frame(b"\x00\x53\x40" + b"\xc0" + bytes([1 + len(array), 1]) + array)


def outcome_frame(code: int, additional: bytes | None = None) -> bytes:
    """sasl-outcome with `code` (0 ok, 1 authentication failed, 2 system error, 4 temporary)."""
    if additional is None:
        return _frame(b"\x00\x53\x44\xc0\x03\x01\x50" + bytes([code]))
    return _performative(_SASL_OUTCOME, [b"\x50" + bytes([code]), codec._enc(additional)])


def init_frame(mechanism: str, response: bytes) -> bytes:
    """sasl-init: the chosen mechanism and its initial response."""
    return _performative(_SASL_INIT, [codec._symbol(mechanism), codec._enc(response)])


def challenge_frame(challenge: bytes) -> bytes:
    return _performative(_SASL_CHALLENGE, [codec._enc(challenge)])


def response_frame(response: bytes) -> bytes:
    return _performative(_SASL_RESPONSE, [codec._enc(response)])


def parse_frame(body: bytes) -> tuple[int, list[object]]:
    """(performative code, its fields) of a SASL frame body."""
    if body[:2] != b"\x00\x53" or len(body) < 4:
        raise codec.CodecError("expected a SASL performative")
    first, count, _end = codec._list_fields(body, 3)
    fields, pos = [], first
    for _ in range(count):
        value, pos = codec._read(body, pos)
        fields.append(value)
    return body[2], fields


def parse_init(body: bytes) -> tuple[str, bytes]:
    """(mechanism, initial response) of a sasl-init frame body."""
    code, fields = parse_frame(body)
    if code != _SASL_INIT:
        raise codec.CodecError("expected a sasl-init frame")
    if not fields:
        raise codec.CodecError("sasl-init without a mechanism")
    mechanism, response = fields[0], fields[1] if len(fields) > 1 else b""
    if not isinstance(mechanism, str) or not isinstance(response, bytes | None):
        raise codec.CodecError("sasl-init fields have the wrong types")
    return mechanism, response or b""


def _binary(fields: list[object], index: int, what: str) -> bytes:
    value = fields[index] if len(fields) > index else None
    if not isinstance(value, bytes | None):
        raise codec.CodecError(f"{what} is not binary")
    return value or b""


def symbols_of(raw: object) -> tuple[str, ...]:
    """A symbol or an array of symbols (as codec._read leaves it: raw bytes) as a tuple."""
    if isinstance(raw, str):
        return (raw,)
    if not isinstance(raw, bytes) or not raw:
        return ()
    if raw[0] == 0xE0:
        count, pos = raw[2], 3
    elif raw[0] == 0xF0:
        count, pos = int.from_bytes(raw[5:9], "big"), 9
    else:
        raise codec.CodecError("sasl-mechanisms is not a symbol array")
    constructor, pos = raw[pos], pos + 1
    width = 1 if constructor == 0xA3 else 4
    if constructor not in (0xA3, 0xB3):
        raise codec.CodecError("sasl-mechanisms is not a symbol array")
    names = []
    for _ in range(count):
        size = int.from_bytes(raw[pos : pos + width], "big")
        names.append(raw[pos + width : pos + width + size].decode("ascii"))
        pos += width + size
    return tuple(names)


def plain_credentials(response: bytes) -> tuple[str, str]:
    """PLAIN's initial response (RFC 4616): authzid NUL authcid NUL password -> (user, password)."""
    parts = response.split(b"\x00")
    if len(parts) != 3:
        raise codec.CodecError("malformed PLAIN response")
    return parts[1].decode(), parts[2].decode()


class _Frames:
    """Frames cut from a byte stream, after its SASL protocol header."""

    def __init__(self) -> None:
        self.buffer = b""
        self.header_seen = False

    def header(self) -> bool | None:
        """True once the SASL header came, False if something else came, None: wait."""
        if self.header_seen:
            return True
        if len(self.buffer) < len(SASL_HEADER):
            return None
        if self.buffer[:8] != SASL_HEADER:
            return False
        self.header_seen = True
        self.buffer = self.buffer[8:]
        return True

    def next(self) -> bytes | None:
        """The next whole frame's body; None: not all of it is here yet."""
        if len(self.buffer) < 8:
            return None
        size, doff, frame_type, _channel = _FRAME.unpack_from(self.buffer)
        if frame_type != 1 or size < 8 or size > MAX_SASL_FRAME or doff < 2:
            raise SaslError("malformed SASL frame")
        if len(self.buffer) < size:
            return None
        body, self.buffer = self.buffer[doff * 4 : size], self.buffer[size:]
        return body

    def rest(self) -> bytes:
        rest, self.buffer = self.buffer, b""
        return rest


_MALFORMED = (codec.CodecError, SaslError, UnicodeError, IndexError, scramp.ScramException)
_DECOY_KEY = secrets.token_bytes(32)


def decoy_keys(mechanism: str, user: str) -> ScramKeys:
    """Keys for a user SCRAM does not know: the same salt each time the name is asked (a fresh
    one would tell it apart), keys no password matches."""
    salt = hmac.new(_DECOY_KEY, f"{mechanism}\0{user}".encode(), hashlib.sha256).digest()[:16]
    return ScramKeys(
        mechanism, salt, SCRAM_ITERATIONS, secrets.token_bytes(64), secrets.token_bytes(64)
    )


# -- the server side ------------------------------------------------------------------------------


class SaslServer:
    """One connection's SASL exchange, fed with the client's bytes as they arrive."""

    def __init__(self, authenticator: Authenticator, *, encrypted: bool) -> None:
        self.authenticator = authenticator
        self.mechanisms = authenticator.mechanisms(encrypted=encrypted)
        self.mechanism: str | None = None
        self.user: str | None = None  # the user the login names, once known
        self._frames = _Frames()
        self._held: bytes | None = None  # while the engine decides: what the client sent since
        self._scram: scramp.ScramServer | None = None

    def feed(self, data: bytes) -> Step:
        if self._held is not None:
            # A pipelining client's AMQP header and open, while its login is being decided.
            self._held += data
            return Step()
        self._frames.buffer += data
        reply = b""
        if not self._frames.header_seen:
            seen = self._frames.header()
            if seen is None:
                return Step()
            if not seen:
                # Plain AMQP (or garbage) where authentication is required: say we speak SASL.
                return Step(reply=SASL_HEADER, done=True, error="SASL is required")
            reply = SASL_HEADER + mechanisms_frame(self.mechanisms)
        return self._go(reply)

    def _go(self, reply: bytes) -> Step:
        try:
            body = self._frames.next()
            if body is None:
                return Step(reply=reply)
            if self._scram is not None:
                return self._scram_final(reply, body)
            return self._init(reply, body)
        except _MALFORMED as err:
            return Step(reply=reply + outcome_frame(SYS_ERROR), done=True, error=str(err))

    def _init(self, reply: bytes, body: bytes) -> Step:
        mechanism, response = parse_init(body)
        self.mechanism = mechanism
        if mechanism not in self.mechanisms:
            return self._failed(reply, wrong=False)
        if mechanism == PLAIN:
            self.user, password = plain_credentials(response)
            self._held = self._frames.rest()
            return Step(reply=reply, check=(self.user, password))
        if mechanism == ANONYMOUS:
            rest = self._frames.rest()
            return Step(reply=reply + outcome_frame(OK), done=True, rest=rest, user="anonymous")
        server = scramp.ScramMechanism(mechanism).make_server(self._keys_of)
        server.set_client_first(response.decode())
        self._scram = server
        self._held = b""  # the client waits for our challenge: anything it sends is early
        return Step(reply=reply, gate=self.user)

    def _keys_of(self, user: str) -> tuple[bytes, bytes, bytes, int]:
        """scramp's auth_fn: the named user's keys (decoys for one we do not know)."""
        assert self.mechanism is not None
        self.user = user
        keys = self.authenticator.scram_keys(self.mechanism, user) or decoy_keys(
            self.mechanism, user
        )
        return keys.salt, keys.stored_key, keys.server_key, keys.iterations

    def go_on(self) -> Step:
        """The engine let the SCRAM login named at `Step.gate` go on: our challenge."""
        assert self._scram is not None, "go_on() without a gate"
        assert self._held is not None, "go_on() without a gate"
        self._frames.buffer += self._held
        self._held = None
        try:
            challenge = challenge_frame(self._scram.get_server_first().encode())
        except _MALFORMED as err:
            return Step(reply=outcome_frame(SYS_ERROR), done=True, error=str(err))
        return self._go(challenge)

    def _scram_final(self, reply: bytes, body: bytes) -> Step:
        assert self._scram is not None
        code, fields = parse_frame(body)
        if code != _SASL_RESPONSE:
            raise SaslError("expected a sasl-response frame")
        try:
            self._scram.set_client_final(_binary(fields, 0, "sasl-response").decode())
            final = self._scram.get_server_final()
        except scramp.ScramException:
            return self._failed(reply, wrong=True)
        rest = self._frames.rest()
        outcome = outcome_frame(OK, final.encode())
        return Step(reply=reply + outcome, done=True, rest=rest, user=self.user)

    def checked(self, allowed: bool, *, failure: str | None = None) -> Step:
        """Ends the exchange with the authenticator's answer to `Step.check` (`failure`: it
        raised, which denies: a broken authenticator does not let anyone in)."""
        assert self._held is not None, "checked() without a check asked"
        rest, self._held = self._held, None
        if failure is not None:
            error = f"authenticator failed: {failure}"
            return Step(reply=outcome_frame(SYS_ERROR), done=True, error=error)
        if not allowed:
            return self._failed(b"", wrong=True)
        return Step(reply=outcome_frame(OK), done=True, rest=rest, user=self.user)

    def turned_away(self, reason: str) -> Step:
        """Ends the exchange before the login is checked (the throttle said no): a temporary
        refusal (sasl-code sys-temp), with `reason` for the server's log and the connection."""
        self._held = None
        self._scram = None
        return Step(reply=outcome_frame(SYS_TEMP), done=True, error=reason, turned_away=True)

    def _failed(self, reply: bytes, *, wrong: bool) -> Step:
        error = _failed(self.mechanism)
        return Step(reply=reply + outcome_frame(AUTH_FAILED), done=True, error=error, wrong=wrong)


def _failed(mechanism: str | None) -> str:
    return f"Authentication failed [mech={mechanism or 'none'}]"


# -- the client side ------------------------------------------------------------------------------


class SaslClient:
    """One outgoing connection's SASL exchange: the first of `mechanisms` the server offers,
    with `user` and `password` (ANONYMOUS needs neither). `start` is what to send first."""

    start = SASL_HEADER

    def __init__(self, *, mechanisms: tuple[str, ...], user: str, password: str) -> None:
        self.mechanisms = mechanisms
        self.user = user
        self.password = password
        self.mechanism: str | None = None
        self._frames = _Frames()
        self._scram: scramp.ScramClient | None = None

    def feed(self, data: bytes) -> Step:
        self._frames.buffer += data
        seen = self._frames.header()
        if seen is None:
            return Step()
        if not seen:
            return Step(done=True, error="the peer does not speak SASL")
        replies = b""
        try:
            while (body := self._frames.next()) is not None:
                step = self._answer(body)
                replies += step.reply
                if step.done:
                    step.reply = replies
                    return step
        except _MALFORMED as err:
            return Step(done=True, error=f"{_failed(self.mechanism)}: {err}")
        return Step(reply=replies)

    def _answer(self, body: bytes) -> Step:
        code, fields = parse_frame(body)
        if code == _SASL_MECHANISMS:
            return self._choose(symbols_of(fields[0] if fields else None))
        if code == _SASL_CHALLENGE and self._scram is not None:
            self._scram.set_server_first(_binary(fields, 0, "sasl-challenge").decode())
            return Step(reply=response_frame(self._scram.get_client_final().encode()))
        if code == _SASL_OUTCOME:
            return self._outcome(fields)
        raise SaslError(f"unexpected SASL frame 0x{code:02x}")

    def _choose(self, offered: tuple[str, ...]) -> Step:
        chosen = next((m for m in self.mechanisms if m in offered), None)
        if chosen is None:
            return Step(done=True, error=_failed(None))
        self.mechanism = chosen
        if chosen == PLAIN:
            response = b"\x00" + self.user.encode() + b"\x00" + self.password.encode()
        elif chosen == ANONYMOUS:
            response = b""
        else:
            self._scram = scramp.ScramClient([chosen], self.user, self.password)
            response = self._scram.get_client_first().encode()
        return Step(reply=init_frame(chosen, response))

    def _outcome(self, fields: list[object]) -> Step:
        code = fields[0] if fields else None
        if code != OK:
            why = ": turned away for now, try again later" if code == SYS_TEMP else ""
            return Step(done=True, error=_failed(self.mechanism) + why)
        if self._scram is not None:
            try:
                self._scram.set_server_final(_binary(fields, 1, "additional-data").decode())
            except scramp.ScramException:
                error = f"{_failed(self.mechanism)}: the server did not prove it knows the password"
                return Step(done=True, error=error)
        user = self.user if self.mechanism != ANONYMOUS else "anonymous"
        return Step(done=True, rest=self._frames.rest(), user=user)
