"""Messaging-user passwords: salted scrypt hashes in, never the password out.

In: the clear password of a `MessagingUser` create or update. Out: the string stored in
`spec.password_hash`, `scrypt$<n>$<r>$<p>$<salt b64>$<hash b64>`, self-describing so that the
cost can be raised later without breaking stored users, and checkable by `verify` (Apply uses it to
tell an unchanged manifest, which carries the password in clear, from a changed one).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets

_N, _R, _P = 2**14, 8, 1


def hash_password(password: str) -> str:
    salt = secrets.token_bytes(16)
    digest = hashlib.scrypt(password.encode(), salt=salt, n=_N, r=_R, p=_P, dklen=32)
    return f"scrypt${_N}${_R}${_P}${_b64(salt)}${_b64(digest)}"


def verify_password(password: str, stored: str) -> bool:
    try:
        scheme, n, r, p, salt, digest = stored.split("$")
    except ValueError:
        return False
    if scheme != "scrypt":
        return False
    expected = base64.b64decode(digest)
    actual = hashlib.scrypt(
        password.encode(),
        salt=base64.b64decode(salt),
        n=int(n),
        r=int(r),
        p=int(p),
        dklen=len(expected),
    )
    return hmac.compare_digest(actual, expected)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()
