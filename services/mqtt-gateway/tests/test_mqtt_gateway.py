"""The MQTT gateway end to end: a real `enmasse-mqtt-gateway` process in front of a real router
process (`--client-auth optional`, MessagingUsers with rules), driven by a real MQTT client
(paho-mqtt, 3.1.1 and 5) and real AMQP clients.

What it shows: QoS 0 and QoS 1 round trips MQTT -> MQTT; MQTT publish -> AMQP consumer (with the
MQTT 5 properties mapped) and AMQP producer -> MQTT subscriber (the AMQP sender's delivery is
accepted once the MQTT client acknowledged it); a wrong password refused in the CONNACK; a user
without the send right refused in the PUBACK (0x87) and without the recv right in the SUBACK;
wildcard filters granted (`test_mqtt_wildcards.py` shows them at work); and bad input (a malformed
packet, ill-formed UTF-8 in a topic, a packet over the maximum size, a topic alias out of range or
never set) ends that client only, with MQTT 5's DISCONNECT reason, while another client keeps
working. A queue behind a real broker keeps a QoS 1 message until a device subscribes; a subscriber
that stops reading holds back the router (its producer's messages stay unsettled there), not the
gateway's memory; a client silent past its keep-alive is closed; a gateway whose router is down
answers CONNACK 0x88.

QoS 2 and MQTT 5 flow control: a QoS 2 round trip exactly once (3.1.1 and 5); a QoS 2 PUBLISH
resent with DUP before PUBREL forwarded once (raw packets, `RawClient`, written and read with
the gateway's own codec: paho will not resend on purpose); a QoS 2 delivery settled at the
router only on PUBCOMP; the client's receive maximum bounding what it has unacknowledged, the
gateway's ending a client that exceeds it (0x93); topic aliases both ways; a message over the
client's maximum packet size not sent to it while another subscriber gets it (and on a queue,
kept by the broker for the next consumer that can take it); the CONNACK's
limits and server keep alive, and a client silent past it disconnected (0x8D).
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from enmasse.amqp import codec
from enmasse.amqp.client import Client
from enmasse.amqp.engine import Outcome
from enmasse.common.passwords import hash_password, scram_credentials
from enmasse.mqtt_gateway.packets import (
    MAXIMUM_PACKET_SIZE,
    MQTT_3_1_1,
    MQTT_5,
    RECEIVE_MAXIMUM,
    TOPIC_ALIAS,
    TOPIC_ALIAS_MAXIMUM,
    Disconnect,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    decode,
    encode_puback,
    encode_pubcomp,
    encode_publish,
    encode_pubrec,
    encode_pubrel,
)
from enmasse.v1 import router_pb2
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from tests.fixtures.broker import BrokerFactory
from tests.fixtures.etcd import free_port
from tests.fixtures.mqtt import V5, V311, WAIT, Device, Protocol
from tests.fixtures.router import RouterFleet, RouterProcess

PASSWORD = "secret"
MAX_PACKET = 64 * 1024
MAX_KEEP_ALIVE = 120
USERS = {  # user -> operation -> address patterns
    "alice": {"send": ["#"], "recv": ["#"]},
    "reader": {"recv": ["#"]},
}
ADDRESSES = {
    "sensors/kitchen": "multicast",
    "sensors/hall": "multicast",
    "commands/pump": "anycast",
    "events": "multicast",
}


@dataclass
class GatewayProcess:
    process: subprocess.Popen[bytes]
    port: int
    log: Path

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                os.kill(self.process.pid, signal.SIGKILL)
                self.process.wait(5)


def start_gateway(
    workdir: Path, *, router_port: int, extra_args: tuple[str, ...] = ()
) -> GatewayProcess:
    ports_file = workdir / "gateway.ports.json"
    log_path = workdir / "gateway.log"
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "enmasse.mqtt_gateway.main",
                "--listen=127.0.0.1:0",
                f"--router=127.0.0.1:{router_port}",
                f"--max-packet-size={MAX_PACKET}",
                f"--ports-file={ports_file}",
                *extra_args,
            ],
            stdout=log,
            stderr=log,
            cwd=workdir,
        )
    deadline = time.monotonic() + 30
    while not ports_file.exists():
        if process.poll() is not None:
            raise RuntimeError(f"gateway exited: {log_path.read_text()[-2000:]}")
        if time.monotonic() > deadline:
            os.kill(process.pid, signal.SIGKILL)
            process.wait(5)
            raise RuntimeError("gateway did not start within 30 s")
        time.sleep(0.05)
    return GatewayProcess(process, json.loads(ports_file.read_text())["mqtt"], log_path)


HASH, SCRAM = hash_password(PASSWORD), scram_credentials(PASSWORD)  # the gateway logs in with SCRAM


def _config() -> router_pb2.RouterConfig:
    return router_pb2.RouterConfig(
        generation=1,
        space="iot",
        addresses=[router_pb2.AddressRoute(address=a, type=t) for a, t in ADDRESSES.items()],
        users=[
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
        ],
    )


@pytest.fixture(scope="module")
def router(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RouterProcess]:
    fleet = RouterFleet(workdir=tmp_path_factory.mktemp("mqtt-router"))
    try:
        started = fleet.start("r1", extra_args=("--client-auth=optional",))
        started.apply(_config())
        yield started
    finally:
        fleet.stop_all()


@pytest.fixture(scope="module")
def gateway(
    router: RouterProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    started = start_gateway(
        tmp_path_factory.mktemp("mqtt-gateway"),
        router_port=router.amqp_port,
        extra_args=(f"--max-keep-alive={MAX_KEEP_ALIVE}",),
    )
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture
def device(gateway: GatewayProcess) -> Iterator[Callable[..., Device]]:
    made: list[Device] = []

    def connect(
        protocol: Protocol = V5,
        *,
        user: str | None = "alice",
        password: str | None = PASSWORD,
        **options: Any,
    ) -> Device:
        connected = Device(gateway.port, protocol=protocol, user=user, password=password, **options)
        made.append(connected)
        return connected

    yield connect
    for each in made:
        each.close()


def connected(device: Callable[..., Device], protocol: Protocol, **login: Any) -> Device:
    client = device(protocol, **login)
    assert client.connack() == 0
    return client


# -- round trips -----------------------------------------------------------------------------


@pytest.mark.parametrize("protocol", [V311, V5], ids=["3.1.1", "5"])
@pytest.mark.parametrize("qos", [0, 1])
def test_a_message_goes_from_device_to_device(
    device: Callable[..., Device], protocol: Protocol, qos: int
) -> None:
    subscriber = connected(device, protocol)
    publisher = connected(device, protocol)
    assert subscriber.subscribe("sensors/kitchen", qos=qos) == qos
    assert publisher.publish("sensors/kitchen", b"21.5", qos=qos) == 0
    message = subscriber.receive()
    assert (message.topic, message.payload, message.qos) == ("sensors/kitchen", b"21.5", qos)


def test_a_qos1_publish_reaches_a_qos0_subscription_at_qos0(
    device: Callable[..., Device],
) -> None:
    subscriber = connected(device, V5)
    publisher = connected(device, V311)
    assert subscriber.subscribe("sensors/hall", qos=0) == 0
    assert publisher.publish("sensors/hall", b"on", qos=1) == 0
    message = subscriber.receive()
    assert (message.payload, message.qos) == (b"on", 0)


def test_mqtt_publish_reaches_an_amqp_consumer_with_its_properties(
    device: Callable[..., Device], router: RouterProcess
) -> None:
    with Client("127.0.0.1", router.amqp_port, user="alice", password=PASSWORD) as amqp:
        consumer = amqp.receiver("commands/pump", credit=10)
        publisher = connected(device, V5)
        properties = Properties(PacketTypes.PUBLISH)
        properties.ContentType = "text/plain"
        properties.UserProperty = [("site", "north")]
        properties.ResponseTopic = "events"
        properties.CorrelationData = b"req-1"
        mid = publisher.publish_async("commands/pump", b"start", qos=1, properties=properties)
        delivery = consumer.receive(WAIT)
        assert mid not in publisher.acks  # no PUBACK before the consumer's outcome
        consumer.accept(delivery)
        assert publisher.puback(mid) == 0
    assert codec.read_body(delivery.payload) == b"start"
    assert delivery.durable
    assert codec.read_application_properties(delivery.payload) == {"site": "north"}
    fields = codec.read_properties(delivery.payload)
    assert (fields.content_type, fields.reply_to, fields.correlation_id) == (
        "text/plain",
        "events",
        b"req-1",
    )


@pytest.mark.parametrize("protocol", [V311, V5], ids=["3.1.1", "5"])
def test_an_amqp_producer_reaches_an_mqtt_subscriber(
    device: Callable[..., Device], router: RouterProcess, protocol: Protocol
) -> None:
    subscriber = connected(device, protocol)
    assert subscriber.subscribe("commands/pump", qos=1) == 1
    with Client("127.0.0.1", router.amqp_port, user="alice", password=PASSWORD) as amqp:
        sent = amqp.sender("commands/pump").send(codec.encode_message(b"stop"), timeout=WAIT)
        message = subscriber.receive()
    assert (message.topic, message.payload, message.qos) == ("commands/pump", b"stop", 1)
    assert sent.outcome is Outcome.ACCEPTED  # settled once paho sent its PUBACK


# -- who may do what -------------------------------------------------------------------------


# paho reports 3.1.1's return code 4 (bad user name or password) as MQTT 5's 0x86 too.
@pytest.mark.parametrize("protocol", [V311, V5], ids=["3.1.1", "5"])
def test_a_wrong_password_is_refused_in_the_connack(
    device: Callable[..., Device], protocol: Protocol
) -> None:
    refused = device(protocol, user="alice", password="wrong")
    assert refused.connack() == 0x86


def test_a_user_without_the_send_right_gets_puback_not_authorized(
    device: Callable[..., Device],
) -> None:
    reader = connected(device, V5, user="reader")
    assert reader.publish("commands/pump", b"x", qos=1) == 0x87
    assert reader.subscribe("sensors/kitchen", qos=1) == 1  # its recv right still works


def test_a_user_without_the_recv_right_gets_suback_not_authorized(
    device: Callable[..., Device], router: RouterProcess
) -> None:
    router.apply(_config_with(generation=2, user="writer", rules={"send": ["#"]}))
    writer = connected(device, V5, user="writer")
    assert writer.subscribe("events", qos=0) == 0x87
    writer_311 = connected(device, V311, user="writer")
    assert writer_311.subscribe("events", qos=0) == 0x80


def _config_with(*, generation: int, user: str, rules: dict[str, list[str]]) -> Any:
    config = _config()
    config.generation = generation
    config.users.append(
        router_pb2.RouterUser(
            username=user,
            password_hash=HASH,
            scram_credentials=SCRAM,
            authorization=[
                router_pb2.RouterRule(addresses=patterns, operations=[operation])
                for operation, patterns in rules.items()
            ],
        )
    )
    return config


@pytest.mark.parametrize("protocol", [V311, V5], ids=["3.1.1", "5"])
@pytest.mark.parametrize("topic_filter", ["sensors/+", "sensors/#"])
def test_wildcard_filters_are_granted(
    device: Callable[..., Device], protocol: Protocol, topic_filter: str
) -> None:
    client = connected(device, protocol)
    assert client.subscribe(topic_filter, qos=1) == 1


# -- bad input ends that client only ---------------------------------------------------------


def _raw_v5_client(port: int) -> socket.socket:
    """A socket that has sent an anonymous MQTT 5 CONNECT and read its CONNACK."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=WAIT)
    body = b"\x00\x04MQTT\x05\x02\x00\x3c\x00" + b"\x00\x03raw"
    sock.sendall(bytes([0x10, len(body)]) + body)
    connack = sock.recv(64)
    assert (connack[0], connack[3]) == (0x20, 0), connack  # success, with the gateway's limits
    return sock


