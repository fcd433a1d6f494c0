"""Retained messages and wills end to end: a real `enmasse-mqtt-gateway` process in front of a
real router and a real broker, driven by real MQTT clients (paho-mqtt, 3.1.1 and 5) and real
AMQP clients.

What it shows: a retained message reaches a later subscriber (retain flag set), replaced by the
next one and cleared by an empty one; MQTT 5 retain handling 2 sends none, 1 only to a new
subscription; retain-as-published keeps the flag on a live message for the subscription that
asked and clears it for the others; retained messages survive a SIGKILL of the broker and of the
gateway (they live in the `mqtt/retained` queue, through the broker's journal). A will is
published when its client's process is SIGKILLed (3.1.1 and 5) and when an MQTT 5 client
disconnects with reason 0x04, never on a clean DISCONNECT (and its stored entry is gone); a will
with a delay comes after it, and a reconnect with the same client id within the delay cancels
it; a will outlives a SIGKILL of the gateway (published by the gateway once it is back). An
AMQP client's will (a message to `mqtt/wills`) is published when its process is killed, and
dropped when it closes its connection cleanly: the router tells the will service (`$lwt`).
"""

from __future__ import annotations

import contextlib
import itertools
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from enmasse.amqp import codec
from enmasse.amqp.client import Client
from enmasse.amqp.engine import Terminus
from enmasse.amqp.selector import SELECTOR_FILTER_KEY, SELECTOR_FILTER_SYMBOL
from enmasse.common.passwords import hash_password, scram_credentials
from enmasse.v1 import router_pb2
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.reasoncodes import ReasonCode
from paho.mqtt.subscribeoptions import SubscribeOptions
from proton import Described, symbol

from tests.fixtures.broker import BrokerProcess
from tests.fixtures.mqtt import V5, V311, WAIT, Device, GatewayProcess, Protocol
from tests.fixtures.router import RouterFleet, RouterProcess
from tests.fixtures.waiting import wait_for

pytestmark = pytest.mark.slow

PASSWORD = "secret"
RETAINED, WILLS = "mqtt/retained", "mqtt/wills"
TOPICS = [f"status/{n}" for n in range(8)] + [f"alerts/{n}" for n in range(10)]
_ids = itertools.count()

# A paho client with a will, run as a process of its own so that the test can SIGKILL it: its
# socket then ends without a DISCONNECT, as when a device loses power.
DEVICE_WITH_A_WILL = """
import sys, threading, time
import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
port, level, client_id, topic, payload, delay = sys.argv[1:7]
protocol = mqtt.MQTTv5 if level == "5" else mqtt.MQTTv311
client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=protocol)
client.username_pw_set("alice", "secret")
properties = None
if protocol == mqtt.MQTTv5 and int(delay):
    properties = Properties(PacketTypes.WILLMESSAGE)
    properties.WillDelayInterval = int(delay)
client.will_set(topic, payload.encode(), qos=1, properties=properties)
connected = threading.Event()
client.on_connect = lambda *args: connected.set()
client.connect("127.0.0.1", int(port), keepalive=60)
client.loop_start()
assert connected.wait(10)
print("connected", flush=True)
time.sleep(600)
"""

# An AMQP client that registers a will (a message to the will queue naming its container id and
# the will's address), then waits to be SIGKILLed.
AMQP_CLIENT_WITH_A_WILL = """
import sys, time
from enmasse.amqp import codec
from enmasse.amqp.client import Client
port, container, address, body = sys.argv[1:5]
client = Client("127.0.0.1", int(port), container_id=container, user="alice", password="secret")
will = codec.encode_message(
    body, durable=True, application_properties={"will_client": container, "will_address": address}
)
client.sender("mqtt/wills").send(will, timeout=10)
print("registered", flush=True)
time.sleep(600)
"""


def _gateway(workdir: Path, router_port: int) -> GatewayProcess:
    """A gateway keeping retained messages and wills; `kill()` is a SIGKILL."""
    options = (f"--retained-address={RETAINED}", f"--will-address={WILLS}")
    return GatewayProcess(workdir, router_port, options)


