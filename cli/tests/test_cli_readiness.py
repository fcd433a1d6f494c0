"""What `up` waits on and `status` shows, from the routers' own answers (pure: no process)."""

from __future__ import annotations

from enmasse.cli.local.readiness import (
    BrokerHolds,
    RouterRun,
    broker_row,
    confirmed_text,
    laggards,
    router_row,
)
from enmasse.v1 import resources_pb2, router_agent_pb2


def space(phase: str = "Active", kind: str = "standard") -> resources_pb2.AddressSpace:
    return resources_pb2.AddressSpace(
        metadata={"name": "demo"},
        spec={"type": kind, "plan": "standard-small"},
        status={"status": {"phase": phase}},
    )


def address(name: str, phase: str, *messages: str) -> resources_pb2.Address:
    return resources_pb2.Address(
        metadata={"name": name, "space": "demo"},
        spec={"address": name, "type": "queue", "plan": "standard-small-queue"},
        status={"status": {"phase": phase, "messages": list(messages)}},
    )


def router(*held: str, answered: bool = True) -> RouterRun:
    return RouterRun(
        "demo",
        "router-0",
        answered=answered,
        generation=7 if answered else 0,
        addresses=frozenset(held),
        error="" if answered else "UNAVAILABLE",
    )


def test_an_address_active_in_the_store_is_ready_only_once_the_router_runs_it() -> None:
    # after a restart of everything: etcd says Active, the router started with nothing
    stale = [address("orders", "Active"), address("rpc", "Active")]
    assert laggards(space=space(), addresses=stale, routers=[router()]) == [
        "orders Active in the store, not yet run by router router-0",
        "rpc Active in the store, not yet run by router router-0",
    ]
    assert laggards(space=space(), addresses=stale, routers=[router("orders", "rpc")]) == []
    assert laggards(space=space(), addresses=stale, routers=[router(answered=False)]) == [
        "router router-0 does not answer (UNAVAILABLE)"
    ]
    assert laggards(space=space(), addresses=stale, routers=[]) == [
        "no router of the space answers yet"
    ]


def test_phases_other_than_active_are_laggards_unless_waiting_cannot_change_them() -> None:
    addresses = [
        address("orders", "Configuring", "waiting for router router-0: unreachable"),
        address("late", "Pending", "quota exceeded"),
    ]
    found = laggards(space=space("Configuring"), addresses=addresses, routers=[router("orders")])
    assert found == [
        "space Configuring",
        "orders Configuring (waiting for router router-0: unreachable)",
        "late Pending (quota exceeded)",
    ]
    settled = laggards(
        space=space(), addresses=addresses, routers=[router("orders")], settled_ok=True
    )
    assert settled == ["orders Configuring (waiting for router router-0: unreachable)"]


def test_a_brokered_space_has_no_router_to_ask_and_an_empty_one_waits_for_nothing() -> None:
    brokered = space(kind="brokered")
    assert laggards(space=brokered, addresses=[address("invoices", "Active")], routers=[]) == []
    assert laggards(space=space("Configuring", kind="brokered"), addresses=[], routers=[]) == []


def test_status_rows_are_one_word_per_cell() -> None:
    known = router_agent_pb2.RouterState(
        router_id="router-0", desired_generation=9, confirmed_at=100.0
    )
    assert router_row(router("orders"), known, now=102.46) == (
        "demo",
        "router-0",
        "7",
        "9",
        "1",
        "yes",
        "2.5s-ago",
    )
    assert router_row(router(answered=False), None, now=0) == (
        "demo",
        "router-0",
        "-",
        "-",
        "-",
        "no(UNAVAILABLE)",
        "-",
    )
    assert confirmed_text(0.0, now=5) == "never"
    held = BrokerHolds("demo", "demo-broker-0", answered=True, queues=2, topics=1, answer_ms=3.2)
    assert broker_row(held) == ("demo", "demo-broker-0", "yes", "2", "1", "0", "3ms")
    silent = BrokerHolds("demo", "demo-broker-0", answered=False, error="UNAVAILABLE")
    assert broker_row(silent) == ("demo", "demo-broker-0", "no(UNAVAILABLE)", "-", "-", "-", "-")
