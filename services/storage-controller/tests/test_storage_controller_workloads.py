"""Broker workloads: rendered manifests, read back, written into the GitOps output (no network)."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from enmasse.common.certificates import TlsFiles
from enmasse.resources.contracts import DRAINING
from enmasse.resources.discovery import BrokerEndpoint, LocalDirectory
from enmasse.resources.rendered_brokers import (
    Broker,
    BrokerWorkload,
    GitOpsOutput,
    LocalPorts,
    local_broker_command,
    read_broker,
)
from enmasse.resources.workload_files import WorkloadError
from enmasse.storage_controller.controller import broker_endpoint
from enmasse.storage_controller.workloads import render_broker

POOLED = Broker("shop-broker-0", pooled=True)
DEDICATED = Broker("shop-orders-0", pooled=False, owner="orders")
PORTS = LocalPorts(amqp=41001, admin=41002)


def documents(text: str) -> dict[str, dict]:
    return {doc["kind"]: doc for doc in yaml.safe_load_all(text)}


def test_a_broker_is_a_service_and_a_stateful_set_with_a_journal_claim() -> None:
    docs = documents(render_broker(space="shop", broker=DEDICATED, ports=PORTS))
    assert set(docs) == {"Service", "StatefulSet"}
    stateful_set = docs["StatefulSet"]
    assert stateful_set["metadata"]["name"] == "shop-orders-0"
    assert stateful_set["metadata"]["labels"]["enmasse.io/space"] == "shop"
    assert stateful_set["metadata"]["labels"]["enmasse.io/broker"] == "shop-orders-0"
    assert stateful_set["metadata"]["labels"]["app.kubernetes.io/component"] == "broker"
    assert stateful_set["metadata"]["annotations"] == {
        "enmasse.io/broker-kind": "dedicated",
        "enmasse.io/owner": "orders",
        "enmasse.io/state": "Active",
        "enmasse.io/serves": "routers",
        "enmasse.io/local-amqp-port": "41001",
        "enmasse.io/local-admin-port": "41002",
    }
    (container,) = stateful_set["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "enmasse-py/broker"
    assert container["args"] == [
        "--host=0.0.0.0",
        "--port=5672",
        "--admin-port=5685",
        "--metrics-port=9102",
        "--data-dir=/var/lib/enmasse/broker",
        "--routers-only",  # a standard space's broker: its routers only, over mutual TLS
    ]
    assert container["volumeMounts"] == [
        {"name": "data", "mountPath": "/var/lib/enmasse/broker"},
        {"name": "grpc-tls", "mountPath": "/etc/enmasse/grpc-tls", "readOnly": True},
        {"name": "grpc-probe", "mountPath": "/etc/enmasse/probe", "readOnly": True},
    ]
    assert container["env"] == [{"name": "ENMASSE_TLS_DIR", "value": "/etc/enmasse/grpc-tls"}]
    assert stateful_set["spec"]["template"]["spec"]["volumes"] == [
        {"name": "grpc-tls", "secret": {"secretName": "enmasse-broker-tls", "defaultMode": 0o440}},
        {"name": "grpc-probe", "configMap": {"name": "enmasse-grpc-probe"}},
    ]
    (claim,) = stateful_set["spec"]["volumeClaimTemplates"]
    assert claim["metadata"]["name"] == "data"
    selector = stateful_set["spec"]["selector"]["matchLabels"]
    assert selector == {"enmasse.io/space": "shop", "enmasse.io/broker": "shop-orders-0"}
    assert docs["Service"]["spec"]["selector"] == selector
    assert stateful_set["spec"]["template"]["metadata"]["labels"].items() >= selector.items()


@pytest.mark.parametrize("broker", [POOLED, DEDICATED])
def test_rendered_objects_are_valid_kubernetes(broker: Broker) -> None:
    for doc in yaml.safe_load_all(render_broker(space="shop", broker=broker, ports=PORTS)):
        kubernetes_validate.validate(doc, "1.32.0", strict=True)


def test_rendering_is_byte_for_byte_deterministic_and_reads_back() -> None:
    text = render_broker(space="shop", broker=POOLED, ports=PORTS)
    assert render_broker(space="shop", broker=POOLED, ports=PORTS) == text
    assert read_broker(text) == BrokerWorkload(space="shop", broker=POOLED, ports=PORTS)
    draining = Broker("shop-orders-0", pooled=False, owner="orders", state=DRAINING)
    back = read_broker(render_broker(space="shop", broker=draining, ports=PORTS))
    assert back is not None
    assert back.broker == draining


def test_files_that_are_not_ours_are_not_read_as_brokers() -> None:
    assert read_broker("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n") is None
    foreign = "kind: StatefulSet\nmetadata: {name: r, labels: {app.kubernetes.io/managed-by: me}}\n"
    assert read_broker(foreign) is None
    broken = (
        "kind: StatefulSet\nmetadata:\n  name: b\n  labels:\n"
        "    app.kubernetes.io/managed-by: enmasse-storage-controller\n"
        "    enmasse.io/space: shop\n    enmasse.io/broker: b\n"
    )
    with pytest.raises(WorkloadError, match=re.escape("lacks a readable 'enmasse.io/broker-kind'")):
        read_broker(broken)


def test_the_output_changes_only_what_changed_and_removes_only_its_own_files(
    tmp_path: Path,
) -> None:
    output = GitOpsOutput(tmp_path)
    texts = {
        POOLED.id: render_broker(space="shop", broker=POOLED, ports=PORTS),
        DEDICATED.id: render_broker(space="shop", broker=DEDICATED, ports=LocalPorts(41003, 41004)),
    }
    assert output.write_space("shop", texts) == ["shop-broker-0", "shop-orders-0"]
    space_dir = tmp_path / "workloads" / "shop"
    foreign = space_dir / "router.yaml"
    foreign.write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: router}\n")
    inode = (space_dir / "shop-broker-0.yaml").stat().st_ino
    assert output.write_space("shop", texts) == []
    assert (space_dir / "shop-broker-0.yaml").stat().st_ino == inode  # not even rewritten
    assert set(output.read_space("shop")) == {"shop-broker-0", "shop-orders-0"}
    assert output.write_space("shop", {POOLED.id: texts[POOLED.id]}) == ["shop-orders-0"]
    assert sorted(p.name for p in space_dir.iterdir()) == ["router.yaml", "shop-broker-0.yaml"]
    assert output.spaces() == ["shop"]
    foreign.unlink()
    output.write_space("shop", {})
    assert not space_dir.exists()
    assert output.spaces() == []


def test_the_local_runtime_starts_a_broker_from_its_file(tmp_path: Path) -> None:
    workload = BrokerWorkload(space="shop", broker=POOLED, ports=PORTS)
    command = local_broker_command(workload, var_dir=tmp_path, executable="enmasse-broker")
    base = tmp_path / "brokers" / "shop" / "shop-broker-0"
    assert command == [
        "enmasse-broker",
        "--host=127.0.0.1",
        "--port=41001",
        "--admin-port=41002",
        f"--data-dir={base / 'data'}",
        f"--ports-file={base / 'ports.json'}",
        "--routers-only",
    ]


def test_the_local_directory_prefers_the_ports_the_broker_wrote(tmp_path: Path) -> None:
    output = GitOpsOutput(tmp_path / "gitops")
    output.write_space("shop", {POOLED.id: render_broker(space="shop", broker=POOLED, ports=PORTS)})
    directory = LocalDirectory(tmp_path / "var")

    def endpoint(broker_id: str) -> BrokerEndpoint | None:
        return broker_endpoint("shop", broker_id, directory=directory, output=output)

    assert endpoint(POOLED.id) == BrokerEndpoint(POOLED.id, "127.0.0.1", 41001, 41002)
    assert endpoint("shop-broker-9") is None
    ports_file = tmp_path / "var" / "brokers" / "shop" / POOLED.id / "ports.json"
    ports_file.parent.mkdir(parents=True)
    ports_file.write_text('{"amqp": 42001, "admin": 42002}')
    assert endpoint(POOLED.id) == BrokerEndpoint(POOLED.id, "127.0.0.1", 42001, 42002)


def test_only_a_standard_spaces_broker_is_rendered_for_routers_only(tmp_path: Path) -> None:
    """A brokered space's broker serves its clients on the AMQP port: no --routers-only, in the
    cluster's args or in the local command line the file reads back into."""
    for routers_only in (True, False):
        text = render_broker(space="shop", broker=POOLED, ports=PORTS, routers_only=routers_only)
        (container,) = documents(text)["StatefulSet"]["spec"]["template"]["spec"]["containers"]
        back = read_broker(text)
        assert back is not None
        assert back.routers_only is routers_only
        command = local_broker_command(back, var_dir=tmp_path, executable="enmasse-broker")
        assert ("--routers-only" in container["args"]) is routers_only
        assert ("--routers-only" in command) is routers_only


