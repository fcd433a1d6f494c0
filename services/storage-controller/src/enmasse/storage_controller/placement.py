"""Placement: which broker holds which store-and-forward address of one address space. Pure.

In: the Address resources of one space, the address plans (their `broker` credit), the space's
AddressSpacePlan (its type and `max_brokers` quota) and the current `Placement`. Out: the next
`Placement`: the brokers the space needs (each Active or Draining), the broker(s) of every
`queue`, `topic` and `subscription`, the moves still to be done (an address leaving a broker: its
messages must be drained to its new broker first) and the addresses left Pending, with why.

The rules (DESIGN §3):
- a pooled plan (credit < 1) is bin-packed by credit onto the fullest Active pooled broker that
  still fits it (capacity 1.0); when none fits, a new pooled broker, if the space plan's
  `max_brokers` allows one more Active broker; otherwise the address stays Pending with
  "quota exceeded: ...";
- credit == 1: a broker of its own; credit > 1: sharded over ceil(credit) brokers of its own;
- a `subscription` lives on the broker(s) of its topic, and takes its credit there;
- a brokered space has one broker for everything, whatever the credits;
- stable: an address keeps its brokers while they are still valid for its plan, so adding an
  address never moves another. Addresses are placed in creation order, so the newest ones are
  the ones that stay Pending when the quota runs out;
- a pooled broker pushed over capacity (a plan's credit grew) sheds its newest addresses, which
  are placed again; pooled brokers holding only queues are compacted when the pool holds more
  brokers than its credit needs, so deleting addresses lets a broker go;
- a queue that is a dead-letter or expiry address (named by the plan of an address placed in the
  space: the space's `DLQ`) is placed as any queue, and then also on every other broker holding
  an address whose plan names it, so a broker always finds the dead-letter queue of what it
  holds on itself (a broker moves a dead letter only on itself). Those extra brokers come after
  its own in its placement; it takes no credit there and never makes a broker needed that was
  not. A broker that no longer holds such an address is one the queue leaves (drained);
- a broker that holds nothing and has nothing to hand over is dropped; one that still has
  messages to hand over stays, Draining, until the controller reports its moves done
  (`Placement.move_done`). Placement never decides a drain happened: the controller does,
  after the broker said so.

Broker ids are stable and readable: `<space>-broker-<n>` for pooled ones, `<space>-<address>-<n>`
for dedicated ones and shards (n is the lowest free number), cut to 52 characters with a hash
when longer, because a StatefulSet's pods must fit a 63-character label.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from enmasse.resources.contracts import ACTIVE, DRAINING, STORED_TYPES
from enmasse.resources.rendered_brokers import Broker
from enmasse.v1 import resources_pb2

CAPACITY = 1.0
_EPSILON = 1e-9
MAX_BROKER_ID = 52
QUOTA_EXCEEDED = "quota exceeded"


@dataclass(frozen=True)
class Placement:
    """One space's brokers and who lives where. Treat as immutable: changes return a new one."""

    space: str
    brokers: dict[str, Broker] = field(default_factory=dict)
    addresses: dict[str, tuple[str, ...]] = field(default_factory=dict)
    moves: dict[str, tuple[str, ...]] = field(default_factory=dict)
    pending: dict[str, str] = field(default_factory=dict)

    def holders(self, broker_id: str) -> list[str]:
        """The addresses placed (Active) on a broker, by name."""
        return sorted(name for name, ids in self.addresses.items() if broker_id in ids)

    def leaving(self, broker_id: str) -> list[str]:
        """The addresses whose messages must still leave a broker."""
        return sorted(name for name, ids in self.moves.items() if broker_id in ids)

    def move_done(self, name: str, broker_id: str) -> Placement:
        """The controller saw `name`'s messages leave `broker_id`; a Draining broker with
        nothing left to hand over is dropped."""
        moves = dict(self.moves)
        remaining = tuple(b for b in moves.get(name, ()) if b != broker_id)
        if remaining:
            moves[name] = remaining
        else:
            moves.pop(name, None)
        brokers = dict(self.brokers)
        broker = brokers.get(broker_id)
        still_leaving = any(broker_id in ids for ids in moves.values())
        if broker is not None and broker.state == DRAINING and not still_leaving:
            del brokers[broker_id]
        return dataclasses.replace(self, brokers=brokers, moves=moves)


