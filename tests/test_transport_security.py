"""Transport security across processes (issue #15, item 3; item 4's admin and etcd identities).

RouterAdmin and BrokerAdmin, given --tls-dir, speak mutual TLS and admit only a control-plane
certificate: a plaintext client gets no call through, nor a certificate of another CA, and a
data-plane certificate of the right CA gets PERMISSION_DENIED. etcd run with client-certificate
auth and its own CA opens only to the config service's etcd certificate (`enmasse.config.store`).
A standard space's broker (--routers-only, with its certificate) takes only peers with a client
certificate of its CA on its AMQP port: a router with its certificate gets messages through, a
plain or anonymous client, one without a certificate and one of another CA are refused in the
handshake, a router without a certificate is refused and logs it once, and a drain between two
such brokers presents the broker's certificate. (The mesh: services/router/tests.)
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from enmasse.amqp import codec
from enmasse.amqp.client import AmqpError, Client
from enmasse.amqp.engine import Condition, Outcome, Tls
from enmasse.amqp.tls import mutual_tls
from enmasse.common.certificates import (
    BROKER,
    CONTROL_PLANE,
    DATA_PLANE,
    STORE,
    Holder,
    TlsFiles,
    ensure_authority,
    ensure_certificate,
)
from enmasse.common.credentials import channel_credentials
from enmasse.config.store import Store
from enmasse.v1 import broker_pb2, broker_pb2_grpc, router_pb2, router_pb2_grpc

from tests.fixtures.broker import BrokerFactory, BrokerProcess
from tests.fixtures.etcd import ETCD_BINARY, free_port
from tests.fixtures.router import RouterFleet


def _files(root: Path, *, ca: str, name: str, role: str) -> TlsFiles:
    authority = ensure_authority(root / ca, name=ca)
    return ensure_certificate(root / ca / name, Holder(name=name, role=role), authority=authority)


def _secure(target: str, tls: TlsFiles) -> grpc.Channel:
    return grpc.secure_channel(target, channel_credentials(tls))


def _code(call: object) -> grpc.StatusCode | None:
    try:
        call()  # type: ignore[operator]
    except grpc.RpcError as error:
        return error.code()  # type: ignore[no-any-return]
    return None


def _assert_only_control_plane(target: str, root: Path, call_with: object) -> None:
    agent = _files(root, ca="ours", name="agent", role=CONTROL_PLANE)
    with _secure(target, agent) as channel:
        assert _code(lambda: call_with(channel)) is None  # type: ignore[operator]
    router = _files(root, ca="ours", name="router", role=DATA_PLANE)
    with _secure(target, router) as channel:
        assert _code(lambda: call_with(channel)) == grpc.StatusCode.PERMISSION_DENIED  # type: ignore[operator]
    with grpc.insecure_channel(target) as channel:
        assert _code(lambda: call_with(channel)) == grpc.StatusCode.UNAVAILABLE  # type: ignore[operator]
    stranger = _files(root, ca="theirs", name="agent", role=CONTROL_PLANE)
    stranger.ca.write_bytes(agent.ca.read_bytes())  # trusts our server: only its own cert is wrong
    with _secure(target, stranger) as channel:
        assert _code(lambda: call_with(channel)) == grpc.StatusCode.UNAVAILABLE  # type: ignore[operator]


def test_router_admin_admits_only_the_control_plane(routers: RouterFleet, tmp_path: Path) -> None:
    server = _files(tmp_path, ca="ours", name="router-a", role=DATA_PLANE)
    router = routers.start("router-a", extra_args=("--tls-dir", str(server.directory)))

    def stats(channel: grpc.Channel) -> None:
        stub = router_pb2_grpc.RouterAdminStub(channel)
        stub.GetStats(router_pb2.StatsRequest(), timeout=5)

    _assert_only_control_plane(f"127.0.0.1:{router.admin_port}", tmp_path, stats)


@pytest.fixture
def tls_broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    server = _files(tmp_path, ca="ours", name="broker-0", role=BROKER)
    broker = BrokerProcess(workdir=tmp_path / "broker", args=["--tls-dir", str(server.directory)])
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


def test_broker_admin_admits_only_the_control_plane(
    tls_broker: BrokerProcess, tmp_path: Path
) -> None:
    def addresses(channel: grpc.Channel) -> None:
        stub = broker_pb2_grpc.BrokerAdminStub(channel)
        stub.ListAddresses(broker_pb2.ListAddressesRequest(), timeout=5)

    _assert_only_control_plane(f"127.0.0.1:{tls_broker.admin_port}", tmp_path, addresses)


@pytest.fixture
def tls_etcd(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """etcd with https client URLs, --client-cert-auth and a CA of its own."""
    server = _files(tmp_path, ca="etcd-ca", name="etcd", role=STORE)
    client, peer = free_port(), free_port()
    url = f"https://127.0.0.1:{client}"
    peer_url = f"http://127.0.0.1:{peer}"
    log = (tmp_path / "etcd.log").open("ab")
    process = subprocess.Popen(
        [
            ETCD_BINARY,
            "--name=tls",
            f"--data-dir={tmp_path / 'etcd-data'}",
            f"--listen-client-urls={url}",
            f"--advertise-client-urls={url}",
            f"--listen-peer-urls={peer_url}",
            f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster=tls={peer_url}",
            f"--cert-file={server.cert}",
            f"--key-file={server.key}",
            f"--trusted-ca-file={server.ca}",
            "--client-cert-auth",
            "--log-level=warn",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    log.close()
    try:
        yield f"127.0.0.1:{client}", tmp_path
    finally:
        process.terminate()
        process.wait(timeout=10)


async def _answers(store: Store, *, within: float) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            await store.revision()
            return True
        except Exception:  # refused or not up yet: both look alike from here
            await asyncio.sleep(0.1)
    return False


async def test_etcd_opens_only_to_configs_certificate(tls_etcd: tuple[str, Path]) -> None:
    endpoint, root = tls_etcd
    config = _files(root, ca="etcd-ca", name="config", role=CONTROL_PLANE)
    store = Store(endpoints=[endpoint], prefix="/tls-test", timeout=2, tls=config)
    try:
        assert await _answers(store, within=20)
    finally:
        await store.close()
    other = _files(root, ca="grpc-ca", name="router-agent", role=CONTROL_PLANE)
    other.ca.write_bytes(config.ca.read_bytes())
    for refused in (
        Store(endpoints=[endpoint], prefix="/tls-test", timeout=2, tls=other),
        Store(endpoints=[endpoint], prefix="/tls-test", timeout=2),
    ):
        try:
            assert not await _answers(refused, within=3)
        finally:
            await refused.close()


# ------------------------------------------------ a standard space's broker: its routers only


def _router_clients(tmp_path: Path) -> tuple[TlsFiles, TlsFiles]:
    """Our CA's control-plane certificate (BrokerAdmin, RouterAdmin) and a router's."""
    agent = _files(tmp_path, ca="ours", name="agent", role=CONTROL_PLANE)
    return agent, _files(tmp_path, ca="ours", name="router", role=DATA_PLANE)


def _routers_broker(broker_factory: BrokerFactory, tmp_path: Path) -> BrokerProcess:
    """A standard space's broker as rendered: --routers-only, with its certificate."""
    agent, _ = _router_clients(tmp_path)
    server = _files(tmp_path, ca="ours", name="broker", role=BROKER)
    return broker_factory("--tls-dir", str(server.directory), "--routers-only", admin_tls=agent)


