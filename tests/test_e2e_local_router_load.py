"""End to end on the local runtime: a space's routers follow its load (router-agent elasticity.py).

`enmasse up` (the session's `local_runtime`), a space whose plan runs 1 to 2 routers and says one
router carries 2 client connections. Four clients connect to its router: after the agent has
seen the load above for its scale-up time (15 s), the space runs, and lists, a second router;
the clients keep working throughout. (Scaling down waits 2 minutes of calm by default: the pure
rule is tested in services/router-agent/tests/test_router_agent_elasticity.py.)
"""

from __future__ import annotations

import contextlib

import pytest
from enmasse.amqp import codec
from enmasse.amqp.client import Client
from enmasse.amqp.engine import Outcome
from enmasse.resources.contracts import AMQP

from tests.fixtures.local_runtime import LocalRuntime, logs, wait_until

pytestmark = pytest.mark.slow

PLAN = """
apiVersion: enmasse.io/v1
kind: AddressSpacePlan
metadata: {name: e2e-by-load}
spec:
  addressSpaceType: standard
  addressPlans: [standard-anycast]
  quotas: {maxAddresses: 10, maxConnections: 100, minRouters: 1, maxRouters: 2,
           connectionsPerRouter: 2}
  allowAnonymous: true
---
apiVersion: enmasse.io/v1
kind: AddressSpace
metadata: {name: busy}
spec: {type: standard, plan: e2e-by-load}
---
apiVersion: enmasse.io/v1
kind: Address
metadata: {name: jobs, space: busy}
spec: {address: jobs, type: anycast, plan: standard-anycast}
"""


def routers(runtime: LocalRuntime) -> list[int]:
    return [
        e.port for e in runtime.address_space("busy").status.endpoints if e.name == AMQP and e.port
    ]


def test_a_space_s_load_starts_a_second_router(local_runtime: LocalRuntime) -> None:
    local_runtime.apply(PLAN)
    local_runtime.wait_active("busy", ["jobs"], timeout=180)
    (port,) = routers(local_runtime)
    with contextlib.ExitStack() as stack:
        clients = [stack.enter_context(Client("127.0.0.1", port, timeout=10)) for _ in range(4)]
        assert wait_until(lambda: len(routers(local_runtime)) == 2, timeout=120), (
            f"still {routers(local_runtime)}\n{logs(local_runtime.var)}"
        )
        consumer = clients[0].receiver("jobs", credit=1)
        sent = clients[1].sender("jobs").send_async(codec.encode_message("still served"))
        delivery = consumer.receive(10)
        assert codec.read_body(delivery.payload) == "still served"
        consumer.accept(delivery)
        assert sent.result(10).outcome is Outcome.ACCEPTED
    log = (local_runtime.var / "log" / "router-agent.log").read_text()
    assert "plan e2e-by-load, by load: load above 15 s (" in log
