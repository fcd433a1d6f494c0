"""Who may do what through the ConfigService: the roles, and one pure function that decides.

In: an `Identity` (a token's name, role and address spaces, or `OPEN` when config runs without
--auth), the RPC called (`CreateAddress`, `Watch`, ...) and the address space it is about.
Out: a `Decision`: allowed, or refused with the message the caller reads (PERMISSION_DENIED).

The roles, in one table (`ROLES`):

| role         | reads                 | writes (Create, Update, Delete) | also                 |
|--------------|-----------------------|---------------------------------|-----------------------|
| admin        | everything            | every kind                      | status, Apply, tokens |
| tenant-admin | its spaces, the plans | its spaces' Address and         | Apply to its spaces   |
|              |                       | MessagingUser                   | (those kinds only)    |
| viewer       | its spaces, the plans | nothing                         |                       |
| controller   | everything            | nothing                         | status; secrets       |
| subscription | everything            | Address (topic annotations)     |                       |
| gitops       | everything            | AddressSpace, Address,          | Apply to a space      |
|              |                       | MessagingUser, by Apply only    |                       |
| open         | everything            | every kind                      | everything (no auth)  |

`controller` is the router-agent's and the storage-controller's identity, `subscription` the
subscription service's (it records which broker holds a durable subscription in the topic's
annotations), `gitops` the GitOps sync's. A tenant's space is the `AddressSpace` of that name,
its addresses and its users; a tenant-admin reads its space (and its status) but does not
change or delete it: that is the admin's, as are the plans every space uses.

What an RPC is (`OPERATIONS`: a verb and a kind) is read from the service's own descriptor, so a
new RPC that matches the naming (`Get<Kind>`, `List...`, `Update<Kind>Status`, its batch
`Update<Kind>Statuses`, ...) needs no new rule, and one that does not is refused to everybody
until it gets one.

"secrets" (a user's password hash, on a Watch `with_secrets`) are the control plane's only: not
even the admin reads them back.

Nothing here touches the network or the store: the servicer authenticates, then asks here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from enmasse.resources.kinds import KINDS, SPACE_SCOPED_KINDS, Key
from enmasse.v1 import config_pb2

ADMIN = "admin"
TENANT_ADMIN = "tenant-admin"
VIEWER = "viewer"
CONTROLLER = "controller"
SUBSCRIPTION = "subscription"
GITOPS = "gitops"
OPEN_ROLE = "open"

READ, WRITE, STATUS, APPLY, SECRETS, TOKENS = (
    "read",
    "write",
    "status",
    "apply",
    "secrets",
    "tokens",
)
WATCH_WITH_SECRETS = "WatchWithSecrets"
"""Not an RPC: a Watch that asks for secrets, authorized on its own."""


@dataclass(frozen=True)
class Operation:
    verb: str
    kind: str = ""
    """The resource kind it reads or writes ("" for Watch, Apply and the token RPCs)."""


@dataclass(frozen=True)
class Role:
    name: str
    verbs: frozenset[str]
    writes: frozenset[str] = frozenset()
    """The kinds its writes (single or through Apply) may create, change or delete."""
    scoped: bool = False
    """Only the address spaces its token names (and the plans, to read)."""


@dataclass(frozen=True)
class Identity:
    name: str
    role: str
    spaces: frozenset[str] = frozenset()

    def describe(self) -> str:
        """`token 'alice' (tenant-admin of a, b)`: how refusals and the audit name a caller."""
        if self.role == OPEN_ROLE:
            return "an unauthenticated caller (config runs without --auth)"
        scope = f" of {', '.join(sorted(self.spaces)) or 'no space'}" if _scoped(self) else ""
        return f"token '{self.name}' ({self.role}{scope})"


@dataclass(frozen=True)
class Decision:
    allowed: bool
    reason: str = ""
    """Why not: the message of the PERMISSION_DENIED the caller gets."""


_ALL_KINDS = frozenset(KINDS)
_TENANT_KINDS = frozenset({"Address", "MessagingUser"})
_SPACE_KINDS = frozenset({"AddressSpace", "Address", "MessagingUser"})

ROLES: Mapping[str, Role] = {
    role.name: role
    for role in (
        Role(ADMIN, frozenset({READ, WRITE, STATUS, APPLY, TOKENS}), writes=_ALL_KINDS),
        Role(TENANT_ADMIN, frozenset({READ, WRITE, APPLY}), writes=_TENANT_KINDS, scoped=True),
        Role(VIEWER, frozenset({READ}), scoped=True),
        Role(CONTROLLER, frozenset({READ, STATUS, SECRETS})),
        Role(SUBSCRIPTION, frozenset({READ, WRITE}), writes=frozenset({"Address"})),
        Role(GITOPS, frozenset({READ, APPLY}), writes=_SPACE_KINDS),
        Role(
            OPEN_ROLE,
            frozenset({READ, WRITE, STATUS, APPLY, SECRETS, TOKENS}),
            writes=_ALL_KINDS,
        ),
    )
}
TOKEN_ROLES = tuple(name for name in ROLES if name != OPEN_ROLE)
"""The roles a token can be given (`open` is config without --auth, never a token's)."""
SCOPED_ROLES = tuple(name for name, role in ROLES.items() if role.scoped)

OPEN = Identity(name="anonymous", role=OPEN_ROLE)
"""Every caller when config runs without --auth: everything is allowed, as before auth."""


def _operations() -> dict[str, Operation]:
    service = config_pb2.DESCRIPTOR.services_by_name["ConfigService"]
    by_list = {kind.list_message.DESCRIPTOR.full_name: name for name, kind in KINDS.items()}
    table = {
        "Watch": Operation(READ),
        "Apply": Operation(APPLY),
        WATCH_WITH_SECRETS: Operation(SECRETS),
        "CreateToken": Operation(TOKENS),
        "ListTokens": Operation(TOKENS),
        "RevokeToken": Operation(TOKENS),
    }
    for method in service.methods:
        name = method.name
        if name in table:
            continue
        if name.startswith("Update") and name.endswith("Status"):
            table[name] = Operation(STATUS, name[len("Update") : -len("Status")])
        elif name.startswith("Update") and name.endswith("Statuses"):  # a batch: the same rule
            table[name] = Operation(STATUS, name[len("Update") : -len("Statuses")])
        elif method.output_type.full_name in by_list:
            table[name] = Operation(READ, by_list[method.output_type.full_name])
        elif name.startswith("Get"):
            table[name] = Operation(READ, name[len("Get") :])
        elif name.startswith(("Create", "Update", "Delete")):
            table[name] = Operation(WRITE, name[len("Create") :])
    return table


OPERATIONS: Mapping[str, Operation] = _operations()
LIST_RPCS: Mapping[str, str] = {
    op.kind: rpc for rpc, op in OPERATIONS.items() if op.verb == READ and rpc.startswith("List")
}
"""The List RPC of each kind (`Address` -> `ListAddresses`)."""


def authorize(identity: Identity, rpc: str, space: str) -> Decision:
    """Whether `identity` may call `rpc` about address space `space`.

    `space` is the space the call is about: an Address's or MessagingUser's space, an
    AddressSpace's own name, an Apply's scope; "" for the plans (cluster-wide) and for a List or
    Watch of every space (which then shows a scoped role only its spaces: `visible_spaces`).
    """
    operation = OPERATIONS.get(rpc)
    role = ROLES.get(identity.role)
    if operation is None or role is None:
        return _refused(identity, rpc, space)
    if operation.verb not in role.verbs:
        return _refused(identity, rpc, space)
    if operation.verb == WRITE and operation.kind not in role.writes:
        return _refused(identity, rpc, space)
    if role.scoped and not _in_scope(identity, operation, space):
        return _refused(identity, rpc, space)
    return Decision(True)


def authorize_applied(identity: Identity, rpc: str, space: str) -> Decision:
    """Whether an Apply by `identity` may make a write that amounts to `rpc` (CreateAddress,
    DeleteAddressSpace, ...) in `space`: the role must Apply, the kind be one it writes, the
    space in its scope (a role may write through Apply what it may not write one by one)."""
    operation = OPERATIONS.get(rpc)
    role = ROLES.get(identity.role)
    allowed = (
        operation is not None
        and role is not None
        and APPLY in role.verbs
        and operation.verb == WRITE
        and operation.kind in role.writes
        and (not role.scoped or space in identity.spaces)
    )
    return Decision(True) if allowed else _refused(identity, f"{rpc} (by Apply)", space)


def visible_spaces(identity: Identity) -> frozenset[str] | None:
    """The address spaces a List or Watch of every space shows `identity` (None: all)."""
    return identity.spaces if _scoped(identity) else None


def space_of(key: Key) -> str:
    """The address space an object belongs to: its own name for an AddressSpace, "" for plans."""
    kind, space, name = key
    if kind in SPACE_SCOPED_KINDS:
        return space
    return name if kind == "AddressSpace" else ""


def sees(visible: frozenset[str] | None, key: Key) -> bool:
    """Whether a List or Watch that shows the spaces `visible` (None: all) shows this object
    (the plans: always)."""
    if visible is None:
        return True
    space = space_of(key)
    return not space or space in visible


def first_refusal(decisions: Iterable[Decision]) -> Decision:
    """The first refused decision, or allowed when none is."""
    return next((d for d in decisions if not d.allowed), Decision(True))


def _in_scope(identity: Identity, operation: Operation, space: str) -> bool:
    if space:
        return space in identity.spaces
    # "" is either the plans (readable by all: every space uses them) or a List / Watch of every
    # space, which `visible_spaces` narrows; nothing else of a scoped role is cluster-wide.
    return operation.verb == READ


def _scoped(identity: Identity) -> bool:
    role = ROLES.get(identity.role)
    return role is not None and role.scoped


def _refused(identity: Identity, rpc: str, space: str) -> Decision:
    where = f" in address space '{space}'" if space else ""
    return Decision(False, f"{identity.describe()} may not {rpc}{where}")
