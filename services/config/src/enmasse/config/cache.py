"""The write path's catalog: every object of the store, in memory, kept exact by etcd's watch.

In: one list of the store's prefix (read in chunks at one revision), then its etcd watch
(re-opened from the last revision when etcd goes away, re-listed when that revision was
compacted). Out: `at_least(revision)`, the catalog once it reflects every change up to
`revision`.

Why it is exact for writes: every write transaction also bumps the guard key, so the guard's mod
revision G is the revision of the last write. A write reads G, waits until this catalog has seen
revision G (it then holds everything any write ever did), validates against it without yielding
to the event loop, and commits comparing the guard with G. A write that slipped in between moves
the guard, the commit fails, and the write starts over. No read of the whole space per write, so
a write costs the same in a space of ten addresses or of ten thousand.

Reads (Get, List, Watch) do not use it: they go to etcd, which is linearizable on its own.
"""

from __future__ import annotations

import asyncio
import contextlib

import structlog
from enmasse.config.listing import Snapshot
from enmasse.config.store import Compacted, Store, StoreUnavailable
from enmasse.config.writes import Refused
from enmasse.resources.validation import Catalog

log = structlog.get_logger(__name__)


class CatalogCache:
    def __init__(self, store: Store, *, catch_up_limit: float = 10.0) -> None:
        self._store = store
        self._catch_up_limit = catch_up_limit
        self.catalog = Catalog()
        self.revision = 0
        self._advanced = asyncio.Condition()
        self._task: asyncio.Task[None] | None = None
        self._starting = asyncio.Lock()

    async def at_least(self, revision: int) -> Catalog:
        """The catalog once it has seen `revision`; StoreUnavailable if it does not in time."""
        await self._ensure_started()
        try:
            async with asyncio.timeout(self._catch_up_limit), self._advanced:
                await self._advanced.wait_for(lambda: self.revision >= revision)
        except TimeoutError as error:
            raise StoreUnavailable(
                f"the catalog stayed at revision {self.revision}, behind {revision}"
            ) from error
        return self.catalog

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _ensure_started(self) -> None:
        async with self._starting:
            if self._task is None:
                await self._load()  # raises StoreUnavailable if etcd is away: try again later
                self._task = asyncio.get_running_loop().create_task(
                    self._follow(), name="catalog-cache"
                )

    async def _load(self) -> None:
        """The whole store, read a chunk at a time at one revision (no etcd answer of the size
        of the store); read again from the start if that revision is compacted meanwhile."""
        while True:
            snapshot = Snapshot(self._store, kind=None, scope="catalog")
            catalog = Catalog()
            try:
                async for _, obj in snapshot.objects():
                    catalog.put(obj)
            except Refused:  # `listing.expired`: the snapshot's revision was compacted
                log.info("catalog snapshot compacted while loading; reading it again")
                continue
            catalog.address_index()  # from now on kept current by put / remove
            self.catalog = catalog
            await self._advance(snapshot.revision)
            return

    async def _advance(self, revision: int) -> None:
        async with self._advanced:
            self.revision = max(self.revision, revision)
            self._advanced.notify_all()

    async def _follow(self) -> None:
        backoff = 0.1
        while True:
            try:
                async for batch in self._store.watch(
                    start_revision=self.revision + 1, with_guard=True
                ):
                    backoff = 0.1
                    for change in batch.changes:
                        if change.type == "delete":
                            self.catalog.remove(change.key)
                        else:
                            self.catalog.put(change.obj)
                    await self._advance(batch.revision)
            except Compacted:
                log.info("catalog history compacted; re-listing", revision=self.revision)
                await self._relist()
            except StoreUnavailable as error:
                log.info("catalog watch broke; resuming", error=str(error))
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 1.0)

    async def _relist(self) -> None:
        while True:
            try:
                await self._load()
                return
            except StoreUnavailable:
                await asyncio.sleep(0.5)
