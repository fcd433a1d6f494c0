"""The write path of the config service, as pure functions over a catalog of the store.

In: a requested change (create, update, delete, status update, a batch of status updates, or
an Apply batch) and the
`Catalog` of everything stored, as of the last write. Out: a `Commit` (what to put and delete, in
one transaction) and what to answer, or `Refused` with the gRPC status code and the exact message.
The catalog is only read, never changed: it is the service's shared cache.

Nothing here touches the network, so every rule (compare-and-swap on resource_version, generation
bookkeeping, password hashing, Apply's scope / prune / unchanged logic) is tested without etcd; the
servicer only fetches the catalog, calls these and commits.

Every create, update and Apply also gives each address space it touches the dead-letter and
expiry queues that the plans of its addresses name and it lacks (`with_space_queues`,
`enmasse.resources.dead_letters`), in the same transaction: the first queue of a plan that names
`DLQ` is stored with the space's `DLQ` queue, whatever wrote it (the API, `enmasse apply`, the
GitOps sync). A plan write touches every space; an address write its own space (an address that
gave up such a string leaves a gap to fill too). A queue the rules refuse (a quota) refuses the
write that needed it, or, in an Apply, comes back REFUSED beside the rest. A space whose plan
serves MQTT gets the gateway's store queues (`mqtt/retained`, `mqtt/wills`, `mqtt/sessions`;
`enmasse.resources.mqtt_stores`) the same way, from its creation on.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
from enmasse.common.passwords import (
    hash_password,
    scram_credentials,
    verify_password,
)
from enmasse.config.store import Commit
from enmasse.resources.dead_letters import (
    NamedQueue,
    named_queues,
    queue_plan_for,
    space_queue,
)
from enmasse.resources.kinds import (
    KINDS,
    SPACE_SCOPED_KINDS,
    AnyObject,
    Key,
    key_of,
    kind_of,
    object_of,
    resource_of,
)
from enmasse.resources.mqtt_stores import store_queue_plan, store_queues
from enmasse.resources.status_batches import ENTRY_TRAILER
from enmasse.resources.validation import (
    AddressIndex,
    Catalog,
    Violation,
    validate_batch,
    validate_delete,
    validate_resource,
)
from enmasse.v1 import config_pb2, resources_pb2
from google.protobuf import timestamp_pb2

PLAN_KINDS = ("AddressSpacePlan", "AddressPlan")
Action = config_pb2.ApplyResult.Action


class Refused(Exception):
    """A request the service refuses: the gRPC status code and the message the caller sees
    (and `trailers`, trailing metadata for a program to read: the refused entry of a batch)."""

    def __init__(
        self, code: grpc.StatusCode, message: str, *, trailers: tuple[tuple[str, str], ...] = ()
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.trailers = trailers


def describe(key: Key) -> str:
    kind, space, name = key
    return f"{kind} {space + '/' if space else ''}{name}"


def refusal_of(violations: Sequence[Violation]) -> Refused:
    code = (
        grpc.StatusCode.FAILED_PRECONDITION
        if all(v.precondition for v in violations)
        else grpc.StatusCode.INVALID_ARGUMENT
    )
    return Refused(code, "; ".join(str(v) for v in violations))


def check_version(key: Key, *, existing: AnyObject | None, resource_version: int) -> AnyObject:
    """The stored object, if `resource_version` (0: any) is its current one; else Refused."""
    if existing is None:
        raise Refused(grpc.StatusCode.NOT_FOUND, f"{describe(key)} not found")
    current = existing.metadata.resource_version
    if resource_version and resource_version != current:
        raise Refused(
            grpc.StatusCode.ABORTED,
            f"{describe(key)} has been modified: resource_version {resource_version} is stale, "
            f"current is {current}",
        )
    return existing


# ---------------------------------------------------------------- single-object writes


def plan_create(obj: AnyObject, *, catalog: Catalog) -> tuple[Commit, AnyObject]:
    key = key_of(obj)
    if catalog.get(key) is not None:
        raise Refused(grpc.StatusCode.ALREADY_EXISTS, f"{describe(key)} already exists")
    desired = _input_form(obj)
    violations = validate_resource(resource_of(desired), catalog=catalog)
    if violations:
        raise refusal_of(violations)
    stored = created(desired)
    commit = Commit(puts={key: stored})
    _refuse_unless_made(with_space_queues(commit, catalog=catalog))
    return commit, stored


def plan_update(obj: AnyObject, *, catalog: Catalog) -> tuple[Commit, AnyObject]:
    key = key_of(obj)
    existing = check_version(
        key, existing=catalog.get(key), resource_version=obj.metadata.resource_version
    )
    desired = _input_form(obj)
    violations = validate_resource(resource_of(desired), catalog=catalog)
    if violations:
        raise refusal_of(violations)
    stored = updated(desired, existing=existing)
    commit = Commit(puts={key: stored})
    _refuse_unless_made(with_space_queues(commit, catalog=catalog))
    return commit, stored


def plan_delete(key: Key, *, resource_version: int, catalog: Catalog) -> Commit:
    check_version(key, existing=catalog.get(key), resource_version=resource_version)
    violations = validate_delete(key, catalog=catalog)
    if violations:
        raise refusal_of(violations)
    emptied = [key[2]] if key[0] == "AddressSpace" else []
    return Commit(deletes=[key], emptied_spaces=emptied)


def plan_status(
    key: Key, *, status: object, resource_version: int, catalog: Catalog
) -> tuple[Commit, AnyObject]:
    """A controller's status update: the spec and generation stay as they are."""
    existing = check_version(key, existing=catalog.get(key), resource_version=resource_version)
    stored = _copy(existing)
    stored.status.CopyFrom(status)
    return Commit(puts={key: stored}), stored


