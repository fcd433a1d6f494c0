"""Who reaches the admin APIs, and with what (issue #15, item 4): tokens at the config service,
certificates at RouterAdmin and BrokerAdmin, and the operator's certificate kept apart from the
control plane's.

The config service (a real `enmasse-config` with --tls-dir and a bootstrap admin token) speaks
TLS only and asks callers for no certificate: a tenant holding a token and the CA certificate,
nothing else, lists its own space and is refused another's with the exact PERMISSION_DENIED
text, by its own channel and through the `enmasse` CLI (`--token`, `--ca-file`, or
$ENMASSE_CA_FILE); a call with neither token nor certificate, or with a certificate and no token
(ours or another CA's: a certificate is no credential there) is UNAUTHENTICATED with the text the
gate gives; a plaintext client, and a client that does not trust config's CA, get no call
through. grpcio cannot "verify a client certificate when one is presented" without requiring one
(enmasse.common.serving), so config does not ask for one at all: the token decides.

RouterAdmin and BrokerAdmin (real processes with --tls-dir) know callers by certificate alone: a
tenant's channel (no certificate) and one with a certificate of another CA are refused in the
handshake; the machine operator's certificate (role `operator`, what `enmasse status` presents)
reads what a router runs and what a broker holds and is refused every change with
PERMISSION_DENIED, which a control-plane certificate makes.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from enmasse.common.certificates import BROKER, CONTROL_PLANE, DATA_PLANE, OPERATOR, TlsFiles
from enmasse.common.credentials import bearer_metadata, channel_credentials, verifying_credentials
from enmasse.v1 import (
    broker_pb2,
    broker_pb2_grpc,
    config_pb2,
    config_pb2_grpc,
    resources_pb2,
    router_pb2,
    router_pb2_grpc,
)

from tests.fixtures.broker import BrokerProcess
from tests.fixtures.certificates import issue
from tests.fixtures.config_service import ConfigProcess
from tests.fixtures.etcd import EtcdProcess
from tests.fixtures.router import RouterFleet

ENMASSE = Path(sys.executable).parent / "enmasse"
NO_CREDENTIALS = "no credentials: call with the metadata 'authorization: Bearer <token>'"
DENIED = "token 'acme-team' (tenant-admin of acme) may not ListAddresses in address space 'globex'"
REFUSED_ROLE = "caller role not allowed"

# ================================================================ the config service


@dataclass(frozen=True)
class Config:
    target: str
    ca: Path  # config's CA certificate: all a tenant needs besides its token
    tenant: str  # acme's tenant-admin token
    tls: Path  # the CAs and certificates of the test


@pytest.fixture
def config(
    etcd: EtcdProcess,
    etcd_prefix: str,
    config_process_factory: Callable[..., ConfigProcess],
    tmp_path: Path,
) -> Config:
    """config with TLS and a bootstrap admin token; spaces acme and globex, a token for acme."""
    server = issue(tmp_path / "tls", ca="ours", name="config", role=CONTROL_PLANE)
    bootstrap = tmp_path / "admin-token"
    bootstrap.write_text("the-admin-token\n")
    process = config_process_factory(
        etcd_endpoint=etcd.endpoint,
        prefix=etcd_prefix,
        extra_args=(f"--tls-dir={server.directory}", f"--bootstrap-token-file={bootstrap}"),
    )
    admin = bearer_metadata("the-admin-token")
    with grpc.secure_channel(process.target, verifying_credentials(server.ca)) as channel:
        stub = config_pb2_grpc.ConfigServiceStub(channel)
        for space in ("acme", "globex"):
            stub.CreateAddressSpace(
                resources_pb2.AddressSpace(
                    metadata=resources_pb2.Metadata(name=space),
                    spec=resources_pb2.AddressSpaceSpec(type="standard", plan="standard-small"),
                ),
                metadata=admin,
                timeout=10,
                wait_for_ready=True,
            )
        request = config_pb2.CreateTokenRequest(
            name="acme-team", role="tenant-admin", spaces=["acme"]
        )
        tenant = stub.CreateToken(request, metadata=admin, timeout=10).secret
    return Config(target=process.target, ca=server.ca, tenant=tenant, tls=tmp_path / "tls")


def _outcome(call: Callable[[], object]) -> tuple[str, str]:
    try:
        call()
    except grpc.RpcError as error:
        return error.code().name, error.details() or ""  # type: ignore[attr-defined]
    return ("OK", "")


def _list_addresses(
    target: str, credentials: grpc.ChannelCredentials | None, *, token: str, space: str
) -> tuple[str, str]:
    channel = (
        grpc.secure_channel(target, credentials)
        if credentials is not None
        else grpc.insecure_channel(target)
    )
    with channel:
        stub = config_pb2_grpc.ConfigServiceStub(channel)
        request = config_pb2.ListRequest(space=space)
        return _outcome(
            lambda: stub.ListAddresses(request, metadata=bearer_metadata(token), timeout=5)
        )


def test_a_token_is_all_a_tenant_needs_to_reach_its_own_space(config: Config) -> None:
    with grpc.secure_channel(config.target, verifying_credentials(config.ca)) as channel:
        stub = config_pb2_grpc.ConfigServiceStub(channel)
        mine = stub.ListAddressSpaces(
            config_pb2.ListRequest(), metadata=bearer_metadata(config.tenant), timeout=5
        )
        assert [s.metadata.name for s in mine.items] == ["acme"]
    verified = verifying_credentials(config.ca)
    assert _list_addresses(config.target, verified, token=config.tenant, space="acme") == ("OK", "")
    assert _list_addresses(config.target, verified, token=config.tenant, space="globex") == (
        "PERMISSION_DENIED",
        DENIED,
    )


def test_without_a_token_no_certificate_gets_a_call_through(config: Config) -> None:
    """Neither no credential at all, nor a certificate of our CA or of another: config asks for
    none, and the call without a token is UNAUTHENTICATED."""
    verified = verifying_credentials(config.ca)
    unauthenticated = ("UNAUTHENTICATED", NO_CREDENTIALS)
    assert _list_addresses(config.target, verified, token="", space="acme") == unauthenticated
    for ca in ("ours", "theirs"):
        holder = issue(config.tls, ca=ca, name="someone", role=CONTROL_PLANE)
        chain, key, _ = holder.read()
        presenting = grpc.ssl_channel_credentials(
            root_certificates=config.ca.read_bytes(), private_key=key, certificate_chain=chain
        )
        outcome = _list_addresses(config.target, presenting, token="", space="acme")
        assert outcome == unauthenticated, ca


def test_config_takes_no_plaintext_and_a_client_checks_its_certificate(config: Config) -> None:
    assert _list_addresses(config.target, None, token=config.tenant, space="acme")[0] == (
        "UNAVAILABLE"
    )
    strangers = issue(config.tls, ca="theirs", name="x", role=CONTROL_PLANE)
    trusting_another = verifying_credentials(strangers.ca)
    outcome = _list_addresses(config.target, trusting_another, token=config.tenant, space="acme")
    assert outcome[0] == "UNAVAILABLE"


def _cli(
    *args: str, env: dict[str, str] | None = None, var: Path
) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("ENMASSE_")}
    return subprocess.run(
        [str(ENMASSE), "--var-dir", str(var), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**clean, **(env or {})},
    )


def test_the_cli_of_a_tenant_needs_its_token_and_the_ca_certificate_only(
    config: Config, tmp_path: Path
) -> None:
    """`enmasse --token T --ca-file ca.crt` from a var dir holding no certificate at all."""
    var = tmp_path / "tenant-var"  # nothing of `enmasse up` in it
    server = ("--server", config.target, "--token", config.tenant)
    listed = _cli(*server, "--ca-file", str(config.ca), "get", "addressspaces", var=var)
    assert listed.returncode == 0, listed.stderr
    assert [line.split()[0] for line in listed.stdout.splitlines()[1:]] == ["acme"]
    by_env = _cli(
        *server,
        "get",
        "addresses",
        "--space",
        "globex",
        env={"ENMASSE_CA_FILE": str(config.ca)},
        var=var,
    )
    assert (by_env.returncode, by_env.stderr) == (1, f"error: {DENIED}\n")
    no_token = _cli(
        "--server", config.target, "--ca-file", str(config.ca), "get", "addressspaces", var=var
    )
    assert no_token.returncode == 1
    assert no_token.stderr.startswith(f"error: {NO_CREDENTIALS} (give --token TOKEN")


# ================================================================ RouterAdmin and BrokerAdmin


def _callers(root: Path, *, server: TlsFiles) -> dict[str, grpc.ChannelCredentials]:
    """Who knocks at a RouterAdmin or BrokerAdmin port whose certificate is `server`'s; each
    trusts that server, so only what it presents can be what is wrong."""
    control_plane = issue(root, ca="ours", name="router-agent", role=CONTROL_PLANE)
    operator = issue(root, ca="ours", name="operator", role=OPERATOR)
    stranger = issue(root, ca="theirs", name="router-agent", role=CONTROL_PLANE)
    stranger.ca.write_bytes(server.ca.read_bytes())
    return {
        "control plane": channel_credentials(control_plane),
        "operator": channel_credentials(operator),
        "a tenant (no certificate)": verifying_credentials(server.ca),
        "another CA's control plane": channel_credentials(stranger),
    }


def _codes(
    target: str, callers: dict[str, grpc.ChannelCredentials], call: Callable[[grpc.Channel], object]
) -> dict[str, str]:
    codes = {}
    for who, credentials in callers.items():
        with grpc.secure_channel(target, credentials) as channel:
            codes[who] = _outcome(lambda: call(channel))[0]
    return codes


def test_router_admin_lets_the_operator_read_and_only_the_control_plane_change(
    routers: RouterFleet, tmp_path: Path
) -> None:
    server = issue(tmp_path / "tls", ca="ours", name="router-a", role=DATA_PLANE)
    router = routers.start("router-a", extra_args=("--tls-dir", str(server.directory)))
    target, callers = f"127.0.0.1:{router.admin_port}", _callers(tmp_path / "tls", server=server)

    def read(channel: grpc.Channel) -> object:
        stub = router_pb2_grpc.RouterAdminStub(channel)
        stub.GetStats(router_pb2.StatsRequest(), timeout=5)
        return stub.GetConfig(router_pb2.GetConfigRequest(), timeout=5)

    def change(channel: grpc.Channel) -> object:  # a configuration older than none: refused
        request = router_pb2.RouterConfig(generation=-1, space="s")
        return router_pb2_grpc.RouterAdminStub(channel).ApplyConfig(request, timeout=5)

    def close(channel: grpc.Channel) -> object:  # a close of a connection nobody has
        request = router_pb2.CloseConnectionRequest(id=424242, reason="test")
        return router_pb2_grpc.RouterAdminStub(channel).CloseConnection(request, timeout=5)

    def close_link(channel: grpc.Channel) -> object:  # and of a link nobody has
        request = router_pb2.CloseLinkRequest(connection_id=424242, name="l", role="sender")
        return router_pb2_grpc.RouterAdminStub(channel).CloseLink(request, timeout=5)

    assert _codes(target, callers, read) == {
        "control plane": "OK",
        "operator": "OK",
        "a tenant (no certificate)": "UNAVAILABLE",
        "another CA's control plane": "UNAVAILABLE",
    }
    assert _codes(target, callers, change) == {
        "control plane": "FAILED_PRECONDITION",
        "operator": "PERMISSION_DENIED",
        "a tenant (no certificate)": "UNAVAILABLE",
        "another CA's control plane": "UNAVAILABLE",
    }
    with grpc.secure_channel(target, callers["operator"]) as channel:
        assert _outcome(lambda: change(channel)) == ("PERMISSION_DENIED", REFUSED_ROLE)
    # Closing a client's connection or link (the console's Close) is the operator's too.
    for closing in (close, close_link):
        assert _codes(target, callers, closing) == {
            "control plane": "NOT_FOUND",
            "operator": "NOT_FOUND",
            "a tenant (no certificate)": "UNAVAILABLE",
            "another CA's control plane": "UNAVAILABLE",
        }


@pytest.fixture
def tls_broker(tmp_path: Path) -> Iterator[tuple[BrokerProcess, TlsFiles]]:
    server = issue(tmp_path / "tls", ca="ours", name="broker-0", role=BROKER)
    broker = BrokerProcess(workdir=tmp_path / "broker", args=["--tls-dir", str(server.directory)])
    broker.start()
    try:
        yield broker, server
    finally:
        broker.stop()


def test_broker_admin_lets_the_operator_read_and_only_the_control_plane_change(
    tls_broker: tuple[BrokerProcess, TlsFiles], tmp_path: Path
) -> None:
    broker, server = tls_broker
    target, callers = f"127.0.0.1:{broker.admin_port}", _callers(tmp_path / "tls", server=server)

    def read(channel: grpc.Channel) -> object:
        stub = broker_pb2_grpc.BrokerAdminStub(channel)
        return stub.ListAddresses(broker_pb2.ListAddressesRequest(), timeout=5)

    def change(channel: grpc.Channel) -> object:
        request = broker_pb2.EnsureAddressRequest(name="orders")
        return broker_pb2_grpc.BrokerAdminStub(channel).EnsureQueue(request, timeout=5)

    assert _codes(target, callers, read) == {
        "control plane": "OK",
        "operator": "OK",
        "a tenant (no certificate)": "UNAVAILABLE",
        "another CA's control plane": "UNAVAILABLE",
    }
    assert _codes(target, callers, change) == {
        "control plane": "OK",
        "operator": "PERMISSION_DENIED",
        "a tenant (no certificate)": "UNAVAILABLE",
        "another CA's control plane": "UNAVAILABLE",
    }
