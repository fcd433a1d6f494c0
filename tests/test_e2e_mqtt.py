"""End to end on the local runtime: `enmasse up` gives a standard space an MQTT gateway, listed
as the space's `mqtt` endpoint, and real MQTT devices (paho-mqtt) use the space's addresses
through it, logged in as the space's MessagingUser (the router checks the login and the rules).

A topic (on a broker) carries QoS 1 from device to device; a queue keeps what a device published
until another subscribes; an AMQP consumer on the router gets what a device published; a wrong
password is refused in the CONNACK.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import pytest
from enmasse.amqp import codec, sasl
from enmasse.amqp.client import Client

from tests.fixtures.local_runtime import LocalRuntime
from tests.fixtures.mqtt import V5, V311, Device, Protocol

pytestmark = pytest.mark.slow

IOT = """
apiVersion: enmasse.io/v1
kind: AddressSpace
metadata: {name: iot}
spec: {type: standard, plan: standard-small}
---
apiVersion: enmasse.io/v1
kind: MessagingUser
metadata: {name: device, space: iot}
spec:
  username: device
  password: device-password
  authorization: [{addresses: ["#"], operations: [send, recv]}]
---
apiVersion: enmasse.io/v1
kind: Address
metadata: {name: telemetry, space: iot}
spec: {address: telemetry, type: topic, plan: standard-small-topic}
---
apiVersion: enmasse.io/v1
kind: Address
metadata: {name: commands, space: iot}
spec: {address: commands, type: queue, plan: standard-small-queue}
---
apiVersion: enmasse.io/v1
kind: Address
metadata: {name: alarms, space: iot}
spec: {address: alarms, type: anycast, plan: standard-anycast}
"""
USER, PASSWORD = "device", "device-password"


@pytest.fixture(scope="module")
def iot(local_runtime: LocalRuntime) -> tuple[int, int]:
    """The `iot` space, Active; its mqtt endpoint's port (from its status) and its router's."""
    local_runtime.apply(IOT, name="iot.yaml")
    local_runtime.wait_active("iot", ["telemetry", "commands", "alarms"], timeout=180)
    return local_runtime.endpoint("iot", "mqtt"), local_runtime.router_port("iot")


@pytest.fixture
def device(iot: tuple[int, int]) -> Iterator[Callable[..., Device]]:
    made: list[Device] = []

    def connect(protocol: Protocol = V5, *, password: str = PASSWORD) -> Device:
        client = Device(iot[0], protocol=protocol, user=USER, password=password)
        made.append(client)
        return client

    yield connect
    for client in made:
        with contextlib.suppress(Exception):
            client.close()


def test_a_topic_carries_qos1_from_device_to_device(device: Callable[..., Device]) -> None:
    subscriber, publisher = device(V311), device(V5)
    assert (subscriber.connack(), publisher.connack()) == (0, 0)
    assert subscriber.subscribe("telemetry", qos=1) == 1
    assert publisher.publish("telemetry", b"t=21.5", qos=1) == 0
    message = subscriber.receive()
    assert (message.topic, message.payload, message.qos) == ("telemetry", b"t=21.5", 1)


def test_a_queue_keeps_a_command_until_a_device_subscribes(device: Callable[..., Device]) -> None:
    publisher = device(V5)
    assert publisher.connack() == 0
    assert publisher.publish("commands", b"open-valve", qos=1) == 0
    subscriber = device(V5)
    assert subscriber.connack() == 0
    assert subscriber.subscribe("commands", qos=1) == 1
    assert subscriber.receive().payload == b"open-valve"


def test_an_amqp_consumer_gets_what_a_device_published(
    device: Callable[..., Device], iot: tuple[int, int]
) -> None:
    with Client(
        "127.0.0.1", iot[1], user=USER, password=PASSWORD, mechanisms=sasl.CLIENT_MECHANISMS
    ) as amqp:
        consumer = amqp.receiver("alarms", credit=10)
        publisher = device(V5)
        assert publisher.connack() == 0
        mid = publisher.publish_async("alarms", b"smoke", qos=1)
        delivery = consumer.receive(15)
        consumer.accept(delivery)
        assert publisher.puback(mid) == 0
    assert codec.read_body(delivery.payload) == b"smoke"


def test_a_wrong_password_is_refused(device: Callable[..., Device]) -> None:
    assert device(V5, password="wrong").connack() == 0x86
