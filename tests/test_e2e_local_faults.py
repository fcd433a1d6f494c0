"""End to end on the local runtime: crashes, brokers coming and going, and isolated spaces.

On the session's `enmasse up` (`local_runtime`): a control-plane process (or etcd) SIGKILLed right
after a change is restarted by supervisord and the system converges (every address Active, none
stuck in Configuring, messages flow); pooled queues beyond one broker's credit start a second
broker, and deleting one lets the controller drain and stop it without losing a message; two
address spaces have their own routers and brokers, never mix messages that share an address name,
and deleting one leaves the other serving.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
from collections.abc import Iterator

import pytest
from enmasse.amqp import codec
from enmasse.amqp.client import Client, Receiver
from enmasse.amqp.engine import Outcome
from enmasse.cli.local.supervisor import pid_alive

from tests.fixtures.local_runtime import LocalRuntime, logs, wait_until

pytestmark = pytest.mark.slow


def space_manifest(name: str, plan: str = "development") -> str:
    """A space whose clients get in anonymously (the development plan): these tests are about
    crashes, not logins."""
    return (
        "---\napiVersion: enmasse.io/v1\nkind: AddressSpace\n"
        f"metadata: {{name: {name}}}\nspec: {{type: standard, plan: {plan}}}\n"
    )


def queue_manifest(name: str, *, space: str, plan: str = "standard-small-queue") -> str:
    return (
        "---\napiVersion: enmasse.io/v1\nkind: Address\n"
        f"metadata: {{name: {name}, space: {space}}}\n"
        f"spec: {{address: {name}, type: queue, plan: {plan}}}\n"
    )


@contextlib.contextmanager
def client(port: int) -> Iterator[Client]:
    opened = Client("127.0.0.1", port, timeout=15)
    try:
        yield opened
    finally:
        opened.close()


def send_all(port: int, address: str, bodies: list[str]) -> None:
    with client(port) as c:
        sender = c.sender(address)
        for body in bodies:
            outcome = sender.send(codec.encode_message(body, durable=True), timeout=15).outcome
            assert outcome is Outcome.ACCEPTED, f"{address} {body}: {outcome}"


def take(receiver: Receiver, count: int) -> list[str]:
    bodies = []
    for _ in range(count):
        delivery = receiver.receive(15)
        receiver.accept(delivery)
        bodies.append(str(codec.read_body(delivery.payload)))
    return bodies


def receive_all(port: int, address: str, count: int) -> list[str]:
    with client(port) as c:
        receiver = c.receiver(address, credit=min(count, 100) or 1)
        bodies = take(receiver, count)
        with contextlib.suppress(TimeoutError):
            bodies.append(f"EXTRA {codec.read_body(receiver.receive(0.5).payload)}")
        return bodies


def port_open(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture(scope="module")
def ops(local_runtime: LocalRuntime) -> int:
    """Space `ops`, where the crash tests add their addresses; its router's amqp port."""
    local_runtime.apply(space_manifest("ops") + queue_manifest("base", space="ops"))
    local_runtime.wait_active("ops", ["base"], timeout=180)
    return local_runtime.router_port("ops")


@pytest.mark.parametrize(
    "victim", ["storage-controller", "router-agent", "subscription", "config", "etcd"]
)
def test_a_process_killed_mid_change_is_restarted_and_the_system_converges(
    local_runtime: LocalRuntime, ops: int, victim: str
) -> None:
    names = [f"{victim}-q{i}" for i in range(3)]
    state, pid = local_runtime.processes()[victim]
    assert state == "RUNNING"
    local_runtime.apply("".join(queue_manifest(n, space="ops") for n in names))
    os.kill(pid, signal.SIGKILL)

    def restarted() -> bool:
        state, new_pid = local_runtime.processes()[victim]
        return state == "RUNNING" and new_pid != pid

    assert wait_until(restarted, timeout=60), f"{victim} not restarted\n{logs(local_runtime.var)}"
    local_runtime.wait_active("ops", names)
    phases = local_runtime.phases("ops")
    assert [n for n, phase in phases.items() if phase != "Active"] == []
    bodies = [f"{victim}-{i}" for i in range(3)]
    send_all(ops, names[-1], bodies)
    assert receive_all(ops, names[-1], 3) == bodies


