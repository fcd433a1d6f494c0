"""End to end: `enmasse up` runs every gRPC port with mutual TLS (issue #15, item 3).

On the session's local runtime: the certificates are in <var>/tls, every private key of mode
0600 in directories of mode 0700; a plaintext client gets no call through to the config service
(even one with the admin token), the CLI's own channel (the admin's client certificate) does,
and a router's RouterAdmin answers that channel too, as `enmasse status` needs.
"""

from __future__ import annotations

import stat
from pathlib import Path

import grpc
import pytest
from enmasse.common.credentials import bearer_metadata
from enmasse.resources.discovery import LocalDirectory
from enmasse.v1 import config_pb2, config_pb2_grpc, router_pb2, router_pb2_grpc

from tests.fixtures.local_runtime import LocalRuntime, enmasse, wait_until

pytestmark = pytest.mark.slow


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_up_keeps_its_keys_private(local_runtime: LocalRuntime) -> None:
    tls = local_runtime.var / "tls"
    assert _mode(tls) == 0o700
    keys = sorted(tls.rglob("*.key"))
    assert {key.parent.name for key in keys} >= {"ca", "etcd-ca", "etcd", "config", "admin"}
    for key in keys:
        assert _mode(key) == 0o600, key
        assert _mode(key.parent) == 0o700, key.parent


def test_a_plaintext_client_of_config_is_refused(local_runtime: LocalRuntime) -> None:
    admin = (local_runtime.var / "run" / "admin-token").read_text()
    request = config_pb2.ListRequest()
    with grpc.insecure_channel(local_runtime.config) as channel:
        stub = config_pb2_grpc.ConfigServiceStub(channel)
        with pytest.raises(grpc.RpcError) as refused:
            stub.ListAddressSpaces(request, metadata=bearer_metadata(admin), timeout=5)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    with local_runtime.channel(local_runtime.config) as channel:
        stub = config_pb2_grpc.ConfigServiceStub(channel)
        stub.ListAddressSpaces(request, metadata=bearer_metadata(admin), timeout=5)


SPACE = """
apiVersion: enmasse.io/v1
kind: AddressSpace
metadata: {name: sealed}
spec: {type: standard, plan: standard-small}
---
apiVersion: enmasse.io/v1
kind: Address
metadata: {name: q, space: sealed}
spec: {address: q, type: anycast, plan: standard-anycast}
"""


def test_router_admin_answers_the_cli_only_over_tls(local_runtime: LocalRuntime) -> None:
    local_runtime.apply(SPACE, name="sealed.yaml")
    local_runtime.wait_active("sealed", ["q"], timeout=180)
    found = LocalDirectory(local_runtime.var)

    def routers() -> list[str]:
        found.refresh()
        return [router.admin for router in found.routers("sealed")]

    assert wait_until(routers, timeout=30)
    admin = routers()[0]
    with local_runtime.channel(admin) as channel:
        config = router_pb2_grpc.RouterAdminStub(channel).GetConfig(
            router_pb2.GetConfigRequest(), timeout=5
        )
    assert "q" in {route.address for route in config.addresses}
    with grpc.insecure_channel(admin) as channel, pytest.raises(grpc.RpcError) as refused:
        router_pb2_grpc.RouterAdminStub(channel).GetConfig(router_pb2.GetConfigRequest(), timeout=5)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    status = enmasse(local_runtime.var, "status")
    assert status.returncode == 0, status.stderr
    rows = [line.split() for line in status.stdout.splitlines()]
    sealed = [row for row in rows if row[:1] == ["sealed"] and "router-0" in row]
    assert sealed, status.stdout
    assert "yes" in sealed[0], status.stdout  # `status` asked the router over TLS