@dataclass(frozen=True)
class _Demand:
    name: str
    type: str
    credit: float
    topic: str
    address: str = ""
    routes: tuple[str, ...] = ()  # the dead-letter and expiry addresses its plan names


def place(
    *,
    space: str,
    addresses: Sequence[resources_pb2.Address],
    plans: Mapping[str, resources_pb2.AddressPlan],
    space_plan: resources_pb2.AddressSpacePlan | None,
    current: Placement,
) -> Placement:
    """The next placement of one address space (see the module docstring for the rules)."""
    demands, pending = _demands(addresses, plans)
    if space_plan is None:
        why = f"address space '{space}' has no known address space plan"
        return _finish(
            _Packing(space=space, current=current, max_brokers=0, brokered=False),
            pending={**pending, **{d.name: why for d in demands}},
            existing={d.name for d in demands},
        )
    packing = _Packing(
        space=space,
        current=current,
        max_brokers=math.floor(space_plan.spec.quotas.max_brokers + _EPSILON),
        brokered=space_plan.spec.address_space_type == "brokered",
        plan_name=space_plan.metadata.name,
    )
    stored = [d for d in demands if d.type != "subscription"]
    subscriptions = [d for d in demands if d.type == "subscription"]
    for demand in stored:
        packing.keep(demand)
    for demand in subscriptions:
        packing.keep(demand)
    packing.shed_overflow(stored + subscriptions)
    # Compaction only when room was freed in the pool (so an added address never moves
    # another), and before placing the new ones, so they may use the broker it frees.
    if not packing.brokered and packing.pool_freed():
        packing.compact(stored)
    for demand in [*stored, *subscriptions]:
        if demand.name not in packing.addresses:
            packing.put(demand, pending)
    packing.follow(demands)
    return _finish(packing, pending=pending, existing={d.name for d in demands})


def _demands(
    addresses: Sequence[resources_pb2.Address], plans: Mapping[str, resources_pb2.AddressPlan]
) -> tuple[list[_Demand], dict[str, str]]:
    demands: list[_Demand] = []
    pending: dict[str, str] = {}
    for address in sorted(addresses, key=_creation_order):
        if address.spec.type not in STORED_TYPES:
            continue
        plan = plans.get(address.spec.plan)
        name = address.metadata.name
        if plan is None:
            pending[name] = f"address plan '{address.spec.plan}' not found"
            continue
        routes = tuple(r for r in (plan.spec.dead_letter_address, plan.spec.expiry_address) if r)
        spec = address.spec
        demands.append(_Demand(name, spec.type, plan.spec.broker, spec.topic, spec.address, routes))
    return demands, pending


def _creation_order(address: resources_pb2.Address) -> tuple[int, int, str]:
    created = address.metadata.created_at
    return (created.seconds, created.nanos, address.metadata.name)


def _shards(credit: float) -> int:
    """0 for pooled, else the number of brokers of its own the plan asks for."""
    if credit < CAPACITY - _EPSILON:
        return 0
    return max(1, math.ceil(credit - _EPSILON))


