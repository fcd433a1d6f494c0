"""A brokered space end to end: real config over etcd, a real broker process, no router.

The test plays the local runtime: it starts the `enmasse-broker` the controller renders, on
ports of its own choosing (port 0), with its ports file where `enmasse up` puts it
(`<var>/brokers/<space>/<id>/ports.json`), as the runtime does for a broker that serves clients
(`--client-auth=required`). So the endpoint the AddressSpace status publishes can only be right
if it was read from that file, and clients reach the broker through it directly, logged in as
the space's users, whom the controller pushes to the broker (again after the broker restarts),
with their rules: a rule change closes the links that lost their right; a user of another space
does not get in.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import grpc
import pytest
from enmasse.amqp import codec, sasl
from enmasse.amqp.client import AmqpError, Client
from enmasse.amqp.engine import Condition, Outcome
from enmasse.resources.discovery import LocalDirectory
from enmasse.resources.rendered_brokers import GitOpsOutput, local_broker_command
from enmasse.storage_controller.controller import StorageController
from enmasse.v1 import config_pb2, config_pb2_grpc, resources_pb2

from tests.fixtures.broker import BrokerProcess
from tests.fixtures.config_service import InProcessConfig

pytestmark = pytest.mark.slow
WAIT = 30.0
CLIENTS = "--client-auth=required"  # what the runtime starts a broker that serves clients with
PASSWORD = "wonderland"
SpaceSummary = tuple[str, list[str], list[tuple[str, str, int]]]
AddressSummary = tuple[str, list[str], list[tuple[str, str]]]


async def eventually(check: Callable[[], Awaitable[bool]], what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {WAIT} s: {what}")
        await asyncio.sleep(0.1)


@pytest.fixture
async def config(
    config_server: InProcessConfig,
) -> AsyncIterator[config_pb2_grpc.ConfigServiceStub]:
    async with grpc.aio.insecure_channel(config_server.target) as channel:
        yield config_pb2_grpc.ConfigServiceStub(channel)


def unauthorized(description: str) -> Condition:
    return Condition("amqp:unauthorized-access", description)


async def create_user(
    config: config_pb2_grpc.ConfigServiceStub,
    name: str,
    *,
    space: str,
    rules: list[tuple[list[str], list[str]]],
    update: bool = False,
) -> None:
    """A MessagingUser with the module's password and `rules` (address patterns, operations)."""
    user = resources_pb2.MessagingUser(
        metadata={"name": name, "space": space},
        spec={
            "username": name,
            "password": "" if update else PASSWORD,  # an update without one keeps the hash
            "authorization": [{"addresses": a, "operations": o} for a, o in rules],
        },
    )
    write = config.UpdateMessagingUser if update else config.CreateMessagingUser
    await write(user, timeout=10)


def log_in(port: int, user: str | None = None, *, host: str = "127.0.0.1") -> Client:
    """A client logged in with SCRAM as `user` (None: no login at all)."""
    return Client(
        host,
        port,
        timeout=10,
        user=user,
        password=PASSWORD if user is not None else None,
        mechanisms=sasl.CLIENT_MECHANISMS if user is not None else None,
    )


def refusal(attempt: Callable[[], object]) -> Condition | None:
    try:
        attempt()
    except AmqpError as refused:
        return refused.condition
    raise AssertionError("not refused")


async def space_of(config: config_pb2_grpc.ConfigServiceStub) -> SpaceSummary:
    found = await config.GetAddressSpace(config_pb2.ObjectRef(name="jms"), timeout=5)
    status = found.status
    return (
        status.status.phase,
        list(status.status.messages),
        [(e.name, e.host, e.port) for e in status.endpoints],
    )


async def address_of(config: config_pb2_grpc.ConfigServiceStub, name: str) -> AddressSummary:
    found = await config.GetAddress(config_pb2.ObjectRef(space="jms", name=name), timeout=5)
    status = found.status
    return (
        status.status.phase,
        list(status.status.messages),
        [(b.broker, b.state) for b in status.brokers],
    )


