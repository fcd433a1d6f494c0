"""Persistent MQTT sessions end to end: two real `enmasse-mqtt-gateway` processes in front of one
real router and one real broker, driven by real MQTT clients (paho-mqtt, 3.1.1 and 5).

What it shows: a persistent session (MQTT 5 session expiry, 3.1.1 clean session 0) gets the QoS 1
messages its topic took while the client was away, through the other gateway instance and across
a SIGKILL of the gateway it was connected to; the CONNACK says whether a session was present; a
clean start discards the old session (nothing it kept is delivered); QoS 2 messages published
while away arrive each exactly once; an expired session is not resumed and what it kept is gone,
and so is one whose DISCONNECT set its expiry to 0;
without a session store (`--sessions-address` unset) an MQTT 5 client is told in the CONNACK that
its session will not be kept. The session's subscriptions live on the broker (durable
subscriptions) and its record in the `mqtt/sessions` queue: nothing of it is in a gateway.

And under `enmasse up --mqtt-gateways 2`, a standard space's status lists two `mqtt` endpoints,
devices on either reach the same addresses, and going back to one lists one again.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from enmasse.common.passwords import hash_password, scram_credentials
from enmasse.v1 import router_pb2
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from tests.fixtures.broker import BrokerProcess
from tests.fixtures.local_runtime import LocalRuntime, enmasse, wait_until
from tests.fixtures.mqtt import V5, V311, WAIT, Device, GatewayProcess, Protocol
from tests.fixtures.router import RouterFleet, RouterProcess

pytestmark = pytest.mark.slow

PASSWORD = "secret"
SESSIONS = "mqtt/sessions"
TOPICS = ("telemetry", "alerts", "meters", "doors", "valves", "lights", "pumps")
_clients = itertools.count()


def _gateway(workdir: Path, router_port: int, sessions: str | None) -> GatewayProcess:
    """A gateway keeping sessions in the queue `sessions` (None: none); `kill()` is a SIGKILL."""
    options = (f"--sessions-address={sessions}",) if sessions else ()
    return GatewayProcess(workdir, router_port, options)


def _config(broker: BrokerProcess) -> router_pb2.RouterConfig:
    waypoint = [router_pb2.BrokerWaypoint(name="b1", host="127.0.0.1", port=broker.amqp_port)]
    addresses = [router_pb2.AddressRoute(address=t, type="topic", brokers=waypoint) for t in TOPICS]
    addresses.append(router_pb2.AddressRoute(address=SESSIONS, type="queue", brokers=waypoint))
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


@pytest.fixture(scope="module")
def space(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[BrokerProcess, RouterProcess]]:
    """One broker holding the topics and the sessions queue; one router in front of it (the
    gateways' store logs in ANONYMOUS: `--client-auth optional`)."""
    broker = BrokerProcess(workdir=tmp_path_factory.mktemp("broker"))
    fleet = RouterFleet(workdir=tmp_path_factory.mktemp("router"))
    try:
        broker.start()
        for topic in TOPICS:
            broker.ensure_topic(topic)
        broker.ensure_queue(SESSIONS)
        router = fleet.start("r1", extra_args=("--client-auth=optional",))
        router.apply(_config(broker))
        yield broker, router
    finally:
        fleet.stop_all()
        broker.stop(timeout=5)


@pytest.fixture(scope="module")
def gateways(
    space: tuple[BrokerProcess, RouterProcess], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[GatewayProcess]]:
    """Two instances of the space's gateway, both in front of the same router."""
    _broker, router = space
    started: list[GatewayProcess] = []
    try:
        for name in ("gw-a", "gw-b"):
            started.append(
                _gateway(tmp_path_factory.mktemp(name), router.amqp_port, SESSIONS).start()
            )
        yield started
    finally:
        for gateway in started:
            gateway.stop()


Connect = Callable[..., Device]


@pytest.fixture
def device() -> Iterator[Connect]:
    made: list[Device] = []

    def connect(port: int, protocol: Protocol, **options: Any) -> Device:
        client = Device(port, protocol=protocol, user="alice", password=PASSWORD, **options)
        made.append(client)
        assert client.connack() == 0
        return client

    yield connect
    for client in made:
        with contextlib.suppress(Exception):
            client.close()


def persistent(protocol: Protocol, client_id: str, *, expiry: int = 3600) -> dict[str, Any]:
    """The options of a client that keeps its session: 3.1.1 clean session 0, MQTT 5 clean
    start 0 with a session expiry interval."""
    if protocol == V311:
        return {"client_id": client_id, "clean": False}
    properties = Properties(PacketTypes.CONNECT)
    properties.SessionExpiryInterval = expiry
    return {"client_id": client_id, "clean": False, "properties": properties}


def gone(client: Device) -> None:
    """A clean DISCONNECT, waited for: the session is over on the gateway's side once paho
    has closed its socket."""
    client.close()
    assert client.disconnected.wait(WAIT)


def received(client: Device, count: int) -> list[tuple[bytes, int]]:
    return [(bytes(m.payload), m.qos) for m in (client.receive() for _ in range(count))]


def nothing_more(client: Device, *, wait: float = 1.0) -> bool:
    with contextlib.suppress(Exception):
        client.messages.get(timeout=wait)
        return False
    return True


def fresh_id(label: str) -> str:
    return f"{label}-{next(_clients)}"


@pytest.mark.parametrize("protocol", [V311, V5], ids=["3.1.1", "5"])
def test_a_persistent_session_gets_what_was_published_while_away_through_another_gateway(
    gateways: list[GatewayProcess], device: Connect, protocol: Protocol
) -> None:
    first, second = gateways
    client_id = fresh_id("sensor")
    subscriber = device(first.port, protocol, **persistent(protocol, client_id))
    assert subscriber.session_present is False
    assert subscriber.subscribe("telemetry", qos=1) == 1
    gone(subscriber)
    publisher = device(first.port, V5)
    for i in range(3):
        assert publisher.publish("telemetry", f"t={i}".encode(), qos=1) == 0
    back = device(second.port, protocol, **persistent(protocol, client_id))
    assert back.session_present is True
    assert received(back, 3) == [(b"t=0", 1), (b"t=1", 1), (b"t=2", 1)]
    assert nothing_more(back)


@pytest.mark.parametrize("protocol", [V311, V5], ids=["3.1.1", "5"])
def test_a_persistent_session_survives_a_sigkill_of_its_gateway(
    gateways: list[GatewayProcess], device: Connect, protocol: Protocol
) -> None:
    doomed, survivor = gateways
    client_id = fresh_id("meter")
    subscriber = device(doomed.port, protocol, **persistent(protocol, client_id))
    assert subscriber.subscribe("meters", qos=1) == 1
    publisher = device(survivor.port, V5)
    assert publisher.publish("meters", b"before", qos=1) == 0
    assert received(subscriber, 1) == [(b"before", 1)]
    doomed.kill()  # the client is still connected: no DISCONNECT, no record of its end
    assert subscriber.disconnected.wait(WAIT)
    subscriber.close()  # paho would reconnect by itself, and take the session over again
    for i in range(3):
        assert publisher.publish("meters", f"away-{i}".encode(), qos=1) == 0
    doomed.start()  # again, on its port, with nothing in memory
    back = device(doomed.port, protocol, **persistent(protocol, client_id))
    assert back.session_present is True
    got = received(back, 3)
    if got[0] == (b"before", 1):
        # At least once: the client had it, but its PUBACK may have died with the gateway
        # before the broker heard of it; then it comes again, first, and only then.
        got = got[1:] + received(back, 1)
    assert got == [(b"away-0", 1), (b"away-1", 1), (b"away-2", 1)]
    assert nothing_more(back)


@pytest.mark.parametrize("protocol", [V311, V5], ids=["3.1.1", "5"])
def test_a_clean_start_discards_the_session(
    gateways: list[GatewayProcess], device: Connect, protocol: Protocol
) -> None:
    first, second = gateways
    client_id = fresh_id("door")
    subscriber = device(first.port, protocol, **persistent(protocol, client_id))
    assert subscriber.subscribe("doors", qos=1) == 1
    gone(subscriber)
    publisher = device(first.port, V5)
    assert publisher.publish("doors", b"kept, then discarded", qos=1) == 0
    clean = device(second.port, protocol, client_id=client_id, clean=True)
    assert clean.session_present is False
    assert nothing_more(clean)  # its old subscription is not resumed
    gone(clean)
    assert publisher.publish("doors", b"after the clean start", qos=1) == 0
    again = device(first.port, protocol, **persistent(protocol, client_id))
    assert again.session_present is False  # the clean session kept nothing
    assert again.subscribe("doors", qos=1) == 1
    assert nothing_more(again)  # what the old durable subscription held went with it
    assert publisher.publish("doors", b"new", qos=1) == 0
    assert received(again, 1) == [(b"new", 1)]


@pytest.mark.parametrize("protocol", [V311, V5], ids=["3.1.1", "5"])
def test_qos2_published_while_away_arrives_exactly_once(
    gateways: list[GatewayProcess], device: Connect, protocol: Protocol
) -> None:
    first, second = gateways
    client_id = fresh_id("valve")
    subscriber = device(first.port, protocol, **persistent(protocol, client_id))
    assert subscriber.subscribe("valves", qos=2) == 2
    gone(subscriber)
    publisher = device(second.port, V5)
    bodies = [f"cmd-{i}".encode() for i in range(20)]
    mids = [publisher.publish_async("valves", body, qos=2) for body in bodies]
    assert all(publisher.puback(mid) == 0 for mid in mids)  # PUBCOMP for each
    back = device(second.port, protocol, **persistent(protocol, client_id))
    assert back.session_present is True
    assert sorted(received(back, len(bodies))) == sorted((body, 2) for body in bodies)
    assert nothing_more(back)


def test_an_expired_session_is_not_resumed_and_what_it_kept_is_gone(
    gateways: list[GatewayProcess], device: Connect
) -> None:
    first, second = gateways
    client_id = fresh_id("light")
    subscriber = device(first.port, V5, **persistent(V5, client_id, expiry=1))
    assert subscriber.subscribe("lights", qos=1) == 1
    gone(subscriber)
    publisher = device(first.port, V5)
    assert publisher.publish("lights", b"stale", qos=1) == 0
    time.sleep(1.5)  # past the session's expiry interval
    back = device(second.port, V5, **persistent(V5, client_id))
    assert back.session_present is False
    assert back.subscribe("lights", qos=1) == 1
    assert nothing_more(back)  # the expired session's durable subscription was removed
    assert publisher.publish("lights", b"fresh", qos=1) == 0
    assert received(back, 1) == [(b"fresh", 1)]


def test_a_session_that_expires_at_once_is_not_kept(
    gateways: list[GatewayProcess], device: Connect
) -> None:
    """MQTT 5 without a session expiry interval: the session ends with the connection."""
    first, second = gateways
    client_id = fresh_id("alert")
    subscriber = device(first.port, V5, client_id=client_id, clean=False)
    assert subscriber.subscribe("alerts", qos=1) == 1
    gone(subscriber)
    back = device(second.port, V5, client_id=client_id, clean=False)
    assert back.session_present is False


@pytest.mark.parametrize("protocol", [V311, V5], ids=["3.1.1", "5"])
def test_a_second_connection_of_a_client_id_takes_the_session_over(
    gateways: list[GatewayProcess], device: Connect, protocol: Protocol
) -> None:
    """On one gateway the older connection is ended (MQTT 5: DISCONNECT 0x8E); the newer one
    has the session, and what its subscription took meanwhile."""
    gateway = gateways[1]
    client_id = fresh_id("lamp")
    older = device(gateway.port, protocol, **persistent(protocol, client_id))
    assert older.subscribe("lights", qos=1) == 1
    newer = device(gateway.port, protocol, **persistent(protocol, client_id))
    assert older.disconnected.wait(WAIT)
    older.close()  # no reconnect of its own: it would take the session back
    assert newer.session_present is True
    if protocol == V5:
        assert older.disconnect_reason == 0x8E
    publisher = device(gateways[0].port, V5)
    assert publisher.publish("lights", b"on", qos=1) == 0
    assert received(newer, 1) == [(b"on", 1)]


def test_an_unsubscribe_in_a_persistent_session_is_kept_too(
    gateways: list[GatewayProcess], device: Connect
) -> None:
    first, second = gateways
    client_id = fresh_id("alarm")
    subscriber = device(first.port, V311, **persistent(V311, client_id))
    assert subscriber.subscribe("alerts", qos=1) == 1
    assert subscriber.subscribe("telemetry", qos=1) == 1
    assert subscriber.unsubscribe("alerts") == 0
    gone(subscriber)
    publisher = device(second.port, V5)
    assert publisher.publish("alerts", b"not for it", qos=1) == 0
    assert publisher.publish("telemetry", b"for it", qos=1) == 0
    back = device(second.port, V311, **persistent(V311, client_id))
    assert back.session_present is True
    assert received(back, 1) == [(b"for it", 1)]
    assert nothing_more(back)


def test_a_disconnect_with_session_expiry_zero_ends_the_session(
    gateways: list[GatewayProcess], device: Connect
) -> None:
    first, second = gateways
    client_id = fresh_id("pump")
    subscriber = device(first.port, V5, **persistent(V5, client_id))
    assert subscriber.subscribe("pumps", qos=1) == 1
    properties = Properties(PacketTypes.DISCONNECT)
    properties.SessionExpiryInterval = 0
    subscriber.client.disconnect(properties=properties)
    assert subscriber.disconnected.wait(WAIT)
    publisher = device(first.port, V5)
    assert publisher.publish("pumps", b"nobody keeps this", qos=1) == 0
    back = device(second.port, V5, **persistent(V5, client_id))
    assert back.session_present is False
    assert back.subscribe("pumps", qos=1) == 1
    assert nothing_more(back)
    assert publisher.publish("pumps", b"new", qos=1) == 0
    assert received(back, 1) == [(b"new", 1)]


def test_without_a_session_store_an_mqtt5_client_is_told_no_session_is_kept(
    space: tuple[BrokerProcess, RouterProcess], tmp_path: Path, device: Connect
) -> None:
    _broker, router = space
    gateway = _gateway(tmp_path, router.amqp_port, None).start()
    try:
        client = device(gateway.port, V5, **persistent(V5, fresh_id("lone")))
        assert client.session_present is False
        assert getattr(client.connack_properties, "SessionExpiryInterval", None) == 0
    finally:
        gateway.stop()


# -- several instances per space under `enmasse up` -------------------------------------------

FLEET = """
apiVersion: enmasse.io/v1
kind: AddressSpace
metadata: {name: fleet}
spec: {type: standard, plan: standard-small}
---
apiVersion: enmasse.io/v1
kind: MessagingUser
metadata: {name: truck, space: fleet}
spec:
  username: truck
  password: truck-password
  authorization: [{addresses: ["#"], operations: [send, recv]}]
---
apiVersion: enmasse.io/v1
kind: Address
metadata: {name: positions, space: fleet}
spec: {address: positions, type: anycast, plan: standard-anycast}
"""


def mqtt_ports(runtime: LocalRuntime, space: str) -> list[int]:
    status = runtime.address_space(space).status
    return sorted(e.port for e in status.endpoints if e.name == "mqtt")


def test_enmasse_up_runs_two_gateways_per_space_both_listed_both_serving(
    local_runtime: LocalRuntime,
) -> None:
    local_runtime.apply(FLEET, name="fleet.yaml")
    local_runtime.wait_active("fleet", ["positions"], timeout=180)
    first = local_runtime.endpoint("fleet", "mqtt")  # waits until the status lists it
    assert mqtt_ports(local_runtime, "fleet") == [first]
    try:
        up = enmasse(local_runtime.var, "up", "--mqtt-gateways", "2")
        assert up.returncode == 0, up.stderr
        assert wait_until(lambda: len(mqtt_ports(local_runtime, "fleet")) == 2, timeout=90)
        one, two = mqtt_ports(local_runtime, "fleet")
        subscriber = Device(one, protocol=V5, user="truck", password="truck-password")
        publisher = Device(two, protocol=V311, user="truck", password="truck-password")
        try:
            assert (subscriber.connack(), publisher.connack()) == (0, 0)
            assert subscriber.subscribe("positions", qos=1) == 1
            assert publisher.publish("positions", b"52.1,4.3", qos=1) == 0
            assert subscriber.receive().payload == b"52.1,4.3"
        finally:
            subscriber.close()
            publisher.close()
    finally:
        enmasse(local_runtime.var, "up", "--mqtt-gateways", "1")
    assert wait_until(lambda: len(mqtt_ports(local_runtime, "fleet")) == 1, timeout=90)
