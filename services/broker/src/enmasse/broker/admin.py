"""BrokerAdmin over gRPC: a thin servicer that turns requests into calls on the `Broker` domain.

The gRPC server runs its own asyncio loop in its own thread; the broker's state belongs to the
engine thread. So every call is posted to the engine thread (`on_engine`, built on the engine's
`call_soon_threadsafe`) and awaited through a future: one owner of the state, no locks. Domain
errors become gRPC statuses with the domain's own words: InvalidName -> INVALID_ARGUMENT,
NotFound -> NOT_FOUND, Conflict -> ALREADY_EXISTS; a failed drain -> UNAVAILABLE.

EnsureQueue/EnsureTopic answer only once their catalog change is fsync'd, but they do not each
pay for an fsync: the change is buffered and the first caller of a loop turn posts one catalog
commit behind every call already queued on the engine, so a burst of concurrent calls (the
storage-controller stocks a broker 16 at a time) shares one append + fsync (group commit).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable
from typing import Any, TypeVar

import grpc
import structlog
from enmasse.broker.broker import AddressError, Broker, Conflict, InvalidName, NotFound
from enmasse.broker.plan import Plan
from enmasse.broker.queue import Queue
from enmasse.v1 import broker_pb2, broker_pb2_grpc

log = structlog.get_logger(__name__)

T = TypeVar("T")
OnEngine = Callable[[Callable[[], Any]], "concurrent.futures.Future[Any]"]
DrainStarter = Callable[[str, int, list[str]], "concurrent.futures.Future[tuple[int, list[str]]]"]

_CODES: dict[type[AddressError], grpc.StatusCode] = {
    InvalidName: grpc.StatusCode.INVALID_ARGUMENT,
    NotFound: grpc.StatusCode.NOT_FOUND,
    Conflict: grpc.StatusCode.ALREADY_EXISTS,
}


def post_to(call_soon_threadsafe: Callable[[Callable[[], None]], object]) -> OnEngine:
    """Builds `on_engine`: run a function on the engine thread, its result in a future."""

    def on_engine(fn: Callable[[], Any]) -> concurrent.futures.Future[Any]:
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()

        def run() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                future.set_result(fn())
            except BaseException as exc:
                future.set_exception(exc)

        call_soon_threadsafe(run)
        return future

    return on_engine


class BrokerAdmin(broker_pb2_grpc.BrokerAdminServicer):
    def __init__(self, *, broker: Broker, on_engine: OnEngine, start_drain: DrainStarter) -> None:
        self._broker = broker
        self._on_engine = on_engine
        self._start_drain = start_drain
        self._catalog_sync: concurrent.futures.Future[None] | None = None  # engine thread only

    async def _call(self, context: grpc.aio.ServicerContext, fn: Callable[[], T]) -> T:
        try:
            return await asyncio.wrap_future(self._on_engine(fn))
        except AddressError as exc:
            await context.abort(_CODES.get(type(exc), grpc.StatusCode.INVALID_ARGUMENT), str(exc))
            raise  # abort raises; this line keeps type checkers honest

    async def EnsureQueue(self, request, context):  # type: ignore[no-untyped-def]
        plan = Plan.from_proto(request.plan)

        def ensure() -> tuple[broker_pb2.BrokerAddress, concurrent.futures.Future[None]]:
            queue = self._broker.ensure_queue(request.name, plan, commit=False)
            return describe_queue(queue, kind="queue"), self._catalog_synced()

        answer, synced = await self._call(context, ensure)
        await self._await_sync(context, synced)
        log.info("queue ensured", address=request.name)
        return answer

    async def EnsureTopic(self, request, context):  # type: ignore[no-untyped-def]
        plan = Plan.from_proto(request.plan)

        def ensure() -> tuple[broker_pb2.BrokerAddress, concurrent.futures.Future[None]]:
            self._broker.ensure_topic(request.name, plan, commit=False)
            return self._describe_topic(request.name), self._catalog_synced()

        answer, synced = await self._call(context, ensure)
        await self._await_sync(context, synced)
        log.info("topic ensured", address=request.name)
        return answer

    def _catalog_synced(self) -> concurrent.futures.Future[None]:
        """(engine thread) The next catalog commit, posted behind the calls already queued."""
        if self._catalog_sync is None:
            self._catalog_sync = concurrent.futures.Future()
            self._on_engine(self._commit_catalog)
        return self._catalog_sync

    def _commit_catalog(self) -> None:
        sync, self._catalog_sync = self._catalog_sync, None
        assert sync is not None
        try:
            self._broker.commit_catalog()
        except OSError as exc:
            sync.set_exception(exc)
        else:
            sync.set_result(None)

    async def _await_sync(
        self, context: grpc.aio.ServicerContext, synced: concurrent.futures.Future[None]
    ) -> None:
        try:
            await asyncio.wrap_future(synced)
        except OSError as exc:
            log.error("catalog not written", error=str(exc))
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"catalog not written: {exc}")

    async def DeleteQueue(self, request, context):  # type: ignore[no-untyped-def]
        gone = await self._call(context, lambda: self._broker.delete_queue(request.name))
        log.info("queue deleted", address=request.name, messages=gone)
        return broker_pb2.DeleteAddressResponse(messages_deleted=gone)

    async def DeleteTopic(self, request, context):  # type: ignore[no-untyped-def]
        gone = await self._call(context, lambda: self._broker.delete_topic(request.name))
        log.info("topic deleted", address=request.name, messages=gone)
        return broker_pb2.DeleteAddressResponse(messages_deleted=gone)

    async def ListAddresses(self, request, context):  # type: ignore[no-untyped-def]
        return await self._call(context, self._list)

    async def Drain(self, request, context):  # type: ignore[no-untyped-def]
        if not request.target_host or not 0 < request.target_port < 65536:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                "target_host and target_port (1-65535) are required",
            )
        names = list(request.addresses)
        unknown = await self._call(
            context, lambda: [n for n in names if n not in self._broker.queues]
        )
        if unknown:
            await context.abort(
                grpc.StatusCode.NOT_FOUND,
                f"no queue {', '.join(map(repr, unknown))} on this broker",
            )
        try:
            moved, drained = await asyncio.wrap_future(
                self._start_drain(request.target_host, request.target_port, names)
            )
        except (OSError, RuntimeError) as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"drain stopped: {exc}")
        log.info("drained", messages=moved, addresses=drained)
        return broker_pb2.DrainResponse(messages_moved=moved, addresses=drained)

    def _describe_topic(self, name: str) -> broker_pb2.BrokerAddress:
        topic = self._broker.topics[name]
        subs = [s.queue for s in topic.subscriptions.values()]
        return broker_pb2.BrokerAddress(
            name=name,
            kind="topic",
            plan=topic.plan.to_proto(),
            depth=sum(q.depth for q in subs),
            bytes=sum(q.bytes for q in subs),
            consumers=sum(q.consumer_count for q in subs),
            enqueued=topic.published,
            dequeued=sum(q.dequeued for q in subs),
            expired=sum(q.expired for q in subs),
            dead_lettered=sum(q.dead_lettered for q in subs),
        )

    def _list(self) -> broker_pb2.ListAddressesResponse:
        broker = self._broker
        out: list[broker_pb2.BrokerAddress] = [
            describe_queue(q, kind="queue") for q in broker.queues.values()
        ]
        for name, topic in broker.topics.items():
            out.append(self._describe_topic(name))
            for sub in topic.subscriptions.values():
                out.append(describe_queue(sub.queue, kind="subscription", durable=sub.durable))
        out.sort(key=_by_name)
        return broker_pb2.ListAddressesResponse(
            addresses=out,
            memory_used_bytes=broker.budget.used,
            memory_limit_bytes=broker.budget.limit,
            journal_live_messages=broker.journal.live_messages if broker.journal else 0,
        )


def describe_queue(queue: Queue, *, kind: str, durable: bool = False) -> broker_pb2.BrokerAddress:
    return broker_pb2.BrokerAddress(
        name=queue.name,
        kind=kind,
        plan=queue.plan.to_proto(),
        depth=queue.depth,
        bytes=queue.bytes,
        consumers=queue.consumer_count,
        enqueued=queue.enqueued,
        dequeued=queue.dequeued,
        expired=queue.expired,
        dead_lettered=queue.dead_lettered,
        durable=durable,
    )


def _by_name(address: broker_pb2.BrokerAddress) -> str:
    return address.name