async def test_a_brokered_space_turns_active_with_its_brokers_endpoint_and_carries_messages(
    config_server: InProcessConfig,
    config: config_pb2_grpc.ConfigServiceStub,
    tmp_path: Path,
) -> None:
    output = GitOpsOutput(tmp_path / "gitops")
    var_dir = tmp_path / "var"
    controller = StorageController(
        config_target=config_server.target,
        output=output,
        directory=LocalDirectory(var_dir),
        resync_interval=0.2,
    )
    broker: BrokerProcess | None = None
    controller.start()
    try:
        await config.CreateAddressSpace(
            resources_pb2.AddressSpace(
                metadata={"name": "jms"}, spec={"type": "brokered", "plan": "brokered-single"}
            ),
            timeout=5,
        )
        for name, kind in (("invoices", "queue"), ("notifications", "topic")):
            await config.CreateAddress(
                resources_pb2.Address(
                    metadata={"name": name, "space": "jms"},
                    spec={"address": name, "type": kind, "plan": f"brokered-{kind}"},
                ),
                timeout=5,
            )
        await create_user(config, "app", space="jms", rules=[(["#"], ["send", "recv"])])

        async def one_broker_rendered() -> bool:
            return len(output.read_space("jms")) == 1

        await eventually(one_broker_rendered, "the space's one broker rendered")
        (broker_id,) = output.read_space("jms")

        # rendered but not running: the space waits for it and publishes no endpoint
        waiting: SpaceSummary = ("Configuring", [f"waiting for broker: {broker_id}"], [])

        async def space_is(expected: SpaceSummary) -> bool:
            return await space_of(config) == expected

        await eventually(lambda: space_is(waiting), "the space waiting for its broker")
        assert await address_of(config, "invoices") == (
            "Configuring",
            [f"placed on broker {broker_id}", f"waiting for broker: {broker_id}"],
            [(broker_id, "Active")],
        )

        # the runtime starts it on ports of its own: only its ports file says where
        broker = BrokerProcess(workdir=var_dir / "brokers" / "jms" / broker_id, args=[CLIENTS])
        await asyncio.to_thread(broker.start)
        active: SpaceSummary = (
            "Active",
            [f"broker ready: {broker_id}"],
            [("amqp", "127.0.0.1", broker.amqp_port)],
        )
        await eventually(lambda: space_is(active), "the space Active at the broker's endpoint")
        for name in ("invoices", "notifications"):
            assert await address_of(config, name) == (
                "Active",
                [f"placed on broker {broker_id}", f"broker ready: {broker_id}"],
                [(broker_id, "Active")],
            )
        held = await asyncio.to_thread(broker.addresses)
        assert held["invoices"].kind == "queue"
        assert held["notifications"].kind == "topic"

        # clients use the published endpoint, straight to the broker
        _, _, [(_, host, port)] = await space_of(config)
        bodies, published = await asyncio.to_thread(_exchange, host, port)
        assert bodies == ["invoice-0", "invoice-1", "invoice-2"]
        assert published == "news"

        # the statuses are settled: further passes write nothing
        space_version = (
            await config.GetAddressSpace(config_pb2.ObjectRef(name="jms"), timeout=5)
        ).metadata.resource_version
        for _ in range(3):
            assert await controller.reconcile_space("jms"), "a settled space left work undone"
        found = await config.GetAddressSpace(config_pb2.ObjectRef(name="jms"), timeout=5)
        assert found.metadata.resource_version == space_version
    finally:
        await controller.stop()
        if broker is not None:
            await asyncio.to_thread(broker.stop)


