"""Watch that never lies: etcd's revision-ordered change stream, filtered and resumable.

In: a `WatchRequest` (kinds, space, resource_version). Out: `WatchEvent`s.

- resource_version 0: ADDED for every matching object (with `revision` 0: a half-received list is
  no place to resume from), then SYNCED carrying the list's revision R, then every change after R.
  The list is read from etcd a chunk at a time at revision R (`enmasse.config.listing.Snapshot`),
  so it costs bounded memory at any size, and every ADDED carries a `continue_token`: a stream
  cut in the list phase (config restarted) resumes with the last one and gets the objects after
  it, at R, then SYNCED, then the changes: nothing missed, nothing repeated. A token whose R
  was compacted meanwhile ends the stream with OUT_OF_RANGE ("... restart the list ...").
- resource_version N > 0: every change with revision > N, in revision order.
- N older than etcd's compaction point: the stream ends with OUT_OF_RANGE
  "resource_version N has been compacted; re-list".

The events come straight from an etcd watch started at last-revision + 1, so a client that resumes
with the revision of the last event it saw gets no gap and no repeat. If etcd goes away while a
stream is open (killed and restarted), this module re-opens the etcd watch from the last revision it
sent, with back-off, for up to `outage_limit` seconds, and only then ends the stream with
UNAVAILABLE; the client can still resume from its last revision on another connection.

The changes of one etcd transaction (an Apply, a cascading delete) share one revision R and arrive
in one etcd response; they are sent back to back, and all but the last carry R-1 as their resume
point (see `resume_points`), so that a stream cut in the middle of a transaction is resumed
before it, never after it.

Filtering: `kinds` keeps those kinds only; `space` keeps the objects of that space (its addresses,
its users and the AddressSpace of that name) plus the plans, which every space uses; `visible`
(the caller's spaces, when its role is scoped to some: `enmasse.config.access`) keeps the objects
of those spaces plus the plans. Secret fields (a user's password hash) are cleared from every
event unless the request asks `with_secrets` (which the servicer allows the control plane only).
When changes
are filtered out, a PROGRESS event (at most one a second) carries the revision reached, so that a
resuming client does not go back further than it must. etcd's own progress notifications are
passed on as PROGRESS too.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc
from enmasse.config.access import sees
from enmasse.config.listing import WATCH_SCOPE, Continue, Snapshot
from enmasse.config.store import Change, Compacted, Store, StoreUnavailable
from enmasse.config.writes import PLAN_KINDS, Refused, public_form
from enmasse.resources.kinds import KINDS, Key, key_of, resource_of
from enmasse.v1 import config_pb2

Event = config_pb2.WatchEvent
PROGRESS_EVERY = 1.0
"""Seconds between PROGRESS events sent for changes the filter drops (so that a watcher of a quiet
space still moves its resume revision forward, and does not fall behind a compaction)."""


@dataclass(frozen=True)
class WatchFilter:
    kinds: frozenset[str]
    space: str
    visible: frozenset[str] | None = None
    secrets: bool = False

    @classmethod
    def of(
        cls, request: config_pb2.WatchRequest, *, visible: frozenset[str] | None = None
    ) -> WatchFilter:
        unknown = [kind for kind in request.kinds if kind not in KINDS]
        if unknown:
            raise Refused(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"kinds: '{unknown[0]}' is not a kind (one of {', '.join(KINDS)})",
            )
        return cls(
            kinds=frozenset(request.kinds),
            space=request.space,
            visible=visible,
            secrets=request.with_secrets,
        )

    def matches(self, key: Key) -> bool:
        kind, space, name = key
        if self.kinds and kind not in self.kinds:
            return False
        if not sees(self.visible, key):
            return False
        if not self.space or kind in PLAN_KINDS:
            return True
        return space == self.space or (kind == "AddressSpace" and name == self.space)


def event_of(change: Change, *, secrets: bool = False) -> config_pb2.WatchEvent:
    if change.type == "delete":
        kind = Event.DELETED
    else:
        kind = Event.ADDED if change.created else Event.MODIFIED
    shown = public_form(change.obj, secrets=secrets)
    return Event(type=kind, object=resource_of(shown), revision=change.revision)


def resume_points(events: list[config_pb2.WatchEvent]) -> list[config_pb2.WatchEvent]:
    """Marks the events of one transaction so that a break between them loses nothing.

    All changes of a transaction share its revision R. Every event but the last of R carries R-1:
    a client cut off in the middle resumes from R-1 and gets the whole transaction again (the
    informer drops what it already has) instead of skipping the rest of it.
    """
    for event, following in itertools.pairwise(events):
        if following.revision == event.revision:
            event.revision -= 1
    return events


async def watch_events(
    store: Store,
    request: config_pb2.WatchRequest,
    *,
    outage_limit: float = 60.0,
    visible: frozenset[str] | None = None,
) -> AsyncIterator[config_pb2.WatchEvent]:
    """The events of `request`, of the spaces `visible` only (None: every space)."""
    selected = WatchFilter.of(request, visible=visible)
    last = request.resource_version
    if last < 0:
        raise Refused(grpc.StatusCode.INVALID_ARGUMENT, "resource_version must not be negative")
    if last == 0:
        token = request.continue_token
        resume = Continue.of(token, scope=WATCH_SCOPE) if token else None
        snapshot = Snapshot(store, kind=None, scope=WATCH_SCOPE, resume=resume)
        async for below, obj in snapshot.objects():
            if selected.matches(key_of(obj)):
                shown = public_form(obj, secrets=selected.secrets)
                yield Event(
                    type=Event.ADDED,
                    object=resource_of(shown),
                    revision=0,
                    continue_token=snapshot.token(below),
                )
        last = snapshot.revision
        yield Event(type=Event.SYNCED, revision=last)
    elif request.continue_token:
        raise Refused(
            grpc.StatusCode.INVALID_ARGUMENT,
            "continue_token resumes a list phase: it goes with resource_version 0",
        )
    down_since: float | None = None
    progressed = time.monotonic()
    backoff = 0.1
    while True:
        try:
            async for batch in store.watch(start_revision=last + 1):
                down_since, backoff = None, 0.1
                if batch.progress_revision:
                    last = max(last, batch.progress_revision)
                    yield Event(type=Event.PROGRESS, revision=last)
                kept = [c for c in batch.changes if selected.matches(c.key)]
                dropped = len(kept) < len(batch.changes)
                events = [event_of(c, secrets=selected.secrets) for c in kept]
                for event in resume_points(events):
                    yield event
                if batch.changes:
                    last = batch.changes[-1].revision
                if dropped and time.monotonic() - progressed > PROGRESS_EVERY:
                    progressed = time.monotonic()
                    yield Event(type=Event.PROGRESS, revision=last)
        except Compacted as error:
            raise Refused(
                grpc.StatusCode.OUT_OF_RANGE,
                f"resource_version {last} has been compacted; re-list",
            ) from error
        except StoreUnavailable as error:
            down_since = down_since or time.monotonic()
            if time.monotonic() - down_since > outage_limit:
                raise Refused(grpc.StatusCode.UNAVAILABLE, str(error)) from error
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 1.0)
