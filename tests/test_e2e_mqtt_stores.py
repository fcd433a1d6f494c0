"""End to end on the local runtime: `enmasse up` turns the MQTT gateway's stores on, so a device
on a fresh standard space gets retained messages, wills and persistent sessions with nothing
declared for them.

The space `home` (plan standard-small, which serves MQTT) is applied with its topics and a
MessagingUser whose rules name those topics only; the config service gives the space its store
queues (`mqtt/retained`, `mqtt/wills`, `mqtt/sessions`, durable) and the gateway uses them as
its own store identity, which the router-agent gives the space's routers. Real devices
(paho-mqtt): a retained message reaches a later subscriber with the retain flag; a device
SIGKILLed (its socket ends without DISCONNECT) has its will published to a subscriber; a
persistent session (3.1.1 clean session 0) subscribed at QoS 1 gets, after reconnecting, every
message published while it was away, once each; the device's user still cannot touch the store
queues (AMQP: `amqp:unauthorized-access`); and after `enmasse down` and `enmasse up` the retained
message is still there (the queue is durable through its broker's journal).

The stack is this module's own (it is stopped and started again in the last test).
"""

from __future__ import annotations

import contextlib
import queue
import signal
import stat
import subprocess
import sys
from collections.abc import Callable, Iterator

import pytest
from enmasse.amqp import sasl
from enmasse.amqp.client import AmqpError, Client
from enmasse.amqp.engine import Condition

from tests.fixtures.local_runtime import LocalRuntime, enmasse, logs, running, wait_until
from tests.fixtures.mqtt import V5, V311, Device, Protocol

pytestmark = pytest.mark.slow

HOME = """
apiVersion: enmasse.io/v1
kind: AddressSpace
metadata: {name: home}
spec: {type: standard, plan: standard-small}
---
apiVersion: enmasse.io/v1
kind: MessagingUser
metadata: {name: device, space: home}
spec:
  username: device
  password: device-password
  authorization: [{addresses: [status, alerts, readings, settings], operations: [send, recv]}]
"""
TOPICS = ["status", "alerts", "readings", "settings"]
HOME += "".join(
    f"""---
apiVersion: enmasse.io/v1
kind: Address
metadata: {{name: {topic}, space: home}}
spec: {{address: {topic}, type: topic, plan: standard-small-topic}}
"""
    for topic in TOPICS
)
STORES = ["mqtt-retained", "mqtt-wills", "mqtt-sessions"]
USER, PASSWORD = "device", "device-password"
UP_TIMEOUT = 240.0

# A device with a will, run as a process of its own so that the test can SIGKILL it: its socket
# then ends without a DISCONNECT, as when a device loses power.
DEVICE_WITH_A_WILL = """
import sys, threading, time
import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
port, client_id, topic, payload = sys.argv[1:5]
client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv311)
client.username_pw_set("device", "device-password")
client.will_set(topic, payload.encode(), qos=1)
connected = threading.Event()
client.on_connect = lambda *args: connected.set()
client.connect("127.0.0.1", int(port), keepalive=60)
client.loop_start()
assert connected.wait(10)
print("connected", flush=True)
time.sleep(600)
"""


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRuntime]:
    """A stack of this module's own with the space `home` Active, its store queues too."""
    with running(tmp_path_factory.mktemp("mqtt-stores") / "var") as runtime:
        runtime.apply(HOME, name="home.yaml")
        runtime.wait_active("home", TOPICS + STORES, timeout=180)
        yield runtime


@pytest.fixture
def device(home: LocalRuntime) -> Iterator[Callable[..., Device]]:
    made: list[Device] = []

    def connect(protocol: Protocol = V5, **options: object) -> Device:
        client = Device(
            home.endpoint("home", "mqtt"),
            protocol=protocol,
            user=USER,
            password=PASSWORD,
            **options,  # type: ignore[arg-type]
        )
        made.append(client)
        return client

    yield connect
    for client in made:
        with contextlib.suppress(Exception):
            client.close()


def test_the_space_holds_its_store_queues_beside_its_own_addresses(home: LocalRuntime) -> None:
    phases = home.phases("home")
    # the store queues came with the space (and the DLQ their queue plan names)
    assert sorted(phases) == sorted([*TOPICS, *STORES, "dlq"])
    assert all(phases[name] == "Active" for name in STORES)
    # the store identity's password: the installation's, readable by its owner alone
    password = home.var / "run" / "mqtt-store-password"
    assert stat.S_IMODE(password.stat().st_mode) == 0o600
    assert len(password.read_text().strip()) >= 32