def _disconnect_reason(sock: socket.socket) -> int:
    """The reason code of the DISCONNECT the gateway sends before it closes the socket."""
    data = b""
    while True:
        chunk = sock.recv(4096)
        if not chunk:
            break
        data += chunk
    assert data[:1] == b"\xe0", data
    return data[2]


@pytest.mark.parametrize(
    ("packet", "reason"),
    [
        (b"\x36\x03\x00\x01a", 0x81),  # PUBLISH with QoS 3
        (b"\x30\x05\x00\x02\xff\xfe\x00", 0x81),  # topic of ill-formed UTF-8
        (b"\x30\x05\x00\x02a+\x00", 0x90),  # a wildcard in a topic name
        (b"\x82\xff\xff\x07", 0x95),  # a SUBSCRIBE of 131,071 bytes: over the maximum
        (b"\xf0\x00", 0x82),  # AUTH, though CONNECT named no authentication method
        (b"\x30\x07\x00\x01a\x03\x23\x00\x00", 0x94),  # topic alias 0
        (b"\x30\x07\x00\x01a\x03\x23\x00\x11", 0x94),  # topic alias 17: over the 16 allowed
        (b"\x30\x06\x00\x00\x03\x23\x00\x05", 0x82),  # an alias never set, no topic
    ],
    ids=[
        "qos3",
        "utf8",
        "wildcard-topic",
        "too-large",
        "auth",
        "alias-0",
        "alias-17",
        "alias-unset",
    ],
)
def test_bad_input_closes_that_client_only(
    device: Callable[..., Device], gateway: GatewayProcess, packet: bytes, reason: int
) -> None:
    bystander = connected(device, V5)
    assert bystander.subscribe("events", qos=1) == 1
    with _raw_v5_client(gateway.port) as sock:
        sock.sendall(packet)
        assert _disconnect_reason(sock) == reason
    publisher = connected(device, V311)
    assert publisher.publish("events", b"still here", qos=1) == 0
    assert bystander.receive().payload == b"still here"
    assert not bystander.disconnected.is_set()


