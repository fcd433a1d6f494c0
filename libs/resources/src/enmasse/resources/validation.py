"""The resource rules of EnMasse-py, as pure functions: no network, no store.

In: one resource (or a batch of them, as an Apply or `enmasse validate` sees them) and a `Catalog`,
the objects that already exist (plans, address spaces, addresses, messaging users). Out: a list of
`Violation`s per resource, each naming the kind, the object, the field and the exact rule broken.
An empty list means the resource may be written.

Why pure: the config service refuses bad input with these rules, and the CLI's offline
`enmasse validate` runs the very same ones over manifests in git, so the two can never disagree.
The config service gives its catalog of the store, caught up to the last write; the CLI builds
one from files.

Whether a write is a create or an update is read from the catalog: an object already there under
the same key is being updated (so its own address string and its own quota slot do not count
against it, and a messaging user keeps its stored password hash).

Each violation says whether it is a *precondition* (it names something that must exist first, a
plan that forbids it, a quota) or plain bad input; the config service answers FAILED_PRECONDITION
for the former and INVALID_ARGUMENT for the latter.

The words the rules check against (address and space types, operations) are the contracts of
`enmasse.resources.contracts`; the kinds and their keys are the table of `enmasse.resources.kinds`.

One rule for address strings, `address_problem`: `spec.address` here (so the config API and
`enmasse validate` alike), and the broker's EnsureQueue/EnsureTopic and AMQP attach, so that an
address the API accepts is one every broker holds, and one it refuses is refused everywhere.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from enmasse.common import tracing
from enmasse.resources.authorization import pattern_problem
from enmasse.resources.contracts import (
    ADDRESS_TYPES,
    BROKERED,
    DEFAULT_MAX_MESSAGE_SIZE,
    MAX_MESSAGE_SIZE_BOUND,
    MQTT_STORE_USER,
    OPERATIONS,
    QUEUE,
    RESERVED_PREFIXES,
    SPACE_TYPES,
    STANDARD,
    STORED_TYPES,
    SUBSCRIPTION,
    SUBSCRIPTION_SEPARATOR,
    TOPIC,
    TYPES_BY_SPACE_TYPE,
)
from enmasse.resources.dead_letters import named_queues, queue_plan_for
from enmasse.resources.kinds import (
    KINDS,
    SPACE_SCOPED_KINDS,
    AnyObject,
    Key,
    key_of,
    kind_of,
    object_of,
)
from enmasse.resources.mqtt_stores import STORE_ADDRESSES, store_queue_plan, store_queues
from enmasse.v1 import resources_pb2

MAX_ADDRESS_LENGTH = 255
MAX_SUBSCRIPTION_NAME_LENGTH = 1024
"""The `<name>` of a broker's `<topic>::<name>` (a subscription address, or a client's durable
subscription identity: its container id and link name)."""
ADDRESS_CHARACTERS = "letters, digits and _ . - / #"
"""What an address string is made of (the set every broker has always held), ASCII only."""

_DNS_1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")  # used with fullmatch
_ADDRESS_CHARACTER = re.compile(r"[^A-Za-z0-9_.\-/#]")  # the first character outside the set
_SEGMENT_SEPARATORS = re.compile(r"[/.]")


def max_message_size_problem(size: int) -> str | None:
    """Why a plan's max message size (bytes; 0: the default) cannot be used, or None."""
    if size < 0:
        return (
            f"must be a positive number of bytes, got {size} (leave it out for the default, "
            f"{DEFAULT_MAX_MESSAGE_SIZE} bytes = {DEFAULT_MAX_MESSAGE_SIZE >> 20} MiB)"
        )
    if size > MAX_MESSAGE_SIZE_BOUND:
        return (
            f"must be at most {MAX_MESSAGE_SIZE_BOUND} bytes "
            f"({MAX_MESSAGE_SIZE_BOUND >> 20} MiB), got {size}"
        )
    return None


def min_routers_problem(*, space_type: str, quotas: resources_pb2.Quotas) -> str | None:
    """Why a plan's min_routers cannot be met, or None. Each standard space runs that many
    routers (`rendered_routers.plan_routers`; 0: one); max_routers 0 means no maximum."""
    wanted, most = quotas.min_routers, quotas.max_routers
    if wanted < 0:
        return f"must not be negative, got {wanted} (0 means one router)"
    if wanted == 0:
        return None
    if space_type == BROKERED:
        return "applies to standard address spaces only: a brokered space has no routers"
    if most > 0 and wanted > most:
        return f"must be at most max_routers ({most}), got {wanted}"
    return None