@dataclass(frozen=True)
class StatusWrite:
    """One entry of a batch of status writes: which object, its new status, the precondition."""

    key: Key
    status: Any
    resource_version: int


def plan_statuses(
    batch: Sequence[StatusWrite], *, catalog: Catalog, total: int = 0
) -> list[tuple[Key, AnyObject]]:
    """A batch of status updates, all or nothing: each entry's object with its new status, in
    order; Refused for the first entry that is stale, missing or named twice, the message naming
    it (`total`: how many entries the whole batch has, when `batch` is the rest of one)."""
    seen: set[Key] = set()
    total = total or len(batch)
    first = total - len(batch)
    out: list[tuple[Key, AnyObject]] = []
    for index, entry in enumerate(batch, start=first):
        try:
            if entry.key in seen:
                raise Refused(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"{describe(entry.key)} appears more than once in the batch",
                )
            seen.add(entry.key)
            commit, _ = plan_status(
                entry.key,
                status=entry.status,
                resource_version=entry.resource_version,
                catalog=catalog,
            )
        except Refused as refused:
            raise Refused(
                refused.code,
                f"entries[{index}] of {total}: {refused.message}",
                trailers=((ENTRY_TRAILER, str(index)),),
            ) from refused
        out.extend(commit.puts.items())
    return out


# ---------------------------------------------------------------- bookkeeping


def created(desired: AnyObject) -> AnyObject:
    stored = _copy(desired)
    stored.metadata.generation = 1
    stored.metadata.uid = str(uuid.uuid4())
    stored.metadata.created_at.CopyFrom(_now())
    stored.metadata.resource_version = 0
    status = KINDS[kind_of(stored)].status
    if status:
        stored.ClearField(status)  # status belongs to controllers, not to creators
    if kind_of(stored) == "MessagingUser":
        _hash_into(stored)
    return stored


def updated(desired: AnyObject, *, existing: AnyObject) -> AnyObject:
    stored = _copy(desired)
    meta = stored.metadata
    meta.uid = existing.metadata.uid
    meta.created_at.CopyFrom(existing.metadata.created_at)
    meta.managed_by = meta.managed_by or existing.metadata.managed_by
    status = KINDS[kind_of(stored)].status
    if status:
        getattr(stored, status).CopyFrom(getattr(existing, status))
    changed = spec_changed(desired, existing=existing)
    if kind_of(stored) == "MessagingUser":
        if stored.spec.password:
            _hash_into(stored)
        else:
            stored.spec.password_hash = existing.spec.password_hash
            stored.spec.scram_credentials.extend(existing.spec.scram_credentials)
    meta.generation = existing.metadata.generation + (1 if changed else 0)
    return stored


