"""The subscription service against real parts: the config service over etcd, two broker processes.

A topic placed on two brokers: look-ups choose one broker per subscription, create the topic there,
record the choice on the topic Address (etcd), give the same answer again and after a restart of
the service, keep every record under concurrent look-ups, and refuse bad requests precisely
without recording anything.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from enmasse.amqp import codec
from enmasse.amqp.client import Client
from enmasse.amqp.engine import Outcome
from enmasse.common.serving import start_server
from enmasse.resources.discovery import LocalDirectory
from enmasse.subscription.choice import annotation_key, choose_broker, recorded
from enmasse.subscription.servicer import SERVICE_NAME, SubscriptionServicer
from enmasse.subscription.subscriptions import DurableSubscriptions
from enmasse.v1 import (
    config_pb2,
    config_pb2_grpc,
    resources_pb2,
    subscription_pb2,
    subscription_pb2_grpc,
)

from tests.fixtures.broker import BrokerProcess

pytestmark = pytest.mark.timeout(120)
Ref = config_pb2.ObjectRef


async def eventually(check: Callable[[], Any], *, what: str, limit: float = 20.0) -> Any:
    deadline = time.monotonic() + limit
    last: Any = None
    while time.monotonic() < deadline:
        last = await check()
        if last:
            return last
        await asyncio.sleep(0.1)
    raise AssertionError(f"{what}: not reached in {limit} s (last: {last})")


class Service:
    """The service in this process, served on a free port, restartable."""

    def __init__(self, *, config_target: str, brokers_dir: Path) -> None:
        self.config_target = config_target
        self.brokers_dir = brokers_dir
        self.subscriptions: DurableSubscriptions | None = None
        self.running: Any = None
        self.channel: grpc.aio.Channel | None = None
        self.stub: subscription_pb2_grpc.SubscriptionServiceStub | None = None

    async def start(self) -> subscription_pb2_grpc.SubscriptionServiceStub:
        self.subscriptions = DurableSubscriptions(
            config_target=self.config_target,
            directory=LocalDirectory(self.brokers_dir.parent, brokers=self.brokers_dir),
        )
        self.subscriptions.start()
        self.running = await start_server(
            registrations=[
                (
                    subscription_pb2_grpc.add_SubscriptionServiceServicer_to_server,
                    SubscriptionServicer(self.subscriptions),
                    SERVICE_NAME,
                )
            ]
        )
        self.channel = grpc.aio.insecure_channel(f"127.0.0.1:{self.running.port}")
        self.stub = subscription_pb2_grpc.SubscriptionServiceStub(self.channel)
        return self.stub

    async def stop(self) -> None:
        if self.channel is not None:
            await self.channel.close()
        if self.running is not None:
            await self.running.stop(grace=0.2)
        if self.subscriptions is not None:
            await self.subscriptions.stop()


@pytest.fixture
async def setup(
    config_server: Any,
    config_stub: config_pb2_grpc.ConfigServiceStub,
    broker_factory: Callable[..., BrokerProcess],
    tmp_path: Path,
) -> AsyncIterator[dict[str, Any]]:
    brokers = {f"broker-{i}": broker_factory() for i in range(2)}
    for name, broker in brokers.items():  # what the runtime's brokers do: their ports files
        (tmp_path / "brokers/shop" / name).mkdir(parents=True)
        (tmp_path / "brokers/shop" / name / "ports.json").write_text(
            json.dumps({"amqp": broker.amqp_port, "admin": broker.admin_port})
        )
    await config_stub.CreateAddressSpace(
        resources_pb2.AddressSpace(
            metadata=resources_pb2.Metadata(name="shop"),
            spec=resources_pb2.AddressSpaceSpec(type="standard", plan="standard-small"),
        )
    )
    await config_stub.CreateAddress(
        resources_pb2.Address(
            metadata=resources_pb2.Metadata(name="prices", space="shop"),
            spec=resources_pb2.AddressSpec(
                address="prices/all", type="topic", plan="standard-small-topic"
            ),
        )
    )
    service = Service(config_target=config_server.target, brokers_dir=tmp_path / "brokers")
    stub = await service.start()
    try:
        yield {"stub": stub, "brokers": brokers, "service": service}
    finally:
        await service.stop()


async def place_topic(stub: config_pb2_grpc.ConfigServiceStub, *brokers: str) -> None:
    """What the storage-controller does: the topic's placement in its status."""
    current = await stub.GetAddress(Ref(space="shop", name="prices"))
    status = resources_pb2.AddressStatus()
    status.CopyFrom(current.status)
    del status.brokers[:]
    for broker in brokers:
        status.brokers.add(broker=broker, state="Active")
    await stub.UpdateAddressStatus(
        config_pb2.UpdateAddressStatusRequest(ref=Ref(space="shop", name="prices"), status=status)
    )


def lookup(identity: int) -> subscription_pb2.LookupRequest:
    return subscription_pb2.LookupRequest(
        space="shop", address="prices/all", container_id=f"app-{identity}", link_name="sub"
    )