def router_load_problem(*, space_type: str, per_router: int) -> str | None:
    """Why a plan's connections_per_router or deliveries_per_router cannot be a scaling
    figure, or None (0: no scaling by that measure)."""
    if per_router < 0:
        return f"must not be negative, got {per_router} (0 means not scaled by it)"
    if per_router > 0 and space_type == BROKERED:
        return "applies to standard address spaces only: a brokered space has no routers"
    return None


def address_problem(address: str, *, subscription_queue: bool = False) -> str | None:
    """Why `address` cannot be an address string, or None when it can: the one rule.

    An address is 1 to MAX_ADDRESS_LENGTH of ADDRESS_CHARACTERS, starting with a letter, digit or
    `_`, with no empty segment between `/` and `.` separators (so no `..`), not starting with a
    prefix reserved for the routers and the control plane (`_dynamic/`, `_mesh/`, `$`), and
    without `::`, which names a topic's subscription queue on a broker. Where such a queue is
    meant (`subscription_queue`: an AMQP attach at the broker), `<topic>::<name>` is allowed: the
    topic follows the rule, the name is printable text of at most MAX_SUBSCRIPTION_NAME_LENGTH.

    The messages read after the field they are about: `spec.address: 'a..b' has an empty segment`.
    """
    if subscription_queue and SUBSCRIPTION_SEPARATOR in address:
        topic, _, name = address.partition(SUBSCRIPTION_SEPARATOR)
        return address_problem(topic) or _subscription_name_problem(name, address=address)
    if not address:
        return "must not be empty"
    if any(c.isspace() for c in address):
        return f"'{address}' must not contain whitespace"
    if len(address) > MAX_ADDRESS_LENGTH:
        return f"must be at most {MAX_ADDRESS_LENGTH} characters (got {len(address)})"
    if not address.isascii():
        return f"'{_shown(address)}' must hold ASCII characters only"
    if not address.isprintable():
        return f"'{_shown(address)}' must not contain control characters"
    if SUBSCRIPTION_SEPARATOR in address:
        return (
            f"'{address}' must not contain '{SUBSCRIPTION_SEPARATOR}', which is reserved for "
            f"subscriptions (<topic>{SUBSCRIPTION_SEPARATOR}<name> on a broker)"
        )
    for prefix in RESERVED_PREFIXES:
        if address.startswith(prefix):
            return (
                f"'{address}' must not start with '{prefix}' "
                "(reserved for the router network and the control plane)"
            )
    if found := _ADDRESS_CHARACTER.search(address):
        return f"'{address}' holds '{found.group()}': an address is {ADDRESS_CHARACTERS}"
    if "" in _SEGMENT_SEPARATORS.split(address):
        return f"'{address}' has an empty segment (segments are separated by '/' and '.')"
    if not (address[0].isalnum() or address[0] == "_"):
        return f"'{address}' must start with a letter, a digit or '_'"
    return None


def _subscription_name_problem(name: str, *, address: str) -> str | None:
    if not name:
        return f"'{_shown(address)}' names no subscription after '{SUBSCRIPTION_SEPARATOR}'"
    if len(name) > MAX_SUBSCRIPTION_NAME_LENGTH:
        return (
            f"subscription name must be at most {MAX_SUBSCRIPTION_NAME_LENGTH} characters "
            f"(got {len(name)})"
        )
    if not name.isprintable():
        return f"subscription name '{_shown(name)}' must not contain control characters"
    return None


def _shown(text: str) -> str:
    """Control and non-ASCII characters escaped: an error message stays one printable line."""
    return text.encode("unicode_escape").decode("ascii")


@dataclass(frozen=True)
class Violation:
    kind: str
    space: str
    name: str
    field: str
    message: str
    precondition: bool = dataclasses.field(default=False, compare=False)

    def __str__(self) -> str:
        space = f"{self.space}/" if self.space else ""
        return f"{self.kind} {space}{self.name}: {self.field}: {self.message}"