def spec_changed(desired: AnyObject, *, existing: AnyObject) -> bool:
    """Whether the spec differs; a user's clear password counts as a change unless it verifies
    against a stored user that has its SCRAM keys (one stored before they existed gets them when
    its manifest is applied again)."""
    if kind_of(desired) != "MessagingUser":
        return desired.spec != existing.spec
    wanted, stored = _copy(desired.spec), _copy(existing.spec)
    password = wanted.password
    for spec in (wanted, stored):
        spec.password = ""
        spec.password_hash = ""
        spec.ClearField("scram_credentials")
    if wanted != stored:
        return True
    if not password:
        return False
    return not existing.spec.scram_credentials or not verify_password(
        password, existing.spec.password_hash
    )


def unchanged(desired: AnyObject, *, existing: AnyObject) -> bool:
    meta, old = desired.metadata, existing.metadata
    return (
        not spec_changed(desired, existing=existing)
        and dict(meta.labels) == dict(old.labels)
        and dict(meta.annotations) == dict(old.annotations)
        and meta.managed_by == old.managed_by
    )


def public_form(obj: AnyObject, *, secrets: bool = False) -> AnyObject:
    """What callers see: never a clear password (it is never stored anyway), and none of the
    kind's secret fields (`Kind.secrets`: a user's password hash) unless `secrets` (the control
    plane's Watch with_secrets). A copy when anything is cleared, else `obj` itself."""
    paths = [] if secrets else list(KINDS[kind_of(obj)].secrets)
    if kind_of(obj) == "MessagingUser":
        paths.append("spec.password")
    present = [path for path in paths if _has(obj, path)]
    if not present:
        return obj
    obj = _copy(obj)
    for path in present:
        parent, _, leaf = path.rpartition(".")
        _field(obj, parent).ClearField(leaf)
    return obj


def _field(obj: Any, path: str) -> Any:
    for part in path.split(".") if path else ():
        obj = getattr(obj, part)
    return obj


def _has(obj: Any, path: str) -> bool:
    parent, _, leaf = path.rpartition(".")
    return bool(getattr(_field(obj, parent), leaf))


def _input_form(obj: AnyObject) -> AnyObject:
    out = _copy(obj)
    if kind_of(out) == "MessagingUser":
        out.spec.password_hash = ""  # output only: a caller cannot set a hash, nor SCRAM keys
        out.spec.ClearField("scram_credentials")
    return out


def _hash_into(user: resources_pb2.MessagingUser) -> None:
    """The clear password becomes what is stored: its scrypt hash (PLAIN logins) and a salted
    SCRAM credential per mechanism (SCRAM logins); the password itself is dropped."""
    password = user.spec.password
    if password:
        user.spec.password_hash = hash_password(password)
        user.spec.ClearField("scram_credentials")
        user.spec.scram_credentials.extend(scram_credentials(password))
    user.spec.password = ""


def _copy(obj: Any) -> Any:
    out = type(obj)()
    out.CopyFrom(obj)
    return out


def _now() -> timestamp_pb2.Timestamp:
    stamp = timestamp_pb2.Timestamp()
    stamp.GetCurrentTime()
    return stamp


# ---------------------------------------------------------------- Apply


@dataclass
class ApplyPlan:
    results: list[config_pb2.ApplyResult] = field(default_factory=list)
    commit: Commit = field(default_factory=Commit)


