"""End to end: `enmasse up` runs the config service with auth on (issue #15, item 4).

On the session's local runtime: the admin token and one token per control-plane service are in
the var dir, mode 0600, each service's of the least role it needs; a call without a token, or
beyond its token's role, is refused; and the router-agent, with its own `controller` token, still
gets the users' password hashes it passes to the routers (a user logs in with its password, a
wrong one is refused), while nobody else reads them.
"""

from __future__ import annotations

import stat
from pathlib import Path

import grpc
import pytest
from enmasse.amqp import codec, sasl
from enmasse.amqp.client import AmqpError, Client
from enmasse.amqp.engine import Condition
from enmasse.cli.local.tokens import SERVICE_ROLES
from enmasse.common.credentials import bearer_metadata
from enmasse.resources.kinds import KINDS
from enmasse.v1 import config_pb2, config_pb2_grpc

from tests.fixtures.local_runtime import LocalRuntime, enmasse, wait_until

pytestmark = pytest.mark.slow

GUARDED = """
apiVersion: enmasse.io/v1
kind: AddressSpace
metadata: {name: guarded}
spec: {type: standard, plan: standard-small}
---
apiVersion: enmasse.io/v1
kind: Address
metadata: {name: calls, space: guarded}
spec: {address: calls, type: anycast, plan: standard-anycast}
---
apiVersion: enmasse.io/v1
kind: MessagingUser
metadata: {name: alice, space: guarded}
spec:
  username: alice
  password: wonderland
  authorization: [{addresses: [calls], operations: [send, recv]}]
"""


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_up_keeps_its_tokens_private_each_of_the_least_role(local_runtime: LocalRuntime) -> None:
    run = local_runtime.var / "run"
    assert _mode(run / "admin-token") == 0o600
    assert _mode(run / "tokens") == 0o700
    for service in SERVICE_ROLES:
        assert _mode(run / "tokens" / f"{service}.token") == 0o600, service
    listed = enmasse(local_runtime.var, "token", "list")
    assert listed.returncode == 0, listed.stderr
    rows = {line.split()[0]: line.split()[1] for line in listed.stdout.splitlines()[1:]}
    assert rows == {"admin": "admin", **SERVICE_ROLES}
    for secret_file in [run / "admin-token", *(run / "tokens").glob("*.token")]:
        assert secret_file.read_text().strip() not in listed.stdout


def test_calls_without_a_token_or_beyond_its_role_are_refused(local_runtime: LocalRuntime) -> None:
    agent = (local_runtime.var / "run" / "tokens" / "router-agent.token").read_text()
    with local_runtime.config_channel() as channel:  # TLS (no client certificate): a tenant's
        stub = config_pb2_grpc.ConfigServiceStub(channel)
        with pytest.raises(grpc.RpcError) as anonymous:
            stub.ListAddressSpaces(config_pb2.ListRequest(), timeout=10)
        assert anonymous.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.RpcError) as beyond:
            stub.DeleteAddressSpace(
                config_pb2.DeleteRequest(ref=config_pb2.ObjectRef(name="anything")),
                metadata=bearer_metadata(agent),
                timeout=10,
            )
        assert (beyond.value.code(), beyond.value.details()) == (
            grpc.StatusCode.PERMISSION_DENIED,
            "token 'router-agent' (controller) may not DeleteAddressSpace in address space "
            "'anything'",
        )


def test_users_log_in_through_the_router_and_their_hashes_stay_inside(
    local_runtime: LocalRuntime,
) -> None:
    local_runtime.apply(GUARDED, name="guarded.yaml")
    local_runtime.wait_active("guarded", ["calls"], timeout=180)
    port = local_runtime.router_port("guarded")

    def logged_in() -> bool:
        try:
            return _round_trip(port, user="alice", password="wonderland") == "hello alice"
        except AmqpError:
            return False  # the agent has not pushed the user to the router yet

    assert wait_until(logged_in, timeout=60)
    with pytest.raises(AmqpError) as refused:
        _round_trip(port, user="alice", password="wonder")
    assert refused.value.condition == Condition(
        "amqp:unauthorized-access", "Authentication failed [mech=SCRAM-SHA-512]"
    )
    with pytest.raises(AmqpError) as plain:  # the plan offers PLAIN over TLS only
        Client("127.0.0.1", port, user="alice", password="wonderland", timeout=10).close()
    assert plain.value.condition == Condition(
        "amqp:unauthorized-access", "Authentication failed [mech=none]"
    )

    with local_runtime.client() as client:  # the admin's
        stored = client.get(KINDS["MessagingUser"], name="alice", space="guarded")
    assert stored.messaging_user.spec.password_hash == ""
    assert not stored.messaging_user.spec.scram_credentials


def _round_trip(port: int, *, user: str, password: str) -> str:
    with Client(
        "127.0.0.1",
        port,
        user=user,
        password=password,
        mechanisms=sasl.CLIENT_MECHANISMS,
        timeout=10,
    ) as client:
        receiver = client.receiver("calls")
        sender = client.sender("calls")
        outcome = sender.send_async(codec.encode_message(f"hello {user}"))
        delivery = receiver.receive(10)
        receiver.accept(delivery)
        outcome.result(10)
        return str(codec.read_body(delivery.payload))