async def refused(call: Any) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await call
    return error.value.code(), error.value.details()


async def test_lookups_choose_create_record_and_answer_the_same_after_a_restart(
    setup: dict[str, Any], config_stub: config_pb2_grpc.ConfigServiceStub
) -> None:
    stub, brokers = setup["stub"], setup["brokers"]
    assert await refused(stub.Lookup(lookup(0), timeout=10)) == (
        grpc.StatusCode.FAILED_PRECONDITION,
        "topic 'prices/all' is not placed on an Active broker yet",
    )
    await place_topic(config_stub, "broker-0", "broker-1")

    async def placed() -> Any:
        try:
            return await stub.Lookup(lookup(0), timeout=10)
        except grpc.aio.AioRpcError:
            return None

    first = await eventually(placed, what="a look-up once the topic is placed")
    assert first.created
    assert (first.space, first.topic, first.identity) == ("shop", "prices/all", "app-0|sub")
    chosen = brokers[first.broker]
    assert (first.host, first.port) == ("127.0.0.1", chosen.amqp_port)
    assert chosen.addresses()["prices/all"].kind == "topic"

    answers = {0: first}
    for identity in range(1, 12):
        answers[identity] = await stub.Lookup(lookup(identity), timeout=10)
        assert answers[identity].created
    again = await stub.Lookup(lookup(0), timeout=10)
    assert (again.broker, again.created) == (first.broker, False)
    assert {a.broker for a in answers.values()} == {"broker-0", "broker-1"}  # spread over both
    for broker in brokers.values():
        assert "prices/all" in broker.addresses()

    stored = await config_stub.GetAddress(Ref(space="shop", name="prices"))
    assert recorded(stored.metadata.annotations) == {
        f"app-{i}|sub": a.broker for i, a in answers.items()
    }
    assert stored.metadata.generation == 1  # a record is not a spec change

    await setup["service"].stop()
    stub = await setup["service"].start()
    for identity, answer in answers.items():
        after = await stub.Lookup(lookup(identity), timeout=10)
        assert (after.broker, after.created) == (answer.broker, False)
    listed = await stub.ListSubscriptions(
        subscription_pb2.ListSubscriptionsRequest(space="shop"), timeout=10
    )
    assert {(s.identity, s.broker) for s in listed.subscriptions} == {
        (f"app-{i}|sub", a.broker) for i, a in answers.items()
    }


async def test_concurrent_lookups_lose_no_record(
    setup: dict[str, Any], config_stub: config_pb2_grpc.ConfigServiceStub
) -> None:
    stub = setup["stub"]
    await place_topic(config_stub, "broker-0", "broker-1")

    async def placed() -> Any:
        try:
            return await stub.Lookup(lookup(100), timeout=10)
        except grpc.aio.AioRpcError:
            return None

    await eventually(placed, what="a look-up once the topic is placed")
    answers = await asyncio.gather(*(stub.Lookup(lookup(i), timeout=20) for i in range(30)))
    stored = await config_stub.GetAddress(Ref(space="shop", name="prices"))
    records = recorded(stored.metadata.annotations)
    assert len(records) == 31
    assert all(records[f"app-{i}|sub"] == a.broker for i, a in enumerate(answers))


async def test_bad_lookups_are_refused_precisely_and_record_nothing(
    setup: dict[str, Any], config_stub: config_pb2_grpc.ConfigServiceStub
) -> None:
    stub, brokers = setup["stub"], setup["brokers"]
    await config_stub.CreateAddressSpace(
        resources_pb2.AddressSpace(
            metadata=resources_pb2.Metadata(name="jms"),
            spec=resources_pb2.AddressSpaceSpec(type="brokered", plan="brokered-single"),
        )
    )
    await place_topic(config_stub, "broker-0", "broker-1")
    Lookup = subscription_pb2.LookupRequest
    cases = [
        (
            Lookup(address="prices/all", container_id="c", link_name="l"),
            grpc.StatusCode.INVALID_ARGUMENT,
            "space: must not be empty",
        ),
        (
            Lookup(space="nowhere", address="prices/all", container_id="c", link_name="l"),
            grpc.StatusCode.NOT_FOUND,
            "address space 'nowhere' not found",
        ),
        (
            Lookup(space="shop", address="no/such", container_id="c", link_name="l"),
            grpc.StatusCode.NOT_FOUND,
            "topic 'no/such' not found in address space 'shop'",
        ),
        (
            Lookup(space="shop", address="prices/all", link_name="l"),
            grpc.StatusCode.INVALID_ARGUMENT,
            "container_id: must not be empty for a subscription that is not shared",
        ),
    ]

    async def jms_known() -> bool:
        try:
            await stub.Lookup(
                Lookup(space="jms", address="t", container_id="c", link_name="l"), timeout=10
            )
        except grpc.aio.AioRpcError as error:
            return error.code() == grpc.StatusCode.FAILED_PRECONDITION
        return False

    await eventually(jms_known, what="the brokered space known to the service")
    assert await refused(
        stub.Lookup(Lookup(space="jms", address="t", container_id="c", link_name="l"), timeout=10)
    ) == (
        grpc.StatusCode.FAILED_PRECONDITION,
        "address space 'jms' is brokered: its one broker holds every subscription",
    )
    for request, code, message in cases:
        assert await refused(stub.Lookup(request, timeout=10)) == (code, message)

    # a broker that is down: the look-up that needs it fails, nothing is recorded, others go on
    brokers["broker-1"].kill()
    identity = next(i for i in range(200, 400) if choice_of(i) == "broker-1")
    code, message = await refused(stub.Lookup(lookup(identity), timeout=30))
    assert code == grpc.StatusCode.UNAVAILABLE
    assert message.startswith(
        f"broker 'broker-1' at 127.0.0.1:{brokers['broker-1'].admin_port} did not take topic "
        "'prices/all': "
    )
    stored = await config_stub.GetAddress(Ref(space="shop", name="prices"))
    assert annotation_key(f"app-{identity}|sub") not in stored.metadata.annotations
    other = next(i for i in range(200, 400) if choice_of(i) == "broker-0")
    served = await stub.Lookup(lookup(other), timeout=10)
    assert (served.broker, served.created) == ("broker-0", True)