def _refused(port: int, **options: object) -> Condition:
    with pytest.raises(AmqpError) as refused:
        Client("127.0.0.1", port, timeout=10, **options)  # type: ignore[arg-type]
    assert refused.value.condition is not None
    return refused.value.condition


def _orders_config(broker: BrokerProcess) -> router_pb2.RouterConfig:
    waypoint = router_pb2.BrokerWaypoint(
        name="b1", host="127.0.0.1", port=broker.amqp_port, state="Active"
    )
    return router_pb2.RouterConfig(
        generation=1,
        space="test",
        addresses=[router_pb2.AddressRoute(address="orders", type="queue", brokers=[waypoint])],
    )


def test_a_standard_spaces_broker_takes_only_routers_over_mutual_tls(
    routers: RouterFleet, broker_factory: BrokerFactory, tmp_path: Path
) -> None:
    agent, router_tls = _router_clients(tmp_path)
    broker = _routers_broker(broker_factory, tmp_path)
    broker.ensure_queue("orders")
    router = routers.start(
        "r1", extra_args=("--tls-dir", str(router_tls.directory)), admin_tls=agent
    )
    router.apply(_orders_config(broker))
    # Messages flow through the router, which reaches the broker over mutual TLS.
    with Client("127.0.0.1", router.amqp_port) as client:
        sent = client.sender("orders").send(codec.encode_message("kept"))
        assert sent.outcome is Outcome.ACCEPTED
        receiver = client.receiver("orders", credit=1)
        delivery = receiver.receive(10)
        receiver.accept(delivery)
        assert codec.read_body(delivery.payload) == "kept"
    assert [c.role for c in router.stats().connections if c.role == "broker"] == ["broker"]

    # Nobody else reaches the broker's queues behind the routers' back.
    port = broker.amqp_port
    assert _refused(port).name == "amqp:connection:framing-error"  # plain, SASL ANONYMOUS
    missing = _refused(port, tls=Tls(ca_file=str(router_tls.ca)))
    assert "certificate required" in missing.description, missing
    stranger = _files(tmp_path, ca="theirs", name="router", role=DATA_PLANE)
    stranger.ca.write_bytes(router_tls.ca.read_bytes())  # trusts the broker: only its cert is wrong
    foreign = _refused(port, tls=mutual_tls(stranger))
    assert "unknown ca" in foreign.description, foreign
    assert "orders" in broker.addresses()
    assert broker.addresses()["orders"].depth == 0