class _Packing:
    """The working state of one `place` call: brokers, who is where, how full."""

    def __init__(
        self,
        *,
        space: str,
        current: Placement,
        max_brokers: int,
        brokered: bool,
        plan_name: str = "",
    ) -> None:
        self.space = space
        self.current = current
        self.max_brokers = max_brokers
        self.brokered = brokered
        self.plan_name = plan_name
        self.brokers: dict[str, Broker] = dict(current.brokers)
        self.addresses: dict[str, tuple[str, ...]] = {}
        self.credits: dict[str, float] = {}
        self.types: dict[str, str] = {}
        self.count: dict[str, int] = {}  # broker id -> addresses on it
        self.used: dict[str, float] = {b.id: 0.0 for b in current.brokers.values() if b.pooled}

    # ------------------------------------------------------------ keeping what stays valid

    def keep(self, demand: _Demand) -> None:
        old = self.current.addresses.get(demand.name, ())
        if demand.type == "subscription":
            topic = self.addresses.get(demand.topic)
            if topic and old == topic and self._fits(topic, demand.credit):
                self._assign(demand, topic)
            return
        if self.brokered or _shards(demand.credit) == 0:
            # its own broker comes first; a dead-letter queue's others are followed anew
            if old and self._active(old[0], pooled=True):
                self._assign(demand, old[:1])
            return
        owned = [b for b in old if self._active(b, pooled=False, owner=demand.name)]
        if owned:
            self._assign(demand, tuple(owned[: _shards(demand.credit)]))

    def _active(self, broker_id: str, *, pooled: bool, owner: str = "") -> bool:
        broker = self.brokers.get(broker_id)
        return (
            broker is not None
            and broker.state == ACTIVE
            and broker.pooled == pooled
            and (pooled or broker.owner == owner)
        )

    def shed_overflow(self, demands: Sequence[_Demand]) -> None:
        """A pooled broker over capacity (a credit grew) lets its newest addresses go."""
        if self.brokered:
            return
        for demand in reversed(demands):
            ids = self.addresses.get(demand.name, ())
            if any(self._pooled(b) and self.used[b] > CAPACITY + _EPSILON for b in ids):
                self._unassign(demand.name)
                for sub in demands:
                    if sub.type == "subscription" and sub.topic == demand.name:
                        self._unassign(sub.name)

    # ------------------------------------------------------------ placing the rest

    def put(self, demand: _Demand, pending: dict[str, str]) -> None:
        if demand.type == "subscription":
            self._put_subscription(demand, pending)
        elif self.brokered:
            self._put_brokered(demand, pending)
        elif _shards(demand.credit) == 0:
            self._put_pooled(demand, pending)
        else:
            self._put_dedicated(demand, pending)

    def _put_subscription(self, demand: _Demand, pending: dict[str, str]) -> None:
        topic = self.addresses.get(demand.topic)
        if not topic:
            pending[demand.name] = f"topic '{demand.topic}' is not placed on a broker"
        elif not self._fits(topic, demand.credit):
            full = ", ".join(topic)
            pending[demand.name] = (
                f"{QUOTA_EXCEEDED}: broker {full} of topic '{demand.topic}' is full"
            )
        else:
            self._assign(demand, topic)

    def _put_brokered(self, demand: _Demand, pending: dict[str, str]) -> None:
        pool = self._pool()
        if pool:
            self._assign(demand, (pool[0],))
        elif self._may_add(1, demand, pending):
            self._assign(demand, (self._new_pooled(),))

    def _put_pooled(self, demand: _Demand, pending: dict[str, str]) -> None:
        fitting = [b for b in self._pool() if self.used[b] + demand.credit <= CAPACITY + _EPSILON]
        fitting = [b for b in fitting if self.count.get(b)] or fitting[:1]
        if fitting and not self.count.get(fitting[0]):
            # an idle broker left from before counts against the quota like a new one
            if self._may_add(1, demand, pending):
                self._assign(demand, (fitting[0],))
        elif fitting:
            best = max(fitting, key=lambda b: self.used[b])  # the fullest; ties: the oldest
            self._assign(demand, (best,))
        elif self._may_add(1, demand, pending):
            self._assign(demand, (self._new_pooled(),))

    def _put_dedicated(self, demand: _Demand, pending: dict[str, str]) -> None:
        kept = self.addresses.get(demand.name, ())
        wanted = _shards(demand.credit) - len(kept)
        if wanted <= 0:
            return
        if kept and not self._room_for(wanted):
            return  # keeps serving on fewer shards rather than moving off the ones it has
        if not self._may_add(wanted, demand, pending):
            return
        self._assign(demand, kept + tuple(self._new_owned(demand.name) for _ in range(wanted)))

    def _may_add(self, count: int, demand: _Demand, pending: dict[str, str]) -> bool:
        if self._room_for(count):
            return True
        # no live count in the text: it would change with every pass and rewrite the status
        pending[demand.name] = (
            f"{QUOTA_EXCEEDED}: address '{demand.name}' needs {count} more "
            f"broker{'s' if count > 1 else ''} than the {self.max_brokers} that address space "
            f"'{self.space}' may have with plan '{self.plan_name}'"
        )
        return False

    def _room_for(self, count: int) -> bool:
        return not self.max_brokers or self._active_count() + count <= self.max_brokers

    def _active_count(self) -> int:
        # brokers that hold something: an idle one left from before is dropped at the end
        return sum(1 for n in self.count.values() if n)

    # ------------------------------------------------------------ dead-letter queues

    def follow(self, demands: Sequence[_Demand]) -> None:
        """Places each placed queue that is a dead-letter or expiry address also on every Active
        broker holding an address whose plan names it (after its own broker, without credit)."""
        queues = {d.address: d.name for d in demands if d.type == "queue"}
        extra: dict[str, list[str]] = {}
        for demand in demands:
            for route in demand.routes:
                target = queues.get(route)
                if target is not None and target != demand.name and target in self.addresses:
                    extra.setdefault(target, []).extend(self.addresses.get(demand.name, ()))
        for name, brokers in extra.items():
            placed = self.addresses[name]
            more = sorted(
                {b for b in brokers if b not in placed and self._is_active(b)}, key=_id_order
            )
            self.addresses[name] = placed + tuple(more)
            for b in more:
                self.count[b] = self.count.get(b, 0) + 1

    def _is_active(self, broker_id: str) -> bool:
        broker = self.brokers.get(broker_id)
        return broker is not None and broker.state == ACTIVE

    # ------------------------------------------------------------ compaction

    def pool_freed(self) -> bool:
        """Did an address leave a pooled broker (deleted, or shed) since the last placement?"""
        return any(
            name not in self.addresses and any(self._pooled(b) for b in ids)
            for name, ids in self.current.addresses.items()
        )

    def compact(self, stored: Sequence[_Demand]) -> bool:
        """Empties pooled brokers holding only queues while the others can take their queues;
        True when one was emptied."""
        queues = {d.name: d for d in stored if d.type == "queue" and _shards(d.credit) == 0}
        emptied = False
        while True:
            pool = [b for b in self._pool() if self.count.get(b)]
            needed = math.ceil(sum(self.used[b] for b in pool) - _EPSILON)
            if len(pool) <= max(needed, 1):
                return emptied
            emptiest = min(reversed(pool), key=lambda b: self.used[b])  # ties: the newest
            holders = self._holders(emptiest)
            if any(n not in queues for n in holders):
                return emptied
            targets = self._refit([queues[n] for n in holders], exclude=emptiest)
            if targets is None:
                return emptied
            for name, target in targets.items():
                self._unassign(name)
                self._assign(queues[name], (target,))
            self.brokers[emptiest] = dataclasses.replace(self.brokers[emptiest], state=DRAINING)
            emptied = True

    def _refit(self, demands: Sequence[_Demand], *, exclude: str) -> dict[str, str] | None:
        others = [b for b in self._pool() if b != exclude]
        used = {b: self.used[b] for b in others}
        targets: dict[str, str] = {}
        for demand in sorted(demands, key=lambda d: (-d.credit, d.name)):
            fitting = [b for b in others if used[b] + demand.credit <= CAPACITY + _EPSILON]
            if not fitting:
                return None
            best = max(fitting, key=lambda b: used[b])
            used[best] += demand.credit
            targets[demand.name] = best
        return targets

    # ------------------------------------------------------------ bookkeeping

    def _pool(self) -> list[str]:
        return sorted(
            (b.id for b in self.brokers.values() if b.pooled and b.state == ACTIVE),
            key=_id_order,
        )

    def _pooled(self, broker_id: str) -> bool:
        broker = self.brokers.get(broker_id)
        return broker is not None and broker.pooled

    def _holders(self, broker_id: str) -> list[str]:
        return [name for name, ids in self.addresses.items() if broker_id in ids]

    def _fits(self, ids: Iterable[str], credit: float) -> bool:
        if self.brokered:
            return True
        return all(
            not self._pooled(b) or self.used.get(b, 0.0) + credit <= CAPACITY + _EPSILON
            for b in ids
        )

    def _assign(self, demand: _Demand, ids: tuple[str, ...]) -> None:
        self.addresses[demand.name] = ids
        self.credits[demand.name] = demand.credit
        self.types[demand.name] = demand.type
        for b in ids:
            self.count[b] = self.count.get(b, 0) + 1
            if self._pooled(b):
                self.used[b] = self.used.get(b, 0.0) + demand.credit

    def _unassign(self, name: str) -> None:
        for b in self.addresses.pop(name, ()):
            self.count[b] -= 1
            if self._pooled(b):
                self.used[b] -= self.credits[name]

    def _new_pooled(self) -> str:
        broker_id = _free_id(f"{self.space}-broker", self.brokers)
        self.brokers[broker_id] = Broker(broker_id, pooled=True)
        self.used[broker_id] = 0.0
        return broker_id

    def _new_owned(self, name: str) -> str:
        broker_id = _free_id(f"{self.space}-{name}", self.brokers)
        self.brokers[broker_id] = Broker(broker_id, pooled=False, owner=name)
        return broker_id


