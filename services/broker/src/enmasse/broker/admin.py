"""BrokerAdmin over gRPC: a thin servicer that turns requests into calls on the `Broker` domain.

The gRPC server runs its own asyncio loop in its own thread; the broker's state belongs to the
engine thread. So every call runs on the engine thread and is awaited there (`engine.call`; what
needs no answer is handed over with `engine.submit`): one owner of the state, no locks. Domain
errors become gRPC statuses with the domain's own words: InvalidName -> INVALID_ARGUMENT,
NotFound -> NOT_FOUND, Conflict -> ALREADY_EXISTS, a topic to drain without target_admin or a
queue another drain is moving -> FAILED_PRECONDITION; a failed drain -> UNAVAILABLE.
SetClientAccess (a brokered space's broker only; FAILED_PRECONDITION elsewhere) validates the push
as a whole (INVALID_ARGUMENT naming the user and the problem) and puts it in force on the engine
thread (`clients.ClientEndpoint.apply`); ListAddresses says which version is in force.

Drain, step by step: pick the queues and topics (`drain.select`, on the engine); with
`target_admin`, call the target's PrepareDrain (it creates what is missing with the same plans,
durable subscriptions included, and answers with a token) from this asyncio thread; then start
the `Drain` on the engine and await its result. Creating through the target's admin rather than
by some AMQP attach capability keeps one way of creating addresses (validated, catalogued,
fsync'd before the answer) and gives the token a natural issuer. A caller that gives up
(deadline, cancel) cancels the drain: what the target did not accept stays here.

EnsureQueue/EnsureTopic answer only once their catalog change is fsync'd, but they do not each
pay for an fsync: the change is buffered and the first caller of a loop turn posts one catalog
commit behind every call already queued on the engine, so a burst of concurrent calls (the
storage-controller stocks a broker 16 at a time) shares one append + fsync (group commit).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable
from typing import TypeVar

import grpc
import structlog
from enmasse.amqp.engine import Engine
from enmasse.broker.broker import AddressError, Broker, Conflict, InvalidName, NotFound
from enmasse.broker.clients import AccessError, ClientEndpoint, access_from_proto
from enmasse.broker.drain import Drain, DrainRefused, Selection, select
from enmasse.broker.inbox import InboxAddress
from enmasse.broker.plan import Plan
from enmasse.broker.queue import Queue
from enmasse.broker.topic import Topic
from enmasse.common.certificates import TlsFiles
from enmasse.common.credentials import peer_channel
from enmasse.v1 import broker_pb2, broker_pb2_grpc

log = structlog.get_logger(__name__)

T = TypeVar("T")
# (engine thread) host, port, queues, token -> the running drain
DrainStarter = Callable[[str, int, list[Queue], str], Drain]
PREPARE_TIMEOUT = 30.0

_CODES: dict[type[AddressError], grpc.StatusCode] = {
    InvalidName: grpc.StatusCode.INVALID_ARGUMENT,
    NotFound: grpc.StatusCode.NOT_FOUND,
    Conflict: grpc.StatusCode.ALREADY_EXISTS,
    DrainRefused: grpc.StatusCode.FAILED_PRECONDITION,
}


class BrokerAdmin(broker_pb2_grpc.BrokerAdminServicer):
    def __init__(
        self,
        *,
        broker: Broker,
        engine: Engine,
        start_drain: DrainStarter,
        tls: TlsFiles | None = None,
        clients: ClientEndpoint | None = None,
    ) -> None:
        self._tls = tls  # this broker's certificate, shown to a drain's target
        self._clients = clients  # a brokered space's broker: who may log in (SetClientAccess)
        self._broker = broker
        self._engine = engine
        self._start_drain = start_drain
        self._catalog_sync: concurrent.futures.Future[None] | None = None  # engine thread only

    async def _call(self, context: grpc.aio.ServicerContext, fn: Callable[[], T]) -> T:
        try:
            return await self._engine.call(fn)
        except AddressError as exc:
            await context.abort(_code_of(exc), str(exc))
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
            self._engine.submit(self._commit_catalog)
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

    async def SetClientAccess(self, request, context):  # type: ignore[no-untyped-def]
        if self._clients is None:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                "this broker is not a client endpoint (started without --client-auth required)",
            )
        clients = self._clients
        assert clients is not None  # abort raised
        try:
            access = access_from_proto(request)
        except AccessError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            raise
        await self._engine.call(lambda: clients.apply(access))
        return broker_pb2.SetClientAccessResponse(version=access.version)

    async def Drain(self, request, context):  # type: ignore[no-untyped-def]
        if not request.target_host or not 0 < request.target_port < 65536:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                "target_host and target_port (1-65535) are required",
            )
        target_admin = request.target_admin
        if target_admin and not _is_host_port(target_admin):
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"target_admin must be host:port, not {target_admin!r}",
            )
        names = list(request.addresses)
        selection: Selection = await self._call(
            context, lambda: select(self._broker, names, with_topics=bool(target_admin))
        )
        token = await self._prepare_target(context, target_admin, selection) if target_admin else ""
        drain: Drain = await self._engine.call(
            lambda: self._start_drain(
                request.target_host, request.target_port, selection.queues, token
            )
        )
        try:
            moved, drained = await asyncio.wrap_future(drain.result)
        except (OSError, RuntimeError) as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"drain stopped: {exc}")
        except asyncio.CancelledError:
            self._engine.submit(drain.cancel)
            raise
        log.info("drained", messages=moved, addresses=drained)
        return broker_pb2.DrainResponse(messages_moved=moved, addresses=drained)

    async def _prepare_target(
        self, context: grpc.aio.ServicerContext, target_admin: str, selection: Selection
    ) -> str:
        """Has the target create what the drain moves; returns the drain's token."""
        request = broker_pb2.PrepareDrainRequest(
            addresses=[
                broker_pb2.DrainAddress(
                    name=a.name,
                    kind=a.kind,
                    plan=a.plan.to_proto(),
                    durable_subscriptions=list(a.subscriptions),
                )
                for a in selection.inbox
            ]
        )
        async with peer_channel(target_admin, tls=self._tls) as channel:
            stub = broker_pb2_grpc.BrokerAdminStub(channel)
            try:
                answer = await stub.PrepareDrain(request, timeout=PREPARE_TIMEOUT)
            except grpc.aio.AioRpcError as exc:
                code = (
                    grpc.StatusCode.UNAVAILABLE
                    if exc.code()
                    in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
                    else grpc.StatusCode.FAILED_PRECONDITION
                )
                await context.abort(
                    code, f"target {target_admin} refused to prepare: {exc.details()}"
                )
                raise
        return str(answer.token)

    async def PrepareDrain(self, request, context):  # type: ignore[no-untyped-def]
        addresses = [
            InboxAddress(
                name=a.name,
                kind=a.kind,
                plan=Plan.from_proto(a.plan),
                subscriptions=tuple(a.durable_subscriptions),
            )
            for a in request.addresses
        ]
        token = await self._call(context, lambda: self._broker.prepare_drain(addresses))
        log.info("drain inbox prepared", addresses=[a.name for a in addresses])
        return broker_pb2.PrepareDrainResponse(token=token)

    def _describe_topic(self, name: str) -> broker_pb2.BrokerAddress:
        return describe_topic(name, self._broker.topics[name])

    def _list(self) -> broker_pb2.ListAddressesResponse:
        broker = self._broker
        return broker_pb2.ListAddressesResponse(
            addresses=list_addresses(broker),
            memory_used_bytes=broker.budget.used,
            memory_limit_bytes=broker.budget.limit,
            journal_live_messages=broker.journal.live_messages if broker.journal else 0,
            client_access_version=self._clients.access.version if self._clients else "",
        )


