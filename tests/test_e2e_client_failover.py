"""`enmasse send` / `receive` going on through the next router when theirs is SIGKILLed.

Real processes: two meshed routers (r1, r2) of one space and a broker holding the queue
`orders`. The verbs (cli/messaging.py over cli/failover.py) get both routers' endpoints, r1
first, the way a space's status lists them; r1 is SIGKILLed while they run. What a user must see:
every message the producer had accepted is received (queue) or was received (anycast, where the
ack is the consumer's), nothing is lost, the verb reports no error; duplicates are allowed (at
least once across a failover) and counted. A peer's refusal is not a loss: it is reported as it
is, through no other router. Every loop is bounded by a count and a deadline.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future

import pytest
from enmasse.amqp import codec
from enmasse.amqp.client import Client
from enmasse.amqp.engine import Outcome
from enmasse.cli.client import CliError
from enmasse.cli.messaging import Endpoint, body_text, parse_urls, receive, send
from enmasse.v1 import router_pb2

from tests.fixtures.broker import BrokerProcess
from tests.fixtures.router import RouterFleet, RouterProcess

COUNT = 300
RATE = 200.0  # messages/s: 1.5 s of sending, r1 killed about a third of the way in


def _waypoint(broker: BrokerProcess) -> router_pb2.BrokerWaypoint:
    return router_pb2.BrokerWaypoint(
        name="b1", host="127.0.0.1", port=broker.amqp_port, state="Active"
    )


@pytest.fixture
def space(routers: RouterFleet, broker: BrokerProcess) -> tuple[RouterProcess, RouterProcess]:
    """r1 and r2, meshed, routing queue `orders` (on the broker) and anycast `jobs`."""
    broker.ensure_queue("orders")
    r1, r2 = routers.start("r1"), routers.start("r2")
    routers.apply_all(
        routers.mesh_config(
            generation=1,
            addresses={"orders": "queue", "jobs": "anycast"},
            waypoints={"orders": [_waypoint(broker)]},
        )
    )
    routers.wait_for_mesh()
    return r1, r2


def _endpoints(*routers: RouterProcess) -> list[Endpoint]:
    return [Endpoint("127.0.0.1", r.amqp_port) for r in routers]


def _in_thread(work: Callable[[], object]) -> Future[object]:
    done: Future[object] = Future()

    def run() -> None:
        try:
            done.set_result(work())
        except BaseException as error:  # handed to the test, which re-raises it
            done.set_exception(error)

    threading.Thread(target=run, daemon=True).start()
    return done


def _wait(condition: Callable[[], bool], *, what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def _stats(router: RouterProcess, address: str) -> router_pb2.AddressStats:
    return router.address_stats(address) or router_pb2.AddressStats()


def _depth(broker: BrokerProcess) -> int:
    return broker.addresses()["orders"].depth


def _drain(port: int, address: str, *, at_least: int) -> list[str]:
    """Everything the queue holds (at least `at_least` messages), accepted."""
    got: list[str] = []
    with Client("127.0.0.1", port, timeout=10) as client:
        receiver = client.receiver(address, credit=100)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                delivery = receiver.receive(1.0 if len(got) >= at_least else 10.0)
            except TimeoutError:
                break
            got.append(body_text(delivery.payload))
            receiver.accept(delivery)
    return got


def test_send_goes_on_through_the_next_router_and_the_queue_loses_nothing(
    space: tuple[RouterProcess, RouterProcess], broker: BrokerProcess
) -> None:
    r1, r2 = space
    bodies = [f"order-{n}" for n in range(COUNT)]
    sending = _in_thread(
        lambda: send(_endpoints(r1, r2), address="orders", bodies=bodies, rate=RATE, timeout=10)
    )
    _wait(lambda: _depth(broker) >= COUNT // 3, what="a third of the orders on the broker")
    r1.kill()
    outcomes = sending.result(60)
    assert [o.name for o in outcomes] == ["ACCEPTED"] * COUNT
    assert _stats(r2, "orders").deliveries_in > 0, "the rest went through r2"
    received = _drain(r2.amqp_port, "orders", at_least=COUNT)
    assert set(received) == set(bodies), f"lost: {sorted(set(bodies) - set(received))[:5]}"
    duplicates = len(received) - len(set(received))
    assert duplicates <= 1, f"{duplicates} sent twice; only the one in flight may be"


def test_anycast_send_goes_on_and_every_accepted_message_was_received(
    space: tuple[RouterProcess, RouterProcess],
) -> None:
    r1, r2 = space
    bodies = [f"job-{n}" for n in range(COUNT)]
    got: list[str] = []
    with Client("127.0.0.1", r2.amqp_port, timeout=10) as consumer:
        receiver = consumer.receiver("jobs", credit=50)
        _wait(
            lambda: _stats(r1, "jobs").remote_routers > 0,
            what="r1 to see the consumer on r2",
        )
        sending = _in_thread(
            lambda: send(_endpoints(r1, r2), address="jobs", bodies=bodies, rate=RATE, timeout=10)
        )
        deadline = time.monotonic() + 60
        while not sending.done() or len(got) < COUNT:
            assert time.monotonic() < deadline, f"{len(got)} of {COUNT} received"
            if len(got) == COUNT // 3 and r1.alive:
                r1.kill()
            try:
                delivery = receiver.receive(0.5)
            except TimeoutError:
                if sending.done():
                    break
                continue
            got.append(body_text(delivery.payload))
            receiver.accept(delivery)
        assert not r1.alive, "r1 was to be killed a third of the way in"
        outcomes = sending.result(1)
    assert [o.name for o in outcomes] == ["ACCEPTED"] * COUNT
    assert _stats(r2, "jobs").deliveries_in > 0, "the rest was sent through r2"
    assert set(got) == set(bodies), f"not received: {sorted(set(bodies) - set(got))[:5]}"


def test_receive_takes_the_rest_through_the_next_router(
    space: tuple[RouterProcess, RouterProcess], broker: BrokerProcess
) -> None:
    r1, r2 = space
    count = 10 * COUNT  # taken faster than sent: enough that the kill lands in the middle
    bodies = [f"order-{n}" for n in range(count)]
    with Client("127.0.0.1", r1.amqp_port, timeout=10) as producer:
        sender = producer.sender("orders")
        sent = [sender.send_async(codec.encode_message(body)) for body in bodies]
        assert {f.result(30).outcome for f in sent} == {Outcome.ACCEPTED}
    receiving = _in_thread(
        lambda: receive(_endpoints(r1, r2), address="orders", count=count, timeout=60)
    )
    _wait(lambda: _depth(broker) <= count * 2 // 3, what="a third of the orders taken")
    r1.kill()
    payloads = receiving.result(90)
    assert _stats(r2, "orders").deliveries_out > 0, "the rest came through r2"
    received = [body_text(p) for p in payloads]  # type: ignore[union-attr]
    leftover = _drain(r2.amqp_port, "orders", at_least=0)
    assert set(received) | set(leftover) == set(bodies), "a message was lost"
    assert len(received) == count, "the verb asked for `count` and stops there"


def test_a_refusal_is_reported_as_it_is_and_not_failed_over(
    space: tuple[RouterProcess, RouterProcess],
) -> None:
    r1, r2 = space
    r2.kill()  # were the refusal taken for a loss, the verb would go on to r2 and say so
    with pytest.raises(CliError) as refused:
        send(_endpoints(r1, r2), address="nowhere", bodies=["x"], timeout=5)
    assert str(refused.value) == (
        "'nowhere': attach refused: amqp:not-found: no address 'nowhere' in space 'test'"
    )


@pytest.fixture
def closed_ports() -> list[int]:
    """Two loopback ports nothing listens on (bound, then released)."""
    sockets = [socket.socket() for _ in range(2)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def test_no_endpoint_answering_names_the_last_one_tried(closed_ports: list[int]) -> None:
    started = time.monotonic()
    endpoints = [Endpoint("127.0.0.1", p) for p in closed_ports]
    with pytest.raises(CliError) as none:
        send(endpoints, address="orders", bodies=["x"], timeout=2)
    assert str(none.value).startswith(f"cannot connect to 127.0.0.1:{closed_ports[1]}: ")
    assert time.monotonic() - started < 30, "bounded by the verb's timeout"


def test_url_takes_a_failover_list() -> None:
    assert parse_urls("amqp://127.0.0.1:5672, 127.0.0.1:5673") == [
        Endpoint("127.0.0.1", 5672),
        Endpoint("127.0.0.1", 5673),
    ]
    with pytest.raises(CliError, match="expected amqp://HOST:PORT"):
        parse_urls("127.0.0.1:5672,nowhere")
