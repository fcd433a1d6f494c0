"""End to end on the local runtime: a space's routers scaled 2 -> 3 -> 2 under steady load.

`enmasse up` (the session's `local_runtime`), a space whose plan says 2 routers, a queue. Two
producers send at a steady rate the whole time, each holding a list of the space's router
endpoints the way `enmasse send` does (cli/failover.py): one starts on router 1, the other on
the third router once the plan says 3. Then the plan says 2 again: the runtime stops the third
router (SIGTERM through supervisord), which redirects its producer between two deliveries
(router departure.py). What a user must see: the space's status lists 2, then 3, then 2 amqp
endpoints; every message of both producers is accepted and is in the queue exactly once.
Every loop is bounded by a count and a deadline.
"""

from __future__ import annotations

import threading
import time

import pytest
from enmasse.amqp.client import Client
from enmasse.cli.messaging import Endpoint, body_text, send
from enmasse.resources.contracts import AMQP

from tests.fixtures.local_runtime import LocalRuntime, logs, wait_until

pytestmark = pytest.mark.slow

RATE = 50.0  # messages/s per producer
COUNT = 1500  # per producer: 30 s of sending at RATE, the whole change inside it


def plan(routers: int) -> str:
    return f"""
apiVersion: enmasse.io/v1
kind: AddressSpacePlan
metadata: {{name: e2e-elastic}}
spec:
  addressSpaceType: standard
  addressPlans: [standard-small-queue]
  quotas: {{maxAddresses: 10, maxBrokers: 1, maxConnections: 100, minRouters: {routers},
           maxRouters: 3}}
  allowAnonymous: true
"""


SPACE = """
apiVersion: enmasse.io/v1
kind: AddressSpace
metadata: {name: elastic}
spec: {type: standard, plan: e2e-elastic}
---
apiVersion: enmasse.io/v1
kind: Address
metadata: {name: orders, space: elastic}
spec: {address: orders, type: queue, plan: standard-small-queue}
"""


def endpoints(runtime: LocalRuntime) -> list[Endpoint]:
    return [
        Endpoint(e.host or "127.0.0.1", e.port)
        for e in runtime.address_space("elastic").status.endpoints
        if e.name == AMQP and e.port
    ]


def wait_routers(runtime: LocalRuntime, count: int) -> list[Endpoint]:
    found: list[Endpoint] = []

    def listed() -> bool:
        found[:] = endpoints(runtime)
        return len(found) == count

    assert wait_until(listed, timeout=120), (
        f"space elastic lists {len(found)} routers, not {count}\n{logs(runtime.var)}"
    )
    return found


class Producer:
    """`send` on a thread, with its outcomes (or its error) kept for the test."""

    def __init__(self, name: str, route: list[Endpoint]) -> None:
        self.bodies = [f"{name}-{n}" for n in range(COUNT)]
        self.outcomes: list[str] = []
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(route,), daemon=True)
        self.thread.start()

    def _run(self, route: list[Endpoint]) -> None:
        try:
            sent = send(route, address="orders", bodies=self.bodies, rate=RATE, timeout=20)
            self.outcomes = [o.name for o in sent]
        except BaseException as error:  # handed to the test
            self.error = error


def drain(port: int, *, expected: int) -> list[str]:
    got: list[str] = []
    with Client("127.0.0.1", port, timeout=10) as client:
        receiver = client.receiver("orders", credit=200)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                delivery = receiver.receive(2.0 if len(got) >= expected else 20.0)
            except TimeoutError:
                break
            got.append(body_text(delivery.payload))
            receiver.accept(delivery)
    return got


def test_routers_scaled_up_and_down_under_load_lose_and_double_nothing(
    local_runtime: LocalRuntime,
) -> None:
    local_runtime.apply(plan(2), name="plan.yaml")
    local_runtime.apply(SPACE)
    local_runtime.wait_active("elastic", ["orders"], timeout=180)
    two = wait_routers(local_runtime, 2)
    first = Producer("first", two)

    local_runtime.apply(plan(3), name="plan.yaml")
    three = wait_routers(local_runtime, 3)
    (added,) = [e for e in three if e not in two]
    second = Producer("second", [added, *two])
    time.sleep(3)  # the second producer sends through the third router for a while

    local_runtime.apply(plan(2), name="plan.yaml")
    after = wait_routers(local_runtime, 2)
    assert added not in after, "the router added last is the one removed"

    for producer in (first, second):
        producer.thread.join(COUNT / RATE + 90)
        assert not producer.thread.is_alive(), "a producer did not finish"
        assert producer.error is None, f"{producer.error}\n{logs(local_runtime.var)}"
        assert producer.outcomes == ["ACCEPTED"] * COUNT
    received = drain(after[0].port, expected=2 * COUNT)
    expected = first.bodies + second.bodies
    assert set(received) == set(expected), f"lost: {sorted(set(expected) - set(received))[:5]}"
    assert sorted(received) == sorted(expected), "a message arrived twice"