def test_a_malformed_311_packet_just_closes_the_client(gateway: GatewayProcess) -> None:
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=WAIT) as sock:
        body = b"\x00\x04MQTT\x04\x02\x00\x3c" + b"\x00\x03raw"
        sock.sendall(bytes([0x10, len(body)]) + body)
        assert sock.recv(64) == b"\x20\x02\x00\x00"
        sock.sendall(b"\x36\x03\x00\x01a")
        assert sock.recv(64) == b""  # closed, no DISCONNECT in 3.1.1


# -- a queue: the broker keeps what a device published until a subscriber comes ---------------


def _router_with_queue(
    routers: RouterFleet, broker_factory: BrokerFactory, *, queue: str, name: str
) -> RouterProcess:
    """A router of its own whose space has `queue` on a real broker, besides the usual ones."""
    broker = broker_factory()
    broker.ensure_queue(queue)
    router = routers.start(name, extra_args=("--client-auth=optional",))
    config = _config()
    config.addresses.append(
        router_pb2.AddressRoute(
            address=queue,
            type="queue",
            brokers=[router_pb2.BrokerWaypoint(name="b1", host="127.0.0.1", port=broker.amqp_port)],
        )
    )
    router.apply(config)
    return router


def test_a_queue_keeps_a_qos1_message_until_a_device_subscribes(
    routers: RouterFleet, broker_factory: BrokerFactory, tmp_path: Path
) -> None:
    router = _router_with_queue(routers, broker_factory, queue="orders", name="rq")
    gateway = start_gateway(tmp_path, router_port=router.amqp_port)
    publisher = subscriber = None
    try:
        publisher = Device(gateway.port, protocol=V5, user="alice", password=PASSWORD)
        assert publisher.connack() == 0
        assert publisher.publish("orders", b"order-1", qos=1) == 0  # accepted by the broker
        subscriber = Device(gateway.port, protocol=V311, user="alice", password=PASSWORD)
        assert subscriber.connack() == 0
        assert subscriber.subscribe("orders", qos=1) == 1
        message = subscriber.receive()
        assert (message.topic, message.payload, message.qos) == ("orders", b"order-1", 1)
    finally:
        for client in (publisher, subscriber):
            if client is not None:
                client.close()
        gateway.stop()


