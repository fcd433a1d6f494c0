"""The pure parts of the local runtime and of send/receive, without any process.

Rendered workload files -> supervisor programs (names, commands, include files, written once),
and where `up` made certificates, each client endpoint's amqps listener with a certificate of
its own naming it; the lines `send` and the demo print; where `send` finds its router, and an
amqps URL's TLS.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from cryptography import x509
from enmasse.amqp.wire import Outcome, Tls
from enmasse.cli import messaging
from enmasse.cli.client import CliError
from enmasse.cli.local.gateways import ensure_pinned_port
from enmasse.cli.local.runtime import (
    desired_programs,
    program_files,
    retire_removed_routers,
    write_program_files,
)
from enmasse.cli.local.tls import ensure_certificates, ensure_endpoint_certificate
from enmasse.cli.local.var_dir import VarDir
from enmasse.resources.rendered_brokers import Broker, LocalPorts
from enmasse.resources.rendered_routers import LocalRouterPorts, RouterWorkload
from enmasse.router_agent.workloads import render_router
from enmasse.storage_controller.workloads import render_broker
from enmasse.v1 import resources_pb2


def rendered_gitops(var: VarDir) -> None:
    directory = var.gitops / "workloads" / "demo"
    directory.mkdir(parents=True)
    router = RouterWorkload(
        "demo",
        "router-0",
        LocalRouterPorts(amqp=41000, inter_router=41001, admin=41002, amqps=41003),
    )
    (directory / "router-0.yaml").write_text(render_router(router))
    broker = Broker(id="demo-broker-0", pooled=True)
    text = render_broker(space="demo", broker=broker, ports=LocalPorts(amqp=42000, admin=42001))
    (directory / "demo-broker-0.yaml").write_text(text)
    (directory / "notes.yaml").write_text("kind: ConfigMap\n")  # not ours: ignored


def test_every_rendered_workload_becomes_one_program_with_its_pinned_ports(tmp_path: Path) -> None:
    var = VarDir(tmp_path)
    rendered_gitops(var)
    programs = desired_programs(var)
    assert sorted(programs) == ["demo-broker-0", "demo-router-0"]
    router = programs["demo-router-0"]
    assert router.command[1:] == (
        "--router-id=router-0",
        "--host=127.0.0.1",
        "--port=41000",
        "--inter-router-port=41001",
        "--admin-port=41002",
        f"--ports-file={tmp_path}/routers/demo/router-0/ports.json",
        "--client-auth=required",
        f"--mesh-secret-file={tmp_path}/routers/demo/mesh-secret",
    )
    assert router.workdir == tmp_path / "routers" / "demo" / "router-0"
    broker = programs["demo-broker-0"]
    assert "--port=42000" in broker.command
    assert f"--data-dir={tmp_path}/brokers/demo/demo-broker-0/data" in broker.command
    assert router.priority < broker.priority


def test_a_standard_space_gets_an_mqtt_gateway_on_a_port_kept_across_passes(
    tmp_path: Path,
) -> None:
    var = VarDir(tmp_path)
    rendered_gitops(var)
    port = ensure_pinned_port(var, "demo")
    assert ensure_pinned_port(var, "demo") == port  # chosen once, kept
    gateway = desired_programs(var)["demo-mqtt-gateway"]
    assert gateway.command[1:] == (
        f"--listen=127.0.0.1:{port}",
        "--router=127.0.0.1:41000",  # router-0's client port
        "--gateway-id=demo-mqtt-gateway",
        f"--ports-file={tmp_path}/gateways/demo/mqtt-gateway/ports.json",
        # its stores: the space's store queues, as the store identity (mqtt_stores)
        "--store-user=$mqtt-store",
        f"--store-password-file={tmp_path}/run/mqtt-store-password",
        "--retained-address=mqtt/retained",
        "--will-address=mqtt/wills",
        "--sessions-address=mqtt/sessions",
    )
    assert gateway.priority > desired_programs(var)["demo-router-0"].priority


def test_where_up_made_certificates_every_router_serves_amqps_with_its_own(
    tmp_path: Path,
) -> None:
    """The router's command opens its pinned amqps port with the certificate the runtime issues
    it, its program's name and localhost in the SAN, server auth only; a standard space's broker
    serves no clients, so no amqps."""
    var = VarDir(tmp_path)
    rendered_gitops(var)
    ensure_certificates(var)
    programs = desired_programs(var)
    router, broker = programs["demo-router-0"], programs["demo-broker-0"]
    own = tmp_path / "tls" / "endpoints" / "demo-router-0"
    assert router.command[-3:] == (
        f"--tls-cert={own}/tls.crt",
        f"--tls-key={own}/tls.key",
        "--amqps-port=41003",
    )
    assert router.endpoint
    assert not broker.endpoint
    assert not any(word.startswith("--tls-cert") for word in broker.command)
    files = ensure_endpoint_certificate(var, "demo-router-0")
    assert files.directory == own
    certificate = x509.load_pem_x509_certificate(files.cert.read_bytes())
    names = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == ["demo-router-0", "localhost"]
    usages = certificate.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usages) == [x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]
    assert (tmp_path / "tls" / "ca.crt").read_bytes() == files.ca.read_bytes()  # clients trust
    assert files.key.stat().st_mode & 0o777 == 0o600


def test_program_files_are_written_once_and_removed_with_their_workload(tmp_path: Path) -> None:
    var = VarDir(tmp_path)
    rendered_gitops(var)
    files = program_files(var, desired_programs(var))
    assert files["demo-router-0.conf"].startswith("[program:demo-router-0]\ncommand = ")
    assert "autorestart = true" in files["demo-broker-0.conf"]
    assert write_program_files(var, files) is True
    assert write_program_files(var, files) is False  # unchanged: supervisord is not bothered
    (var.gitops / "workloads" / "demo" / "demo-broker-0.yaml").unlink()
    assert write_program_files(var, program_files(var, desired_programs(var))) is True
    assert sorted(p.name for p in var.programs_dir.iterdir()) == ["demo-router-0.conf"]


def test_a_router_no_longer_rendered_leaves_its_space_s_endpoints(tmp_path: Path) -> None:
    var = VarDir(tmp_path)
    rendered_gitops(var)
    kept = var.root / "routers" / "demo" / "router-0" / "ports.json"
    scaled_down = var.root / "routers" / "demo" / "router-1" / "ports.json"
    gone_space = var.root / "routers" / "old" / "router-0" / "ports.json"
    for ports in (kept, scaled_down, gone_space):
        ports.parent.mkdir(parents=True)
        ports.write_text('{"amqp": 41000}')
    assert sorted(retire_removed_routers(var)) == sorted([scaled_down, gone_space])
    assert kept.exists(), "a rendered router keeps its file (crashed, it comes back)"
    assert not scaled_down.exists()
    assert not gone_space.exists()


def test_send_lines_say_how_many_where_and_the_outcome() -> None:
    accepted = [Outcome.ACCEPTED]
    line = messaging.sent_line(count=1, kind="queue", address="orders", outcomes=accepted)
    assert line == "sent 1 message to queue 'orders' (accepted)"
    mixed = [Outcome.ACCEPTED, Outcome.REJECTED, Outcome.ACCEPTED]
    line = messaging.sent_line(count=3, kind="", address="x", outcomes=mixed)
    assert line == "sent 3 messages to 'x' (2 accepted, 1 rejected)"


def test_a_url_is_host_and_port_or_a_precise_error(tmp_path: Path) -> None:
    assert messaging.parse_url("amqp://127.0.0.1:5672") == messaging.Endpoint("127.0.0.1", 5672)
    assert messaging.parse_url("127.0.0.1:5672/") == messaging.Endpoint("127.0.0.1", 5672)
    with pytest.raises(
        CliError, match=r"--url 'nowhere': expected amqp://HOST:PORT, amqps://HOST:PORT or HOST:"
    ):
        messaging.parse_url("nowhere")
    ca = tmp_path / "ca.crt"
    secure = messaging.parse_url("amqps://localhost:5671", ca_file=ca)
    assert secure == messaging.Endpoint(
        "localhost", 5671, tls=Tls(ca_file=str(ca), verify_hostname=True)
    )
    assert str(secure) == "amqps://localhost:5671"
    with pytest.raises(CliError) as no_ca:
        messaging.parse_url("amqps://localhost:5671")
    assert no_ca.value.message == (
        "--url 'amqps://localhost:5671': amqps needs the CA its certificate chains to: give "
        "--ca-file (`enmasse up`'s is <var-dir>/tls/ca.crt)"
    )


def test_a_space_without_routers_yet_has_no_endpoint_to_send_to() -> None:
    space = resources_pb2.AddressSpace(metadata=resources_pb2.Metadata(name="demo"))
    with pytest.raises(CliError) as refused:
        messaging.space_endpoint(space)
    assert str(refused.value.message) == (
        "address space 'demo' has no amqp endpoint yet (phase Pending); "
        "wait until it is Active, or give --url"
    )
    space.status.endpoints.add(name="amqp", host="127.0.0.1", port=41000)
    assert messaging.space_endpoint(space) == messaging.Endpoint("127.0.0.1", 41000)


def test_the_demo_takes_one_address_per_type_and_a_subscription_publishes_to_its_topic() -> None:
    def address(name: str, kind: str, topic: str = "") -> resources_pb2.Address:
        return resources_pb2.Address(
            metadata=resources_pb2.Metadata(name=name, space="demo"),
            spec=resources_pb2.AddressSpec(address=f"amqp-{name}", type=kind, topic=topic),
        )

    chosen = messaging.demo_addresses(
        [
            address("rpc", "anycast"),
            address("audit", "subscription", topic="prices"),
            address("prices", "topic"),
            address("orders", "queue"),
            address("b-orders", "queue"),
        ]
    )
    assert [(a.kind, a.address, a.publish_to) for a in chosen] == [
        ("queue", "amqp-b-orders", "amqp-b-orders"),
        ("topic", "amqp-prices", "amqp-prices"),
        ("subscription", "amqp-audit", "amqp-prices"),
        ("anycast", "amqp-rpc", "amqp-rpc"),
    ]
    ok = messaging.DemoResult("queue", "orders", 1, 1)
    assert ok.line() == "queue         orders         sent 1, received 1  ok"
    lost = messaging.DemoResult("anycast", "rpc", 1, 0)
    assert lost.line() == "anycast       rpc            sent 1, received 0  FAILED: message lost"
