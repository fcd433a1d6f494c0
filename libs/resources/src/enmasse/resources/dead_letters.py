"""The queues an address space keeps for what its addresses cannot deliver: the dead-letter and
expiry addresses its plans name.

In: address plans by name (what their `deadLetterAddress` and `expiryAddress` say). Out: the
address strings they name, what for and by which plans (`named_queues`); the queue plan such a
queue is created with (`queue_plan_for`, the space plan's smallest); and the `Address` the config
service creates for one a space lacks (`space_queue`).

Why: a plan that names `DLQ` promises a place for a poison message, and EnMasse and Artemis users
expect `DLQ` to simply be there. So the config service creates these queues in the space, in the
same transaction as the first address whose plan names one (and again whenever a plan starts
naming one the space lacks), as ordinary addresses of the space: listed by `enmasse get
addresses`, placed on brokers and routed like any queue, deleted with the space. Only the plans
the space's addresses use count, so a space of anycast addresses alone needs no broker for an
empty `DLQ`. They are `managed_by: SPACE_MANAGER`, so no Apply's prune ever takes them; the
rules refuse to delete one alone while an address of its space uses a plan that names it, or to
make an address the space plan's plans name anything but a queue
(`enmasse.resources.validation`). A space that declares the queue itself (any Address holding
that address string) gets none created: its own is the one.

Pure, and without the validation catalog, so the rules and the config service's write path can
both call it.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from enmasse.resources.contracts import QUEUE
from enmasse.v1 import resources_pb2

SPACE_MANAGER = "enmasse-space"
"""The `metadata.managed_by` of the queues the config service creates for a space."""
DEAD_LETTER = "dead-letter"
EXPIRY = "expiry"
_ROLE_FIELDS = ((DEAD_LETTER, "dead_letter_address"), (EXPIRY, "expiry_address"))
_NOT_IN_LABEL = re.compile(r"[^a-z0-9-]+")
_LABEL_LENGTH = 63


@dataclass(frozen=True)
class NamedQueue:
    """An address string the space's plans name as dead-letter or expiry address."""

    address: str
    roles: tuple[str, ...]  # DEAD_LETTER, EXPIRY: what the plans name it for
    plans: tuple[str, ...]  # the address plans that name it, in the space plan's order
    owner: str = "address plan"  # what kind of plan names it (`mqtt_stores`: the space plan)

    def describe(self) -> str:
        """`the dead-letter address of address plan 'standard-small-queue'`, for messages."""
        roles = " and ".join(self.roles)
        plans = ", ".join(f"'{p}'" for p in self.plans)
        return f"the {roles} address of {self.owner}{'s' if len(self.plans) > 1 else ''} {plans}"


def named_queues(
    plan_names: Iterable[str], address_plans: Mapping[str, resources_pb2.AddressPlan]
) -> dict[str, NamedQueue]:
    """The dead-letter and expiry addresses the address plans `plan_names` name, by address
    string (names of plans that do not exist name nothing)."""
    roles: dict[str, list[str]] = {}
    plans: dict[str, list[str]] = {}
    for plan_name in plan_names:
        plan = address_plans.get(plan_name)
        if plan is None:
            continue
        for role, field_name in _ROLE_FIELDS:
            address = getattr(plan.spec, field_name)
            if not address:
                continue
            if role not in roles.setdefault(address, []):
                roles[address].append(role)
            if plan_name not in plans.setdefault(address, []):
                plans[address].append(plan_name)
    return {
        address: NamedQueue(address, tuple(sorted(roles[address])), tuple(plans[address]))
        for address in roles
    }


def queue_plan_for(
    space_plan: resources_pb2.AddressSpacePlan | None,
    address_plans: Mapping[str, resources_pb2.AddressPlan],
) -> str | None:
    """The queue plan a space's dead-letter and expiry queues get: of the queue plans the space
    plan lists, the one that takes the least of a broker (pooled before dedicated), ties by
    name; None when it lists none."""
    if space_plan is None:
        return None
    queue_plans = [
        (plan.spec.broker, name)
        for name in space_plan.spec.address_plans
        if (plan := address_plans.get(name)) is not None and plan.spec.address_type == QUEUE
    ]
    return min(queue_plans)[1] if queue_plans else None


def space_queue(
    *, space: str, named: NamedQueue, plan: str, taken: Collection[str]
) -> resources_pb2.Address:
    """The Address the config service creates for `named` in `space`: a queue with `plan`,
    named after its address string (a DNS-1123 label: `DLQ` -> `dlq`; `-2`, `-3` ... when the
    name is `taken` by another address of the space)."""
    address = resources_pb2.Address(
        spec=resources_pb2.AddressSpec(address=named.address, type=QUEUE, plan=plan)
    )
    address.metadata.space = space
    address.metadata.name = _free_name(_label_of(named.address), taken)
    address.metadata.managed_by = SPACE_MANAGER
    return address


def _label_of(address: str) -> str:
    label = _NOT_IN_LABEL.sub("-", address.lower()).strip("-")
    return label[:_LABEL_LENGTH].rstrip("-") or "queue"


def _free_name(base: str, taken: Collection[str]) -> str:
    if base not in taken:
        return base
    n = 2
    while True:
        suffix = f"-{n}"
        name = f"{base[: _LABEL_LENGTH - len(suffix)].rstrip('-')}{suffix}"
        if name not in taken:
            return name
        n += 1