def test_a_311_client_without_an_id_must_start_clean(gateway: GatewayProcess) -> None:
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=WAIT) as sock:
        body = b"\x00\x04MQTT\x04\x00\x00\x3c" + b"\x00\x00"  # no id, clean session 0
        sock.sendall(bytes([0x10, len(body)]) + body)
        assert sock.recv(64) == b"\x20\x02\x00\x02"  # identifier rejected


def test_a_subscriber_that_stops_reading_holds_back_the_router_not_the_gateways_memory(
    gateway: GatewayProcess, router: RouterProcess
) -> None:
    """A QoS 0 subscriber that reads nothing: once its socket's buffers are full the gateway
    gives the router no more credit, so the producer's messages wait at the router (unsettled)
    instead of piling up in the gateway; once the client reads, they all come."""
    count, body = 800, b"x" * 65536
    with _raw_v5_client(gateway.port) as sock:
        topic = b"commands/pump"
        subscribe = b"\x00\x01\x00" + len(topic).to_bytes(2, "big") + topic + b"\x00"
        sock.sendall(bytes([0x82, len(subscribe)]) + subscribe)
        assert sock.recv(5)[:1] == b"\x90"  # SUBACK
        with Client("127.0.0.1", router.amqp_port, user="alice", password=PASSWORD) as amqp:
            sender = amqp.sender("commands/pump")
            sent = [sender.send_async(codec.encode_message(body)) for _ in range(count)]
            settled = _settled_when_steady(sent)
            assert settled < count  # held back: the client has read nothing
            drained = threading.Event()
            reader = threading.Thread(target=_read_until, args=(sock, drained), daemon=True)
            reader.start()
            try:
                for future in sent:
                    assert future.result(60).outcome is Outcome.ACCEPTED
            finally:
                drained.set()
                reader.join(10)