@dataclass
class Catalog:
    address_space_plans: dict[str, resources_pb2.AddressSpacePlan] = field(default_factory=dict)
    address_plans: dict[str, resources_pb2.AddressPlan] = field(default_factory=dict)
    address_spaces: dict[str, resources_pb2.AddressSpace] = field(default_factory=dict)
    addresses: dict[tuple[str, str], resources_pb2.Address] = field(default_factory=dict)
    messaging_users: dict[tuple[str, str], resources_pb2.MessagingUser] = field(
        default_factory=dict
    )
    _index: AddressIndex | None = field(default=None, init=False, repr=False, compare=False)

    def address_index(self) -> AddressIndex:
        """The index of the addresses, built on first use and kept current by put / remove
        (change the catalog through those two once the index is in use)."""
        if self._index is None:
            self._index = AddressIndex(self.addresses.values(), plans=self.address_plans)
        return self._index

    def get(self, key: Key) -> AnyObject | None:
        kind, space, name = key
        table = self._table(kind)
        return table.get((space, name) if kind in SPACE_SCOPED_KINDS else name)

    def put(self, resource: resources_pb2.Resource | AnyObject) -> None:
        """Adds or replaces an object (given bare or wrapped in a Resource)."""
        obj = object_of(resource) if isinstance(resource, resources_pb2.Resource) else resource
        kind, space, name = key_of(obj)
        self._table(kind)[(space, name) if kind in SPACE_SCOPED_KINDS else name] = obj
        if kind == "Address" and self._index is not None:
            self._index.add(obj)

    def remove(self, key: Key) -> None:
        kind, space, name = key
        self._table(kind).pop((space, name) if kind in SPACE_SCOPED_KINDS else name, None)
        if kind == "Address" and self._index is not None:
            self._index.remove(space, name)

    def objects(self) -> Iterator[tuple[Key, AnyObject]]:
        """Every object with its key, without copying."""
        for kind in KINDS:
            for obj in self._table(kind).values():
                yield key_of(obj), obj

    def copy(self) -> Catalog:
        return Catalog(
            address_space_plans=dict(self.address_space_plans),
            address_plans=dict(self.address_plans),
            address_spaces=dict(self.address_spaces),
            addresses=dict(self.addresses),
            messaging_users=dict(self.messaging_users),
        )

    def _table(self, kind: str) -> dict[Any, Any]:
        table: dict[Any, Any] = getattr(self, KINDS[kind].collection)
        return table


# ------------------------------------------------------------------ the public rules


def validate_resource(resource: resources_pb2.Resource, *, catalog: Catalog) -> list[Violation]:
    """Every rule the resource breaks, given what exists; empty when it may be written."""
    index = catalog.address_index()
    return _Rules(resource, references=catalog, stored=catalog, used=index, counted=index).run()


def validate_batch(
    resources: Sequence[resources_pb2.Resource], *, catalog: Catalog
) -> list[list[Violation]]:
    """One list of violations per resource, in order.

    The batch's own objects count as existing (a subscription may name a topic of the same batch).
    A refused object stops counting, and whatever leaned on it is checked again, until nothing
    changes, so that an accepted object never names a refused one. Quotas count what exists plus
    the accepted objects before this one, so the first ones that fit are accepted.
    """
    results: list[list[Violation]] = [[] for _ in resources]
    for index in _duplicates(resources):
        results[index].extend(_duplicate_violations(resources, index))
    refused = {i for i, found in enumerate(results) if found}
    while True:
        newly = _validate_round(resources, catalog=catalog, refused=refused, results=results)
        if not newly:
            return results
        refused |= newly


def validate_delete(key: Key, *, catalog: Catalog) -> list[Violation]:
    """Why an object may not be deleted: a plan still used by a space, an address or a plan; a
    topic that subscriptions still read; the queue of a dead-letter or expiry address that a
    plan of the space's other addresses names (it goes with the space)."""
    kind, space, name = key
    if kind == "AddressPlan":
        return _address_plan_users(name, catalog)
    if kind == "Address":
        readers = sorted(
            n
            for (s, n), obj in catalog.addresses.items()
            if s == space and obj.spec.type == SUBSCRIPTION and obj.spec.topic == name
        )
        found = [
            Violation(
                kind, space, name, "metadata.name", f"is the topic of subscription '{r}'", True
            )
            for r in readers
        ]
        return found + _space_queue_kept(key, catalog)
    if kind == "AddressSpacePlan":
        users = sorted(s for s, obj in catalog.address_spaces.items() if obj.spec.plan == name)
        return [
            Violation(kind, "", name, "metadata.name", f"is used by address space '{user}'", True)
            for user in users
        ]
    return []


# ------------------------------------------------------------------ batches


