"""End to end: `enmasse up` runs every port that crosses a boundary with TLS (issue #15, item 3).

On the session's local runtime: the certificates are in <var>/tls, every private key of mode
0600 in directories of mode 0700, and the CA certificate published for clients (<var>/tls/ca.crt);
a plaintext client gets no call through to the config service (even one with the admin token),
a tenant's channel (TLS verified against ca.crt, no client certificate) does with a token, and a
router's RouterAdmin answers the operator's certificate, as `enmasse status` needs. Routers reach
their brokers over mutual TLS (their certificate from `up`), and a plain client is refused on a
standard space's broker port and on a router's inter-router port. Every router is a client
endpoint on amqps too, with a certificate naming it: the space's status shows it, and `enmasse
send`/`receive --url amqps://...` (verifying against ca.crt by default) carry a message through
it; without a user the login, not the TLS, is what the router refuses.
"""

from __future__ import annotations

import stat
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from enmasse.amqp import codec, sasl
from enmasse.amqp.client import AmqpError, Client
from enmasse.amqp.engine import Outcome
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
    assert {key.parent.name for key in keys} >= {"ca", "etcd-ca", "etcd", "config", "operator"}
    assert _mode(tls / "ca.crt") == 0o644  # the CA's certificate, for clients: nothing secret
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
    with local_runtime.config_channel() as channel:  # TLS, the admin token, no certificate
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


VAULT = """
apiVersion: enmasse.io/v1
kind: AddressSpace
metadata: {name: vault}
spec: {type: standard, plan: standard-small}
---
apiVersion: enmasse.io/v1
kind: MessagingUser
metadata: {name: keeper, space: vault}
spec:
  username: keeper
  password: keeper-password
  authorization: [{addresses: ["#"], operations: [send, recv]}]
---
apiVersion: enmasse.io/v1
kind: Address
metadata: {name: deposits, space: vault}
spec: {address: deposits, type: queue, plan: standard-small-queue}
"""


def test_routers_reach_their_brokers_over_mutual_tls_and_nobody_else_does(
    local_runtime: LocalRuntime,
) -> None:
    """`up` runs every router with its certificate: it reaches the space's broker over mutual TLS
    (messages go through), while a plain client reaches neither the broker's AMQP port nor the
    router's inter-router port."""
    local_runtime.apply(VAULT, name="vault.yaml")
    local_runtime.wait_active("vault", ["deposits"], timeout=180)
    port = local_runtime.router_port("vault")
    login = {"user": "keeper", "password": "keeper-password", "mechanisms": sasl.CLIENT_MECHANISMS}
    with Client("127.0.0.1", port, timeout=15, **login) as client:  # type: ignore[arg-type]
        sent = client.sender("deposits").send(codec.encode_message("gold"), timeout=15)
        assert sent.outcome is Outcome.ACCEPTED
        receiver = client.receiver("deposits", credit=1)
        delivery = receiver.receive(15)
        receiver.accept(delivery)
        assert codec.read_body(delivery.payload) == "gold"
    found = LocalDirectory(local_runtime.var)
    found.refresh()
    (broker,) = found.brokers("vault").values()
    (router,) = found.routers("vault")
    for where in (broker.amqp_port, router.inter_router_port):
        with pytest.raises(AmqpError) as refused:
            Client("127.0.0.1", where, timeout=15)
        assert refused.value.condition is not None
        assert refused.value.condition.name == "amqp:connection:framing-error", where


def test_every_router_serves_amqps_with_a_certificate_naming_it(
    local_runtime: LocalRuntime,
) -> None:
    """The vault space's status shows an amqps endpoint beside amqp; the CLI sends and receives
    through it, verifying the router against <var>/tls/ca.crt by default; its certificate names
    the router's program and is one of the local CA's, for server auth only."""
    local_runtime.apply(VAULT, name="vault.yaml")
    local_runtime.wait_active("vault", ["deposits"], timeout=180)
    url = f"amqps://127.0.0.1:{local_runtime.endpoint('vault', 'amqps')}"
    login = ("--user", "keeper", "--password", "keeper-password")
    where = ("--space", "vault", "--url", url, *login)
    sent = enmasse(local_runtime.var, "send", "deposits", "--body", "over amqps", *where)
    assert (sent.returncode, sent.stdout) == (0, "sent 1 message to 'deposits' (accepted)\n"), (
        sent.stderr
    )
    got = enmasse(local_runtime.var, "receive", "deposits", *where)
    assert (got.returncode, got.stdout) == (0, "over amqps\n"), got.stderr
    # Without a user the TLS (the router's name: 127.0.0.1) holds, and the login is what fails.
    anonymous = enmasse(local_runtime.var, "send", "deposits", "--url", url)
    assert (anonymous.returncode, anonymous.stderr) == (
        1,
        f"error: cannot connect to {url}: connection refused: amqp:unauthorized-access: "
        "Authentication failed [mech=none]\n",
    )
    certificate = x509.load_pem_x509_certificate(
        (local_runtime.var / "tls" / "endpoints" / "vault-router-0" / "tls.crt").read_bytes()
    )
    names = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "vault-router-0" in names.get_values_for_type(x509.DNSName)
    other_ca = local_runtime.var.parent / "other-ca.crt"
    other_ca.write_bytes((local_runtime.var / "tls" / "etcd-ca" / "ca.crt").read_bytes())
    refused = enmasse(local_runtime.var, "send", "deposits", *where, "--ca-file", str(other_ca))
    assert refused.returncode == 1
    assert refused.stderr.startswith(f"error: cannot connect to {url}: "), refused.stderr
    assert "certificate verify failed" in refused.stderr, refused.stderr