def _settled_when_steady(sent: list[Any]) -> int:
    """How many sends were settled once that number stopped moving for a second (bounded)."""
    last, deadline = -1, time.monotonic() + 60
    while time.monotonic() < deadline:
        settled = sum(future.done() for future in sent)
        if settled == last:
            return settled
        last = settled
        time.sleep(1.0)
    return last


def _read_until(sock: socket.socket, stop: threading.Event) -> None:
    sock.settimeout(0.5)
    while not stop.is_set():
        try:
            if not sock.recv(1 << 20):
                return
        except TimeoutError:
            continue


def test_a_client_silent_past_its_keep_alive_is_closed(gateway: GatewayProcess) -> None:
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=WAIT) as sock:
        body = b"\x00\x04MQTT\x04\x02\x00\x01" + b"\x00\x03raw"  # keep-alive: 1 s
        sock.sendall(bytes([0x10, len(body)]) + body)
        assert sock.recv(64) == b"\x20\x02\x00\x00"
        sock.sendall(b"\xc0\x00")  # PINGREQ
        assert sock.recv(64) == b"\xd0\x00"  # PINGRESP
        assert sock.recv(64) == b""  # then nothing for 1.5 s: closed


def test_a_gateway_whose_router_is_down_says_server_unavailable(tmp_path: Path) -> None:
    gateway = start_gateway(tmp_path, router_port=free_port())  # nobody listens there
    try:
        client = Device(gateway.port, protocol=V5, user="alice", password=PASSWORD)
        try:
            assert client.connack() == 0x88
        finally:
            client.close()
    finally:
        gateway.stop()


# -- QoS 2 and MQTT 5 flow control -------------------------------------------------------------