def _config(broker: BrokerProcess) -> router_pb2.RouterConfig:
    waypoint = [router_pb2.BrokerWaypoint(name="b1", host="127.0.0.1", port=broker.amqp_port)]
    addresses = [router_pb2.AddressRoute(address=t, type="multicast") for t in TOPICS]
    addresses += [
        router_pb2.AddressRoute(address=queue, type="queue", brokers=waypoint)
        for queue in (RETAINED, WILLS)
    ]
    return router_pb2.RouterConfig(
        generation=1,
        space="iot",
        addresses=addresses,
        users=[
            router_pb2.RouterUser(
                username="alice",
                password_hash=hash_password(PASSWORD),
                scram_credentials=scram_credentials(PASSWORD),
                authorization=[router_pb2.RouterRule(addresses=["#"], operations=["send", "recv"])],
            )
        ],
    )


@dataclass
class Space:
    broker: BrokerProcess
    router: RouterProcess
    gateway: GatewayProcess


@pytest.fixture(scope="module")
def space(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Space]:
    """One broker holding the retained and will queues, one router in front of it (the
    gateway's store logs in ANONYMOUS: `--client-auth optional`), one gateway."""
    broker = BrokerProcess(workdir=tmp_path_factory.mktemp("broker"))
    fleet = RouterFleet(workdir=tmp_path_factory.mktemp("router"))
    gateway: GatewayProcess | None = None
    try:
        broker.start()
        broker.ensure_queue(RETAINED)
        broker.ensure_queue(WILLS)
        router = fleet.start("r1", extra_args=("--client-auth=optional",))
        router.apply(_config(broker))
        gateway = _gateway(tmp_path_factory.mktemp("gateway"), router.amqp_port).start()
        yield Space(broker, router, gateway)
    finally:
        if gateway is not None:
            gateway.stop()
        fleet.stop_all()
        broker.stop(timeout=5)


Connect = Callable[..., Device]


@pytest.fixture
def device(space: Space) -> Iterator[Connect]:
    made: list[Device] = []

    def connect(protocol: Protocol = V5, **options: Any) -> Device:
        client = Device(
            space.gateway.port, protocol=protocol, user="alice", password=PASSWORD, **options
        )
        made.append(client)
        assert client.connack() == 0
        return client

    yield connect
    for client in made:
        with contextlib.suppress(Exception):
            client.close()


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.kill()
        process.wait(10)


def retain(client: Device, topic: str, payload: bytes) -> None:
    """A retained QoS 1 PUBLISH, acknowledged (so it is kept by now)."""
    mid = client.client.publish(topic, payload, qos=1, retain=True).mid
    assert client.puback(mid) == 0


def subscribe(client: Device, topic: str, *, handling: int = 0, as_published: bool = False) -> None:
    """An MQTT 5 SUBSCRIBE at QoS 1 with retain handling and retain-as-published."""
    options = SubscribeOptions(qos=1, retainAsPublished=as_published, retainHandling=handling)
    _result, mid = client.client.subscribe(topic, options=options)
    assert mid is not None
    with client._acked:
        assert client._acked.wait_for(lambda: mid in client.subacks, WAIT), "no SUBACK"
    assert client.subacks[mid] == [1]


def first_after_marker(client: Device, publisher: Device, topic: str) -> mqtt.MQTTMessage:
    """Publishes a plain marker to `topic` and returns the first message the client got: the
    marker itself when nothing (no retained message, no will) came before it."""
    assert publisher.publish(topic, b"marker", qos=1) == 0
    return client.receive()


def stored_wills(router: RouterProcess, key: str) -> int:
    """How many wills the will queue holds for `key`."""
    return stored(router, WILLS, f"will_client = '{key}'")


def stored(router: RouterProcess, queue: str, selector: str) -> int:
    """How many entries of `queue` the selector picks (browsed: they stay)."""
    selecting = {SELECTOR_FILTER_KEY: Described(symbol(SELECTOR_FILTER_SYMBOL), selector)}
    source = Terminus(address=queue, distribution_mode="copy", filter=selecting)
    with Client("127.0.0.1", router.amqp_port) as amqp:
        browser = amqp.receiver(queue, source=source, credit=100)
        count = 0
        with contextlib.suppress(TimeoutError):
            while True:
                browser.receive(1.0)
                count += 1
    return count


# -- retained messages -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("protocol", "topic"), [(V311, "status/0"), (V5, "status/1")], ids=["3.1.1", "5"]
)
def test_a_later_subscriber_gets_the_last_retained_message(
    device: Connect, space: Space, protocol: Protocol, topic: str
) -> None:
    publisher = device(protocol)
    retain(publisher, topic, b"on")
    retain(publisher, topic, b"off")
    assert stored(space.router, RETAINED, f"mqtt_topic = '{topic}'") == 1  # "on" taken off
    subscriber = device(protocol)
    assert subscriber.subscribe(topic, qos=1) == 1
    message = subscriber.receive()
    assert (message.payload, message.retain, message.qos) == (b"off", True, 1)
    assert first_after_marker(subscriber, publisher, topic).payload == b"marker"