def _duplicates(resources: Sequence[resources_pb2.Resource]) -> list[int]:
    seen: dict[tuple[str, str], list[int]] = {}
    keys: dict[Key, list[int]] = {}
    for i, resource in enumerate(resources):
        if resource.WhichOneof("kind") is None:
            continue
        keys.setdefault(key_of(resource), []).append(i)
        if kind_of(resource) == "Address":
            address = resource.address
            seen.setdefault((address.metadata.space, address.spec.address), []).append(i)
    dup = [i for group in [*seen.values(), *keys.values()] if len(group) > 1 for i in group]
    return sorted(set(dup))


def _duplicate_violations(
    resources: Sequence[resources_pb2.Resource], index: int
) -> list[Violation]:
    resource = resources[index]
    kind, space, name = key_of(resource)
    out = []
    others = [i for i, r in enumerate(resources) if i != index and r.WhichOneof("kind")]
    if any(key_of(resources[i]) == (kind, space, name) for i in others):
        out.append(Violation(kind, space, name, "metadata.name", "is declared twice in this batch"))
    if kind == "Address":
        address = resource.address.spec.address
        twins = [
            resources[i].address.metadata.name
            for i in others
            if kind_of(resources[i]) == "Address"
            and resources[i].address.metadata.space == space
            and resources[i].address.spec.address == address
            and resources[i].address.metadata.name != name
        ]
        if twins:
            out.append(
                Violation(
                    kind,
                    space,
                    name,
                    "spec.address",
                    f"address '{address}' is declared twice in this batch (also by '{twins[0]}')",
                )
            )
    return out


def _validate_round(
    resources: Sequence[resources_pb2.Resource],
    *,
    catalog: Catalog,
    refused: set[int],
    results: list[list[Violation]],
) -> set[int]:
    references = catalog.copy()
    for i, resource in enumerate(resources):
        if i not in refused:
            references.put(resource)
    plans = references.address_plans
    used = references.address_index()
    counted = AddressIndex(catalog.addresses.values(), plans=plans)
    newly: set[int] = set()
    for i, resource in enumerate(resources):
        if i in refused:
            continue
        rules = _Rules(resource, references=references, stored=catalog, used=used, counted=counted)
        found = rules.run()
        if found:
            results[i] = found
            newly.add(i)
        elif resource.WhichOneof("kind") == "address":
            counted.add(resource.address)
    return newly


class AddressIndex:
    """Per address space: who uses each address string, how many addresses it holds and which
    plans they use (for broker credit), kept up to date object by object; so that one check in a
    space of ten thousand addresses, or a batch of thousands, costs no scan of the space.

    Credits are looked up in `plans` (a live dict) when asked, so a plan whose credit changes is
    counted at its new credit."""

    def __init__(
        self,
        addresses: Iterable[resources_pb2.Address],
        *,
        plans: dict[str, resources_pb2.AddressPlan],
    ) -> None:
        self._plans = plans
        self._holders: dict[tuple[str, str], set[str]] = {}
        self._members: dict[str, dict[str, tuple[str, str]]] = {}  # space: name: (address, plan)
        self._plan_counts: dict[str, dict[str, int]] = {}
        for address in addresses:
            self.add(address)

    def add(self, address: resources_pb2.Address) -> None:
        """Adds an address, or replaces the one of the same space and name."""
        space, name = address.metadata.space, address.metadata.name
        self.remove(space, name)
        self._holders.setdefault((space, address.spec.address), set()).add(name)
        self._members.setdefault(space, {})[name] = (address.spec.address, address.spec.plan)
        counts = self._plan_counts.setdefault(space, {})
        counts[address.spec.plan] = counts.get(address.spec.plan, 0) + 1

    def remove(self, space: str, name: str) -> None:
        old = self._members.get(space, {}).pop(name, None)
        if old is None:
            return
        address, plan = old
        self._holders[(space, address)].discard(name)
        counts = self._plan_counts[space]
        counts[plan] -= 1
        if not counts[plan]:
            del counts[plan]

    def credit(self, plan_name: str) -> float:
        plan = self._plans.get(plan_name)
        return plan.spec.broker if plan is not None else 0.0

    def holders(self, space: str, address: str) -> set[str]:
        return self._holders.get((space, address), set())

    def plan_counts(self, space: str) -> dict[str, int]:
        """How many of the space's addresses use each address plan (a copy)."""
        return dict(self._plan_counts.get(space, {}))

    def plans_used(self, space: str, *, without: str = "") -> list[str]:
        """The address plans the space's addresses use (leaving out address `without`)."""
        counts = self.plan_counts(space)
        own = self._members.get(space, {}).get(without)
        if own is not None:
            counts[own[1]] -= 1
        return sorted(plan for plan, count in counts.items() if count > 0)

    def count_without(self, space: str, name: str) -> int:
        members = self._members.get(space, {})
        return len(members) - (1 if name in members else 0)

    def credit_without(self, space: str, name: str) -> float:
        counts = self._plan_counts.get(space, {})
        total = sum(count * self.credit(plan) for plan, count in counts.items())
        own = self._members.get(space, {}).get(name)
        return total - (self.credit(own[1]) if own is not None else 0.0)