class RawClient:
    """An MQTT client of raw packets written and read with the gateway's own codec, for what
    paho will not do: resend a PUBLISH with DUP, hold back acknowledgements, set topic aliases
    and read the ones the gateway sets, claim a small maximum packet size."""

    def __init__(
        self, port: int, *, level: int = MQTT_5, properties: dict[int, Any] | None = None
    ) -> None:
        self.level = level
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=WAIT)
        body = b"\x00\x04MQTT" + bytes([level, 0xC2]) + b"\x00\x3c"  # user, password, clean
        if level >= MQTT_5:
            body += _properties(properties or {})
        body += _field(f"raw-{next(_raw_ids)}".encode()) + _field(b"alice")
        body += _field(PASSWORD.encode())
        self.sock.sendall(bytes([0x10]) + _varint(len(body)) + body)
        first, connack = self.read_raw()
        assert (first, connack[1]) == (0x20, 0), connack

    def read_raw(self) -> tuple[int, bytes]:
        first = self._exactly(1)[0]
        length, shift = 0, 0
        while True:
            digit = self._exactly(1)[0]
            length |= (digit & 0x7F) << shift
            shift += 7
            if not digit & 0x80:
                break
        return first, self._exactly(length)

    def read(self) -> Any:
        """The next packet the gateway sent, decoded (PUBLISH, the acks, DISCONNECT)."""
        first, body = self.read_raw()
        return decode(first, body, level=self.level)

    def quiet_for(self, seconds: float) -> bool:
        """Whether nothing arrives for that long (then the socket's timeout is WAIT again)."""
        self.sock.settimeout(seconds)
        try:
            return not self.sock.recv(1, socket.MSG_PEEK)
        except TimeoutError:
            return True
        finally:
            self.sock.settimeout(WAIT)

    def _exactly(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            assert chunk, "the gateway closed the connection"
            data += chunk
        return data

    def send(self, packet: bytes) -> None:
        self.sock.sendall(packet)

    def publish(self, publish: Publish) -> None:
        self.send(encode_publish(publish, level=self.level))

    def subscribe(self, topic: str, *, qos: int) -> int:
        body = b"\x00\x01" + (b"\x00" if self.level >= MQTT_5 else b"") + _field(topic.encode())
        self.send(bytes([0x82]) + _varint(len(body) + 1) + body + bytes([qos]))
        first, suback = self.read_raw()
        assert first == 0x90, suback
        return suback[-1]

    def close(self) -> None:
        self.sock.close()


_raw_ids = itertools.count()


def _field(raw: bytes) -> bytes:
    return len(raw).to_bytes(2, "big") + raw


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        digit, n = n & 0x7F, n >> 7
        out.append(digit | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _properties(properties: dict[int, Any]) -> bytes:
    """MQTT 5 CONNECT properties of two- and four-byte integers (all a test client sets)."""
    out = b""
    for identifier, value in properties.items():
        size = 4 if identifier == MAXIMUM_PACKET_SIZE else 2
        out += bytes([identifier]) + value.to_bytes(size, "big")
    return _varint(len(out)) + out


@pytest.fixture
def raw(gateway: GatewayProcess) -> Iterator[Callable[..., RawClient]]:
    made: list[RawClient] = []

    def connect(**options: Any) -> RawClient:
        client = RawClient(gateway.port, **options)
        made.append(client)
        return client

    yield connect
    for each in made:
        each.close()


def _only(subscriber: Device, payloads: list[bytes]) -> None:
    """The subscriber got exactly these messages: the last is a marker published after the
    others on the same address, so once it came any duplicate before it had come too."""
    got = [subscriber.receive().payload for _ in payloads]
    assert got == payloads
    assert subscriber.messages.empty()


@pytest.mark.parametrize("protocol", [V311, V5], ids=["3.1.1", "5"])
def test_a_qos2_message_goes_from_device_to_device_exactly_once(
    device: Callable[..., Device], protocol: Protocol
) -> None:
    subscriber = connected(device, protocol)
    publisher = connected(device, protocol)
    assert subscriber.subscribe("sensors/kitchen", qos=2) == 2
    assert publisher.publish("sensors/kitchen", b"22.0", qos=2) == 0  # PUBCOMP
    message = subscriber.receive()
    assert (message.topic, message.payload, message.qos) == ("sensors/kitchen", b"22.0", 2)
    assert publisher.publish("sensors/kitchen", b"marker", qos=1) == 0
    _only(subscriber, [b"marker"])


def test_the_connack_advertises_qos2_and_the_gateways_limits(
    device: Callable[..., Device],
) -> None:
    client = device(V5, keepalive=0)
    assert client.connack() == 0
    assert _told(client, "MaximumQoS") is None  # absent: QoS 2 (the property says 0 or 1)
    assert (_told(client, "ReceiveMaximum"), _told(client, "TopicAliasMaximum")) == (100, 16)
    assert _told(client, "ServerKeepAlive") == MAX_KEEP_ALIVE  # asked for none: the gateway's
    longer = device(V5, keepalive=MAX_KEEP_ALIVE * 2)
    assert longer.connack() == 0
    assert _told(longer, "ServerKeepAlive") == MAX_KEEP_ALIVE
    shorter = device(V5, keepalive=30)
    assert shorter.connack() == 0
    assert _told(shorter, "ServerKeepAlive") is None  # its own stands


def _told(client: Device, name: str) -> Any:
    """A property of the client's CONNACK as paho read it, None when the gateway sent none."""
    return getattr(client.connack_properties, name, None)


@pytest.mark.parametrize("level", [MQTT_3_1_1, MQTT_5], ids=["3.1.1", "5"])
def test_a_qos2_publish_resent_before_pubrel_is_forwarded_once(
    device: Callable[..., Device], raw: Callable[..., RawClient], level: int
) -> None:
    subscriber = connected(device, V5)
    assert subscriber.subscribe("sensors/hall", qos=2) == 2
    publisher = raw(level=level)
    first = Publish(topic="sensors/hall", payload=b"once", qos=2, packet_id=7)
    publisher.publish(first)
    assert publisher.read() == PubRec(7)
    publisher.publish(replace(first, dup=True))  # as if the PUBREC had been lost
    assert publisher.read() == PubRec(7)  # answered again, not forwarded again
    publisher.send(encode_pubrel(7, level=level))
    assert publisher.read() == PubComp(7)
    # A resend that overtakes the outcome of the first (both sent before any answer).
    second = Publish(topic="sensors/hall", payload=b"twice sent", qos=2, packet_id=8)
    publisher.send(
        encode_publish(second, level=level) + encode_publish(replace(second, dup=True), level=level)
    )
    assert publisher.read() == PubRec(8)
    publisher.send(encode_pubrel(8, level=level))
    answer = publisher.read()
    if answer == PubRec(8):  # the resend came after the outcome: answered with PUBREC too
        answer = publisher.read()
    assert answer == PubComp(8)
    publisher.publish(Publish(topic="sensors/hall", payload=b"marker", qos=1, packet_id=9))
    assert publisher.read() == PubAck(9)
    _only(subscriber, [b"once", b"twice sent", b"marker"])
    if level >= MQTT_5:  # a PUBREL for an id no longer held: PUBCOMP 0x92
        publisher.send(encode_pubrel(7, level=level))
        assert publisher.read() == PubComp(7, reason=0x92)


def test_a_qos2_delivery_is_settled_at_the_router_only_on_pubcomp(
    raw: Callable[..., RawClient], router: RouterProcess
) -> None:
    subscriber = raw()
    assert subscriber.subscribe("commands/pump", qos=2) == 2
    with Client("127.0.0.1", router.amqp_port, user="alice", password=PASSWORD) as amqp:
        sent = amqp.sender("commands/pump").send_async(codec.encode_message(b"open"))
        publish = subscriber.read()
        assert (publish.topic, publish.payload, publish.qos) == ("commands/pump", b"open", 2)
        subscriber.send(encode_pubrec(publish.packet_id, level=MQTT_5))
        assert subscriber.read() == PubRel(publish.packet_id)
        assert not sent.done()  # the client has not completed the exchange yet
        subscriber.send(encode_pubcomp(publish.packet_id, level=MQTT_5))
        assert sent.result(WAIT).outcome is Outcome.ACCEPTED


def test_the_clients_receive_maximum_bounds_what_it_has_unacknowledged(
    raw: Callable[..., RawClient], router: RouterProcess
) -> None:
    """Receive maximum 2 across two subscriptions: each gives the router credit 2, and the
    gateway holds the third and fourth until the client acknowledges what it has."""
    subscriber = raw(properties={RECEIVE_MAXIMUM: 2})
    assert subscriber.subscribe("commands/pump", qos=1) == 1
    assert subscriber.subscribe("events", qos=1) == 1
    with Client("127.0.0.1", router.amqp_port, user="alice", password=PASSWORD) as amqp:
        senders = {address: amqp.sender(address) for address in ("commands/pump", "events")}
        expected = [f"{address} {i}".encode() for address in senders for i in range(3)]
        sent = [
            senders[payload.decode().split()[0]].send_async(
                codec.encode_message(payload, durable=True)  # QoS 1 for multicast too
            )
            for payload in expected
        ]
        unacked = [subscriber.read(), subscriber.read()]
        got = [p.payload for p in unacked]
        assert subscriber.quiet_for(1.0)  # two in flight: the others wait
        while unacked:
            subscriber.send(encode_puback(unacked.pop(0).packet_id, level=MQTT_5))
            if len(got) < len(sent):
                unacked.append(subscriber.read())  # one acknowledged: one more comes
                got.append(unacked[-1].payload)
        assert sorted(got) == sorted(expected)
        assert [future.result(WAIT).outcome for future in sent] == [Outcome.ACCEPTED] * 6


def test_a_client_over_the_gateways_receive_maximum_is_disconnected(
    raw: Callable[..., RawClient],
) -> None:
    publisher = raw()
    for packet_id in range(1, 102):  # QoS 2 never released: every id stays in flight
        publisher.publish(Publish(topic="events", payload=b"x", qos=2, packet_id=packet_id))
    answers = [publisher.read()]
    while not isinstance(answers[-1], Disconnect):  # outcomes back before the 101st: PUBREC
        answers.append(publisher.read())
    assert answers[-1] == Disconnect(0x93)
    assert all(isinstance(answer, PubRec) for answer in answers[:-1])


def test_a_topic_alias_set_by_the_client_stands_for_its_topic(
    device: Callable[..., Device], raw: Callable[..., RawClient]
) -> None:
    subscriber = connected(device, V5)
    assert subscriber.subscribe("sensors/kitchen", qos=1) == 1
    publisher = raw()
    alias = {TOPIC_ALIAS: 3}
    publisher.publish(Publish("sensors/kitchen", b"set", 1, packet_id=1, properties=alias))
    publisher.publish(Publish("", b"used", 1, packet_id=2, properties=alias))
    assert [publisher.read(), publisher.read()] == [PubAck(1), PubAck(2)]
    messages = [subscriber.receive(), subscriber.receive()]
    assert [(m.topic, m.payload) for m in messages] == [
        ("sensors/kitchen", b"set"),
        ("sensors/kitchen", b"used"),
    ]


def test_the_gateway_sets_topic_aliases_up_to_the_clients_maximum(
    device: Callable[..., Device], raw: Callable[..., RawClient]
) -> None:
    subscriber = raw(properties={TOPIC_ALIAS_MAXIMUM: 1})
    assert subscriber.subscribe("sensors/kitchen", qos=0) == 0
    assert subscriber.subscribe("sensors/hall", qos=0) == 0
    publisher = connected(device, V5)
    assert publisher.publish("sensors/kitchen", b"1", qos=1) == 0
    assert publisher.publish("sensors/kitchen", b"2", qos=1) == 0
    got = [subscriber.read(), subscriber.read()]  # the kitchen's first: it gets the one alias
    assert publisher.publish("sensors/hall", b"3", qos=1) == 0
    got.append(subscriber.read())
    assert [(p.topic, p.properties, p.payload) for p in got] == [
        ("sensors/kitchen", {TOPIC_ALIAS: 1}, b"1"),  # the alias set
        ("", {TOPIC_ALIAS: 1}, b"2"),  # and used
        ("sensors/hall", {}, b"3"),  # the client allows one alias: the rest go by name
    ]


def test_a_message_over_the_clients_maximum_packet_size_is_not_sent_to_it(
    device: Callable[..., Device], raw: Callable[..., RawClient]
) -> None:
    small = raw(properties={MAXIMUM_PACKET_SIZE: 200})
    assert small.subscribe("events", qos=1) == 1
    normal = connected(device, V5)
    assert normal.subscribe("events", qos=1) == 1
    publisher = connected(device, V5)
    assert publisher.publish("events", b"x" * 1000, qos=1) == 0
    assert publisher.publish("events", b"small", qos=1) == 0
    assert [normal.receive().payload, normal.receive().payload] == [b"x" * 1000, b"small"]
    publish = small.read()
    assert publish.payload == b"small"  # the large one was discarded, the client kept
    small.send(encode_puback(publish.packet_id, level=MQTT_5))


def test_a_client_silent_past_the_server_keep_alive_is_disconnected(
    router: RouterProcess, tmp_path: Path
) -> None:
    gateway = start_gateway(
        tmp_path, router_port=router.amqp_port, extra_args=("--max-keep-alive=1",)
    )
    try:
        client = RawClient(gateway.port)  # asks for 60 s: told 1 s
        assert client.read() == Disconnect(0x8D)  # keep alive timeout, after 1.5 s of silence
        client.close()
    finally:
        gateway.stop()


def test_a_queue_keeps_a_message_too_large_for_its_consumer_for_another(
    routers: RouterFleet, broker_factory: BrokerFactory, tmp_path: Path
) -> None:
    """The oversized message is settled MODIFIED undeliverable-here: the broker keeps it, offers
    it no more to the small client (which goes on getting what fits), and gives it to the next
    consumer that can take it."""
    router = _router_with_queue(routers, broker_factory, queue="jobs", name="rj")
    gateway = start_gateway(tmp_path, router_port=router.amqp_port)
    small = RawClient(gateway.port, properties={MAXIMUM_PACKET_SIZE: 200})
    publisher = normal = None
    try:
        assert small.subscribe("jobs", qos=1) == 1
        publisher = Device(gateway.port, protocol=V5, user="alice", password=PASSWORD)
        assert publisher.connack() == 0
        assert publisher.publish("jobs", b"x" * 1000, qos=1) == 0
        assert publisher.publish("jobs", b"small", qos=1) == 0
        publish = small.read()
        assert publish.payload == b"small"
        small.send(encode_puback(publish.packet_id, level=MQTT_5))
        normal = Device(gateway.port, protocol=V5, user="alice", password=PASSWORD)
        assert normal.connack() == 0
        assert normal.subscribe("jobs", qos=1) == 1
        assert normal.receive().payload == b"x" * 1000
    finally:
        small.close()
        for client in (publisher, normal):
            if client is not None:
                client.close()
        gateway.stop()
