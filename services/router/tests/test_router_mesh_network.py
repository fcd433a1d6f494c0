"""The router mesh with real router processes: anycast and outcomes across routers,
request-response over two routers, multicast to consumers on two routers, and a router killed
with SIGKILL under load while failover clients carry on."""

from __future__ import annotations

import contextlib
import threading
import time
from concurrent.futures import Future

import pytest
from enmasse.amqp import codec
from enmasse.amqp.client import AmqpError, Client, Receiver
from enmasse.amqp.engine import Condition, Delivery, Outcome, Terminus
from enmasse.router.points import PRODUCER_WINDOW, TRANSIT_WINDOW
from enmasse.v1 import router_pb2

from tests.fixtures.router import RouterFleet, RouterProcess
from tests.fixtures.waiting import wait_for

ADDRESSES = {"work": "anycast", "rpc": "anycast", "news": "multicast"}


@pytest.fixture
def pair(routers: RouterFleet) -> tuple[RouterProcess, RouterProcess]:
    r1, r2 = routers.start("r1"), routers.start("r2")
    routers.apply_all(routers.mesh_config(generation=1, addresses=ADDRESSES))
    routers.wait_for_mesh()
    return r1, r2


def _connect(router: RouterProcess, opened: list[Client]) -> Client:
    opened.append(Client("127.0.0.1", router.amqp_port))
    return opened[-1]


def _wait_remote(router: RouterProcess, address: str, count: int) -> None:
    """Until `router` sees consumers for `address` on `count` other routers."""
    deadline = time.monotonic() + 10
    while True:
        stats = router.address_stats(address)
        if stats is not None and stats.remote_routers == count:
            return
        assert time.monotonic() < deadline, f"{address}: {stats}"
        time.sleep(0.02)


def _unsettled(router: RouterProcess, address: str) -> int:
    """Deliveries `router` sent on `address` that its peers have not settled yet."""
    links = router.admin().ListLinks(router_pb2.ListLinksRequest(), timeout=10).links
    return sum(link.unsettled for link in links if link.address == address)


def _send_to_a_stalled_consumer(
    near: RouterProcess, far: RouterProcess, clients: list[Client], *, total: int
) -> tuple[Receiver, list[Future[Delivery]], list[Delivery]]:
    """A consumer on `far` takes 5 messages and stalls; a producer on `near` sends `total`.
    Returns once the producer's client has had a second to send on as far as credit allows."""
    consumer = _connect(far, clients).receiver("work", credit=0)
    consumer.flow(5)
    _wait_remote(near, "work", 1)
    producer = _connect(near, clients).sender("work")
    sent = [producer.send_async(codec.encode_message(str(n).encode())) for n in range(total)]
    got = [consumer.receive(10) for _ in range(5)]
    time.sleep(1.0)  # the producer's client keeps sending as long as the routers give credit
    return consumer, sent, got


def _release_the_stalled_consumer(
    consumer: Receiver, sent: list[Future[Delivery]], got: list[Delivery]
) -> None:
    """The consumer takes the rest: every message arrives, in order, and every one was accepted."""
    total = len(sent)
    consumer.flow(total - len(got))
    rest = [consumer.receive(10) for _ in range(total - len(got))]
    for delivery in [*got, *rest]:
        consumer.accept(delivery)
    assert [int(codec.read_body(d.payload)) for d in [*got, *rest]] == list(range(total))
    assert {f.result(10).outcome for f in sent} == {Outcome.ACCEPTED}


def test_anycast_and_its_outcome_cross_routers(
    pair: tuple[RouterProcess, RouterProcess], clients: list[Client]
) -> None:
    r1, r2 = pair
    producer = _connect(r1, clients).sender("work")
    assert r1.address_stats("work").producers == 1  # type: ignore[union-attr]
    assert clients[0]._call(lambda: producer.link.credit) == 0  # type: ignore[union-attr]
    consumer = _connect(r2, clients).receiver("work", credit=10)
    first = producer.send_async(codec.encode_message(b"1"))
    second = producer.send_async(codec.encode_message(b"2"))
    consumer.accept(consumer.receive(10))
    consumer.settle(
        consumer.receive(10), Outcome.REJECTED, error=Condition("app:no", "not this one")
    )
    assert first.result(10).outcome is Outcome.ACCEPTED
    rejected = second.result(10)
    assert rejected.outcome is Outcome.REJECTED
    assert rejected.error == Condition("app:no", "not this one")