def test_a_brokered_spaces_broker_checks_its_clients_logins(tmp_path: Path) -> None:
    """A brokered space's broker runs --client-auth=required (its clients log in as the space's
    users), in the cluster's args and in the local command line; a standard space's does not."""
    for routers_only in (True, False):
        text = render_broker(space="jms", broker=POOLED, ports=PORTS, routers_only=routers_only)
        (container,) = documents(text)["StatefulSet"]["spec"]["template"]["spec"]["containers"]
        back = read_broker(text)
        assert back is not None
        command = local_broker_command(back, var_dir=tmp_path, executable="enmasse-broker")
        assert ("--client-auth=required" in container["args"]) is not routers_only
        assert ("--client-auth=required" in command) is not routers_only


def test_a_brokered_spaces_broker_serves_amqps_with_a_certificate_of_its_own(
    tmp_path: Path,
) -> None:
    """Its clients' endpoint is amqp and amqps: the cluster's pod mounts the Certificate rendered
    beside it (its own Service names, role `endpoint`) and opens 5671, its Service too; locally
    the runtime's certificate and the pinned amqps port. A standard space's broker has neither."""
    clients = render_broker(
        space="jms", broker=POOLED, ports=replace(PORTS, amqps=41003), routers_only=False
    )
    docs = documents(clients)
    certificate = docs["Certificate"]["spec"]
    assert certificate["secretName"] == f"{POOLED.id}-amqps-tls"
    assert certificate["dnsNames"][0] == POOLED.id
    assert certificate["subject"] == {"organizationalUnits": ["endpoint"]}
    pod = docs["StatefulSet"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["args"][-3:] == [
        "--tls-cert=/etc/enmasse/tls/tls.crt",
        "--tls-key=/etc/enmasse/tls/tls.key",
        "--amqps-port=5671",
    ]
    mounted = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    secrets = {v["name"]: v.get("secret", {}).get("secretName") for v in pod["volumes"]}
    assert mounted["amqps-tls"] == "/etc/enmasse/tls"
    assert secrets["amqps-tls"] == f"{POOLED.id}-amqps-tls"
    service_ports = docs["Service"]["spec"]["ports"]
    assert {"name": "amqps", "port": 5671, "targetPort": "amqps"} in service_ports
    for kind in ("Service", "StatefulSet"):  # the Certificate: tests/test_k8s_manifests.py
        kubernetes_validate.validate(docs[kind], "1.32.0", strict=True)
    back = read_broker(clients)
    assert back is not None
    assert back.ports.amqps == 41003
    endpoint = TlsFiles(tmp_path / "endpoint")
    command = local_broker_command(back, var_dir=tmp_path, executable="b", endpoint_tls=endpoint)
    assert command[-3:] == [
        f"--tls-cert={endpoint.cert}",
        f"--tls-key={endpoint.key}",
        "--amqps-port=41003",
    ]
    routers = render_broker(space="shop", broker=POOLED, ports=PORTS)
    assert "Certificate" not in documents(routers)
    assert "amqps" not in routers
    back = read_broker(routers)
    assert back is not None
    command = local_broker_command(back, var_dir=tmp_path, executable="b", endpoint_tls=endpoint)
    assert not any(word.startswith("--tls-cert") for word in command)
