"""Wildcard and shared subscriptions end to end: a real `enmasse-mqtt-gateway` process in front of
a real router (`--client-auth optional`, MessagingUsers with rules) whose topic addresses live on
a real broker, driven by real MQTT clients (paho-mqtt, 3.1.1 and 5).

What it shows: `+` and `#` filters receive from several multicast and topic addresses, each
message under its own address as topic; an address created after the SUBSCRIBE (a new
configuration pushed to the router) is received from too; a shared subscription
(`$share/group/filter`) with two members gives each message to exactly one of them (none lost,
none twice) while a plain subscriber still gets every one; a `#` filter of a user without recv
on everything is refused in the SUBACK (0x87; 3.1.1 0x80) while that client and others go on.
And the router's side of it, as any AMQP client sees it: a pattern receiver is told the matching
addresses, or refused with the precise condition.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import queue
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from enmasse.amqp import codec
from enmasse.amqp.client import AmqpError, Client
from enmasse.amqp.engine import Condition, Terminus
from enmasse.common.passwords import hash_password, scram_credentials
from enmasse.resources.address_patterns import PATTERN_CAPABILITY
from enmasse.v1 import router_pb2

from tests.fixtures.broker import BrokerProcess
from tests.fixtures.mqtt import V5, V311, WAIT, Device, Protocol
from tests.fixtures.router import RouterFleet, RouterProcess

PASSWORD = "secret"
HASH, SCRAM = hash_password(PASSWORD), scram_credentials(PASSWORD)
USERS = {  # user -> operation -> address patterns
    "alice": {"send": ["#"], "recv": ["#"]},
    "kitchen": {"send": ["#"], "recv": ["sensors/kitchen"]},
}
MULTICAST = ("sensors/kitchen", "sensors/hall", "alerts")
TOPICS = ("telemetry/a", "telemetry/b", "jobs")
_generations = itertools.count(1)


class Space:
    """The router's configuration, grown by tests that create addresses."""

    def __init__(self, router: RouterProcess, broker: BrokerProcess) -> None:
        self.router, self.broker = router, broker
        self.multicast, self.topics = list(MULTICAST), list(TOPICS)
        for topic in self.topics:
            broker.ensure_topic(topic)
        self.apply()

    def add(self, address: str, kind: str) -> None:
        if kind == "topic":
            self.broker.ensure_topic(address)
            self.topics.append(address)
        else:
            self.multicast.append(address)
        self.apply()

    def apply(self) -> None:
        waypoint = router_pb2.BrokerWaypoint(
            name="b1", host="127.0.0.1", port=self.broker.amqp_port
        )
        addresses = [router_pb2.AddressRoute(address=a, type="multicast") for a in self.multicast]
        addresses += [
            router_pb2.AddressRoute(address=a, type="topic", brokers=[waypoint])
            for a in self.topics
        ]
        users = [
            router_pb2.RouterUser(
                username=name,
                password_hash=HASH,
                scram_credentials=SCRAM,
                authorization=[
                    router_pb2.RouterRule(addresses=patterns, operations=[operation])
                    for operation, patterns in rules.items()
                ],
            )
            for name, rules in USERS.items()
        ]
        config = router_pb2.RouterConfig(
            generation=next(_generations), space="iot", addresses=addresses, users=users
        )
        self.router.apply(config)


def _start_gateway(workdir: Path, *, router_port: int) -> tuple[subprocess.Popen[bytes], int]:
    ports_file, log_path = workdir / "gateway.ports.json", workdir / "gateway.log"
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "enmasse.mqtt_gateway.main",
                "--listen=127.0.0.1:0",
                f"--router=127.0.0.1:{router_port}",
                f"--ports-file={ports_file}",
            ],
            stdout=log,
            stderr=log,
            cwd=workdir,
        )
    deadline = time.monotonic() + 30
    while not ports_file.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            _stop(process)
            raise RuntimeError(f"gateway did not start: {log_path.read_text()[-2000:]}")
        time.sleep(0.05)
    return process, json.loads(ports_file.read_text())["mqtt"]


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            os.kill(process.pid, signal.SIGKILL)
            process.wait(5)


@pytest.fixture(scope="module")
def space(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Space]:
    broker = BrokerProcess(workdir=tmp_path_factory.mktemp("wildcards-broker"))
    fleet = RouterFleet(workdir=tmp_path_factory.mktemp("wildcards-router"))
    try:
        broker.start()
        router = fleet.start("r1", extra_args=("--client-auth=optional",))
        yield Space(router, broker)
    finally:
        fleet.stop_all()
        broker.stop()