def _finish(packing: _Packing, *, pending: dict[str, str], existing: set[str]) -> Placement:
    """Moves for every address that left a broker, and the brokers nobody needs dropped or
    set Draining."""
    current = packing.current
    moves: dict[str, tuple[str, ...]] = {}
    for name in sorted(existing):
        # A Pending address that had brokers keeps them (Draining, with nowhere to drain to
        # yet) rather than losing what they hold.
        now = packing.addresses.get(name, ())
        before = [*current.moves.get(name, ()), *current.addresses.get(name, ())]
        leaving = tuple(dict.fromkeys(b for b in before if b not in now and b in packing.brokers))
        if leaving:
            moves[name] = leaving
    needed = {b for ids in packing.addresses.values() for b in ids}
    handing_over = {b for ids in moves.values() for b in ids}
    brokers: dict[str, Broker] = {}
    for broker_id, broker in sorted(packing.brokers.items()):
        if broker_id in needed and broker.state == ACTIVE:
            brokers[broker_id] = broker
        elif broker_id in handing_over:
            brokers[broker_id] = dataclasses.replace(broker, state=DRAINING)
    return Placement(
        space=packing.space,
        brokers=brokers,
        addresses=dict(sorted(packing.addresses.items())),
        moves=moves,
        pending=dict(sorted(pending.items())),
    )


def _free_id(base: str, taken: Mapping[str, Broker]) -> str:
    base = _bounded(base)
    n = 0
    while f"{base}-{n}" in taken:
        n += 1
    return f"{base}-{n}"


def _bounded(base: str) -> str:
    """Leaves room for `-<n>` within MAX_BROKER_ID; a long base keeps its start and a hash."""
    room = MAX_BROKER_ID - 4
    if len(base) <= room:
        return base
    digest = hashlib.sha1(base.encode()).hexdigest()[:6]
    return f"{base[: room - 7].rstrip('-')}-{digest}"


_NUMBER = re.compile(r"^(.*)-(\d+)$")


def _id_order(broker_id: str) -> tuple[str, int]:
    """`shop-broker-2` before `shop-broker-10`."""
    match = _NUMBER.match(broker_id)
    return (match.group(1), int(match.group(2))) if match else (broker_id, -1)