async def test_the_brokers_clients_are_the_spaces_users_as_their_rules_say(
    config_server: InProcessConfig,
    config: config_pb2_grpc.ConfigServiceStub,
    tmp_path: Path,
) -> None:
    output = GitOpsOutput(tmp_path / "gitops")
    var_dir = tmp_path / "var"
    controller = StorageController(
        config_target=config_server.target,
        output=output,
        directory=LocalDirectory(var_dir),
        resync_interval=0.2,
        access_check_interval=0.2,
    )
    broker: BrokerProcess | None = None
    controller.start()
    try:
        # `shop` only holds another space's user: of a plan without `mqtt`, so that it holds no
        # queue (the MQTT store queues) whose broker nobody here starts
        routed = await config.GetAddressSpacePlan(
            config_pb2.ObjectRef(name="standard-small"), timeout=5
        )
        routed.metadata.Clear()
        routed.metadata.name = "standard-small-no-mqtt"
        routed.spec.mqtt = False
        await config.CreateAddressSpacePlan(routed, timeout=5)
        for name, kind, plan in (
            ("jms", "brokered", "brokered-single"),
            ("shop", "standard", "standard-small-no-mqtt"),
        ):
            await config.CreateAddressSpace(
                resources_pb2.AddressSpace(
                    metadata={"name": name}, spec={"type": kind, "plan": plan}
                ),
                timeout=5,
            )
        await config.CreateAddress(
            resources_pb2.Address(
                metadata={"name": "invoices", "space": "jms"},
                spec={"address": "invoices", "type": "queue", "plan": "brokered-queue"},
            ),
            timeout=5,
        )
        await create_user(config, "writer", space="jms", rules=[(["invoices"], ["send"])])
        await create_user(config, "reader", space="jms", rules=[(["invoices"], ["recv"])])
        await create_user(config, "eve", space="shop", rules=[(["#"], ["send", "recv"])])

        async def one_broker_rendered() -> bool:
            return len(output.read_space("jms")) == 1

        await eventually(one_broker_rendered, "the space's one broker rendered")
        ((broker_id, workload),) = output.read_space("jms").items()
        assert local_broker_command(workload, var_dir=var_dir)[-1] == CLIENTS
        broker = BrokerProcess(workdir=var_dir / "brokers" / "jms" / broker_id, args=[CLIENTS])
        await asyncio.to_thread(broker.start)

        async def active() -> bool:
            return (await space_of(config))[0] == "Active"

        await eventually(active, "the space Active: its broker holds its users")
        port = broker.amqp_port
        writer = await asyncio.to_thread(log_in, port, "writer")
        try:
            sender = await asyncio.to_thread(writer.sender, "invoices")
            assert await asyncio.to_thread(
                refusal, lambda: writer.receiver("invoices")
            ) == unauthorized("user 'writer' may not recv from 'invoices'")
            sent = await asyncio.to_thread(sender.send, codec.encode_message("inv", durable=True))
            assert sent.outcome is Outcome.ACCEPTED, "its connection still sends"
            # a user of another space, and no user at all, do not get in
            assert await asyncio.to_thread(refusal, lambda: log_in(port, "eve")) == Condition(
                "amqp:unauthorized-access", "Authentication failed [mech=SCRAM-SHA-512]"
            )
            assert await asyncio.to_thread(refusal, lambda: log_in(port)) == Condition(
                "amqp:unauthorized-access", "Authentication failed [mech=none]"
            )
            # a rule change in the store reaches the live link
            started = time.monotonic()
            await create_user(
                config, "writer", space="jms", rules=[(["invoices"], ["recv"])], update=True
            )
            async with asyncio.timeout(WAIT):
                closed = await asyncio.wrap_future(sender.detached)
            print(f"rule change to detach: {(time.monotonic() - started) * 1000:.0f} ms")
            assert closed == unauthorized("user 'writer' may not send to 'invoices'")
            assert not writer.closed_with.done(), "the connection stays"
        finally:
            await asyncio.to_thread(writer.close)

        # A restarted broker holds no access (nobody gets in); the controller notices and pushes.
        await asyncio.to_thread(broker.restart)

        async def reader_gets_in() -> bool:
            try:
                return await asyncio.to_thread(_take_one, broker.amqp_port, "reader") == "inv"
            except AmqpError:
                return False

        await eventually(reader_gets_in, "the restarted broker lets the space's users in again")
    finally:
        await controller.stop()
        if broker is not None:
            await asyncio.to_thread(broker.stop)


def _take_one(port: int, user: str) -> str:
    with log_in(port, user) as client:
        receiver = client.receiver("invoices", credit=1)
        delivery = receiver.receive(timeout=10)
        receiver.accept(delivery)
        return str(codec.read_body(delivery.payload))


def _exchange(host: str, port: int) -> tuple[list[str], str]:
    """Three messages through the queue, in order, and one through the topic."""
    with log_in(port, "app", host=host) as client:
        sender = client.sender("invoices")
        for i in range(3):
            delivery = sender.send(codec.encode_message(f"invoice-{i}", durable=True))
            assert delivery.outcome == Outcome.ACCEPTED
        receiver = client.receiver("invoices", credit=10)
        bodies = []
        for _ in range(3):
            delivery = receiver.receive(timeout=10)
            bodies.append(codec.read_body(delivery.payload))
            receiver.accept(delivery)
        subscriber = client.receiver("notifications", credit=10)
        publisher = client.sender("notifications")
        assert publisher.send(codec.encode_message("news")).outcome == Outcome.ACCEPTED
        delivery = subscriber.receive(timeout=10)
        subscriber.accept(delivery)
        return bodies, codec.read_body(delivery.payload)