@pytest.fixture(scope="module")
def gateway_port(space: Space, tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    process, port = _start_gateway(
        tmp_path_factory.mktemp("wildcards-gateway"), router_port=space.router.amqp_port
    )
    try:
        yield port
    finally:
        _stop(process)


@pytest.fixture
def device(gateway_port: int) -> Iterator[Callable[..., Device]]:
    made: list[Device] = []

    def connect(protocol: Protocol = V5, *, user: str = "alice") -> Device:
        client = Device(gateway_port, protocol=protocol, user=user, password=PASSWORD)
        made.append(client)
        assert client.connack() == 0
        return client

    yield connect
    for each in made:
        with contextlib.suppress(Exception):
            each.close()


def _take(client: Device, count: int) -> list[mqtt.MQTTMessage]:
    return [client.receive() for _ in range(count)]


def _nothing_more(*clients: Device, wait: float = 0.5) -> None:
    """Nothing further arrives at any of `clients` within `wait` seconds."""
    time.sleep(wait)
    for client in clients:
        assert client.messages.empty(), client.messages.get_nowait().topic


@pytest.mark.parametrize("protocol", [V311, V5], ids=["3.1.1", "5"])
def test_plus_and_hash_receive_from_several_addresses(
    device: Callable[..., Device], protocol: Protocol
) -> None:
    subscriber, publisher = device(protocol), device(V5)
    assert subscriber.subscribe("sensors/+", qos=0) == 0
    assert subscriber.subscribe("telemetry/#", qos=1) == 1
    for address in ("sensors/kitchen", "sensors/hall", "alerts", "telemetry/a", "telemetry/b"):
        assert publisher.publish(address, f"to {address}".encode(), qos=1) == 0
    received = {(m.topic, m.payload, m.qos) for m in _take(subscriber, 4)}
    assert received == {
        ("sensors/kitchen", b"to sensors/kitchen", 0),
        ("sensors/hall", b"to sensors/hall", 0),
        ("telemetry/a", b"to telemetry/a", 1),
        ("telemetry/b", b"to telemetry/b", 1),
    }
    _nothing_more(subscriber)  # `alerts` matches neither filter


def _publish_until_received(
    publisher: Device, subscriber: Device, address: str
) -> mqtt.MQTTMessage:
    """Publishes to `address` (QoS 0) until `subscriber` gets one: the subscriber's gateway
    joins the new address once the router told it, a moment after the configuration."""
    deadline = time.monotonic() + WAIT
    for n in itertools.count():
        publisher.publish(address, f"{n}".encode(), qos=0)
        try:
            return subscriber.messages.get(timeout=0.2)
        except queue.Empty:
            assert time.monotonic() < deadline, f"nothing from {address} within {WAIT} s"
    raise AssertionError("unreachable")


@pytest.mark.parametrize(
    ("protocol", "address", "kind"),
    [(V5, "sensors/porch", "multicast"), (V311, "telemetry/new/deep", "topic")],
    ids=["5-multicast", "3.1.1-topic"],
)
def test_an_address_created_after_subscribing_is_received(
    device: Callable[..., Device], space: Space, protocol: Protocol, address: str, kind: str
) -> None:
    subscriber, publisher = device(protocol), device(V5)
    assert subscriber.subscribe(f"{address.split('/')[0]}/#", qos=0) == 0
    space.add(address, kind)
    message = _publish_until_received(publisher, subscriber, address)
    assert message.topic == address
    assert publisher.publish(address, b"after", qos=1) == 0  # and it stays joined
    deadline = time.monotonic() + WAIT
    while (message := subscriber.receive()).payload != b"after":
        assert time.monotonic() < deadline
    assert message.topic == address


def test_a_shared_subscription_gives_each_message_to_one_member(
    device: Callable[..., Device], space: Space
) -> None:
    first, second, plain, publisher = device(V5), device(V311), device(V5), device(V5)
    assert first.subscribe("$share/workers/jobs", qos=1) == 1
    assert second.subscribe("$share/workers/jobs", qos=1) == 1
    assert plain.subscribe("jobs", qos=1) == 1
    sent = [f"job-{n}".encode() for n in range(20)]
    for payload in sent:
        assert publisher.publish("jobs", payload, qos=1) == 0
    everything = [m.payload for m in _take(plain, len(sent))]
    assert everything == sent  # a plain subscriber still gets every one, in order
    got: dict[str, list[bytes]] = {"first": [], "second": []}
    deadline = time.monotonic() + WAIT
    while sum(map(len, got.values())) < len(sent) and time.monotonic() < deadline:
        for name, member in (("first", first), ("second", second)):
            with contextlib.suppress(queue.Empty):
                message = member.messages.get(timeout=0.1)
                assert message.topic == "jobs"
                got[name].append(bytes(message.payload))
    _nothing_more(first, second)
    assert sorted(got["first"] + got["second"]) == sorted(sent)  # none lost, none twice
    assert got["first"]
    assert got["second"]  # the group's members compete: both had some
    group = "jobs::mqtt-share:workers:jobs"  # the group's subscription queue on the broker
    assert group in space.broker.addresses()
    first.close()
    assert group in space.broker.addresses()  # one member left: the group goes on
    second.close()
    deadline = time.monotonic() + WAIT
    while group in space.broker.addresses():  # the last member gone: so is the group's queue
        assert time.monotonic() < deadline, f"{group} still on the broker"
        time.sleep(0.05)


@pytest.mark.parametrize(("protocol", "code"), [(V311, 0x80), (V5, 0x87)], ids=["3.1.1", "5"])
def test_hash_without_the_right_is_refused_while_others_go_on(
    device: Callable[..., Device], protocol: Protocol, code: int
) -> None:
    watcher, publisher = device(V5), device(V5)
    assert watcher.subscribe("sensors/#", qos=0) == 0
    limited = device(protocol, user="kitchen")
    assert limited.subscribe("#", qos=0) == code
    assert limited.subscribe("sensors/+", qos=0) == code  # recv on sensors/kitchen only
    assert limited.subscribe("sensors/kitchen", qos=0) == 0  # what it may do, it still does
    assert publisher.publish("sensors/kitchen", b"21.5", qos=1) == 0
    for client in (limited, watcher):
        message = client.receive()
        assert (message.topic, message.payload) == ("sensors/kitchen", b"21.5")


def test_unsubscribing_a_wildcard_stops_its_addresses(device: Callable[..., Device]) -> None:
    subscriber, publisher = device(V5), device(V5)
    assert subscriber.subscribe("sensors/+", qos=0) == 0
    assert publisher.publish("sensors/hall", b"1", qos=1) == 0
    assert subscriber.receive().payload == b"1"
    _unsubscribe(subscriber, "sensors/+")
    assert publisher.publish("sensors/hall", b"2", qos=1) == 0
    _nothing_more(subscriber)


def _unsubscribe(client: Device, topic_filter: str) -> None:
    done: queue.Queue[Any] = queue.Queue()
    client.client.on_unsubscribe = lambda *args: done.put(args)
    client.client.unsubscribe(topic_filter)
    done.get(timeout=WAIT)


def test_the_connack_no_longer_says_wildcards_or_shared_are_unavailable(
    device: Callable[..., Device],
) -> None:
    client = device(V5)
    properties = client.connack_properties
    # Absent: available (MQTT 5 3.2.2.3.12-13); the gateway said 0 for both before.
    assert getattr(properties, "WildcardSubscriptionAvailable", None) is None
    assert getattr(properties, "SharedSubscriptionAvailable", None) is None
    assert getattr(properties, "ReceiveMaximum", None) == 100  # the properties were read


def _told(receiver: Any) -> dict[str, Any]:
    return codec.read_application_properties(receiver.receive(WAIT).payload)


def test_an_amqp_pattern_receiver_is_told_the_matching_addresses(space: Space) -> None:
    # `+`: one level, so the one-level addresses (the others have more, the tests add more)
    pattern = Terminus(address="+", capabilities=(PATTERN_CAPABILITY,))
    port = space.router.amqp_port
    with Client("127.0.0.1", port, user="alice", password=PASSWORD) as amqp:
        receiver = amqp.receiver("+", source=pattern, credit=100)
        told = [_told(receiver) for _ in range(3)]
        assert told == [
            {"event": "matched", "address": "alerts", "type": "multicast"},
            {"event": "matched", "address": "jobs", "type": "topic"},
            {"event": "current"},
        ]
    everything = Terminus(address="#", capabilities=(PATTERN_CAPABILITY,))
    with (
        Client("127.0.0.1", port, user="kitchen", password=PASSWORD) as amqp,
        pytest.raises(AmqpError) as refused,
    ):
        amqp.receiver("#", source=everything, credit=10)
    assert refused.value.condition == Condition(
        "amqp:unauthorized-access",
        "user 'kitchen' may not recv from every address '#' matches: "
        "a pattern receiver needs recv on all of them",
    )
