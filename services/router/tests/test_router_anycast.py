"""Anycast through a real router process with real AMQP clients: credit only with a consumer,
balancing, outcomes travelling back to the producer, release and re-route when a consumer dies,
precise refusals for unknown addresses and bad anonymous sends."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator

import pytest
from enmasse.amqp import codec
from enmasse.amqp.client import AmqpError, Client
from enmasse.amqp.engine import Condition, Delivery, Outcome
from enmasse.router.points import PRODUCER_BYTES, PRODUCER_WINDOW
from enmasse.v1 import router_pb2

from tests.fixtures.router import RouterFleet, RouterProcess
from tests.fixtures.waiting import wait_for


@pytest.fixture
def router(routers: RouterFleet) -> RouterProcess:
    r1 = routers.start("r1")
    r1.apply(routers.mesh_config(generation=1, addresses={"work": "anycast", "other": "anycast"}))
    return r1


@pytest.fixture
def client(router: RouterProcess) -> Iterator[Callable[[], Client]]:
    opened: list[Client] = []

    def open_client() -> Client:
        opened.append(Client("127.0.0.1", router.amqp_port))
        return opened[-1]

    yield open_client
    for c in opened:
        c.close()


def _body(n: int) -> bytes:
    return codec.encode_message(str(n).encode())


def _number(payload: bytes) -> int:
    return int(codec.read_body(payload))


def test_producer_waits_with_zero_credit_until_a_consumer_attaches(
    router: RouterProcess, client: Callable[[], Client]
) -> None:
    producer_side = client()
    sender = producer_side.sender("work")
    # The stats call is a round trip through the router's loop, after the attach was handled.
    assert router.address_stats("work").producers == 1  # type: ignore[union-attr]
    assert producer_side._call(lambda: sender.link.credit) == 0  # type: ignore[union-attr]
    waiting = sender.send_async(_body(1))

    receiver = client().receiver("work", credit=10)
    got = receiver.receive(10)
    receiver.accept(got)
    assert _number(got.payload) == 1
    assert waiting.result(10).outcome is Outcome.ACCEPTED
    assert producer_side._call(lambda: sender.link.credit) > 0  # type: ignore[union-attr]


def test_a_draining_consumer_gets_what_waits_then_its_credit_back(
    router: RouterProcess, client: Callable[[], Client]
) -> None:
    consumer_side = client()
    receiver = consumer_side.receiver("work", credit=0)
    sender = client().sender("work")
    waiting = [sender.send_async(_body(n)) for n in (1, 2)]
    link = receiver.link
    assert link is not None
    # A drain asks for what waits at the router now: wait until both messages are there.
    deadline = time.monotonic() + 10
    while _arrived(router, "work") < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    consumer_side.call(lambda: link.drain(10))
    got = [receiver.receive(10) for _ in range(2)]
    assert [_number(d.payload) for d in got] == [1, 2]
    deadline = time.monotonic() + 10
    while consumer_side.call(lambda: link.credit) != 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert consumer_side.call(lambda: link.credit) == 0  # the 8 left over came back
    for delivery in got:
        receiver.accept(delivery)
    assert [f.result(10).outcome for f in waiting] == [Outcome.ACCEPTED] * 2
    third = sender.send_async(_body(3))
    with pytest.raises(TimeoutError):
        receiver.receive(0.5)  # no credit left: nothing comes until asked again
    receiver.flow(1)
    last = receiver.receive(10)
    receiver.accept(last)
    assert _number(last.payload) == 3
    assert third.result(10).outcome is Outcome.ACCEPTED


def _arrived(router: RouterProcess, address: str) -> int:
    stats = router.address_stats(address)
    return stats.deliveries_in if stats is not None else 0


def test_deliveries_are_balanced_over_three_consumers(
    router: RouterProcess, client: Callable[[], Client]
) -> None:
    consumers = client()
    receivers = [consumers.receiver("work", credit=300) for _ in range(3)]
    sender = client().sender("work")
    sent = [sender.send_async(_body(n)) for n in range(300)]
    taken: dict[int, list[Delivery]] = {index: [] for index in range(3)}
    deadline = time.monotonic() + 30
    while sum(len(t) for t in taken.values()) < 300 and time.monotonic() < deadline:
        for index, receiver in enumerate(receivers):
            with contextlib.suppress(TimeoutError):
                taken[index].append(receiver.receive(0.05))
    # Settled only now: a consumer that settles sooner rightly gets more (least outstanding).
    for index, receiver in enumerate(receivers):
        for delivery in taken[index]:
            receiver.accept(delivery)
    seen = sorted(_number(d.payload) for t in taken.values() for d in t)
    assert seen == list(range(300))
    for index in range(3):
        assert 90 <= len(taken[index]) <= 110, {i: len(t) for i, t in taken.items()}
    assert all(f.result(10).outcome is Outcome.ACCEPTED for f in sent)


@pytest.mark.parametrize(
    ("outcome", "how"),
    [
        (Outcome.REJECTED, {"error": Condition("app:bad-order", "order 7 has no lines")}),
        (Outcome.RELEASED, {}),
        (Outcome.MODIFIED, {"delivery_failed": True, "undeliverable_here": True}),
    ],
)
def test_the_consumers_outcome_settles_the_producers_delivery(
    router: RouterProcess,
    client: Callable[[], Client],
    outcome: Outcome,
    how: dict[str, object],
) -> None:
    receiver = client().receiver("work", credit=5)
    sender = client().sender("work")
    pending = sender.send_async(_body(7))
    receiver.settle(receiver.receive(10), outcome, **how)
    settled = pending.result(10)
    assert settled.outcome is outcome
    if outcome is Outcome.REJECTED:
        assert settled.error == Condition("app:bad-order", "order 7 has no lines")
    if outcome is Outcome.MODIFIED:
        assert settled.delivery_failed
        assert settled.undeliverable_here
    stats = router.address_stats("work")
    assert stats is not None
    assert getattr(stats, outcome.name.lower()) == 1


def test_outcomes_reach_the_right_producer_when_settled_out_of_order(
    router: RouterProcess, client: Callable[[], Client]
) -> None:
    receiver = client().receiver("work", credit=20)
    senders = [client().sender("work") for _ in range(2)]
    futures = {
        (s, n): senders[s].send_async(_body(s * 100 + n)) for s in range(2) for n in range(5)
    }
    deliveries = [receiver.receive(10) for _ in range(10)]
    for delivery in reversed(deliveries):
        number = _number(delivery.payload)
        receiver.settle(delivery, Outcome.ACCEPTED if number % 2 else Outcome.RELEASED)
    for (s, n), future in futures.items():
        expected = Outcome.ACCEPTED if (s * 100 + n) % 2 else Outcome.RELEASED
        assert future.result(10).outcome is expected, (s, n)


_HOARDER = textwrap.dedent(
    """
    import sys, time
    from enmasse.amqp.client import Client
    client = Client("127.0.0.1", int(sys.argv[1]))
    receiver = client.receiver("work", credit=int(sys.argv[2]))
    for _ in range(int(sys.argv[2])):
        receiver.receive(20)  # taken, never settled
    print("holding", flush=True)
    time.sleep(60)
    """
)


def _hoarder(router: RouterProcess, count: int) -> subprocess.Popen[str]:
    """A consumer in its own process that takes `count` deliveries and never settles them."""
    return subprocess.Popen(
        [sys.executable, "-c", _HOARDER, str(router.amqp_port), str(count)],
        stdout=subprocess.PIPE,
        text=True,
    )


def test_killed_consumer_with_unsettled_deliveries_releases_them_to_the_producer(
    router: RouterProcess, client: Callable[[], Client]
) -> None:
    hoarder = _hoarder(router, 5)
    try:
        sender = client().sender("work")
        futures = [sender.send_async(_body(n)) for n in range(5)]
        assert hoarder.stdout is not None
        assert hoarder.stdout.readline().strip() == "holding"
        assert not any(f.done() for f in futures)
        hoarder.kill()
        hoarder.wait(10)
        assert [f.result(10).outcome for f in futures] == [Outcome.RELEASED] * 5
        # The producer sends them again; a second consumer gets every one.
        receiver = client().receiver("work", credit=10)
        again = [sender.send_async(_body(n)) for n in range(5)]
        got = []
        for _ in range(5):
            delivery = receiver.receive(10)
            got.append(_number(delivery.payload))
            receiver.accept(delivery)
        assert sorted(got) == list(range(5))
        assert [f.result(10).outcome for f in again] == [Outcome.ACCEPTED] * 5
    finally:
        if hoarder.poll() is None:
            hoarder.kill()
            hoarder.wait(10)


def test_killed_consumer_deliveries_are_rerouted_to_another_consumer(
    router: RouterProcess, client: Callable[[], Client]
) -> None:
    hoarder = _hoarder(router, 4)
    try:
        sender = client().sender("work")
        first = [sender.send_async(_body(n)) for n in range(4)]
        assert hoarder.stdout is not None
        assert hoarder.stdout.readline().strip() == "holding"
        survivor = client().receiver("work", credit=0)  # attached, no credit: gets nothing yet
        hoarder.kill()
        hoarder.wait(10)
        survivor.flow(10)
        got = []
        for _ in range(4):
            delivery = survivor.receive(10)
            got.append(_number(delivery.payload))
            survivor.accept(delivery)
        assert sorted(got) == [0, 1, 2, 3]
        assert [f.result(10).outcome for f in first] == [Outcome.ACCEPTED] * 4
    finally:
        if hoarder.poll() is None:
            hoarder.kill()
            hoarder.wait(10)


def test_attach_to_an_unknown_address_is_refused_with_not_found(
    router: RouterProcess, client: Callable[[], Client]
) -> None:
    c = client()
    with pytest.raises(AmqpError) as refused:
        c.receiver("nowhere")
    assert refused.value.condition == Condition(
        "amqp:not-found", "no address 'nowhere' in space 'test'"
    )
    with pytest.raises(AmqpError) as refused:
        c.sender("nowhere")
    assert refused.value.condition == Condition(
        "amqp:not-found", "no address 'nowhere' in space 'test'"
    )
    # The connection is still good for known addresses.
    receiver = c.receiver("work", credit=1)
    c.sender("work").send_async(_body(1))
    assert _number(receiver.receive(10).payload) == 1


def test_anonymous_relay_routes_by_to_and_rejects_what_it_cannot(
    router: RouterProcess, client: Callable[[], Client]
) -> None:
    receiver = client().receiver("work", credit=5)
    relaying = client()
    # offered in the open frame, as a brokered space's broker offers it: clients may check it
    assert relaying.call(lambda: relaying.connection.remote_offered_capabilities) == (
        "ANONYMOUS-RELAY",
    )
    anonymous = relaying.sender(None)
    routed = anonymous.send_async(codec.encode_message(b"9", to="work"))
    got = receiver.receive(10)
    receiver.accept(got)
    assert _number(got.payload) == 9
    assert routed.result(10).outcome is Outcome.ACCEPTED

    unknown = anonymous.send(codec.encode_message(b"x", to="nowhere"))
    assert unknown.outcome is Outcome.REJECTED
    assert unknown.error == Condition("amqp:not-found", "no address 'nowhere' in space 'test'")
    no_to = anonymous.send(codec.encode_message(b"x"))
    assert no_to.outcome is Outcome.REJECTED
    assert no_to.error == Condition(
        "amqp:precondition-failed", "a message on an anonymous link needs a 'to' address"
    )
    nobody = anonymous.send(codec.encode_message(b"x", to="other"))
    assert nobody.outcome is Outcome.RELEASED
    garbage = anonymous.send(b"\x00Ss\xc0\x05\x03\xa1\x10ab")  # a `to` cut short
    assert garbage.outcome is Outcome.REJECTED
    assert garbage.error is not None
    assert garbage.error.name == "amqp:decode-error"
    assert garbage.error.description == (
        "cannot read the message's 'to': value at offset 6 runs past the end of the message"
    )


def test_an_anonymous_sender_too_waits_once_its_window_waits_here(
    router: RouterProcess, client: Callable[[], Client]
) -> None:
    receiver = client().receiver("work", credit=0)  # takes 5, then stalls
    receiver.flow(5)
    anonymous = client().sender(None)
    total = PRODUCER_WINDOW + 500
    sent = [
        anonymous.send_async(codec.encode_message(str(n).encode(), to="work")) for n in range(total)
    ]
    got = [receiver.receive(10) for _ in range(5)]
    time.sleep(1.0)  # the sender's client sends on as long as the router gives credit back
    stats = router.address_stats("work")
    assert stats is not None
    assert stats.deliveries_in <= 5 + PRODUCER_WINDOW, stats
    receiver.flow(total - 5)
    rest = [receiver.receive(10) for _ in range(total - 5)]
    for delivery in [*got, *rest]:
        receiver.accept(delivery)
    assert [_number(d.payload) for d in [*got, *rest]] == list(range(total))
    assert {f.result(10).outcome for f in sent} == {Outcome.ACCEPTED}


def test_an_anonymous_senders_credit_comes_back_when_the_address_it_waited_for_is_deleted(
    routers: RouterFleet, router: RouterProcess, client: Callable[[], Client]
) -> None:
    client().receiver("work", credit=0)  # a consumer that never takes: what is sent waits
    anonymous = client().sender(None)
    waiting = [
        anonymous.send_async(codec.encode_message(str(n).encode(), to="work"))
        for n in range(PRODUCER_WINDOW)
    ]
    wait_for(
        lambda: (
            (router.address_stats("work") or router_pb2.AddressStats()).deliveries_in
            == len(waiting)
        ),
        what="the window to reach the router",
        limit=10,
    )
    router.apply(routers.mesh_config(generation=2, addresses={"other": "anycast"}))
    assert {f.result(10).outcome for f in waiting} == {Outcome.RELEASED}
    router.apply(routers.mesh_config(generation=3, addresses={"work": "anycast"}))
    receiver = client().receiver("work", credit=10)
    later = [
        anonymous.send_async(codec.encode_message(str(n).encode(), to="work")) for n in range(3)
    ]
    got = [receiver.receive(10) for _ in range(3)]
    for delivery in got:
        receiver.accept(delivery)
    assert [_number(d.payload) for d in got] == [0, 1, 2]
    assert {f.result(10).outcome for f in later} == {Outcome.ACCEPTED}


def test_with_a_max_message_size_a_producer_of_big_messages_gets_a_smaller_window(
    routers: RouterFleet, router: RouterProcess, client: Callable[[], Client]
) -> None:
    limits = router_pb2.RouterLimits(max_message_size=2 << 20)
    router.apply(routers.mesh_config(generation=2, addresses={"work": "anycast"}, limits=limits))
    receiver = client().receiver("work", credit=0)
    producer_side = client()
    producer = producer_side.sender("work")
    credit = producer_side._call(lambda: producer.link.credit)  # type: ignore[union-attr]
    assert credit == PRODUCER_BYTES // (2 << 20) == 8
    big = [codec.encode_message(bytes([n]) * (1 << 20)) for n in range(20)]
    sent = [producer.send_async(payload) for payload in big]
    time.sleep(1.0)
    stats = router.address_stats("work")
    assert stats is not None
    assert stats.deliveries_in == 8, stats  # 8 MB wait here, the other 12 at the producer
    receiver.flow(20)
    got = [receiver.receive(10) for _ in range(20)]
    for delivery in got:
        receiver.accept(delivery)
    assert [d.payload for d in got] == big
    assert {f.result(10).outcome for f in sent} == {Outcome.ACCEPTED}


def test_a_producer_of_large_messages_gets_its_window_cut_to_the_byte_budget(
    router: RouterProcess, client: Callable[[], Client]
) -> None:
    receiver = client().receiver("work", credit=0)
    producer_side = client()
    producer = producer_side.sender("work")
    assert producer_side._call(lambda: producer.link.credit) == PRODUCER_WINDOW  # type: ignore[union-attr]
    total = PRODUCER_WINDOW + 500
    payload = codec.encode_message(b"x" * (64 << 10))
    receiver.flow(total)
    sent = [producer.send_async(payload) for _ in range(total)]
    for _ in range(total):
        receiver.accept(receiver.receive(10))
    assert {f.result(10).outcome for f in sent} == {Outcome.ACCEPTED}
    # Sizes seen: 16 MB of 64 kB messages is 255 of them (each a few bytes over 64 kB).
    credit = producer_side._call(lambda: producer.link.credit)  # type: ignore[union-attr]
    assert 0 <= credit <= PRODUCER_BYTES // len(payload) == 255