# ------------------------------------------------------------------ the rules themselves


class _Rules:
    """The checks of one resource against what exists (`references`, with `used` indexing its
    address strings), what counts against quotas (`counted`) and what is stored (`stored`: tells
    an update from a create)."""

    def __init__(
        self,
        resource: resources_pb2.Resource,
        *,
        references: Catalog,
        stored: Catalog,
        used: AddressIndex,
        counted: AddressIndex,
    ) -> None:
        self.resource = resource
        self.references = references
        self.stored = stored
        self.used = used
        self.counted = counted
        self.found: list[Violation] = []
        self.kind = ""
        self.space = ""
        self.name = ""

    def run(self) -> list[Violation]:
        if self.resource.WhichOneof("kind") is None:
            return [Violation("Resource", "", "", "kind", "the resource holds no object")]
        self.kind, self.space, self.name = key_of(self.resource)
        self.obj = object_of(self.resource)
        self.existing = self.stored.get((self.kind, self.space, self.name))
        self._metadata()
        getattr(self, f"_{self.kind}")()
        return self.found

    def bad(self, field_name: str, message: str, *, precondition: bool = False) -> None:
        self.found.append(
            Violation(self.kind, self.space, self.name, field_name, message, precondition)
        )

    def _metadata(self) -> None:
        meta = self.obj.metadata
        _check_label(meta.name, "metadata.name", self.bad)
        if self.kind in SPACE_SCOPED_KINDS:
            if not meta.space:
                self.bad("metadata.space", "must name the address space")
            elif meta.space not in self.references.address_spaces:
                self.bad(
                    "metadata.space",
                    f"address space '{meta.space}' not found",
                    precondition=True,
                )
        elif meta.space:
            self.bad("metadata.space", f"must be empty: {self.kind} is not space-scoped")

    # -- plans

    def _AddressPlan(self) -> None:
        spec = self.obj.spec
        if spec.address_type not in ADDRESS_TYPES:
            self.bad(
                "spec.address_type", _not_one_of(spec.address_type, "address type", ADDRESS_TYPES)
            )
        if spec.address_type in STORED_TYPES and not spec.broker > 0:
            self.bad(
                "spec.broker",
                f"must be greater than 0 for a {spec.address_type} plan (got {_num(spec.broker)})",
            )
        elif spec.broker < 0:
            self.bad("spec.broker", f"must not be negative (got {_num(spec.broker)})")
        for field_name in ("dead_letter_address", "expiry_address"):
            target = getattr(spec, field_name)
            if target and (problem := address_problem(target)):
                self.bad(f"spec.{field_name}", problem)
        old_type = self.existing.spec.address_type if self.existing is not None else ""
        changed = self.existing is not None and spec.address_type != old_type
        if changed and _address_plan_users(self.name, self.references):
            self.bad(
                "spec.address_type",
                f"cannot change from '{old_type}' while the plan is in use",
                precondition=True,
            )

    def _AddressSpacePlan(self) -> None:
        spec = self.obj.spec
        if spec.address_space_type not in SPACE_TYPES:
            self.bad(
                "spec.address_space_type",
                _not_one_of(spec.address_space_type, "address space type", SPACE_TYPES),
            )
        allowed = TYPES_BY_SPACE_TYPE.get(spec.address_space_type, ADDRESS_TYPES)
        for i, plan_name in enumerate(spec.address_plans):
            plan = self.references.address_plans.get(plan_name)
            if plan is None:
                self.bad(
                    f"spec.address_plans[{i}]",
                    f"address plan '{plan_name}' not found",
                    precondition=True,
                )
            elif plan.spec.address_type not in allowed:
                self.bad(
                    f"spec.address_plans[{i}]",
                    f"address plan '{plan_name}' serves '{plan.spec.address_type}', "
                    f"which {spec.address_space_type} address spaces do not have",
                )
        self._space_queues_creatable()
        self._mqtt_stores_creatable()
        quotas = spec.quotas
        for name in (
            "max_addresses",
            "max_brokers",
            "max_connections",
            "max_routers",
            "max_connections_per_user",
            "max_links_per_connection",
            "max_sessions_per_connection",
        ):
            if getattr(quotas, name) < 0:
                self.bad(f"spec.quotas.{name}", "must not be negative (0 means unlimited)")
        for name in ("connections_per_router", "deliveries_per_router"):
            scaling_problem = router_load_problem(
                space_type=spec.address_space_type, per_router=getattr(quotas, name)
            )
            if scaling_problem:
                self.bad(f"spec.quotas.{name}", scaling_problem)
        size_problem = max_message_size_problem(quotas.max_message_size)
        if size_problem:
            self.bad("spec.quotas.max_message_size", size_problem)
        if spec.HasField("trace_sampling"):
            sampling_problem = tracing.router_sampling_problem(spec.trace_sampling)
            if sampling_problem:
                self.bad("spec.trace_sampling", sampling_problem)
        routers_problem = min_routers_problem(space_type=spec.address_space_type, quotas=quotas)
        if routers_problem:
            self.bad("spec.quotas.min_routers", routers_problem)
        if spec.address_space_type == BROKERED:
            # The login policy is what a standard space's routers enforce; a brokered space has
            # none, so a plan saying it allows more would promise what nobody does.
            for name in ("allow_anonymous", "allow_plain_without_tls"):
                if getattr(spec, name):
                    self.bad(f"spec.{name}", "applies to standard address spaces' routers only")

    def _space_queues_creatable(self) -> None:
        """A space of this plan gets the dead-letter and expiry addresses its plans name as
        queues (`enmasse.resources.dead_letters`): the plan must offer a queue plan for them."""
        plans = self.references.address_plans
        named = named_queues(self.obj.spec.address_plans, plans)
        if named and queue_plan_for(self.obj, plans) is None:
            first = next(iter(named.values()))
            self.bad(
                "spec.address_plans",
                f"'{first.address}' is {first.describe()}, which an address space of this "
                "plan gets as a queue, but the plan lists no queue plan to create it with",
            )

    def _mqtt_stores_creatable(self) -> None:
        """A plan that serves MQTT gives its spaces the gateway's store queues
        (`enmasse.resources.mqtt_stores`): a standard plan, with a persistent queue plan."""
        spec = self.obj.spec
        if not spec.mqtt:
            return
        if spec.address_space_type != STANDARD:
            self.bad("spec.mqtt", "applies to standard address spaces only (their MQTT gateway)")
        elif store_queue_plan(self.obj, self.references.address_plans) is None:
            self.bad(
                "spec.mqtt",
                "an address space of this plan gets the MQTT gateway's store queues "
                f"({', '.join(STORE_ADDRESSES)}), but the plan lists no persistent queue plan "
                "to create them with",
            )

    # -- tenant resources

    def _AddressSpace(self) -> None:
        spec = self.obj.spec
        if spec.type not in SPACE_TYPES:
            self.bad("spec.type", _not_one_of(spec.type, "address space type", SPACE_TYPES))
        if self.existing is not None and spec.type != self.existing.spec.type:
            self.bad(
                "spec.type", f"cannot change from '{self.existing.spec.type}' to '{spec.type}'"
            )
        if not spec.plan:
            self.bad("spec.plan", "must name an address space plan")
            return
        plan = self.references.address_space_plans.get(spec.plan)
        if plan is None:
            self.bad("spec.plan", f"address space plan '{spec.plan}' not found", precondition=True)
        elif spec.type in SPACE_TYPES and plan.spec.address_space_type != spec.type:
            self.bad(
                "spec.plan",
                f"address space plan '{spec.plan}' is for {plan.spec.address_space_type} "
                f"address spaces, not {spec.type}",
                precondition=True,
            )
        elif self.existing is not None and self.existing.spec.plan != spec.plan:
            self._plan_change_fits(plan)

    def _plan_change_fits(self, plan: resources_pb2.AddressSpacePlan) -> None:
        addresses = [a for (s, _), a in self.references.addresses.items() if s == self.name]
        for address in addresses:
            if address.spec.plan not in plan.spec.address_plans:
                self.bad(
                    "spec.plan",
                    f"address space plan '{plan.metadata.name}' does not allow address plan "
                    f"'{address.spec.plan}' of address '{address.metadata.name}'",
                    precondition=True,
                )
        limit = plan.spec.quotas.max_addresses
        if limit and len(addresses) > limit:
            self.bad(
                "spec.plan",
                f"address space plan '{plan.metadata.name}' allows {limit} addresses, "
                f"the space has {len(addresses)}",
                precondition=True,
            )

    def _Address(self) -> None:
        spec = self.obj.spec
        self._address_string(spec.address)
        type_ok = spec.type in ADDRESS_TYPES
        if not type_ok:
            self.bad("spec.type", _not_one_of(spec.type, "address type", ADDRESS_TYPES))
        if self.existing is not None and spec.type != self.existing.spec.type:
            self.bad(
                "spec.type", f"cannot change from '{self.existing.spec.type}' to '{spec.type}'"
            )
        space = self.references.address_spaces.get(self.space)
        if space is not None and type_ok:
            allowed = TYPES_BY_SPACE_TYPE.get(space.spec.type, ADDRESS_TYPES)
            if spec.type not in allowed:
                self.bad(
                    "spec.type",
                    f"type '{spec.type}' is not allowed in a {space.spec.type} address space "
                    f"(allowed: {', '.join(allowed)})",
                )
        self._topic(spec)
        self._address_plan(spec, space)
        if space is not None and type_ok and spec.type != QUEUE:
            self._not_a_space_queue(spec, space)
        if space is not None and spec.address and len(spec.address) <= MAX_ADDRESS_LENGTH:
            self._unique_address(spec.address)
        if space is not None:
            self._quotas(space)

    def _not_a_space_queue(
        self, spec: resources_pb2.AddressSpec, space: resources_pb2.AddressSpace
    ) -> None:
        space_plan = self.references.address_space_plans.get(space.spec.plan)
        if space_plan is None:
            return
        plans = self.references.address_plans
        named = named_queues(space_plan.spec.address_plans, plans).get(spec.address)
        named = named or store_queues(space_plan).get(spec.address)
        if named is not None:
            self.bad(
                "spec.type",
                f"address '{spec.address}' is {named.describe()} in address space "
                f"'{self.space}': it must be a queue, not '{spec.type}'",
            )

    def _address_string(self, address: str) -> None:
        if problem := address_problem(address):
            self.bad("spec.address", problem)

    def _topic(self, spec: resources_pb2.AddressSpec) -> None:
        if spec.type != SUBSCRIPTION:
            if spec.topic:
                self.bad("spec.topic", "only a subscription names a topic")
            return
        if not spec.topic:
            self.bad("spec.topic", "a subscription must name its topic address")
            return
        topic = self.references.addresses.get((self.space, spec.topic))
        if topic is None:
            self.bad(
                "spec.topic",
                f"topic address '{spec.topic}' not found in address space '{self.space}'",
                precondition=True,
            )
        elif topic.spec.type != TOPIC:
            self.bad(
                "spec.topic",
                f"address '{spec.topic}' is of type '{topic.spec.type}', not 'topic'",
                precondition=True,
            )

    def _address_plan(
        self, spec: resources_pb2.AddressSpec, space: resources_pb2.AddressSpace | None
    ) -> None:
        if not spec.plan:
            self.bad("spec.plan", "must name an address plan")
            return
        plan = self.references.address_plans.get(spec.plan)
        if plan is None:
            self.bad("spec.plan", f"address plan '{spec.plan}' not found", precondition=True)
            return
        if spec.type in ADDRESS_TYPES and plan.spec.address_type != spec.type:
            self.bad(
                "spec.plan",
                f"address plan '{spec.plan}' serves type '{plan.spec.address_type}', "
                f"not '{spec.type}'",
                precondition=True,
            )
        if space is None:
            return
        space_plan = self.references.address_space_plans.get(space.spec.plan)
        if space_plan is not None and spec.plan not in space_plan.spec.address_plans:
            self.bad(
                "spec.plan",
                f"address plan '{spec.plan}' is not allowed by address space plan "
                f"'{space.spec.plan}'",
                precondition=True,
            )

    def _unique_address(self, address: str) -> None:
        others = sorted(self.used.holders(self.space, address) - {self.name})
        if others:
            self.bad(
                "spec.address",
                f"address '{address}' is already used by address '{others[0]}' "
                f"in address space '{self.space}'",
                precondition=True,
            )

    def _quotas(self, space: resources_pb2.AddressSpace) -> None:
        plan = self.references.address_space_plans.get(space.spec.plan)
        if plan is None:
            return
        others = self.counted.count_without(self.space, self.name)
        limit = plan.spec.quotas.max_addresses
        if limit and others + 1 > limit:
            self.bad(
                "metadata.name",
                f"address space '{self.space}' already has {others} addresses, the most "
                f"its plan '{plan.metadata.name}' allows",
                precondition=True,
            )
        max_brokers = plan.spec.quotas.max_brokers
        if max_brokers:
            need = self.counted.credit_without(self.space, self.name)
            need += self.counted.credit(self.obj.spec.plan)
            if need > max_brokers + 1e-6:
                self.bad(
                    "spec.plan",
                    f"the addresses of address space '{self.space}' would need {_num(need)} "
                    f"brokers, more than the {_num(max_brokers)} its plan "
                    f"'{plan.metadata.name}' allows",
                    precondition=True,
                )

    def _MessagingUser(self) -> None:
        spec = self.obj.spec
        if not spec.username:
            self.bad("spec.username", "must not be empty")
        elif any(c.isspace() for c in spec.username):
            self.bad("spec.username", f"'{spec.username}' must not contain whitespace")
        elif spec.username == MQTT_STORE_USER:
            self.bad(
                "spec.username",
                f"'{spec.username}' is reserved: the MQTT gateway's store identity logs in as it",
            )
        if not spec.password and (self.existing is None or not self.existing.spec.password_hash):
            self.bad("spec.password", "is required when a messaging user is created")
        for i, rule in enumerate(spec.authorization):
            if not rule.addresses:
                self.bad(f"spec.authorization[{i}].addresses", "must name at least one address")
            for pattern in rule.addresses:
                if problem := pattern_problem(pattern):
                    self.bad(f"spec.authorization[{i}].addresses", problem)
            if not rule.operations:
                self.bad(f"spec.authorization[{i}].operations", "must name at least one operation")
            for operation in rule.operations:
                if operation not in OPERATIONS:
                    self.bad(
                        f"spec.authorization[{i}].operations",
                        _not_one_of(operation, "operation", OPERATIONS),
                    )
        self._unique_username(spec.username)

    def _unique_username(self, username: str) -> None:
        for (space, name), other in self.references.messaging_users.items():
            if space == self.space and name != self.name and other.spec.username == username:
                self.bad(
                    "spec.username",
                    f"username '{username}' is already used by messaging user '{name}'",
                    precondition=True,
                )
                return


