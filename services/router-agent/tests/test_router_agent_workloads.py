"""Router workloads: rendered to the GitOps output, read back, started as the runtime would.

Pure: rendering is deterministic, read back gives what was rendered (the router's amqps
Certificate, its mount and flags included), ports stay across re-renders (a router rendered
before routers had an amqps port gets one, its other ports kept), and only the agent's own files
are touched; the mesh secret is a mounted Secret in a cluster and a 0600 file written once
locally. With real parts: the agent renders a new space's router, the test starts it exactly as
`enmasse up` would (`local_router_command`, with an amqps certificate naming it), the agent finds
it by its ports file, configures it, an address becomes Active and the space's status shows both
endpoints, amqp and amqps, an anonymous client is refused (the plan allows none), a
MessagingUser created in the store logs in with SCRAM and carries a message, on amqp and on
amqps (verifying the router's name), while a wrong password is refused; deleting the space
removes the router's workload file and nothing else.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from enmasse.amqp import codec, sasl
from enmasse.amqp.client import AmqpError, Client
from enmasse.amqp.engine import Condition, Tls
from enmasse.resources.discovery import LocalDirectory
from enmasse.resources.rendered_routers import (
    LocalRouterPorts,
    RouterWorkload,
    ensure_local_mesh_secret,
    local_router_command,
    local_router_dir,
    read_router,
)
from enmasse.router_agent.agent import RouterAgent
from enmasse.router_agent.workloads import RouterWorkloads, kept_ports, render_router
from enmasse.v1 import config_pb2, config_pb2_grpc, resources_pb2

from tests.fixtures.certificates import issue

pytestmark = pytest.mark.timeout(120)
Ref = config_pb2.ObjectRef
WORKLOAD = RouterWorkload(
    space="shop",
    router_id="router-0",
    ports=LocalRouterPorts(amqp=1, inter_router=2, admin=3, amqps=4),
)


def test_rendering_is_deterministic_and_reads_back() -> None:
    text = render_router(WORKLOAD)
    assert text == render_router(WORKLOAD)
    assert read_router(text) == WORKLOAD
    service, certificate, stateful_set = list(yaml.safe_load_all(text))
    assert [d["kind"] for d in (service, certificate, stateful_set)] == [
        "Service",
        "Certificate",
        "StatefulSet",
    ]
    assert stateful_set["metadata"]["labels"]["app.kubernetes.io/component"] == "router"
    assert stateful_set["metadata"]["annotations"] == {
        "enmasse.io/local-amqp-port": "1",
        "enmasse.io/local-inter-router-port": "2",
        "enmasse.io/local-admin-port": "3",
        "enmasse.io/local-amqps-port": "4",
    }
    assert {p["name"]: p["port"] for p in service["spec"]["ports"]}["amqps"] == 5671
    assert certificate["spec"]["secretName"] == "shop-router-0-amqps-tls"
    assert certificate["spec"]["dnsNames"][:2] == ["shop-router-0", "shop-router-0.enmasse"]
    assert certificate["spec"]["subject"] == {"organizationalUnits": ["endpoint"]}
    assert "client auth" not in certificate["spec"]["usages"]
    pod = stateful_set["spec"]["template"]["spec"]
    assert pod["containers"][0]["args"][0] == "--router-id=router-0"
    assert pod["containers"][0]["args"][-5:] == [
        "--client-auth=required",
        "--mesh-secret-file=/etc/enmasse/mesh/secret",
        "--tls-cert=/etc/enmasse/tls/tls.crt",
        "--tls-key=/etc/enmasse/tls/tls.key",
        "--amqps-port=5671",
    ]
    assert {"name": "amqps", "containerPort": 5671} in pod["containers"][0]["ports"]
    assert pod["volumes"] == [
        {"name": "mesh-secret", "secret": {"secretName": "shop-router-mesh", "defaultMode": 0o440}},
        {"name": "grpc-tls", "secret": {"secretName": "enmasse-router-tls", "defaultMode": 0o440}},
        {"name": "grpc-probe", "configMap": {"name": "enmasse-grpc-probe"}},
        {
            "name": "amqps-tls",
            "secret": {"secretName": "shop-router-0-amqps-tls", "defaultMode": 0o440},
        },
    ]
    assert pod["containers"][0]["volumeMounts"] == [
        {"name": "mesh-secret", "mountPath": "/etc/enmasse/mesh", "readOnly": True},
        {"name": "grpc-tls", "mountPath": "/etc/enmasse/grpc-tls", "readOnly": True},
        {"name": "grpc-probe", "mountPath": "/etc/enmasse/probe", "readOnly": True},
        {"name": "amqps-tls", "mountPath": "/etc/enmasse/tls", "readOnly": True},
    ]
    assert pod["containers"][0]["env"] == [
        {"name": "ENMASSE_TLS_DIR", "value": "/etc/enmasse/grpc-tls"}
    ]


def test_the_local_mesh_secret_is_written_once_and_private(tmp_path: Path) -> None:
    path = ensure_local_mesh_secret(space="shop", var_dir=tmp_path)
    assert path == tmp_path / "routers/shop/mesh-secret"
    secret = path.read_text()
    assert len(secret.strip()) >= 32
    assert path.stat().st_mode & 0o777 == 0o600
    assert ensure_local_mesh_secret(space="shop", var_dir=tmp_path) == path
    assert path.read_text() == secret, "kept: running routers still agree with new ones"
    assert ensure_local_mesh_secret(space="other", var_dir=tmp_path).read_text() != secret
    assert sorted(p.name for p in path.parent.iterdir()) == ["mesh-secret"]
    command = local_router_command(WORKLOAD, var_dir=tmp_path)
    assert f"--mesh-secret-file={path}" in command
    assert "--client-auth=required" in command


def test_a_router_rendered_without_an_amqps_port_gets_one_and_keeps_the_others() -> None:
    before = LocalRouterPorts(amqp=1, inter_router=2, admin=3)
    picks = iter([2, 3, 9])  # a port taken already is not handed out twice
    assert kept_ports(before, port=lambda: next(picks)) == LocalRouterPorts(1, 2, 3, amqps=9)
    assert kept_ports(WORKLOAD.ports) == WORKLOAD.ports
    assert read_router(render_router(RouterWorkload("shop", "router-0", before))) is not None


def test_the_output_keeps_ports_and_touches_only_its_own_files(tmp_path: Path) -> None:
    output = RouterWorkloads(tmp_path)
    assert output.ensure_space("shop", routers=2) == ["router-0", "router-1"]
    first = output.read_space("shop")
    assert output.ensure_space("shop", routers=2) == []  # nothing changed: no byte written
    assert output.read_space("shop") == first  # ports kept
    broker = tmp_path / "workloads/shop/broker-0.yaml"  # the storage-controller's
    broker.write_text("kind: StatefulSet\nmetadata: {labels: {app.kubernetes.io/managed-by: x}}\n")
    shrunk = RouterWorkloads(tmp_path)
    assert shrunk.ensure_space("shop", routers=1) == ["router-1"]
    assert shrunk.spaces() == ["shop"]
    assert shrunk.remove_space("shop") == ["router-0"]
    assert shrunk.spaces() == []
    assert broker.exists()
    assert sorted(p.name for p in (tmp_path / "workloads/shop").iterdir()) == ["broker-0.yaml"]


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[bytes]]]:
    processes: list[subprocess.Popen[bytes]] = []
    try:
        yield processes
    finally:
        for process in processes:
            if process.poll() is None:
                os.kill(process.pid, signal.SIGKILL)
                process.wait(10)


async def test_a_rendered_router_started_like_the_runtime_carries_messages(
    config_server: Any,
    config_stub: config_pb2_grpc.ConfigServiceStub,
    tmp_path: Path,
    started: list[subprocess.Popen[bytes]],
) -> None:
    var, gitops = tmp_path / "var", tmp_path / "gitops"
    output = RouterWorkloads(gitops)
    agent = RouterAgent(
        config_target=config_server.target,
        directory=LocalDirectory(var),
        tick=0.1,
        workloads=output,
    )
    agent.start()
    try:
        await config_stub.CreateAddressSpace(
            resources_pb2.AddressSpace(
                metadata=resources_pb2.Metadata(name="shop"),
                spec=resources_pb2.AddressSpaceSpec(type="standard", plan="standard-small"),
            )
        )
        workload = await _eventually(lambda: output.read_space("shop").get("router-0"))
        local_router_dir(workload, var_dir=var).mkdir(parents=True)  # the runtime's part
        ensure_local_mesh_secret(space="shop", var_dir=var)
        # Its amqps certificate, naming it ("localhost" too, as `enmasse up` issues it).
        endpoint = issue(tmp_path / "tls", ca="ca", name="localhost", role="endpoint")
        command = local_router_command(workload, var_dir=var, endpoint_tls=endpoint)
        with open(tmp_path / "router-0.log", "ab") as log:  # noqa: ASYNC230
            started.append(subprocess.Popen(command, stdout=log, stderr=log))  # noqa: ASYNC220
        await config_stub.CreateAddress(
            resources_pb2.Address(
                metadata=resources_pb2.Metadata(name="calls", space="shop"),
                spec=resources_pb2.AddressSpec(
                    address="calls", type="anycast", plan="standard-anycast"
                ),
            )
        )

        async def active() -> bool:
            got = await config_stub.GetAddress(Ref(space="shop", name="calls"))
            return got.status.status.phase == "Active"

        async def endpoints() -> list[tuple[str, int]]:
            space = await config_stub.GetAddressSpace(Ref(name="shop"))
            return [(e.name, e.port) for e in space.status.endpoints]

        await _eventually_async(active)
        # Written before the address's status, but a conflicting write is retried a pass later.
        await _eventually_async(endpoints)
        assert await endpoints() == [
            ("amqp", workload.ports.amqp),
            ("amqps", workload.ports.amqps),
        ]
        # Rendered routers run `--client-auth required`: standard-small lets no one in anonymously.
        with pytest.raises(AmqpError) as anonymous:
            await asyncio.to_thread(_one_message, workload.ports.amqp)
        assert anonymous.value.condition == Condition(
            "amqp:unauthorized-access", "Authentication failed [mech=none]"
        )

        await config_stub.CreateMessagingUser(
            resources_pb2.MessagingUser(
                metadata={"name": "alice", "space": "shop"},
                spec={
                    "username": "alice",
                    "password": "wonderland",
                    # A user with no rule may do nothing: alice may use `calls`.
                    "authorization": [{"addresses": ["calls"], "operations": ["send", "recv"]}],
                },
            )
        )
        login = {"user": "alice", "password": "wonderland"}
        body = await _eventually(lambda: _logged_in_message(workload.ports.amqp, login))
        assert body == "through the rendered router"
        assert workload.ports.amqps is not None
        secure = {**login, "tls": Tls(ca_file=str(endpoint.ca), verify_hostname=True)}
        body = await asyncio.to_thread(_one_message, workload.ports.amqps, secure)
        assert body == "through the rendered router"
        with pytest.raises(AmqpError) as refused:
            await asyncio.to_thread(
                _one_message, workload.ports.amqp, {"user": "alice", "password": "wonder"}
            )
        assert refused.value.condition == Condition(
            "amqp:unauthorized-access", "Authentication failed [mech=SCRAM-SHA-512]"
        )

        await config_stub.DeleteAddressSpace(config_pb2.DeleteRequest(ref=Ref(name="shop")))
        await _eventually(lambda: not (gitops / "workloads/shop/router-0.yaml").exists())
    finally:
        await agent.stop()


def _logged_in_message(port: int, login: dict[str, Any]) -> str | None:
    """The message, once the agent has pushed the user to the router; None before."""
    try:
        return _one_message(port, login)
    except AmqpError:
        return None


def _one_message(port: int, login: dict[str, Any] | None = None) -> str:
    mechanisms = sasl.CLIENT_MECHANISMS if login else None  # SCRAM: the keys config derived
    options = {"hostname": "localhost", **(login or {})}  # the name its certificate carries
    with Client("127.0.0.1", port, mechanisms=mechanisms, **options) as client:
        receiver = client.receiver("calls")
        sender = client.sender("calls")
        outcome = sender.send_async(codec.encode_message("through the rendered router"))
        delivery = receiver.receive(10)
        receiver.accept(delivery)
        outcome.result(10)
        return str(codec.read_body(delivery.payload))


async def _eventually(check: Any, *, limit: float = 20.0) -> Any:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if found := await asyncio.to_thread(check):
            return found
        await asyncio.sleep(0.1)
    raise AssertionError(f"not reached in {limit} s")


async def _eventually_async(check: Any, *, limit: float = 20.0) -> None:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if await check():
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"not reached in {limit} s")
