"""Access tokens: made, checked, listed and revoked; the secret shown once, only its hash kept.

In: the `authorization: Bearer <secret>` metadata of a call (`Authenticator.identify`), an admin's
CreateToken / RevokeToken, and at start the bootstrap token file `enmasse up` writes. Out: the
caller's `Identity` (name, role, spaces) or UNAUTHENTICATED with why (no credentials, unknown,
expired, revoked); new and revoked token records in the store (`Store.put_token`).

Why sha256 and not scrypt, as for messaging users' passwords: a token is 32 random bytes
(`secrets.token_urlsafe`), not something a person chose, so there is no dictionary to try and
no slow hash is needed to make guessing from a stolen store hopeless; a fast hash lets every call
be checked without spending tens of milliseconds of CPU on it.

A token's record is read from etcd on a call and kept for `cache_seconds` (1 s), so a revoke on
another config instance takes effect within that; on this instance at once (`forget`). Expiry
is checked on every call against the clock.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import time
from collections.abc import Callable, Iterable

import grpc
import structlog
from enmasse.config.access import ADMIN, SCOPED_ROLES, TOKEN_ROLES, Identity
from enmasse.config.store import Store
from enmasse.config.writes import Refused
from enmasse.v1 import config_pb2
from google.protobuf import timestamp_pb2

log = structlog.get_logger(__name__)

BOOTSTRAP_NAME = "admin"
_NAME = re.compile(r"^[a-z0-9]([a-z0-9.-]{0,61}[a-z0-9])?$")
_CACHE_LIMIT = 10_000


def new_secret() -> str:
    """A fresh token: 32 random bytes, URL-safe text (43 characters)."""
    return secrets.token_urlsafe(32)


def digest_of(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def bearer_of(metadata: Iterable[tuple[str, str | bytes]]) -> str:
    """The secret of the call's `authorization: Bearer <secret>`; Refused (UNAUTHENTICATED)
    when the call carries none or another scheme."""
    values = [str(value) for key, value in metadata if key.lower() == "authorization"]
    if not values:
        raise Refused(
            grpc.StatusCode.UNAUTHENTICATED,
            "no credentials: call with the metadata 'authorization: Bearer <token>'",
        )
    scheme, _, secret = values[0].partition(" ")
    if scheme.lower() != "bearer" or not secret.strip():
        raise Refused(
            grpc.StatusCode.UNAUTHENTICATED, "the authorization metadata must be 'Bearer <token>'"
        )
    return secret.strip()


def identity_of(token: config_pb2.Token | None, *, now: float) -> Identity:
    """Who a stored token is, if it may still be used; else Refused (UNAUTHENTICATED)."""
    if token is None:
        raise Refused(grpc.StatusCode.UNAUTHENTICATED, "unknown token")
    if token.revoked:
        raise Refused(grpc.StatusCode.UNAUTHENTICATED, f"token '{token.name}' has been revoked")
    if expired(token, now=now):
        when = token.expires_at.ToDatetime().isoformat(timespec="seconds")
        raise Refused(grpc.StatusCode.UNAUTHENTICATED, f"token '{token.name}' expired at {when}Z")
    return Identity(name=token.name, role=token.role, spaces=frozenset(token.spaces))


def expired(token: config_pb2.Token, *, now: float) -> bool:
    return token.HasField("expires_at") and token.expires_at.ToNanoseconds() <= now * 1e9


def check_request(request: config_pb2.CreateTokenRequest) -> None:
    """Refused (INVALID_ARGUMENT) unless the request names a token that can exist."""
    if not _NAME.match(request.name):
        raise Refused(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"name: '{request.name}' must be lower-case letters, digits, '-' or '.' "
            "(at most 63, starting and ending with a letter or digit)",
        )
    if request.role not in TOKEN_ROLES:
        raise Refused(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"role: '{request.role}' is not a role (one of {', '.join(TOKEN_ROLES)})",
        )
    if request.role in SCOPED_ROLES and not request.spaces:
        raise Refused(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"spaces: a {request.role} token needs at least one address space",
        )
    if request.role not in SCOPED_ROLES and request.spaces:
        raise Refused(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"spaces: a {request.role} token covers every space; give none",
        )
    if request.expires_in_seconds < 0:
        raise Refused(grpc.StatusCode.INVALID_ARGUMENT, "expires_in_seconds must not be negative")


def token_of(
    request: config_pb2.CreateTokenRequest, *, created_by: str, now: float
) -> config_pb2.Token:
    token = config_pb2.Token(
        name=request.name,
        role=request.role,
        spaces=sorted(set(request.spaces)),
        created_at=_stamp(now),
        created_by=created_by,
    )
    if request.expires_in_seconds:
        token.expires_at.CopyFrom(_stamp(now + request.expires_in_seconds))
    return token


def _stamp(seconds: float) -> timestamp_pb2.Timestamp:
    stamp = timestamp_pb2.Timestamp()
    stamp.FromNanoseconds(int(seconds * 1e9))
    return stamp


class Authenticator:
    """Bearer tokens -> identities, against the store (with a short cache)."""

    def __init__(
        self,
        store: Store,
        *,
        clock: Callable[[], float] = time.time,
        cache_seconds: float = 1.0,
    ) -> None:
        self._store = store
        self._clock = clock
        self._cache_seconds = cache_seconds
        self._cache: dict[str, tuple[config_pb2.Token, float]] = {}

    async def identify(self, metadata: Iterable[tuple[str, str | bytes]]) -> Identity:
        digest = digest_of(bearer_of(metadata))
        return identity_of(await self._record(digest), now=self._clock())

    def forget(self) -> None:
        """Drops what the cache holds (after a revoke or replace on this instance)."""
        self._cache.clear()

    async def _record(self, digest: str) -> config_pb2.Token | None:
        now = time.monotonic()
        cached = self._cache.get(digest)
        if cached is not None and now - cached[1] < self._cache_seconds:
            return cached[0]
        token = await self._store.token(digest)
        if token is not None:  # unknown ones are not kept: a flood of guesses must not grow it
            if len(self._cache) >= _CACHE_LIMIT:
                self._cache.clear()
            self._cache[digest] = (token, now)
        return token

    # ------------------------------------------------------------ the admin's verbs

    async def create(
        self, request: config_pb2.CreateTokenRequest, *, created_by: str
    ) -> config_pb2.CreateTokenResponse:
        check_request(request)
        token = token_of(request, created_by=created_by, now=self._clock())
        secret = new_secret()
        replacing = await self._store.token_digest(request.name)
        if replacing[1] and not request.replace:
            raise Refused(
                grpc.StatusCode.ALREADY_EXISTS,
                f"token '{request.name}' already exists (revoke it, or create it with replace)",
            )
        if not await self._store.put_token(token, digest=digest_of(secret), replacing=replacing):
            raise Refused(
                grpc.StatusCode.ABORTED, f"token '{request.name}' changed meanwhile; retry"
            )
        self.forget()
        return config_pb2.CreateTokenResponse(token=token, secret=secret)

    async def revoke(self, name: str) -> config_pb2.Token:
        digest, _revision = await self._store.token_digest(name)
        token = await self._store.token(digest) if digest else None
        if token is None:
            raise Refused(grpc.StatusCode.NOT_FOUND, f"token '{name}' not found")
        token.revoked = True
        await self._store.save_token(token, digest=digest)
        self.forget()
        return token

    async def list(self) -> list[config_pb2.Token]:
        return await self._store.tokens()


async def bootstrap_admin(store: Store, *, secret: str, now: float) -> bool:
    """Stores `secret` (the bootstrap token file's) as the admin token `admin`, unless an admin
    token that can still be used exists; whether it stored it. So a fresh store is never open,
    and the file cannot bring back an admin token an admin revoked while another one lives."""
    tokens = await store.tokens()
    if any(t.role == ADMIN and not t.revoked and not expired(t, now=now) for t in tokens):
        return False
    request = config_pb2.CreateTokenRequest(name=BOOTSTRAP_NAME, role=ADMIN)
    token = token_of(request, created_by="bootstrap", now=now)
    replacing = await store.token_digest(BOOTSTRAP_NAME)
    stored = await store.put_token(token, digest=digest_of(secret), replacing=replacing)
    if stored:
        log.info("stored the bootstrap admin token", name=BOOTSTRAP_NAME)
    return stored