def plan_apply(
    request: config_pb2.ApplyRequest,
    *,
    catalog: Catalog,
    unchanged_check: Callable[..., bool] = unchanged,
) -> ApplyPlan:
    """What an Apply does to the catalog: per resource CREATED / UPDATED / UNCHANGED / REFUSED, and
    PRUNED for what `manager` owns in scope and the batch lacks. Refused with INVALID_ARGUMENT
    when `atomic` and anything is refused (the message lists every refusal)."""
    batch = [_scoped(resource, request) for resource in request.resources]
    scope_errors = [_scope_violation(resource, request) for resource in batch]
    keys = {key_of(r) for r, bad in zip(batch, scope_errors, strict=True) if not bad}
    pruned = _prune_set(request, catalog=catalog, keep=keys) if request.prune else []
    remaining = catalog.copy()
    for key in pruned:
        remaining.remove(key)
    checkable = [r for r, bad in zip(batch, scope_errors, strict=True) if not bad]
    verdicts = iter(validate_batch(checkable, catalog=remaining))
    plan = ApplyPlan()
    after = remaining.copy()
    for resource, scope_error in zip(batch, scope_errors, strict=True):
        violations = [scope_error] if scope_error else next(verdicts)
        plan.results.append(
            _apply_one(
                resource,
                violations,
                catalog=catalog,
                plan=plan,
                after=after,
                unchanged_check=unchanged_check,
            )
        )
    _prune_into(plan, pruned, catalog=catalog, after=after)
    plan.results.extend(_space_queue_results(with_space_queues(plan.commit, catalog=catalog)))
    refusals = [r for r in plan.results if r.action == Action.REFUSED]
    if request.atomic and refusals:
        raise Refused(
            grpc.StatusCode.INVALID_ARGUMENT,
            "apply refused: " + "; ".join(r.message for r in refusals),
        )
    return plan


def _apply_one(
    resource: resources_pb2.Resource,
    violations: list[Violation],
    *,
    catalog: Catalog,
    plan: ApplyPlan,
    after: Catalog,
    unchanged_check: Callable[..., bool],
) -> config_pb2.ApplyResult:
    key = key_of(resource) if resource.WhichOneof("kind") else ("Resource", "", "")
    result = config_pb2.ApplyResult(
        kind=key[0], ref=config_pb2.ObjectRef(space=key[1], name=key[2])
    )
    if violations:
        result.action = Action.REFUSED
        result.message = "; ".join(str(v) for v in violations)
        return result
    desired = _input_form(object_of(resource))
    existing = catalog.get(key)
    if existing is None:
        stored, result.action = created(desired), Action.CREATED
    elif unchanged_check(desired, existing=existing):
        result.action = Action.UNCHANGED
        return result
    else:
        stored, result.action = updated(desired, existing=existing), Action.UPDATED
    plan.commit.puts[key] = stored
    after.put(resource_of(stored))
    return result


def _prune_into(plan: ApplyPlan, pruned: list[Key], *, catalog: Catalog, after: Catalog) -> None:
    refused = _refused_prunes(pruned, catalog=catalog, after=after)
    for key in pruned:
        result = config_pb2.ApplyResult(
            kind=key[0], ref=config_pb2.ObjectRef(space=key[1], name=key[2])
        )
        if key in refused:
            result.action = Action.REFUSED
            result.message = "; ".join(str(v) for v in refused[key])
        else:
            result.action = Action.PRUNED
            plan.commit.deletes.append(key)
            if key[0] == "AddressSpace":
                plan.commit.emptied_spaces.append(key[2])
        plan.results.append(result)


def _refused_prunes(
    pruned: list[Key], *, catalog: Catalog, after: Catalog
) -> dict[Key, list[Violation]]:
    """The prunes refused (a plan still in use), to a fixpoint: a plan kept because it is in use
    keeps in use the plans it lists."""
    refused: dict[Key, list[Violation]] = {}
    changed = True
    while changed:
        changed = False
        for key in pruned:
            if key in refused:
                continue
            violations = validate_delete(key, catalog=after)
            if violations:
                refused[key] = violations
                after.put(resource_of(catalog.get(key)))  # type: ignore[arg-type]
                changed = True
    return refused


def _scoped(
    resource: resources_pb2.Resource, request: config_pb2.ApplyRequest
) -> resources_pb2.Resource:
    out = resources_pb2.Resource()
    out.CopyFrom(resource)
    if out.WhichOneof("kind") is None:
        return out
    obj = object_of(out)
    if kind_of(obj) in SPACE_SCOPED_KINDS and not obj.metadata.space:
        obj.metadata.space = request.space
    if request.manager:
        obj.metadata.managed_by = request.manager
    return out


