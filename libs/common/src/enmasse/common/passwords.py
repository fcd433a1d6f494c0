"""Messaging-user password hashes, shared by whoever stores them and whoever checks them.

In: a clear password (a MessagingUser create, or a client's SASL PLAIN login at a router). Out:
the stored form `scrypt$<n>$<r>$<p>$<salt b64>$<hash b64>` (self-describing, so the cost can be
raised later without breaking stored users), or whether a password matches such a string.

Why here: the config service hashes (and `Apply` uses `verify_password` to tell an unchanged
manifest, which carries the password in clear, from a changed one) and the router checks logins
against the hashes the router-agent passes it; a router image must not carry the config service
to do so. A malformed stored string never matches and never raises.

Beside the scrypt hash (what SASL PLAIN is checked against), a password gives SCRAM keys
(`scram_keys`: RFC 5802 / 7677, derived by `scramp`, one per mechanism in `SCRAM_MECHANISMS`): a
salt, an iteration count, the stored key and the server key. A SCRAM server needs only those to
check a login (a few HMACs, no key derivation), and they cannot be replayed as a password; they
still let whoever holds them pose as the server, so they are secrets like the hash.
`scram_credentials` gives them as the MessagingUser stores them, one per mechanism.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
from dataclasses import dataclass, field

import scramp
from enmasse.v1 import resources_pb2

SCHEME = "scrypt"
_N, _R, _P = 2**14, 8, 1
SCRAM_MECHANISMS = ("SCRAM-SHA-512", "SCRAM-SHA-256")  # best first, as a server offers them
SCRAM_ITERATIONS = 4096  # RFC 7677's minimum, and scramp's: a client derives once per login


@dataclass(frozen=True)
class ScramKeys:
    """What a SCRAM server keeps of one user's password for one mechanism (RFC 5802 section 3)."""

    mechanism: str
    salt: bytes = field(repr=False)
    iterations: int
    stored_key: bytes = field(repr=False)
    server_key: bytes = field(repr=False)


def scram_keys(password: str, *, mechanism: str, iterations: int = SCRAM_ITERATIONS) -> ScramKeys:
    """Fresh salt, then the keys scramp derives from `password` (ValueError: unknown mechanism
    or too few iterations)."""
    if mechanism not in SCRAM_MECHANISMS:
        raise ValueError(f"unknown SCRAM mechanism {mechanism!r}")
    try:
        salt, stored_key, server_key, rounds = scramp.ScramMechanism(mechanism).make_auth_info(
            password, iteration_count=iterations
        )
    except scramp.ScramException as error:
        raise ValueError(str(error)) from error
    return ScramKeys(mechanism, salt, rounds, stored_key, server_key)


def scram_credentials(password: str) -> list[resources_pb2.ScramCredential]:
    """The salted SCRAM keys of `password` for every mechanism, as a MessagingUser stores them."""
    return [
        resources_pb2.ScramCredential(
            mechanism=keys.mechanism,
            salt=keys.salt,
            iterations=keys.iterations,
            stored_key=keys.stored_key,
            server_key=keys.server_key,
        )
        for keys in (scram_keys(password, mechanism=m) for m in SCRAM_MECHANISMS)
    ]


def hash_password(password: str) -> str:
    salt = secrets.token_bytes(16)
    digest = hashlib.scrypt(password.encode(), salt=salt, n=_N, r=_R, p=_P, dklen=32)
    return f"{SCHEME}${_N}${_R}${_P}${_b64(salt)}${_b64(digest)}"


def is_password_hash(stored: str) -> bool:
    """True when `stored` has the shape `verify_password` can check."""
    return _parse(stored) is not None


def verify_password(password: str, stored: str) -> bool:
    parsed = _parse(stored)
    if parsed is None:
        return False
    n, r, p, salt, expected = parsed
    try:
        actual = hashlib.scrypt(password.encode(), salt=salt, n=n, r=r, p=p, dklen=len(expected))
    except (ValueError, MemoryError):  # parameters OpenSSL refuses: not a match
        return False
    return hmac.compare_digest(actual, expected)


def _parse(stored: str) -> tuple[int, int, int, bytes, bytes] | None:
    try:
        scheme, n, r, p, salt, digest = stored.split("$")
        parsed = (int(n), int(r), int(p), base64.b64decode(salt), base64.b64decode(digest))
    except (ValueError, binascii.Error):
        return None
    if scheme != SCHEME or min(parsed[:3]) < 1 or not parsed[4]:
        return None
    return parsed


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()
