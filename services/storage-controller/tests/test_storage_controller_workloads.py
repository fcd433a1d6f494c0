"""Broker workloads: rendered manifests, read back, written into the GitOps output (no network)."""

from __future__ import annotations

import re
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
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
        "enmasse.io/local-amqp-port": "41001",
        "enmasse.io/local-admin-port": "41002",
    }
    (container,) = stateful_set["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "enmasse-py/broker"
    assert container["args"] == [
        "--host=0.0.0.0",
        "--port=5672",
        "--admin-port=5685",
        "--data-dir=/var/lib/enmasse/broker",
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
