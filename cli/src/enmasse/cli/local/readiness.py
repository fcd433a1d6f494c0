"""What the routers and brokers of a space run now, asked of them: what `up` waits on and
`status` shows.

In: the var dir (where `LocalDirectory` finds each router's and broker's ports file), a space's
AddressSpace and Addresses as the config service holds them, and the router-agent's address
(<var>/ports.json). Out: `RouterRun` (the generation a router says it runs and the addresses its
running configuration holds: RouterAdmin.GetConfig), `BrokerHolds` (what a broker holds:
BrokerAdmin.ListAddresses), the router-agent's view of each router (`agent_view`: the generation
it wants, and when the router last confirmed one), and `laggards`: why an address is not ready
to use yet, or nothing.

Why ask the routers themselves: after a restart of everything, etcd still holds the phases the
previous processes wrote, and the new router-agent has not spoken yet; a phase read from the
store can say Active for an address the router just started without. An address is ready only
when the store says Active AND every router of its space answers with a configuration that holds
it; whoever wrote the phase, whenever, that pair cannot be stale. A brokered space has no router:
its phases are all there is (the storage-controller writes them from what its broker holds).

Every question goes over the operator's channel (`enmasse.cli.client.open_operator_channel`):
mutual TLS with the machine operator's certificate under `enmasse up`, which RouterAdmin and
BrokerAdmin let read (what a router runs, what a broker holds) and nothing else.

`laggards` is pure; the rest asks over gRPC with a short deadline each, so a router that does
not answer is a laggard, never a hang.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc
from enmasse.cli.client import open_operator_channel
from enmasse.common.certificates import TlsFiles
from enmasse.resources.contracts import ACTIVE, BROKERED, FAILED, PENDING, QUEUE, TOPIC
from enmasse.resources.discovery import LocalDirectory
from enmasse.v1 import (
    broker_pb2,
    broker_pb2_grpc,
    resources_pb2,
    router_agent_pb2,
    router_agent_pb2_grpc,
    router_pb2,
    router_pb2_grpc,
)

ASK_DEADLINE = 2.0
SETTLED = (PENDING, FAILED)
"""Phases that waiting does not change (a quota, a refused plan): `up` reports them, waits not."""


@dataclass(frozen=True)
class RouterRun:
    """One router as it answered just now (`answered` False: it did not, `error` says why)."""

    space: str
    router_id: str
    answered: bool
    generation: int = 0
    addresses: frozenset[str] = frozenset()  # the AMQP addresses its running configuration holds
    error: str = ""


@dataclass(frozen=True)
class BrokerHolds:
    """What one broker holds, as it answered just now, and how long the answer took."""

    space: str
    broker_id: str
    answered: bool
    queues: int = 0
    topics: int = 0
    subscriptions: int = 0
    answer_ms: float = 0.0
    error: str = ""


def directory(var_root: Path) -> LocalDirectory:
    found = LocalDirectory(var_root)
    found.refresh()
    return found


def routers_of(found: LocalDirectory, space: str, *, tls: TlsFiles | None) -> list[RouterRun]:
    return [_ask_router(space, r.router_id, r.admin, tls=tls) for r in found.routers(space)]


def _ask_router(space: str, router_id: str, admin: str, *, tls: TlsFiles | None) -> RouterRun:
    with open_operator_channel(admin, tls=tls) as channel:
        try:
            config = router_pb2_grpc.RouterAdminStub(channel).GetConfig(
                router_pb2.GetConfigRequest(), timeout=ASK_DEADLINE
            )
        except grpc.RpcError as error:
            return RouterRun(space, router_id, answered=False, error=_code(error))
    return RouterRun(
        space,
        router_id,
        answered=True,
        generation=config.generation,
        addresses=frozenset(route.address for route in config.addresses),
    )


def brokers_of(found: LocalDirectory, space: str, *, tls: TlsFiles | None) -> list[BrokerHolds]:
    return [_ask_broker(space, b.name, b.admin, tls=tls) for b in found.brokers(space).values()]


def _ask_broker(space: str, broker_id: str, admin: str, *, tls: TlsFiles | None) -> BrokerHolds:
    started = time.monotonic()
    with open_operator_channel(admin, tls=tls) as channel:
        try:
            listing = broker_pb2_grpc.BrokerAdminStub(channel).ListAddresses(
                broker_pb2.ListAddressesRequest(), timeout=ASK_DEADLINE
            )
        except grpc.RpcError as error:
            return BrokerHolds(space, broker_id, answered=False, error=_code(error))
    kinds = [a.kind for a in listing.addresses]
    return BrokerHolds(
        space,
        broker_id,
        answered=True,
        queues=kinds.count(QUEUE),
        topics=kinds.count(TOPIC),
        subscriptions=len(kinds) - kinds.count(QUEUE) - kinds.count(TOPIC),
        answer_ms=(time.monotonic() - started) * 1000,
    )


def agent_view(
    target: str, *, tls: TlsFiles | None
) -> dict[tuple[str, str], router_agent_pb2.RouterState]:
    """(space, router id) -> what the router-agent knows of that router; empty when the agent
    does not answer (status shows `-` then)."""
    with open_operator_channel(target, tls=tls) as channel:
        try:
            topology = router_agent_pb2_grpc.RouterAgentStub(channel).GetTopology(
                router_agent_pb2.TopologyRequest(), timeout=ASK_DEADLINE
            )
        except grpc.RpcError:
            return {}
    return {(s.space, r.router_id): r for s in topology.spaces for r in s.routers}


def _code(error: grpc.RpcError) -> str:
    code = error.code() if isinstance(error, grpc.Call) else None
    return code.name if code is not None else "no answer"


# ---------------------------------------------------------------- the truth `up` waits on


def laggards(
    *,
    space: resources_pb2.AddressSpace,
    addresses: Sequence[resources_pb2.Address],
    routers: Sequence[RouterRun],
    settled_ok: bool = False,
) -> list[str]:
    """Why the space, or each of its addresses, is not ready to use: [] when all are.

    Ready: the store says Active and, in a standard space, every router answers with a
    configuration holding the address. With `settled_ok`, an address Pending or Failed (waiting
    will not change it) is no laggard."""
    found: list[str] = []
    standard = space.spec.type != BROKERED
    if addresses and space.status.status.phase != ACTIVE:  # an empty brokered space never is
        found.append(f"space {_phase(space)}")
    if standard and not routers:
        found.append("no router of the space answers yet")
    silent = [r for r in routers if not r.answered]
    found += [f"router {r.router_id} does not answer ({r.error})" for r in silent]
    for address in addresses:
        name, phase = address.metadata.name, address.status.status.phase
        if settled_ok and phase in SETTLED:
            continue
        if phase != ACTIVE:
            found.append(f"{name} {_phase(address)}")
            continue
        if not standard:
            continue
        lacking = [
            r.router_id for r in routers if r.answered and address.spec.address not in r.addresses
        ]
        if lacking:
            found.append(f"{name} Active in the store, not yet run by router {', '.join(lacking)}")
    return found


def _phase(resource: resources_pb2.AddressSpace | resources_pb2.Address) -> str:
    status = resource.status.status
    why = f" ({'; '.join(status.messages)})" if status.messages else ""
    return f"{status.phase or PENDING}{why}"


# ---------------------------------------------------------------- what `status` shows


def router_row(
    run: RouterRun, known: router_agent_pb2.RouterState | None, *, now: float
) -> tuple[str, ...]:
    """SPACE ROUTER RUNS DESIRED ADDRESSES REACHABLE CONFIRMED: the router's own answer, the
    generation the router-agent wants (`-` when the agent does not know the router) and how
    long ago the router last confirmed a generation to the agent. One word per cell."""
    return (
        run.space,
        run.router_id,
        str(run.generation) if run.answered else "-",
        str(known.desired_generation) if known is not None else "-",
        str(len(run.addresses)) if run.answered else "-",
        "yes" if run.answered else f"no({run.error})",
        confirmed_text(known.confirmed_at if known is not None else None, now=now),
    )


def confirmed_text(confirmed_at: float | None, *, now: float) -> str:
    """`0.4s-ago`, `never` (the agent knows the router, which never confirmed), `-` (unknown)."""
    if confirmed_at is None:
        return "-"
    if not confirmed_at:
        return "never"
    return f"{max(now - confirmed_at, 0.0):.1f}s-ago"


def broker_row(held: BrokerHolds) -> tuple[str, ...]:
    """SPACE BROKER REACHABLE QUEUES TOPICS SUBSCRIPTIONS ANSWER: what it holds now, and how
    long its answer took."""
    if not held.answered:
        return (held.space, held.broker_id, f"no({held.error})", "-", "-", "-", "-")
    return (
        held.space,
        held.broker_id,
        "yes",
        str(held.queues),
        str(held.topics),
        str(held.subscriptions),
        f"{held.answer_ms:.0f}ms",
    )
