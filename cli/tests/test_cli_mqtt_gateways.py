"""Several MQTT gateway instances per standard space on this machine, without any process.

`enmasse up --mqtt-gateways N` keeps N in the var dir; each pass of the runtime then has N
gateway programs per standard space, each on a port pinned once, spread over the space's
routers; the space's status lists one `mqtt` endpoint per instance whose ports file is there,
and an instance no longer wanted is listed no more.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from enmasse.cli.local import gateways
from enmasse.cli.local.runtime import desired_programs
from enmasse.cli.local.var_dir import VarDir
from enmasse.resources.discovery import LocalDirectory, client_endpoints
from enmasse.resources.rendered_routers import LocalRouterPorts, RouterWorkload
from enmasse.router_agent.workloads import render_router


def two_routers(var: VarDir) -> None:
    directory = var.gitops / "workloads" / "demo"
    directory.mkdir(parents=True)
    for n, base in ((0, 41000), (1, 41100)):
        router = RouterWorkload(
            "demo",
            f"router-{n}",
            LocalRouterPorts(amqp=base, inter_router=base + 1, admin=base + 2, amqps=base + 3),
        )
        (directory / f"router-{n}.yaml").write_text(render_router(router))


def pin_all(var: VarDir) -> list[int]:
    return [gateways.ensure_pinned_port(var, "demo", g) for g in gateways.gateway_ids(var)]


def test_one_instance_until_asked_for_more(tmp_path: Path) -> None:
    var = VarDir(tmp_path)
    two_routers(var)
    assert gateways.instances(var) == 1
    pin_all(var)
    assert [n for n in desired_programs(var) if "mqtt" in n] == ["demo-mqtt-gateway"]


def test_two_instances_each_with_its_port_in_front_of_its_own_router(tmp_path: Path) -> None:
    var = VarDir(tmp_path)
    two_routers(var)
    gateways.set_instances(var, 2)
    first, second = pin_all(var)
    assert first != second
    assert pin_all(var) == [first, second]  # pinned once, kept
    programs = desired_programs(var)
    one, two = programs["demo-mqtt-gateway"], programs["demo-mqtt-gateway-2"]
    assert one.command[1:3] == (f"--listen=127.0.0.1:{first}", "--router=127.0.0.1:41000")
    assert two.command[1:] == (
        f"--listen=127.0.0.1:{second}",
        "--router=127.0.0.1:41100",  # router-1's client port
        "--gateway-id=demo-mqtt-gateway-2",
        f"--ports-file={tmp_path}/gateways/demo/mqtt-gateway-2/ports.json",
        # its stores: the space's store queues, as the store identity (mqtt_stores)
        "--store-user=$mqtt-store",
        f"--store-password-file={tmp_path}/run/mqtt-store-password",
        "--retained-address=mqtt/retained",
        "--will-address=mqtt/wills",
        "--sessions-address=mqtt/sessions",
    )


def test_the_status_lists_each_instance_and_forgets_one_no_longer_wanted(tmp_path: Path) -> None:
    var = VarDir(tmp_path)
    two_routers(var)
    gateways.set_instances(var, 2)
    ports = pin_all(var)
    for gateway_id, port in zip(gateways.gateway_ids(var), ports, strict=True):
        ports_file = gateways.gateway_dir(var, "demo", gateway_id) / "ports.json"
        ports_file.write_text(json.dumps({"mqtt": port}))
    directory = LocalDirectory(tmp_path)
    directory.refresh()
    listed = client_endpoints(directory.gateways("demo"))
    assert [(e.name, e.port) for e in listed] == [("mqtt", ports[0]), ("mqtt", ports[1])]
    gateways.set_instances(var, 1)
    gateways.retire_unwanted(var, "demo")
    directory.refresh()
    assert [e.port for e in client_endpoints(directory.gateways("demo"))] == [ports[0]]
    assert [n for n in desired_programs(var) if "mqtt" in n] == ["demo-mqtt-gateway"]


@pytest.mark.parametrize("count", [0, gateways.MAX_INSTANCES + 1])
def test_a_count_out_of_range_is_refused(tmp_path: Path, count: int) -> None:
    with pytest.raises(ValueError, match="--mqtt-gateways must be 1"):
        gateways.set_instances(VarDir(tmp_path), count)
