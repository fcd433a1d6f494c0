"""An informer: a controller's local, always-catching-up copy of resources in the config service.

In: the ConfigService `Watch` stream (kinds, space). Out: a cache (`get`, `list`), handlers called
for every added / modified / deleted object, a `synced` event set once the first full list is in,
and `revision`, the last store revision the cache reflects.

How it stays right:
- it starts with a list (resource_version 0: ADDED..., SYNCED) and then follows the changes;
  a stream cut during that list resumes it with the `continue_token` of the last ADDED (the
  server reads the list at one revision, a page at a time), so a list of 100,000 objects is
  not started over when config restarts in the middle of it;
- when the stream breaks (config restarted, network, etcd restarted behind config) it reconnects
  with back-off and resumes from `revision`, so it sees every change once, none missed, none
  repeated (a transaction cut in the middle is replayed whole by the server, and what the cache
  already holds at that version is dropped here);
- when the config service answers OUT_OF_RANGE (its revision was compacted away) it lists again
  and turns the difference between the old cache and the new list into handler calls (added,
  modified, deleted), so handlers never miss a deletion that happened while it was away.

Handlers may be plain functions or coroutines; they run in stream order, one at a time; one that
raises is logged and the informer goes on.

Credentials: given a `token` (`enmasse.common.credentials`), every Watch carries it; a refusal
(UNAUTHENTICATED while `enmasse up` has not written the token file yet) is retried like a break.
`with_secrets` asks for users' password hashes, which the config service gives the control
plane's `controller` role only (the router-agent, which passes them to its routers, and the
storage-controller, which passes them to brokered spaces' brokers).
Controllers (storage-controller, router-agent, ...) build on this; it has no controller logic.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import grpc
import structlog
from enmasse.common.certificates import TlsFiles
from enmasse.common.credentials import TokenSource, config_channel
from enmasse.resources.kinds import Key, key_of, object_of
from enmasse.v1 import config_pb2, config_pb2_grpc, resources_pb2

log = structlog.get_logger(__name__)
Handler = Callable[[resources_pb2.Resource], Awaitable[None] | None]
Event = config_pb2.WatchEvent


class Informer:
    def __init__(
        self,
        *,
        target: str | Callable[[], str],
        kinds: Sequence[str] = (),
        space: str = "",
        on_added: Handler | None = None,
        on_modified: Handler | None = None,
        on_deleted: Handler | None = None,
        initial_backoff: float = 0.1,
        max_backoff: float = 2.0,
        token: TokenSource | None = None,
        with_secrets: bool = False,
        tls: TlsFiles | None = None,
    ) -> None:
        """`target` is host:port of the config service, or a function returning it (asked again
        on every reconnect, so a restarted service on a new port is found)."""
        self._target = target
        self._token = token
        self._tls = tls  # mutual TLS to the config service (None: plaintext)
        self.with_secrets = with_secrets
        self.kinds = list(kinds)
        self.space = space
        self._handlers = {"added": on_added, "modified": on_modified, "deleted": on_deleted}
        self._initial_backoff = initial_backoff
        self._max_backoff = max_backoff
        self._backoff = initial_backoff
        self._cache: dict[Key, resources_pb2.Resource] = {}
        self.revision = 0
        # the list phase in progress, kept across a break so that it resumes where it was cut
        self._listing: dict[Key, resources_pb2.Resource] | None = None
        self._continue = ""
        self.synced = asyncio.Event()
        self.relists = 0
        self.reconnects = 0
        self._task: asyncio.Task[None] | None = None

    # ------------------------------------------------------------ the view

    def get(self, kind: str, name: str, *, space: str = "") -> resources_pb2.Resource | None:
        return self._cache.get((kind, space, name))

    def list(
        self, kind: str | None = None, *, space: str | None = None
    ) -> list[resources_pb2.Resource]:
        return [
            resource
            for (k, s, _), resource in sorted(self._cache.items())
            if (kind is None or k == kind) and (space is None or s == space)
        ]

    # ------------------------------------------------------------ running

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self.run(), name="informer")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def run(self) -> None:
        while True:
            target = self._target() if callable(self._target) else self._target
            try:
                async with config_channel(target, token=self._token, tls=self._tls) as channel:
                    stub = config_pb2_grpc.ConfigServiceStub(channel)
                    await self._follow(stub)
            except grpc.aio.AioRpcError as error:
                if error.code() == grpc.StatusCode.OUT_OF_RANGE:
                    log.info("revision compacted; re-listing", revision=self.revision)
                    self.relists += 1
                    self.revision = 0
                    self._listing, self._continue = None, ""
                    continue
                log.info("watch broke; resuming", code=error.code().name, revision=self.revision)
            except _WatchEnded:
                log.info("watch ended; resuming", revision=self.revision)
            self.reconnects += 1
            await asyncio.sleep(self._backoff)
            self._backoff = min(self._backoff * 2, self._max_backoff)

    async def _follow(self, stub: config_pb2_grpc.ConfigServiceStub) -> None:
        request = config_pb2.WatchRequest(
            kinds=self.kinds,
            space=self.space,
            resource_version=self.revision,
            with_secrets=self.with_secrets,
            continue_token=self._continue if self.revision == 0 else "",
        )
        if self.revision == 0 and not self._continue:
            self._listing = {}
        async for event in stub.Watch(request):
            if event.type == Event.ADDED and self._listing is not None:
                self._listing[key_of(event.object)] = event.object
                self._continue = event.continue_token
            elif event.type == Event.SYNCED and self._listing is not None:
                await self._replace(self._listing)
                self._listing, self._continue = None, ""
                self.revision = event.revision
                self.synced.set()
            elif event.type == Event.PROGRESS:
                self.revision = max(self.revision, event.revision)
            else:
                await self._apply(event)
                self.revision = event.revision
            self._backoff = self._initial_backoff  # a working stream: the next break is news
        raise _WatchEnded  # the server never ends a watch normally: treat it as a break

    async def _apply(self, event: config_pb2.WatchEvent) -> None:
        key = key_of(event.object)
        if _already_seen(self._cache.get(key), event):
            return  # a transaction replayed after a break inside it (the server's resume points)
        if event.type == Event.DELETED:
            self._cache.pop(key, None)
            await self._call("deleted", event.object)
        elif key in self._cache:
            self._cache[key] = event.object
            await self._call("modified", event.object)
        else:
            self._cache[key] = event.object
            await self._call("added", event.object)

    async def _replace(self, listing: dict[Key, resources_pb2.Resource]) -> None:
        """A fresh list: report what changed since the old cache (empty on the first list)."""
        old = self._cache
        self._cache = dict(listing)
        for key, resource in old.items():
            if key not in listing:
                await self._call("deleted", resource)
        for key, resource in listing.items():
            if key not in old:
                await self._call("added", resource)
            elif _version(old[key]) != _version(resource):
                await self._call("modified", resource)

    async def _call(self, which: str, resource: resources_pb2.Resource) -> None:
        handler = self._handlers[which]
        if handler is None:
            return
        try:
            result: Any = handler(resource)
            if inspect.isawaitable(result):
                await result
        except Exception:
            # a controller's bug must not stop the cache from following the store
            log.exception("informer handler failed", handler=which, kind=key_of(resource)[0])


class _WatchEnded(Exception):
    pass


def _already_seen(cached: resources_pb2.Resource | None, event: config_pb2.WatchEvent) -> bool:
    if event.type == Event.DELETED:
        return cached is None
    return cached is not None and _version(cached) == _version(event.object)


def _version(resource: resources_pb2.Resource) -> int:
    return int(object_of(resource).metadata.resource_version)