def test_anycast_balances_over_consumers_not_routers(
    pair: tuple[RouterProcess, RouterProcess], clients: list[Client]
) -> None:
    r1, r2 = pair
    receivers = [_connect(r1, clients).receiver("work", credit=300)]
    far = _connect(r2, clients)
    receivers += [far.receiver("work", credit=300) for _ in range(2)]
    deadline = time.monotonic() + 10
    while (r1.address_stats("work") or router_pb2.AddressStats()).remote_consumers != 2:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    sender = _connect(r1, clients).sender("work")
    sent = [sender.send_async(codec.encode_message(str(n).encode())) for n in range(300)]
    taken: list[list[Delivery]] = [[], [], []]
    deadline = time.monotonic() + 30
    while sum(len(t) for t in taken) < 300 and time.monotonic() < deadline:
        for index, receiver in enumerate(receivers):
            with contextlib.suppress(TimeoutError):
                taken[index].append(receiver.receive(0.05))
    for receiver, deliveries in zip(receivers, taken, strict=True):
        for delivery in deliveries:
            receiver.accept(delivery)
    got = sorted(int(codec.read_body(d.payload)) for t in taken for d in t)
    assert got == list(range(300))
    assert all(90 <= len(t) <= 110 for t in taken), [len(t) for t in taken]
    assert all(f.result(10).outcome is Outcome.ACCEPTED for f in sent)


def test_request_response_over_two_routers(
    pair: tuple[RouterProcess, RouterProcess], clients: list[Client]
) -> None:
    r1, r2 = pair
    server = _connect(r1, clients)
    requests = server.receiver("rpc", credit=10)
    replies_out = server.sender(None)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                request = requests.receive(0.2)
            except (TimeoutError, AmqpError):
                continue
            body = codec.read_body(request.payload)
            reply = codec.encode_message(body.upper(), to=request.reply_to)
            replies_out.send_async(reply)
            requests.accept(request)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        client = _connect(r2, clients)
        replies = client.receiver(None, source=Terminus(dynamic=True), credit=10)
        assert replies.address is not None
        assert replies.address.startswith("_dynamic/r2/")
        _wait_remote(r2, "rpc", 1)
        ask = client.sender("rpc")
        for word in (b"one", b"two", b"three"):
            sent = ask.send(codec.encode_message(word, reply_to=replies.address))
            assert sent.outcome is Outcome.ACCEPTED
            answer = replies.receive(10)
            replies.accept(answer)
            assert codec.read_body(answer.payload) == word.upper()
    finally:
        stop.set()
        thread.join(5)


def test_multicast_reaches_five_consumers_on_two_routers(
    pair: tuple[RouterProcess, RouterProcess], clients: list[Client]
) -> None:
    r1, r2 = pair
    near, far = _connect(r1, clients), _connect(r2, clients)
    receivers = [near.receiver("news", credit=100) for _ in range(3)]
    receivers += [far.receiver("news", credit=100) for _ in range(2)]
    _wait_remote(r1, "news", 1)
    sender = _connect(r1, clients).sender("news")
    for n in range(50):
        assert sender.send(codec.encode_message(str(n).encode())).outcome is Outcome.ACCEPTED
    for receiver in receivers:
        got = [int(codec.read_body(receiver.receive(10).payload)) for _ in range(50)]
        assert got == list(range(50))
    stats = r1.address_stats("news")
    assert stats is not None
    assert stats.deliveries_in == 50
    assert stats.dropped == 0


class _FailoverConsumer:
    """Receives from `address` on the first router that answers; on loss, on the next one."""

    def __init__(self, ports: list[int], address: str) -> None:
        self.ports = ports
        self.address = address
        self.received: set[int] = set()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        turn = 0
        deadline = time.monotonic() + 90
        while not self.stop.is_set() and time.monotonic() < deadline:
            port = self.ports[turn % len(self.ports)]
            turn += 1
            try:
                with Client("127.0.0.1", port, timeout=5) as client:
                    receiver = client.receiver(self.address, credit=50)
                    while not self.stop.is_set():
                        try:
                            delivery = receiver.receive(0.2)
                        except TimeoutError:
                            continue
                        self.received.add(int(codec.read_body(delivery.payload)))
                        receiver.accept(delivery)
            except (AmqpError, OSError, TimeoutError, ConnectionError):
                time.sleep(0.1)


