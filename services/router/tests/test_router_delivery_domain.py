"""Balancing, multicast copy queues, addresses: the pure delivery logic."""

from __future__ import annotations

from collections import Counter

import pytest
from enmasse.resources.contracts import ReplyAddresses, dynamic_owner
from enmasse.router.addressing import UnknownAddress, resolve
from enmasse.router.balancing import Balancer
from enmasse.router.config import AddressRoute, Distribution, RouterConfig
from enmasse.router.fanout import CopyQueue


def test_idle_consumers_share_round_robin() -> None:
    balancer: Balancer[str] = Balancer()
    for name in ("c1", "c2", "c3"):
        balancer.add(name)
    got = Counter()
    for _ in range(300):
        chosen = balancer.choose(lambda _t: True)
        assert chosen is not None
        got[chosen] += 1
        balancer.sent(chosen)
        balancer.settled(chosen)
    assert got == {"c1": 100, "c2": 100, "c3": 100}


def test_least_outstanding_goes_first_and_no_credit_is_skipped() -> None:
    balancer: Balancer[str] = Balancer()
    for name in ("slow", "fast", "stuck"):
        balancer.add(name)
    for _ in range(3):
        balancer.sent("slow")  # never settles
    picks = []
    for _ in range(4):
        chosen = balancer.choose(lambda t: t != "stuck")
        assert chosen is not None
        picks.append(chosen)
        balancer.sent(chosen)
        if chosen == "fast":
            balancer.settled(chosen)
    assert picks == ["fast"] * 4
    assert balancer.outstanding("slow") == 3
    assert balancer.choose(lambda _t: False) is None


def test_a_weighted_target_counts_as_that_many_consumers() -> None:
    # One local consumer, and the link towards a router with three: deliveries go 1:3.
    balancer: Balancer[str] = Balancer()
    balancer.add("local")
    balancer.add("router-b", weight=3)
    idle = Counter(_pick(balancer, settle=True) for _ in range(400))
    assert idle == {"local": 100, "router-b": 300}
    busy = Counter(_pick(balancer, settle=False) for _ in range(400))
    assert busy == {"local": 100, "router-b": 300}
    balancer.add("router-b", weight=1)  # two of its consumers left
    assert balancer.outstanding("router-b") == 300
    assert len(balancer) == 2


def _pick(balancer: Balancer[str], *, settle: bool) -> str:
    chosen = balancer.choose(lambda _t: True)
    assert chosen is not None
    balancer.sent(chosen)
    if settle:
        balancer.settled(chosen)
    return chosen


def test_removing_a_target_keeps_rotation_sane() -> None:
    balancer: Balancer[str] = Balancer()
    for name in ("a", "b", "c"):
        balancer.add(name)
    assert balancer.choose(lambda _t: True) == "a"
    assert balancer.choose(lambda _t: True) == "b"
    balancer.remove("a")
    assert balancer.choose(lambda _t: True) == "c"
    balancer.remove("c")
    assert balancer.choose(lambda _t: True) == "b"
    balancer.remove("b")
    assert balancer.choose(lambda _t: True) is None
    assert len(balancer) == 0


def test_copy_queue_holds_then_drops_the_oldest_and_counts() -> None:
    queue: CopyQueue[bytes] = CopyQueue(limit=3)
    assert queue.offer(b"1", credit=1) == [b"1"]
    for n in range(2, 7):
        assert queue.offer(str(n).encode(), credit=0) == []
    assert queue.dropped == 2
    assert queue.take(credit=2) == [b"4", b"5"]
    assert queue.offer(b"7", credit=5) == [b"6", b"7"]
    assert len(queue) == 0


def test_copy_queue_holds_at_most_its_bytes_but_always_the_newest_copy() -> None:
    queue: CopyQueue[bytes] = CopyQueue(limit=10, max_bytes=100)
    for n in range(4):
        assert queue.offer(bytes([n]) * 40, credit=0) == []
    assert (len(queue), queue.dropped) == (2, 2)  # 80 bytes held: a third copy would be 120
    assert queue.offer(b"x" * 150, credit=0) == []
    assert (len(queue), queue.dropped) == (1, 4)  # alone over the limit, but kept
    assert queue.take(credit=3) == [b"x" * 150]
    assert queue.offer(b"y" * 60, credit=0) == []
    assert queue.offer(b"z" * 30, credit=0) == []
    assert queue.take(credit=3) == [b"y" * 60, b"z" * 30]  # 90 bytes: nothing dropped
    assert queue.dropped == 4


def test_dynamic_addresses_name_their_router_and_are_unique() -> None:
    replies = ReplyAddresses("r2")
    first, second = replies.allocate(), replies.allocate()
    assert first != second
    assert dynamic_owner(first) == "r2"
    assert dynamic_owner("orders") is None
    assert dynamic_owner("_dynamic/") is None
    assert ReplyAddresses("r2").allocate() != first  # a restarted router never reuses one


def test_resolve_known_dynamic_and_unknown() -> None:
    config = RouterConfig(
        generation=1,
        space="shop",
        addresses={"calls": AddressRoute(address="calls", distribution=Distribution.ANYCAST)},
    )
    assert resolve("calls", config=config).direct
    reply = resolve("_dynamic/r9/x.1", config=config)
    assert reply.direct
    assert reply.owner == "r9"
    with pytest.raises(UnknownAddress) as raised:
        resolve("nope", config=config)
    assert str(raised.value) == "no address 'nope' in space 'shop'"