def choice_of(identity: int) -> str:
    """What the service will choose for `app-<identity>|sub` over both brokers."""
    return choose_broker(
        identity=f"app-{identity}|sub",
        topic="prices/all",
        placement=[("broker-0", "Active"), ("broker-1", "Active")],
        recorded_broker=None,
    )


async def test_the_console_script_serves_lookups(
    config_server: Any, config_stub: config_pb2_grpc.ConfigServiceStub, tmp_path: Path
) -> None:
    """`enmasse-subscription` as a real process: it follows the store and answers."""
    port_file = tmp_path / "subscription.port"
    command = [
        str(Path(sys.executable).parent / "enmasse-subscription"),
        f"--config={config_server.target}",
        f"--var={tmp_path}",
        f"--port-file={port_file}",
    ]
    with open(tmp_path / "subscription.log", "ab") as log:  # noqa: ASYNC230
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)  # noqa: ASYNC220
    try:
        await eventually(lambda: _exists(port_file), what="the port file")
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port_file.read_text().strip()}") as ch:
            stub = subscription_pb2_grpc.SubscriptionServiceStub(ch)
            code, message = await refused(stub.Lookup(lookup(1), timeout=10))
            assert (code, message) == (grpc.StatusCode.NOT_FOUND, "address space 'shop' not found")
            await config_stub.CreateAddressSpace(
                resources_pb2.AddressSpace(
                    metadata=resources_pb2.Metadata(name="shop"),
                    spec=resources_pb2.AddressSpaceSpec(type="standard", plan="standard-small"),
                )
            )

            async def answers() -> bool:
                try:
                    listed = await stub.ListSubscriptions(
                        subscription_pb2.ListSubscriptionsRequest(space="shop"), timeout=10
                    )
                except grpc.aio.AioRpcError:
                    return False  # not known yet: NOT_FOUND
                return list(listed.subscriptions) == []

            await eventually(answers, what="the new space known to the process")
        assert process.poll() is None
    finally:
        os.kill(process.pid, signal.SIGKILL)
        process.wait(10)


async def _exists(path: Path) -> bool:
    return await asyncio.to_thread(path.exists)


async def test_a_subscription_address_collects_from_its_topic_before_any_consumer(
    setup: dict[str, Any], config_stub: config_pb2_grpc.ConfigServiceStub
) -> None:
    brokers = setup["brokers"]
    await place_topic(config_stub, "broker-1")
    await config_stub.CreateAddress(
        resources_pb2.Address(
            metadata=resources_pb2.Metadata(name="audit", space="shop"),
            spec=resources_pb2.AddressSpec(
                address="audit",
                type="subscription",
                plan="standard-small-subscription",
                topic="prices",
            ),
        )
    )
    holder = brokers["broker-1"]

    async def created() -> Any:
        found = await asyncio.to_thread(holder.addresses)
        return found.get("prices/all::audit")

    subscription = await eventually(created, what="prices/all::audit on broker-1")
    assert (subscription.kind, subscription.durable) == ("subscription", True)
    assert "prices/all::audit" not in await asyncio.to_thread(brokers["broker-0"].addresses)

    # published after the address was made, before anybody consumes: kept for the subscription
    got = await asyncio.to_thread(_publish_then_consume, holder.amqp_port)
    assert got == ["p1", "p2", "p3"]


def _publish_then_consume(port: int) -> list[str]:
    with Client("127.0.0.1", port) as publisher:
        sender = publisher.sender("prices/all")
        for body in ("p1", "p2", "p3"):
            assert sender.send(codec.encode_message(body)).outcome is Outcome.ACCEPTED
    with Client("127.0.0.1", port) as consumer:
        receiver = consumer.receiver("prices/all::audit", credit=10)
        bodies = []
        for _ in range(3):
            delivery = receiver.receive(10)
            bodies.append(str(codec.read_body(delivery.payload)))
            receiver.accept(delivery)
    return bodies