@pytest.mark.soak
def test_kill_one_of_three_routers_under_load(routers: RouterFleet) -> None:
    r1, r2, r3 = routers.start("r1"), routers.start("r2"), routers.start("r3")
    routers.apply_all(routers.mesh_config(generation=1, addresses=ADDRESSES))
    routers.wait_for_mesh()
    consumers = [
        _FailoverConsumer([r2.amqp_port, r3.amqp_port], "work"),
        _FailoverConsumer([r3.amqp_port, r2.amqp_port], "work"),
    ]
    accepted: set[int] = set()
    total = 3000
    next_number = 0
    killed_at = None
    ports = [r1.amqp_port, r2.amqp_port]
    turn = 0
    deadline = time.monotonic() + 90
    try:
        while len(accepted) < total and time.monotonic() < deadline:
            port = ports[min(turn, len(ports) - 1)]
            turn += 1
            try:
                with Client("127.0.0.1", port, timeout=5) as client:
                    sender = client.sender("work")
                    while len(accepted) < total:
                        batch = [n for n in range(next_number, min(next_number + 100, total))]
                        batch += [n for n in range(next_number) if n not in accepted][:100]
                        futures = {
                            n: sender.send_async(codec.encode_message(str(n).encode()))
                            for n in batch
                        }
                        next_number = max(next_number, max(batch) + 1)
                        for n, future in futures.items():
                            if future.result(15).outcome is Outcome.ACCEPTED:
                                accepted.add(n)
                        if killed_at is None and len(accepted) >= total // 3:
                            killed_at = len(accepted)
                            r1.kill()
            except (AmqpError, OSError, TimeoutError, ConnectionError):
                time.sleep(0.1)
        assert killed_at is not None
        assert len(accepted) == total  # traffic resumed after the kill, through r2
        deadline = time.monotonic() + 20
        while not accepted <= (consumers[0].received | consumers[1].received):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert sorted(r2.stats().reachable_routers) == ["r3"]
        assert sorted(r3.stats().reachable_routers) == ["r2"]
        # Back on its old ports, the restarted router rejoins and carries traffic again.
        r1 = routers.restart("r1")
        r1.apply(routers.mesh_config(generation=1, addresses=ADDRESSES))
        routers.wait_for_mesh()
        with Client("127.0.0.1", r1.amqp_port) as client:
            assert client.sender("work").send(codec.encode_message(b"-1")).outcome is (
                Outcome.ACCEPTED
            )
        deadline = time.monotonic() + 20
        while -1 not in consumers[0].received | consumers[1].received:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        for consumer in consumers:
            consumer.stop.set()
        for consumer in consumers:
            consumer.thread.join(10)


def test_a_slow_multicast_consumer_does_not_stall_the_others(
    pair: tuple[RouterProcess, RouterProcess], clients: list[Client]
) -> None:
    r1, _ = pair
    consumers = _connect(r1, clients)
    total = 1200  # the router holds at most 1,000 copies for one consumer
    stalled = consumers.receiver("news", credit=0)  # never grants credit
    # Credit for every message: no copy ever waits at the router for this one, so however slowly
    # this test reads (a busy CI machine), it cannot fall 1,000 behind and have copies dropped.
    lively = consumers.receiver("news", credit=total)
    sender = _connect(r1, clients).sender("news", settled=True)
    for n in range(total):
        sender.send_async(codec.encode_message(str(n).encode()))
    got = [int(codec.read_body(lively.receive(10).payload)) for _ in range(total)]
    assert got == list(range(total))
    stats = r1.address_stats("news")
    assert stats is not None
    assert stats.dropped == total - 1000
    stalled.flow(2000)
    first = int(codec.read_body(stalled.receive(10).payload))
    assert first == total - 1000  # the oldest copies were the ones dropped