HALF_PLANS = """
apiVersion: enmasse.io/v1
kind: AddressPlan
metadata: {name: e2e-half-queue}
spec: {addressType: queue, broker: 0.4, persistent: true}
---
apiVersion: enmasse.io/v1
kind: AddressSpacePlan
metadata: {name: e2e-roomy}
spec:
  addressSpaceType: standard
  addressPlans: [e2e-half-queue]
  quotas: {maxAddresses: 10, maxBrokers: 3, maxConnections: 100, maxRouters: 1}
  allowAnonymous: true
"""


def test_pooled_queues_beyond_one_broker_start_a_second_that_drains_when_not_needed(
    local_runtime: LocalRuntime,
) -> None:
    local_runtime.apply(HALF_PLANS, name="plans.yaml")
    names = ["p1", "p2", "p3"]
    local_runtime.apply(
        space_manifest("pool", "e2e-roomy")
        + "".join(queue_manifest(n, space="pool", plan="e2e-half-queue") for n in names)
    )
    local_runtime.wait_active("pool", names, timeout=180)

    def brokers() -> list[str]:
        return sorted(
            name
            for name, (state, _pid) in local_runtime.processes().items()
            if name.startswith("pool-broker-") and state == "RUNNING"
        )

    # 0.4 + 0.4 fit one broker; the third needs a second one.
    assert brokers() == ["pool-broker-0", "pool-broker-1"]
    port = local_runtime.router_port("pool")
    sent = {n: [f"{n}-{i}" for i in range(20)] for n in names}
    for name, bodies in sent.items():
        send_all(port, name, bodies)

    local_runtime.delete("address", "p1", space="pool")
    assert wait_until(lambda: len(brokers()) == 1, timeout=120), (
        f"{brokers()}\n{logs(local_runtime.var)}"
    )
    local_runtime.wait_active("pool", ["p2", "p3"])
    assert receive_all(port, "p2", 20) == sent["p2"]
    assert receive_all(port, "p3", 20) == sent["p3"]


def test_two_address_spaces_are_isolated_and_deleting_one_leaves_the_other(
    local_runtime: LocalRuntime,
) -> None:
    local_runtime.apply(
        space_manifest("east")
        + queue_manifest("orders", space="east")
        + space_manifest("west")
        + queue_manifest("orders", space="west")
    )
    local_runtime.wait_active("east", ["orders"], timeout=180)
    local_runtime.wait_active("west", ["orders"], timeout=180)
    east, west = local_runtime.router_port("east"), local_runtime.router_port("west")
    assert east != west
    programs = local_runtime.processes()
    assert {"east-router-0", "west-router-0", "east-broker-0", "west-broker-0"} <= set(programs)

    send_all(east, "orders", ["for-east-1", "for-east-2"])
    send_all(west, "orders", ["for-west"])
    assert receive_all(west, "orders", 1) == ["for-west"]
    assert receive_all(east, "orders", 2) == ["for-east-1", "for-east-2"]

    west_pids = [programs[n][1] for n in ("west-router-0", "west-broker-0")]
    local_runtime.delete("addressspace", "west")

    def west_gone() -> bool:
        return not any(n.startswith("west-") for n in local_runtime.processes())

    assert wait_until(west_gone, timeout=120), f"{local_runtime.processes()}"
    assert not any(pid_alive(pid) for pid in west_pids)
    assert not port_open(west)
    send_all(east, "orders", ["after"])
    assert receive_all(east, "orders", 1) == ["after"]


def test_a_dedicated_queue_gets_a_broker_of_its_own_and_carries_messages(
    local_runtime: LocalRuntime, ops: int
) -> None:
    local_runtime.apply(queue_manifest("solo", space="ops", plan="standard-large-queue"))
    local_runtime.wait_active("ops", ["solo"])
    state, _pid = local_runtime.processes()["ops-solo-0"]
    assert state == "RUNNING"
    send_all(ops, "solo", ["mine-1", "mine-2"])
    assert receive_all(ops, "solo", 2) == ["mine-1", "mine-2"]
