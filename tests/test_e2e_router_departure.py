"""A router leaving its space on SIGTERM (departure.py), with real routers and a real broker.

Two meshed routers (r1, r2) of one space route queue `orders` on one broker. r1 is sent
SIGTERM while clients use it. What a user must see: each client connection closed with
`amqp:connection:redirect` naming r2's client endpoint; a producer going on through r2 loses
nothing and, since the close lands between two deliveries, sends nothing twice; a consumer
that holds a delivery unsettled past the deadline is closed anyway and the message goes back
to the queue; a router with no peer closes with `amqp:connection:forced`. Bounded loops only.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable

from enmasse.amqp import codec
from enmasse.amqp.client import Client
from enmasse.amqp.engine import Condition
from enmasse.cli.messaging import Endpoint, body_text, send
from enmasse.v1 import router_pb2

from tests.fixtures.broker import BrokerProcess
from tests.fixtures.router import RouterFleet, RouterProcess

COUNT = 300
RATE = 200.0


def _space(
    routers: RouterFleet, broker: BrokerProcess, *, ids: tuple[str, ...], leave_timeout: float = 5
) -> list[RouterProcess]:
    broker.ensure_queue("orders")
    started = [routers.start(r, extra_args=("--leave-timeout", str(leave_timeout))) for r in ids]
    routers.apply_all(
        routers.mesh_config(
            generation=1,
            addresses={"orders": "queue"},
            waypoints={
                "orders": [
                    router_pb2.BrokerWaypoint(
                        name="b1", host="127.0.0.1", port=broker.amqp_port, state="Active"
                    )
                ]
            },
        )
    )
    if len(started) > 1:
        routers.wait_for_mesh()
    return started


def _wait(condition: Callable[[], bool], *, what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def _leave_in_background(router: RouterProcess) -> threading.Thread:
    leaving = threading.Thread(target=router.leave, daemon=True)
    leaving.start()
    return leaving


def _drain(port: int, *, at_least: int) -> list[str]:
    got: list[str] = []
    with Client("127.0.0.1", port, timeout=10) as client:
        receiver = client.receiver("orders", credit=100)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                delivery = receiver.receive(1.0 if len(got) >= at_least else 10.0)
            except TimeoutError:
                break
            got.append(body_text(delivery.payload))
            receiver.accept(delivery)
    return got


def test_a_leaving_router_redirects_its_clients_to_a_peer(
    routers: RouterFleet, broker: BrokerProcess
) -> None:
    r1, r2 = _space(routers, broker, ids=("r1", "r2"))
    with Client("127.0.0.1", r1.amqp_port, timeout=10) as consumer:
        consumer.receiver("orders", credit=10)
        r1.leave()
        condition = consumer.closed_with.result(10)
    assert condition == Condition(
        "amqp:connection:redirect",
        f"router r1 is leaving the space: go on at 127.0.0.1:{r2.amqp_port}",
        (("network-host", "127.0.0.1"), ("port", r2.amqp_port)),
    )
    assert r1.process.returncode == 0, "it left, it did not crash"


def test_a_router_with_no_peer_says_it_is_leaving(
    routers: RouterFleet, broker: BrokerProcess
) -> None:
    (r1,) = _space(routers, broker, ids=("r1",))
    with Client("127.0.0.1", r1.amqp_port, timeout=10) as client:
        r1.leave()
        condition = client.closed_with.result(10)
    assert condition == Condition("amqp:connection:forced", "router r1 is leaving the space")


def test_a_producer_moved_between_deliveries_sends_nothing_twice(
    routers: RouterFleet, broker: BrokerProcess
) -> None:
    r1, r2 = _space(routers, broker, ids=("r1", "r2"))
    bodies = [f"order-{n}" for n in range(COUNT)]
    outcomes: list[object] = []
    sending = threading.Thread(
        target=lambda: outcomes.extend(
            send(
                [Endpoint("127.0.0.1", r1.amqp_port), Endpoint("127.0.0.1", r2.amqp_port)],
                address="orders",
                bodies=bodies,
                rate=RATE,
                timeout=10,
            )
        ),
        daemon=True,
    )
    sending.start()
    _wait(lambda: broker.addresses()["orders"].depth >= COUNT // 3, what="a third sent")
    leaving = _leave_in_background(r1)
    sending.join(60)
    leaving.join(30)
    assert not sending.is_alive()
    assert not r1.alive
    assert [o.name for o in outcomes] == ["ACCEPTED"] * COUNT  # type: ignore[attr-defined]
    received = _drain(r2.amqp_port, at_least=COUNT)
    assert sorted(received) == sorted(bodies), "every order exactly once"


def test_a_consumer_busy_past_the_deadline_is_closed_and_its_message_goes_back(
    routers: RouterFleet, broker: BrokerProcess
) -> None:
    r1, r2 = _space(routers, broker, ids=("r1", "r2"), leave_timeout=1)
    with Client("127.0.0.1", r2.amqp_port, timeout=10) as producer:
        producer.sender("orders").send(codec.encode_message("held"))
    with Client("127.0.0.1", r1.amqp_port, timeout=10) as consumer:
        held = consumer.receiver("orders", credit=1).receive(10)  # and never settled
        assert body_text(held.payload) == "held"
        r1.leave()
        condition = consumer.closed_with.result(10)
    assert condition is not None
    assert condition.name == "amqp:connection:redirect"
    assert _drain(r2.amqp_port, at_least=1) == ["held"], "released back to the queue, not lost"


def test_a_second_sigterm_changes_nothing(routers: RouterFleet, broker: BrokerProcess) -> None:
    r1, _r2 = _space(routers, broker, ids=("r1", "r2"), leave_timeout=2)
    with Client("127.0.0.1", r1.amqp_port, timeout=10) as consumer:
        consumer.receiver("orders", credit=1)
        r1.process.send_signal(signal.SIGTERM)
        r1.process.send_signal(signal.SIGTERM)
        condition = consumer.closed_with.result(10)
    assert r1.process.wait(10) == 0
    assert condition is not None
    assert condition.name == "amqp:connection:redirect"
    assert r1.log_path.read_text().count('"event": "router leaving"') == 1
