"""Durable subscriptions of standard spaces: answer look-ups, create, record.

What flows in: look-ups (space, the address a durable receiver attached to, its container id and
link name, shared or not), the store through an informer (address spaces, addresses with their
placement and recorded choices, address plans), and where brokers listen (a `Directory`, asked
per look-up, so a restarted broker is found at once). What flows out: the broker that holds the
subscription and its AMQP listener; as effects, the topic ensured on that broker
(BrokerAdmin.EnsureTopic with the topic's plan, idempotent) and the choice recorded on the topic
Address (config UpdateAddress, compare-and-swap).

Why it is built so: the decision is pure (`choice`), the effects are idempotent, and look-ups of
one topic run one at a time (a lock per topic), so two subscribers of the same topic never race
each other's record. Between instances the record is compare-and-swap: on ABORTED the fresh topic
is read and the decision made again on top of it, so the first recorded choice wins everywhere.
The broker is made to hold the topic BEFORE the choice is recorded: a recorded choice always
names a broker that has the topic.

Beside the look-ups, a loop follows the `subscription` Addresses: each, once placed, gets its
shared durable subscription `<topic>::<address>` on its broker (an AMQP attach and detach, on a
thread), which is the node routers attach its consumers to. A standard space's broker takes only
certificates of its CA on that port (`--routers-only`), so the attach presents this service's
own, as its BrokerAdmin calls do.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import grpc
import structlog
from enmasse.amqp.client import AmqpError, Client
from enmasse.amqp.engine import Terminus, Tls
from enmasse.amqp.tls import mutual_tls
from enmasse.common.certificates import TlsFiles
from enmasse.common.credentials import TokenSource, config_channel, peer_channel
from enmasse.common.metrics import LoopMetrics
from enmasse.resources.discovery import BrokerEndpoint, Directory
from enmasse.resources.informer import Informer
from enmasse.resources.kinds import object_of
from enmasse.subscription.choice import (
    Refusal,
    Subscriber,
    annotation_key,
    choose_broker,
    recorded,
    subscriber_of,
    subscription_address_broker,
    subscription_queue,
)
from enmasse.v1 import (
    broker_pb2,
    broker_pb2_grpc,
    config_pb2,
    config_pb2_grpc,
    resources_pb2,
    subscription_pb2,
)

log = structlog.get_logger(__name__)

CALL_DEADLINE = 10.0
RECORD_ATTEMPTS = 5
PASS_SECONDS = 1.0
CONTAINER_ID = "enmasse-subscription"
TopicKey = tuple[str, str]  # (space, topic resource name)


class DurableSubscriptions:
    def __init__(
        self,
        *,
        config_target: str | Callable[[], str],
        directory: Directory,
        token: TokenSource | None = None,
        tls: TlsFiles | None = None,
    ) -> None:
        self._config_target = config_target
        self._token = token
        self._tls = tls  # this service's certificate: to config and to every BrokerAdmin
        self.directory = directory
        self.informer = Informer(
            target=config_target,
            kinds=["AddressSpace", "Address", "AddressPlan"],
            token=token,
            tls=tls,
            on_added=self._changed,
            on_modified=self._changed,
        )
        self._locks: dict[TopicKey, asyncio.Lock] = {}
        self._written: dict[TopicKey, resources_pb2.Address] = {}
        self.made: dict[TopicKey, str] = {}  # subscription address -> the broker holding it
        self._not_yet: dict[TopicKey, str] = {}
        self._wake = asyncio.Event()
        self.metrics = LoopMetrics("subscription")  # each pass timed, failures counted
        self._task: asyncio.Task[None] | None = None

    def _changed(self, _resource: resources_pb2.Resource) -> None:
        self._wake.set()

    def start(self) -> None:
        self.informer.start()
        self._task = asyncio.get_running_loop().create_task(
            self._follow_subscription_addresses(), name="subscription-addresses"
        )

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self.informer.stop()

    def _target(self) -> str:
        return self._config_target() if callable(self._config_target) else self._config_target

    # ------------------------------------------------------------ look-up

    async def lookup(
        self, request: subscription_pb2.LookupRequest
    ) -> subscription_pb2.SubscriptionLocation:
        """Refusal with the exact reason when the request or the store does not allow it."""
        if not request.space:
            raise Refusal(grpc.StatusCode.INVALID_ARGUMENT, "space: must not be empty")
        subscriber = subscriber_of(
            address=request.address,
            container_id=request.container_id,
            link_name=request.link_name,
            shared=request.shared,
        )
        await self._synced()
        self._standard_space(request.space)
        topic = self._topic(request.space, subscriber.topic)
        key = (request.space, topic.metadata.name)
        async with self._locks.setdefault(key, asyncio.Lock()):
            return await self._place(key, subscriber)

    async def _place(
        self, key: TopicKey, subscriber: Subscriber
    ) -> subscription_pb2.SubscriptionLocation:
        async with config_channel(self._target(), token=self._token, tls=self._tls) as channel:
            config = config_pb2_grpc.ConfigServiceStub(channel)
            for _attempt in range(RECORD_ATTEMPTS):
                topic = self._freshest(key)
                was = recorded(topic.metadata.annotations).get(subscriber.identity)
                broker = choose_broker(
                    identity=subscriber.identity,
                    topic=subscriber.topic,
                    placement=[(b.broker, b.state) for b in topic.status.brokers],
                    recorded_broker=was,
                )
                endpoint = self._endpoint(key[0], broker)
                await self._ensure_topic(endpoint, topic)
                if was == broker or await self._record(config, topic, subscriber, broker):
                    return _location(key[0], subscriber, endpoint, created=was != broker)
        raise Refusal(
            grpc.StatusCode.ABORTED,
            f"topic '{subscriber.topic}' kept changing while recording the subscription; retry",
        )

    async def _record(
        self,
        config: config_pb2_grpc.ConfigServiceStub,
        topic: resources_pb2.Address,
        subscriber: Subscriber,
        broker: str,
    ) -> bool:
        """True when recorded; False when the topic changed meanwhile (the caller decides again)."""
        update = resources_pb2.Address()
        update.CopyFrom(topic)
        update.metadata.annotations[annotation_key(subscriber.identity)] = broker
        key = (topic.metadata.space, topic.metadata.name)
        try:
            stored = await config.UpdateAddress(update, timeout=CALL_DEADLINE)
        except grpc.aio.AioRpcError as error:
            if error.code() == grpc.StatusCode.ABORTED:
                fresh = await config.GetAddress(
                    config_pb2.ObjectRef(space=key[0], name=key[1]), timeout=CALL_DEADLINE
                )
                self._written[key] = fresh
                return False
            if error.code() == grpc.StatusCode.NOT_FOUND:
                raise Refusal(
                    grpc.StatusCode.NOT_FOUND,
                    f"topic '{subscriber.topic}' was deleted from address space '{key[0]}'",
                ) from None
            raise Refusal(
                grpc.StatusCode.UNAVAILABLE,
                f"the config service could not record the subscription: {error.details()}",
            ) from None
        self._written[key] = stored
        log.info(
            "subscription recorded",
            space=key[0],
            address=subscriber.topic,
            subscription=subscriber.identity,
            broker=broker,
        )
        return True

    async def _ensure_topic(self, endpoint: BrokerEndpoint, topic: resources_pb2.Address) -> None:
        plan = self.informer.get("AddressPlan", topic.spec.plan)
        spec = object_of(plan).spec if plan is not None else resources_pb2.AddressPlanSpec()
        async with peer_channel(endpoint.admin, tls=self._tls) as channel:
            admin = broker_pb2_grpc.BrokerAdminStub(channel)
            try:
                await admin.EnsureTopic(
                    broker_pb2.EnsureAddressRequest(name=topic.spec.address, plan=spec),
                    timeout=CALL_DEADLINE,
                )
            except grpc.aio.AioRpcError as error:
                raise Refusal(
                    grpc.StatusCode.UNAVAILABLE,
                    f"broker '{endpoint.name}' at {endpoint.admin} did not take topic "
                    f"'{topic.spec.address}': {error.code().name} {error.details() or ''}".rstrip(),
                ) from None

    # ------------------------------------------------------------ reading the store

    async def _synced(self) -> None:
        try:
            async with asyncio.timeout(CALL_DEADLINE):
                await self.informer.synced.wait()
        except TimeoutError:
            raise Refusal(
                grpc.StatusCode.UNAVAILABLE, "the config service has not answered yet; retry"
            ) from None

    def _standard_space(self, space: str) -> None:
        found = self.informer.get("AddressSpace", space)
        if found is None:
            raise Refusal(grpc.StatusCode.NOT_FOUND, f"address space '{space}' not found")
        kind = object_of(found).spec.type
        if kind != "standard":
            raise Refusal(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"address space '{space}' is {kind}: its one broker holds every subscription",
            )

    def _topic(self, space: str, address: str) -> resources_pb2.Address:
        for resource in self.informer.list("Address", space=space):
            candidate = object_of(resource)
            if candidate.spec.address == address and candidate.spec.type == "topic":
                return candidate
        raise Refusal(
            grpc.StatusCode.NOT_FOUND, f"topic '{address}' not found in address space '{space}'"
        )

    def _freshest(self, key: TopicKey) -> resources_pb2.Address:
        """The newest version known: the informer's, or the one this service just wrote."""
        cached = self.informer.get("Address", key[1], space=key[0])
        written = self._written.get(key)
        if cached is None:
            raise Refusal(
                grpc.StatusCode.NOT_FOUND, f"topic '{key[1]}' not found in address space '{key[0]}'"
            )
        topic = object_of(cached)
        if (
            written is not None
            and written.metadata.resource_version > topic.metadata.resource_version
        ):
            return written
        return topic

    def _endpoint(self, space: str, broker: str) -> BrokerEndpoint:
        endpoint = self.directory.broker(space, broker)
        if endpoint is None:
            raise Refusal(
                grpc.StatusCode.UNAVAILABLE,
                f"broker '{broker}' of address space '{space}' is not running yet",
            )
        return endpoint

    # ------------------------------------------------------------ subscription addresses

    async def _follow_subscription_addresses(self) -> None:
        await self.informer.synced.wait()
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(PASS_SECONDS):
                    await self._wake.wait()
            self._wake.clear()
            try:
                with self.metrics.timed_pass():
                    await self.ensure_subscription_addresses()
            except Exception:
                log.exception("subscription addresses pass failed")

    async def ensure_subscription_addresses(self) -> None:
        """Each placed `subscription` Address of a standard space gets its durable shared
        subscription on its broker, once per (address, broker); what cannot be done yet (no
        placement, broker not running) is tried again on the next pass."""
        addresses = [object_of(r) for r in self.informer.list("Address")]
        present = {(a.metadata.space, a.metadata.name) for a in addresses}
        for gone in [key for key in self.made if key not in present]:
            del self.made[gone]  # deleted: made again if it comes back
        for address in addresses:
            if address.spec.type != "subscription":
                continue
            key = (address.metadata.space, address.metadata.name)
            try:
                broker = self._subscription_broker(address)
                if self.made.get(key) == broker:
                    continue
                await self._make_subscription(address, broker)
            except Refusal as refusal:
                if self._not_yet.get(key) != refusal.message:  # once per reason, not per pass
                    log.info(
                        "subscription address waits",
                        space=key[0],
                        address=key[1],
                        reason=refusal.message,
                    )
                    self._not_yet[key] = refusal.message
                continue
            self.made[key] = broker
            self._not_yet.pop(key, None)

    def _subscription_broker(self, address: resources_pb2.Address) -> str:
        space = address.metadata.space
        self._standard_space(space)
        topic = self._topic_by_name(space, address.spec.topic)
        return subscription_address_broker(
            name=address.spec.address,
            topic=topic.spec.address,
            own=[(b.broker, b.state) for b in address.status.brokers],
            topic_placement=[(b.broker, b.state) for b in topic.status.brokers],
        )

    async def _make_subscription(self, address: resources_pb2.Address, broker: str) -> None:
        space = address.metadata.space
        topic = self._topic_by_name(space, address.spec.topic)
        endpoint = self._endpoint(space, broker)
        await self._ensure_topic(endpoint, topic)
        try:
            await asyncio.to_thread(
                subscribe_durably,
                endpoint,
                topic=topic.spec.address,
                name=address.spec.address,
                tls=mutual_tls(self._tls) if self._tls is not None else None,
            )
        except (AmqpError, OSError, TimeoutError) as error:
            raise Refusal(
                grpc.StatusCode.UNAVAILABLE,
                f"broker '{broker}' did not take subscription "
                f"'{subscription_queue(topic=topic.spec.address, name=address.spec.address)}': "
                f"{error}",
            ) from None
        log.info(
            "subscription address created",
            space=space,
            address=address.spec.address,
            topic=topic.spec.address,
            broker=broker,
        )

    def _topic_by_name(self, space: str, name: str) -> resources_pb2.Address:
        found = self.informer.get("Address", name, space=space)
        if found is None or object_of(found).spec.type != "topic":
            raise Refusal(
                grpc.StatusCode.NOT_FOUND, f"topic '{name}' not found in address space '{space}'"
            )
        return object_of(found)

    # ------------------------------------------------------------ listing

    async def list(
        self, request: subscription_pb2.ListSubscriptionsRequest
    ) -> subscription_pb2.SubscriptionList:
        if not request.space:
            raise Refusal(grpc.StatusCode.INVALID_ARGUMENT, "space: must not be empty")
        await self._synced()
        if self.informer.get("AddressSpace", request.space) is None:
            raise Refusal(grpc.StatusCode.NOT_FOUND, f"address space '{request.space}' not found")
        found = []
        for resource in self.informer.list("Address", space=request.space):
            topic = object_of(resource)
            if topic.spec.type != "topic" or request.topic not in ("", topic.spec.address):
                continue
            topic = self._freshest((request.space, topic.metadata.name))
            for identity, broker in sorted(recorded(topic.metadata.annotations).items()):
                endpoint = self.directory.broker(request.space, broker)
                found.append(
                    subscription_pb2.SubscriptionLocation(
                        space=request.space,
                        topic=topic.spec.address,
                        identity=identity,
                        broker=broker,
                        host=endpoint.host if endpoint else "",
                        port=endpoint.amqp_port if endpoint else 0,
                    )
                )
        return subscription_pb2.SubscriptionList(subscriptions=found)


def _location(
    space: str, subscriber: Subscriber, endpoint: BrokerEndpoint, *, created: bool
) -> subscription_pb2.SubscriptionLocation:
    return subscription_pb2.SubscriptionLocation(
        space=space,
        topic=subscriber.topic,
        identity=subscriber.identity,
        broker=endpoint.name,
        host=endpoint.host,
        port=endpoint.amqp_port,
        created=created,
    )


def subscribe_durably(
    endpoint: BrokerEndpoint, *, topic: str, name: str, tls: Tls | None = None
) -> None:
    """Creates (or finds) the shared durable subscription `name` of `topic` on the broker: a
    receiver attaches with a durable, never-expiring, shared source and detaches (not closes),
    which leaves the subscription collecting. tls: the broker's port is mutual TLS (a standard
    space's broker with its certificate). Blocking: run it on a thread."""
    with Client(
        endpoint.host, endpoint.amqp_port, container_id=CONTAINER_ID, timeout=10, tls=tls
    ) as client:
        receiver = client.receiver(
            topic,
            name=name,
            credit=0,
            source=Terminus(
                address=topic, durable=2, expiry_policy="never", capabilities=("shared",)
            ),
        )
        receiver.detach()