def _scope_violation(
    resource: resources_pb2.Resource, request: config_pb2.ApplyRequest
) -> Violation | None:
    if resource.WhichOneof("kind") is None:
        return Violation("Resource", "", "", "kind", "the resource holds no object")
    kind, space, name = key_of(resource)
    in_scope = (
        (kind in PLAN_KINDS and not request.space)
        or (kind == "AddressSpace" and name == request.space)
        or (kind in SPACE_SCOPED_KINDS and request.space and space == request.space)
    )
    if in_scope:
        return None
    scope = f"address space '{request.space}'" if request.space else "plans (no space)"
    return Violation(kind, space, name, "metadata", f"is outside the scope of this apply: {scope}")


def _prune_set(request: config_pb2.ApplyRequest, *, catalog: Catalog, keep: set[Key]) -> list[Key]:
    if not request.manager:
        raise Refused(grpc.StatusCode.INVALID_ARGUMENT, "prune needs a manager")
    owned = [key for key, obj in catalog.objects() if obj.metadata.managed_by == request.manager]
    in_scope = [key for key in owned if _key_in_scope(key, request.space)]
    return sorted(key for key in in_scope if key not in keep)


def _key_in_scope(key: Key, space: str) -> bool:
    kind, key_space, name = key
    if not space:
        return kind in PLAN_KINDS
    return key_space == space or (kind == "AddressSpace" and name == space)


# ---------------------------------------------------------------- the spaces' own queues


@dataclass
class SpaceQueue:
    """A dead-letter or expiry queue a write gives a space: stored, or refused with why."""

    address: AnyObject
    why: str  # `the dead-letter address of address plan 'standard-small-queue'`
    violations: list[Violation] = field(default_factory=list)


def with_space_queues(
    commit: Commit, *, catalog: Catalog, spaces: set[str] | None = None
) -> list[SpaceQueue]:
    """Adds to `commit` the queues the spaces it touches (or `spaces`) lack once it is done
    (see the module docstring); returns them, the refused ones (not added) with their
    violations."""
    spaces = _touched_spaces(commit, catalog) if spaces is None else spaces
    if not spaces:
        return []
    after: Catalog | None = None  # built only when something is missing: a copy costs
    made: list[SpaceQueue] = []
    for space in sorted(spaces):
        for named, plan in _missing(space, commit=commit, catalog=catalog):
            after = after if after is not None else _after(commit, catalog)
            taken = {name for s, name in after.addresses if s == space}
            desired = space_queue(space=space, named=named, plan=plan, taken=taken)
            found = SpaceQueue(desired, named.describe())
            found.violations = validate_resource(resource_of(desired), catalog=after)
            if not found.violations:
                stored = created(desired)
                commit.puts[key_of(stored)] = stored
                after.put(stored)
                found.address = stored
            made.append(found)
    return made


def plan_space_queues(*, catalog: Catalog) -> tuple[Commit, list[SpaceQueue]]:
    """Every space's missing dead-letter and expiry queues, for a store written before the
    config service created them with the space (it runs this once at start)."""
    commit = Commit()
    made = with_space_queues(commit, catalog=catalog, spaces=set(catalog.address_spaces))
    return commit, made


def _touched_spaces(commit: Commit, catalog: Catalog) -> set[str]:
    gone = set(commit.emptied_spaces) | {k[2] for k in commit.deletes if k[0] == "AddressSpace"}
    if any(key[0] in PLAN_KINDS for key in commit.puts):
        return set(catalog.address_spaces) - gone | _put_spaces(commit)
    spaces = _put_spaces(commit) | {key[1] for key in commit.puts if key[0] == "Address"}
    return spaces - gone


def _put_spaces(commit: Commit) -> set[str]:
    return {key[2] for key in commit.puts if key[0] == "AddressSpace"}