def test_a_router_without_a_certificate_is_refused_by_the_broker_and_says_so(
    routers: RouterFleet, broker_factory: BrokerFactory, tmp_path: Path
) -> None:
    broker = _routers_broker(broker_factory, tmp_path)
    broker.ensure_queue("orders")
    router = routers.start("r1")
    router.apply(_orders_config(broker))
    deadline = time.monotonic() + 15
    while not (refusals := _log_events(router.log_path, "broker refused the router")):
        assert time.monotonic() < deadline, router.log_path.read_text()[-2000:]
        time.sleep(0.05)
    refusal = refusals[0]
    assert refusal["broker"] == "b1"
    assert refusal["address"] == f"127.0.0.1:{broker.amqp_port}"
    assert refusal["condition"] == "amqp:connection:framing-error"
    assert not [c for c in router.stats().connections if c.role == "broker"]
    # It is redialled, but the same refusal is not logged again.
    time.sleep(1.5)
    assert len(_log_events(router.log_path, "broker refused the router")) == 1


def test_a_drain_between_standard_brokers_presents_the_brokers_certificate(
    broker_factory: BrokerFactory, tmp_path: Path
) -> None:
    _, router_tls = _router_clients(tmp_path)
    source = _routers_broker(broker_factory, tmp_path)
    target = _routers_broker(broker_factory, tmp_path)
    source.ensure_queue("orders")
    with Client("127.0.0.1", source.amqp_port, tls=mutual_tls(router_tls)) as client:
        sender = client.sender("orders")
        for n in range(5):
            assert sender.send(codec.encode_message(f"m{n}")).outcome is Outcome.ACCEPTED
    moved = source.admin().Drain(
        broker_pb2.DrainRequest(
            target_host="127.0.0.1",
            target_port=target.amqp_port,
            addresses=["orders"],
            target_admin=f"127.0.0.1:{target.admin_port}",
        ),
        timeout=30,
    )
    assert moved.messages_moved == 5
    assert target.addresses()["orders"].depth == 5
    assert source.addresses()["orders"].depth == 0


def _log_events(path: Path, event: str) -> list[dict[str, object]]:
    lines = (json.loads(x) for x in path.read_text().splitlines() if x.startswith("{"))
    return [line for line in lines if line.get("event") == event]