def test_a_stalled_consumer_behind_another_router_holds_back_the_producer(
    pair: tuple[RouterProcess, RouterProcess], clients: list[Client]
) -> None:
    """What waits for a consumer is bounded by credit all the way back: the far router gives
    the near one no more credit while deliveries wait for its consumer, so the near router
    stops topping up the producer, and the producer waits (nothing piles up, nothing is lost)."""
    r1, r2 = pair
    total = PRODUCER_WINDOW + 2 * TRANSIT_WINDOW + 1000  # more than all the windows on the way
    consumer, sent, got = _send_to_a_stalled_consumer(r1, r2, clients, total=total)
    near, far = r1.address_stats("work"), r2.address_stats("work")
    assert near is not None
    assert far is not None
    assert far.deliveries_in <= 5 + TRANSIT_WINDOW, far
    assert near.deliveries_in <= 5 + TRANSIT_WINDOW + PRODUCER_WINDOW, near
    _release_the_stalled_consumer(consumer, sent, got)


def test_a_router_in_the_middle_passes_the_holding_back_on(
    routers: RouterFleet, clients: list[Client]
) -> None:
    """r1 - r2 - r3 in a line: r2 passes r1's deliveries on towards r3 and gives r1 credit back
    only while its link towards r3 has some, so a stalled consumer on r3 piles up nothing on r2."""
    r1, r2, r3 = (routers.start(name) for name in ("r1", "r2", "r3"))
    full = routers.mesh_config(generation=1, addresses=ADDRESSES)
    neighbours = {"r1": {"r2"}, "r2": {"r1", "r3"}, "r3": {"r2"}}
    for router in (r1, r2, r3):
        config = router_pb2.RouterConfig()
        config.CopyFrom(full)
        del config.peers[:]
        config.peers.extend(p for p in full.peers if p.router_id in neighbours[router.router_id])
        router.apply(config)
    routers.wait_for_mesh()
    total = PRODUCER_WINDOW + 4 * TRANSIT_WINDOW + 1000  # more than all the windows on the way
    consumer, sent, got = _send_to_a_stalled_consumer(r1, r3, clients, total=total)
    middle = r2.address_stats("work")
    assert middle is not None
    # r3 holds at most its window; r2 its own, plus what it passed on before the link towards
    # r3 had any credit (it is opened with the first delivery). Nothing like all of them.
    assert middle.deliveries_in <= 5 + 3 * TRANSIT_WINDOW, middle
    _release_the_stalled_consumer(consumer, sent, got)


@pytest.mark.parametrize("between", ["deleted", "made multicast", "deleted while 6,000 wait"])
def test_an_address_defined_again_carries_messages_across_routers_again(
    routers: RouterFleet,
    pair: tuple[RouterProcess, RouterProcess],
    clients: list[Client],
    between: str,
) -> None:
    """A neighbour's link for the address outlives the address; what arrives on it after the
    address is defined again goes to the new address, not the retired one, and credit the
    retired one held back (6,000 waiting exhaust the link's window) is given back."""
    r1, r2 = pair
    if between == "deleted while 6,000 wait":
        _, sent, _ = _send_to_a_stalled_consumer(r1, r2, clients, total=6000)
    else:
        consumer = _connect(r2, clients).receiver("work", credit=10)
        _wait_remote(r1, "work", 1)
        producer = _connect(r1, clients).sender("work")
        sent = [producer.send_async(codec.encode_message(b"before"))]
        consumer.accept(consumer.receive(10))
    changed = dict(ADDRESSES)
    if between == "made multicast":
        changed["work"] = "multicast"
    else:
        del changed["work"]
    routers.apply_all(routers.mesh_config(generation=2, addresses=changed))
    for before in sent:
        before.exception(10)  # each one ends: accepted, or failed with the producer's link
    wait_for(  # what waited on r2 went back to r1
        lambda: _unsettled(r1, "_mesh/to/r2/work") == 0,
        what="r1's deliveries to r2 settled",
        limit=10,
    )
    routers.apply_all(routers.mesh_config(generation=3, addresses=ADDRESSES))
    consumer = _connect(r2, clients).receiver("work", credit=10)
    _wait_remote(r1, "work", 1)
    producer = _connect(r1, clients).sender("work")
    after = [producer.send_async(codec.encode_message(f"after {n}".encode())) for n in range(3)]
    got = [consumer.receive(10) for _ in range(3)]
    for delivery in got:
        consumer.accept(delivery)
    assert [codec.read_body(d.payload) for d in got] == [b"after 0", b"after 1", b"after 2"]
    assert [f.result(10).outcome for f in after] == [Outcome.ACCEPTED] * 3
