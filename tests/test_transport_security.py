"""Transport security across processes (issue #15, item 3; item 4's admin and etcd identities).

RouterAdmin and BrokerAdmin, given --tls-dir, speak mutual TLS and admit only a control-plane
certificate: a plaintext client gets no call through, nor a certificate of another CA, and a
data-plane certificate of the right CA gets PERMISSION_DENIED. etcd run with client-certificate
auth and its own CA opens only to the config service's etcd certificate (`enmasse.config.store`).
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
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

from tests.fixtures.broker import BrokerProcess
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