def test_a_retained_message_reaches_a_later_subscriber(device: Callable[..., Device]) -> None:
    publisher = device(V5)
    assert publisher.connack() == 0
    mid = publisher.client.publish("status", b"online", qos=1, retain=True).mid
    assert publisher.puback(mid) == 0
    for protocol in (V311, V5):
        subscriber = device(protocol)
        assert subscriber.connack() == 0
        assert subscriber.subscribe("status", qos=1) == 1
        message = subscriber.receive()
        assert (message.topic, message.payload, message.retain) == ("status", b"online", True)


def test_a_killed_devices_will_is_published(
    home: LocalRuntime, device: Callable[..., Device]
) -> None:
    watcher = device(V5)
    assert watcher.connack() == 0
    assert watcher.subscribe("alerts", qos=1) == 1
    process = subprocess.Popen(
        [
            sys.executable,
            "-c",
            DEVICE_WITH_A_WILL,
            str(home.endpoint("home", "mqtt")),
            "door-1",
            "alerts",
            "door-1 offline",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        assert process.stdout.readline().strip() == "connected"
        with pytest.raises(queue.Empty):  # alive: no will yet
            watcher.messages.get(timeout=1.0)
        process.send_signal(signal.SIGKILL)
        process.wait(10)
        will = watcher.receive()
        assert (will.topic, will.payload) == ("alerts", b"door-1 offline")
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)


def test_a_persistent_session_gets_what_was_published_while_it_was_away(
    device: Callable[..., Device],
) -> None:
    logger = device(V311, client_id="logger-1", clean=False)
    assert logger.connack() == 0
    assert logger.subscribe("readings", qos=1) == 1
    logger.close()  # a clean DISCONNECT: the session (clean session 0) stays

    publisher = device(V5)
    assert publisher.connack() == 0
    sent = [f"t={n}".encode() for n in range(5)]
    for payload in sent:
        assert publisher.publish("readings", payload, qos=1) == 0

    back = device(V311, client_id="logger-1", clean=False)
    assert back.connack() == 0
    assert back.session_present is True
    received = [back.receive() for _ in sent]
    assert [(m.topic, m.payload, m.qos) for m in received] == [("readings", p, 1) for p in sent]
    with pytest.raises(queue.Empty):  # none twice
        back.messages.get(timeout=2.0)


def test_the_devices_user_gains_no_access_to_the_store_queues(home: LocalRuntime) -> None:
    with (
        Client(
            "127.0.0.1",
            home.router_port("home"),
            user=USER,
            password=PASSWORD,
            mechanisms=sasl.CLIENT_MECHANISMS,
        ) as amqp,
        pytest.raises(AmqpError) as refused,
    ):
        amqp.receiver("mqtt/retained", credit=1)
    assert refused.value.condition == Condition(
        "amqp:unauthorized-access", "user 'device' may not recv from 'mqtt/retained'"
    )


def test_a_retained_message_outlives_a_restart_of_the_runtime(
    home: LocalRuntime, device: Callable[..., Device]
) -> None:
    publisher = device(V5)
    assert publisher.connack() == 0
    mid = publisher.client.publish("settings", b"mode=eco", qos=1, retain=True).mid
    assert publisher.puback(mid) == 0
    publisher.close()

    down = enmasse(home.var, "down", timeout=120)
    assert down.returncode == 0, down.stderr
    up = enmasse(home.var, "up", timeout=UP_TIMEOUT)
    assert up.returncode == 0, up.stderr + logs(home.var)
    # its port is kept unless another process took it meanwhile: ask where it listens now
    home.config = (home.var / "run" / "config.addr").read_text().strip()
    home.wait_active("home", TOPICS + STORES, timeout=180)

    port = home.endpoint("home", "mqtt")
    subscriber: list[Device] = []

    def connected() -> bool:  # the gateway comes up after the routers
        with contextlib.suppress(Exception):
            candidate = Device(port, protocol=V5, user=USER, password=PASSWORD)
            if candidate.connack() == 0:
                subscriber.append(candidate)
                return True
            candidate.close()
        return False

    assert wait_until(connected, timeout=60, interval=1.0), logs(home.var)
    try:
        assert subscriber[0].subscribe("settings", qos=1) == 1
        message = subscriber[0].receive()
        assert (message.topic, message.payload, message.retain) == ("settings", b"mode=eco", True)
    finally:
        subscriber[0].close()