def _space_queue_kept(key: Key, catalog: Catalog) -> list[Violation]:
    """An address holding the dead-letter or expiry address of a plan its space's other
    addresses use stays, and so does a store queue of a space whose plan serves MQTT."""
    kind, space, name = key
    address = catalog.addresses.get((space, name))
    if address is None:
        return []
    used = catalog.address_index().plans_used(space, without=name)
    named = named_queues(used, catalog.address_plans).get(address.spec.address)
    if named is not None:
        message = (
            f"holds '{named.address}', {named.describe()}, which addresses of address space "
            f"'{space}' use: it can be deleted once none does, or with the space"
        )
        return [Violation(kind, space, name, "metadata.name", message, True)]
    address_space = catalog.address_spaces.get(space)
    space_plan = catalog.address_space_plans.get(address_space.spec.plan) if address_space else None
    store = store_queues(space_plan).get(address.spec.address)
    if store is None:
        return []
    message = (
        f"holds '{store.address}', {store.describe()}, which the MQTT gateway of address space "
        f"'{space}' uses: it goes with the space, or once its plan no longer serves MQTT"
    )
    return [Violation(kind, space, name, "metadata.name", message, True)]


def _address_plan_users(name: str, catalog: Catalog) -> list[Violation]:
    out = []
    for (space, address_name), address in sorted(catalog.addresses.items()):
        if address.spec.plan == name:
            out.append(f"is used by address '{space}/{address_name}'")
    for plan_name, plan in sorted(catalog.address_space_plans.items()):
        if name in plan.spec.address_plans:
            out.append(f"is listed by address space plan '{plan_name}'")
    return [Violation("AddressPlan", "", name, "metadata.name", m, True) for m in out]


def _check_label(value: str, field_name: str, bad: Callable[[str, str], None]) -> None:
    if not value:
        bad(field_name, "must not be empty")
    elif len(value) > 63:
        bad(field_name, f"must be at most 63 characters (got {len(value)})")
    elif not _DNS_1123_LABEL.fullmatch(value):
        bad(
            field_name,
            f"'{value}' is not a DNS-1123 label (lower-case letters, digits and '-', "
            "starting and ending with a letter or digit)",
        )


def _not_one_of(value: str, what: str, allowed: Iterable[str]) -> str:
    return f"'{value}' is not an {what} (one of {', '.join(allowed)})"


def _num(value: float) -> str:
    return f"{value:g}"