def test_an_empty_retained_message_clears_the_topic(device: Connect) -> None:
    publisher = device(V311)
    retain(publisher, "status/2", b"open")
    retain(publisher, "status/2", b"")
    subscriber = device(V5)
    assert subscriber.subscribe("status/2", qos=1) == 1
    assert first_after_marker(subscriber, publisher, "status/2").payload == b"marker"


def test_retain_handling_and_retain_as_published(device: Connect) -> None:
    topic = "status/3"
    publisher = device(V5)
    retain(publisher, topic, b"v1")
    never = device(V5)
    subscribe(never, topic, handling=SubscribeOptions.RETAIN_DO_NOT_SEND)
    if_new = device(V5)
    subscribe(if_new, topic, handling=SubscribeOptions.RETAIN_SEND_IF_NEW_SUB)
    assert (if_new.receive().payload, if_new.messages.empty()) == (b"v1", True)
    subscribe(if_new, topic, handling=SubscribeOptions.RETAIN_SEND_IF_NEW_SUB)  # not new now
    as_published = device(V5)
    subscribe(as_published, topic, handling=SubscribeOptions.RETAIN_DO_NOT_SEND, as_published=True)
    retain(publisher, topic, b"v2")  # a live retained message
    assert [(m.payload, m.retain) for m in (never.receive(), if_new.receive())] == [
        (b"v2", False),
        (b"v2", False),
    ]
    message = as_published.receive()
    assert (message.payload, message.retain) == (b"v2", True)


def test_retained_messages_survive_a_broker_and_a_gateway_sigkill(
    device: Connect, space: Space
) -> None:
    topic = "status/4"
    retain(device(V5), topic, b"kept")
    space.broker.restart()  # SIGKILL, then the same broker again from its journal
    space.gateway.kill()
    space.gateway.start()

    def subscriber_gets_it() -> bool:
        subscriber = device(V311)
        assert subscriber.subscribe(topic, qos=1) == 1
        with contextlib.suppress(Exception):
            message = subscriber.messages.get(timeout=2.0)
            return (message.payload, message.retain) == (b"kept", True)
        return False  # the router has not reached the broker again yet

    wait_for(subscriber_gets_it, what="the retained message after the restarts", limit=60)


# -- wills -----------------------------------------------------------------------------------