def _missing(space: str, *, commit: Commit, catalog: Catalog) -> list[tuple[NamedQueue, str]]:
    """(named queue, queue plan) for each address the space's plans name and no address of the
    space holds once `commit` is done; looked up without copying the catalog."""
    address_space = commit.puts.get(("AddressSpace", "", space)) or catalog.address_spaces.get(
        space
    )
    if address_space is None:
        return []
    plan_key = ("AddressSpacePlan", "", address_space.spec.plan)
    space_plan = commit.puts.get(plan_key) or catalog.address_space_plans.get(plan_key[2])
    plans: dict[str, resources_pb2.AddressPlan] = catalog.address_plans
    changed_plans = {k[2]: o for k, o in commit.puts.items() if k[0] == "AddressPlan"}
    if changed_plans:
        plans = {**plans, **changed_plans}
    index = catalog.address_index()
    written = {k[2]: o for k, o in commit.puts.items() if k[0] == "Address" and k[1] == space}
    deleted = {k[2] for k in commit.deletes if k[0] == "Address" and k[1] == space}
    stores = store_queues(space_plan)
    store_plan = store_queue_plan(space_plan, plans) if stores else None
    used = _plans_used(space, index, written, deleted, catalog)
    if store_plan is not None:
        used.add(store_plan)  # the store queues' own dead-letter queue comes with them
    named = named_queues(used, plans)
    queue_plan = queue_plan_for(space_plan, plans) if named else None
    # A space plan without the queue plan the rules ask for (stored before them) creates none.
    wanted = [(queue, queue_plan) for queue in named.values() if queue_plan is not None]
    wanted += [(queue, store_plan) for queue in stores.values() if store_plan is not None]
    missing = []
    for queue, plan in wanted:
        holders = index.holders(space, queue.address) - deleted - set(written)
        holders |= {name for name, obj in written.items() if obj.spec.address == queue.address}
        if not holders:
            missing.append((queue, plan))
    return missing


def _plans_used(
    space: str,
    index: AddressIndex,
    written: dict[str, AnyObject],
    deleted: set[str],
    catalog: Catalog,
) -> set[str]:
    """The address plans the space's addresses use once the commit is done."""
    counts = index.plan_counts(space)
    for name in deleted | set(written):
        old = catalog.addresses.get((space, name))
        if old is not None:
            counts[old.spec.plan] -= 1
    for address in written.values():
        counts[address.spec.plan] = counts.get(address.spec.plan, 0) + 1
    return {plan for plan, count in counts.items() if count > 0}


def _after(commit: Commit, catalog: Catalog) -> Catalog:
    """The catalog as it will be once `commit` is done."""
    after = catalog.copy()
    for key in commit.deletes:
        after.remove(key)
    for space in commit.emptied_spaces:
        for s, name in [k for k in after.addresses if k[0] == space]:
            after.remove(("Address", s, name))
        for s, name in [k for k in after.messaging_users if k[0] == space]:
            after.remove(("MessagingUser", s, name))
    for obj in commit.puts.values():
        after.put(obj)
    return after


def _refuse_unless_made(made: list[SpaceQueue]) -> None:
    """A single write that needed a queue the rules refuse is refused, saying which and why."""
    refused = [q for q in made if q.violations]
    if not refused:
        return
    first = refused[0]
    space = first.address.metadata.space
    refusal = refusal_of(first.violations)
    raise Refused(
        refusal.code,
        f"address space '{space}' needs a queue for '{first.address.spec.address}', {first.why}, "
        f"and it cannot be created: {refusal.message}",
    )


def _space_queue_results(made: list[SpaceQueue]) -> list[config_pb2.ApplyResult]:
    results = []
    for queue in made:
        result = config_pb2.ApplyResult(
            kind="Address",
            ref=config_pb2.ObjectRef(
                space=queue.address.metadata.space, name=queue.address.metadata.name
            ),
            action=Action.REFUSED if queue.violations else Action.CREATED,
        )
        if queue.violations:
            result.message = (
                f"the queue of '{queue.address.spec.address}', {queue.why}: "
                + "; ".join(str(v) for v in queue.violations)
            )
        results.append(result)
    return results
