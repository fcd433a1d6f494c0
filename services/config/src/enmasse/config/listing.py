"""Paged reads of the store: List pages and the Watch's list phase, each one consistent snapshot.

In: a List (kind, space, limit, continue_token) or a Watch's list phase (continue_token). Out: one
page of objects under a count and a byte budget with the token of the next page (`list_page`),
or every object one by one with the token that resumes after it (`Snapshot`).

Why pages: a List of 100,000 addresses is tens of MiB, past gRPC's 4 MiB default message and
past what one etcd read should hold in memory. A page is at most `MAX_LIMIT` objects and
`MAX_PAGE_BYTES` (so an answer stays under 4 MiB whatever the objects hold: etcd's own request
limit keeps each one under 1.5 MiB); the store is read `limit` keys at a time.

Why a revision in the token: every page of one list is read at the revision the first page was
read at (etcd keeps history until it is compacted), so the pages are one snapshot however much
is written between them, and an object is listed once, never twice, never missed. Once etcd has
compacted that revision the token is expired: OUT_OF_RANGE, "restart the list" (Kubernetes' 410
Gone). The token is opaque to clients (base64 of the revision, which list it belongs to and
the last key sent); a token of another list, or not a token at all, is INVALID_ARGUMENT. It
grants nothing: the filters of the request (kind, space, the caller's spaces) apply to every
page, and the key it names is that of an object the caller was sent (readable base64: it must
not name another tenant's object).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import grpc
from enmasse.config.store import Compacted, Store
from enmasse.config.writes import Refused
from enmasse.resources.kinds import AnyObject

DEFAULT_LIMIT = 500
"""Objects in a List page when the request gives no `limit`."""
MAX_LIMIT = 1000
"""The most objects in a List page; a larger `limit` is cut to it."""
MAX_PAGE_BYTES = 3 * 1024 * 1024
"""A page ends before the object that would take it past this (gRPC's default limit is 4 MiB)."""
SNAPSHOT_CHUNK = 500
"""Keys read from etcd at a time by a Watch's list phase."""
WATCH_SCOPE = "Watch"


@dataclass(frozen=True)
class Continue:
    """Where a paged read goes on: at `revision`, after the key `after`, of the list `scope`."""

    revision: int
    after: str
    scope: str

    def token(self) -> str:
        # made for every ADDED of a Watch's list phase: plain lines, no JSON (keys hold no "\n")
        raw = f"{self.revision}\n{self.scope}\n{self.after}"
        return base64.urlsafe_b64encode(raw.encode()).decode()

    @classmethod
    def of(cls, token: str, *, scope: str) -> Continue:
        """The token a client sent back; INVALID_ARGUMENT if it is none of ours or of another
        list."""
        try:
            raw = base64.urlsafe_b64decode(token.encode()).decode()
            revision, scope_of, after = raw.split("\n")
            found = cls(revision=int(revision), after=after, scope=scope_of)
        except (binascii.Error, ValueError) as error:
            raise Refused(
                grpc.StatusCode.INVALID_ARGUMENT, "continue_token: not a continue token"
            ) from error
        if found.scope != scope or found.revision <= 0:
            raise Refused(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"continue_token: belongs to another list ({found.scope}), not to {scope}",
            )
        return found


def expired(revision: int) -> Refused:
    """The answer to a token whose revision etcd has compacted away."""
    return Refused(
        grpc.StatusCode.OUT_OF_RANGE,
        f"continue_token expired: store revision {revision} has been compacted; "
        "restart the list without a continue_token",
    )


def limit_of(requested: int) -> int:
    if requested < 0:
        raise Refused(grpc.StatusCode.INVALID_ARGUMENT, "limit must not be negative")
    return min(requested or DEFAULT_LIMIT, MAX_LIMIT)


class Snapshot:
    """Every object of a key range at one revision, read from etcd a chunk at a time.

    `revision` is 0 until the first chunk is read (from a `resume` token: that token's)."""

    def __init__(
        self,
        store: Store,
        *,
        kind: str | None,
        space: str = "",
        scope: str,
        resume: Continue | None = None,
        chunk: int = SNAPSHOT_CHUNK,
    ) -> None:
        self._store = store
        self._kind = kind
        self._space = space
        self._scope = scope
        self._chunk = chunk
        self.revision = resume.revision if resume else 0
        self._after = resume.after if resume else ""

    def token(self, after: str) -> str:
        """The continue token that resumes this snapshot after the key `after`."""
        return Continue(revision=self.revision, after=after, scope=self._scope).token()

    async def objects(self) -> AsyncIterator[tuple[str, AnyObject]]:
        """(key, object) in key order; OUT_OF_RANGE (`expired`) once the revision is compacted."""
        while True:
            try:
                page = await self._store.page(
                    kind=self._kind,
                    space=self._space,
                    after=self._after,
                    revision=self.revision,
                    limit=self._chunk,
                )
            except Compacted as error:
                raise expired(self.revision) from error
            self.revision = page.revision
            for below, obj in page.objects:
                yield below, obj
            if not page.more:
                return
            self._after = page.last


@dataclass
class ListPage:
    items: list[AnyObject]
    revision: int
    continue_token: str


async def list_page(
    store: Store,
    *,
    kind: str,
    space: str,
    limit: int,
    continue_token: str,
    shown: Callable[[AnyObject], AnyObject | None],
) -> ListPage:
    """One page of a List: the objects `shown` returns (None: not for this caller), at most
    `limit_of(limit)` of them and under MAX_PAGE_BYTES, and the token of the next page ("" on
    the last)."""
    scope = f"List/{kind}/{space}"
    resume = Continue.of(continue_token, scope=scope) if continue_token else None
    count = limit_of(limit)
    # one key more than a page: the page ends on seeing the next object, in the same read
    snapshot = Snapshot(store, kind=kind, space=space, scope=scope, resume=resume, chunk=count + 1)
    items: list[AnyObject] = []
    size = 0
    last = resume.after if resume else ""
    async for below, obj in snapshot.objects():
        answer = shown(obj)
        if answer is not None:
            weight = answer.ByteSize()
            if items and (len(items) >= count or size + weight > MAX_PAGE_BYTES):
                return ListPage(items, snapshot.revision, snapshot.token(last))
            items.append(answer)
            size += weight
            # the token names the last object the caller got, never one it may not see: what
            # the filter dropped after it is read again (and dropped again) by the next page
            last = below
    return ListPage(items, snapshot.revision, "")