def _killed_device(
    space: Space,
    processes: list[subprocess.Popen[str]],
    *,
    level: str,
    client_id: str,
    topic: str,
    payload: str,
    delay: int = 0,
    before: Callable[[], None] = lambda: None,
) -> subprocess.Popen[str]:
    """Runs a device with a will in its own process until it is connected, then (after
    `before`) SIGKILLs it."""
    process = subprocess.Popen(
        [
            sys.executable,
            "-c",
            DEVICE_WITH_A_WILL,
            str(space.gateway.port),
            level,
            client_id,
            topic,
            payload,
            str(delay),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    processes.append(process)
    assert process.stdout is not None
    assert process.stdout.readline().strip() == "connected"
    before()
    process.send_signal(signal.SIGKILL)
    process.wait(10)
    return process


@pytest.mark.parametrize(
    ("level", "topic"), [("4", "alerts/0"), ("5", "alerts/1")], ids=["3.1.1", "5"]
)
def test_a_will_is_published_when_the_client_is_killed(
    device: Connect, space: Space, processes: list[subprocess.Popen[str]], level: str, topic: str
) -> None:
    subscriber = device(V5)
    assert subscriber.subscribe(topic, qos=1) == 1
    _killed_device(
        space, processes, level=level, client_id=f"pump-{level}", topic=topic, payload="pump lost"
    )
    message = subscriber.receive()
    assert (message.topic, message.payload) == (topic, b"pump lost")


def test_a_will_outlives_a_sigkill_of_the_gateway(
    space: Space, processes: list[subprocess.Popen[str]]
) -> None:
    """The gateway dies with the device's connection (the device too, so that it does not
    reconnect): the will is in the queue, and the gateway publishes it when it is back (to an
    AMQP consumer: an MQTT subscriber would need the gateway)."""
    topic = "alerts/8"
    with Client("127.0.0.1", space.router.amqp_port) as amqp:
        consumer = amqp.receiver(topic, credit=10)
        _killed_device(
            space,
            processes,
            level="5",
            client_id="door-1",
            topic=topic,
            payload="door lost",
            before=space.gateway.kill,
        )
        assert stored_wills(space.router, "mqtt:door-1") == 1
        space.gateway.start()
        delivery = consumer.receive(WAIT)
    assert codec.read_body(delivery.payload) == b"door lost"
    wait_for(lambda: stored_wills(space.router, "mqtt:door-1") == 0, what="the will taken")


def test_no_will_on_a_clean_disconnect(device: Connect, space: Space) -> None:
    topic = "alerts/2"
    subscriber = device(V5)
    assert subscriber.subscribe(topic, qos=1) == 1
    leaving = device(V311, client_id="fan-1", will={"topic": topic, "payload": b"fan lost"})
    assert stored_wills(space.router, "mqtt:fan-1") == 1
    leaving.close()
    assert leaving.disconnected.wait(WAIT)
    wait_for(lambda: stored_wills(space.router, "mqtt:fan-1") == 0, what="the will dropped")
    assert first_after_marker(subscriber, device(V5), topic).payload == b"marker"


def test_a_disconnect_with_reason_4_publishes_the_will(device: Connect) -> None:
    topic = "alerts/3"
    subscriber = device(V5)
    assert subscriber.subscribe(topic, qos=1) == 1
    leaving = device(V5, will={"topic": topic, "payload": b"goodbye, with will", "qos": 1})
    leaving.client.disconnect(reasoncode=ReasonCode(PacketTypes.DISCONNECT, identifier=0x04))
    assert subscriber.receive().payload == b"goodbye, with will"


def test_a_delayed_will_comes_after_its_delay(
    device: Connect, space: Space, processes: list[subprocess.Popen[str]]
) -> None:
    topic = "alerts/4"
    subscriber = device(V5)
    assert subscriber.subscribe(topic, qos=1) == 1
    _killed_device(
        space, processes, level="5", client_id="vent-1", topic=topic, payload="late", delay=1
    )
    assert subscriber.receive().payload == b"late"


def test_a_reconnect_within_the_will_delay_cancels_the_will(
    device: Connect, space: Space, processes: list[subprocess.Popen[str]]
) -> None:
    topic, delay = "alerts/5", 8
    subscriber = device(V5)
    assert subscriber.subscribe(topic, qos=1) == 1
    _killed_device(
        space, processes, level="5", client_id="gate-1", topic=topic, payload="x", delay=delay
    )
    killed_at = time.monotonic()
    device(V5, client_id="gate-1")  # back, without a will
    assert time.monotonic() - killed_at < delay, "the reconnect came too late to prove anything"
    assert stored_wills(space.router, "mqtt:gate-1") == 0
    time.sleep(delay + 1 - (time.monotonic() - killed_at))  # past the delay: nothing comes
    assert first_after_marker(subscriber, device(V5), topic).payload == b"marker"


def test_an_amqp_clients_will_is_published_when_its_connection_is_lost(
    device: Connect, space: Space, processes: list[subprocess.Popen[str]]
) -> None:
    topic = "alerts/6"
    subscriber = device(V5)
    assert subscriber.subscribe(topic, qos=1) == 1
    process = subprocess.Popen(
        [
            sys.executable,
            "-c",
            AMQP_CLIENT_WITH_A_WILL,
            str(space.router.amqp_port),
            "sensor-7",
            topic,
            "sensor 7 lost",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    processes.append(process)
    assert process.stdout is not None
    assert process.stdout.readline().strip() == "registered"
    process.send_signal(signal.SIGKILL)
    process.wait(10)
    message = subscriber.receive()
    assert (message.topic, message.payload) == (topic, b"sensor 7 lost")


def test_an_amqp_clients_will_is_dropped_when_it_closes_cleanly(
    device: Connect, space: Space
) -> None:
    topic = "alerts/7"
    subscriber = device(V5)
    assert subscriber.subscribe(topic, qos=1) == 1
    will = codec.encode_message(
        "sensor 8 lost",
        durable=True,
        application_properties={"will_client": "sensor-8", "will_address": topic},
    )
    with Client(
        "127.0.0.1",
        space.router.amqp_port,
        container_id="sensor-8",
        user="alice",
        password=PASSWORD,
    ) as amqp:
        amqp.sender(WILLS).send(will, timeout=WAIT)
        assert stored_wills(space.router, "sensor-8") == 1
    wait_for(lambda: stored_wills(space.router, "sensor-8") == 0, what="the will dropped")
    assert first_after_marker(subscriber, device(V5), topic).payload == b"marker"