def list_addresses(broker: Broker) -> list[broker_pb2.BrokerAddress]:
    """Every queue, topic and subscription of the broker, by name (engine thread only)."""
    out: list[broker_pb2.BrokerAddress] = [
        describe_queue(q, kind="queue") for q in broker.queues.values()
    ]
    for name, topic in broker.topics.items():
        out.append(describe_topic(name, topic))
        for sub in topic.subscriptions.values():
            out.append(describe_queue(sub.queue, kind="subscription", durable=sub.durable))
    out.sort(key=_by_name)
    return out


def describe_topic(name: str, topic: Topic) -> broker_pb2.BrokerAddress:
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
        dead_letters_held=sum(q.dead_letters_held for q in subs),
        in_flight=sum(q.in_flight for q in subs),
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
        dead_letters_held=queue.dead_letters_held,
        in_flight=queue.in_flight,
        durable=durable,
        draining=queue.hand_off is not None,
    )


def _by_name(address: broker_pb2.BrokerAddress) -> str:
    return address.name


def _code_of(exc: AddressError) -> grpc.StatusCode:
    found = (code for kind, code in _CODES.items() if isinstance(exc, kind))
    return next(found, grpc.StatusCode.INVALID_ARGUMENT)


def _is_host_port(value: str) -> bool:
    host, _, port = value.rpartition(":")
    return bool(host) and port.isdigit() and 0 < int(port) < 65536
