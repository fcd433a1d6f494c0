"""The one table of resource kinds, and the one way to wrap and unwrap a `Resource`.

Every kind the API knows is one `Kind` row here: its name (`Address`, what a manifest's `kind:`
says), the field of the `Resource` oneof that holds it, its protobuf message and the message its
List RPC answers with, the words people type for it (`addresses`, `addr`), the metadata fields
that name one (`space` + `name`, or `name` alone), which part of the message people write (spec)
and which the controllers write (status), which stored fields are secret (never answered), and
the columns `enmasse get` prints. Manifests, validation, the config service and the CLI all read
this table, so a new kind is one new row, the way Qpid Dispatch's `qdrouter.json` drives its
management agent from one schema, or a Kubernetes CustomResourceDefinition gives a kind its
names, scope and printer columns.

And the helpers over it: `kind_of` (the kind of a Resource or of the message inside one),
`object_of` (the message inside a Resource), `resource_of` (a message wrapped into a Resource)
and `key_of` ((kind, space, name): how the store, the catalog and the informers index objects).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeAlias

from enmasse.v1 import config_pb2, resources_pb2
from google.protobuf.message import Message

API_VERSION = "enmasse.io/v1"

AnyObject: TypeAlias = Any
"""One of the resource messages (AddressSpacePlan, AddressPlan, AddressSpace, Address,
MessagingUser). Typed loosely on purpose: the messages share `metadata` and `spec` by convention,
not by a common base class that a type checker could follow."""
Key = tuple[str, str, str]
"""(kind, space, name): space is empty for kinds that are not space-scoped."""


@dataclass(frozen=True)
class Column:
    """One column of `enmasse get` (a CRD's printer column): a header and the dotted path of the
    field it shows, from the message (`spec.address`, `status.status.phase`)."""

    header: str
    path: str
    zero: str = ""
    """What a number 0 means in this column, when it means something (a quota: unlimited)."""
    wide: bool = False
    """Shown only by `enmasse get -o wide` (kubectl's priority > 0 columns)."""


@dataclass(frozen=True)
class Kind:
    name: str
    """The kind as manifests and the API spell it: `Address`."""
    field: str
    """The field of the `Resource` oneof that holds one: `address`."""
    message: type[Message]
    list_message: type[Message]
    """What the config service's List RPC of the kind answers (`AddressList`)."""
    plural: str
    """The word `enmasse get` takes and prints (`addresses`), kubectl's plural."""
    short_names: tuple[str, ...]
    key: tuple[str, ...]
    """The metadata fields that name one object: ("space", "name") or ("name",)."""
    collection: str
    """What a catalog calls its set of them (`addresses`, `address_spaces`)."""
    columns: tuple[Column, ...]
    spec: str = "spec"
    """The part of the message people write (and manifests carry)."""
    status: str = ""
    """The part the controllers write ("" when the kind has none); callers never set it."""
    secrets: tuple[str, ...] = ()
    """Stored fields no answer carries (dotted paths: `spec.password_hash`, a user's SCRAM keys):
    the config service clears them in every Get, List, Watch and write answer, for every caller;
    only the control plane's Watch `with_secrets` gets them (the router-agent passes users' hashes
    and keys to routers)."""

    @property
    def space_scoped(self) -> bool:
        """Whether one lives inside an address space (its key holds the space)."""
        return "space" in self.key


_NAME = Column("NAME", "metadata.name")
_SPACE = Column("SPACE", "metadata.space")
_PHASE = Column("PHASE", "status.status.phase")

KINDS: Mapping[str, Kind] = {
    kind.name: kind
    for kind in (
        Kind(
            name="AddressSpacePlan",
            field="address_space_plan",
            message=resources_pb2.AddressSpacePlan,
            list_message=config_pb2.AddressSpacePlanList,
            plural="addressspaceplans",
            short_names=("asp", "spaceplan", "spaceplans"),
            key=("name",),
            collection="address_space_plans",
            columns=(
                _NAME,
                Column("TYPE", "spec.address_space_type"),
                Column("ADDRESS-PLANS", "spec.address_plans"),
                Column("MAX-ADDRESSES", "spec.quotas.max_addresses", zero="unlimited"),
            ),
        ),
        Kind(
            name="AddressPlan",
            field="address_plan",
            message=resources_pb2.AddressPlan,
            list_message=config_pb2.AddressPlanList,
            plural="addressplans",
            short_names=("ap", "plan", "plans"),
            key=("name",),
            collection="address_plans",
            columns=(
                _NAME,
                Column("ADDRESS-TYPE", "spec.address_type"),
                Column("BROKER", "spec.broker"),
                Column("PERSISTENT", "spec.persistent"),
            ),
        ),
        Kind(
            name="AddressSpace",
            field="address_space",
            message=resources_pb2.AddressSpace,
            list_message=config_pb2.AddressSpaceList,
            plural="addressspaces",
            short_names=("as", "space", "spaces"),
            key=("name",),
            collection="address_spaces",
            columns=(_NAME, Column("TYPE", "spec.type"), Column("PLAN", "spec.plan"), _PHASE),
            status="status",
        ),
        Kind(
            name="Address",
            field="address",
            message=resources_pb2.Address,
            list_message=config_pb2.AddressList,
            plural="addresses",
            short_names=("addr", "addrs"),
            key=("space", "name"),
            collection="addresses",
            columns=(
                _SPACE,
                _NAME,
                Column("ADDRESS", "spec.address"),
                Column("TYPE", "spec.type"),
                Column("PLAN", "spec.plan"),
                _PHASE,
                Column("MANAGED-BY", "metadata.managed_by", wide=True),
                Column("DEAD-LETTERED", "status.dead_lettered", wide=True),
                Column("DEAD-HELD", "status.dead_letters_held", wide=True),
            ),
            status="status",
        ),
        Kind(
            name="MessagingUser",
            field="messaging_user",
            message=resources_pb2.MessagingUser,
            list_message=config_pb2.MessagingUserList,
            plural="messagingusers",
            short_names=("user", "users", "mu"),
            key=("space", "name"),
            collection="messaging_users",
            columns=(_SPACE, _NAME, Column("USERNAME", "spec.username")),
            secrets=("spec.password_hash", "spec.scram_credentials"),
        ),
    )
}
SPACE_SCOPED_KINDS = tuple(name for name, kind in KINDS.items() if kind.space_scoped)
_BY_FIELD = {kind.field: kind for kind in KINDS.values()}


# ------------------------------------------------------------------ wrap and unwrap


def kind_of(item: resources_pb2.Resource | AnyObject) -> str:
    """ "Address", "AddressSpace", ... for a Resource or for the message inside one."""
    if isinstance(item, resources_pb2.Resource):
        which = item.WhichOneof("kind")
        if which is None:
            raise ValueError("the resource holds no object")
        return _BY_FIELD[which].name
    return str(type(item).DESCRIPTOR.name)


def object_of(resource: resources_pb2.Resource) -> AnyObject:
    """The message inside a Resource (an Address, an AddressSpace, ...)."""
    which = resource.WhichOneof("kind")  # the oneof field: a Kind's `field`
    if which is None:
        raise ValueError("the resource holds no object")
    return getattr(resource, which)


def resource_of(obj: AnyObject) -> resources_pb2.Resource:
    """Wraps an Address, AddressSpace, ... into a Resource (a copy)."""
    kind = KINDS.get(kind_of(obj))
    if kind is None:
        raise TypeError(f"not a resource message: {type(obj).__name__}")
    resource = resources_pb2.Resource()
    getattr(resource, kind.field).CopyFrom(obj)
    return resource


def key_of(item: resources_pb2.Resource | AnyObject) -> Key:
    """(kind, space, name) of a Resource or of the message inside one."""
    obj = object_of(item) if isinstance(item, resources_pb2.Resource) else item
    kind = kind_of(obj)
    space = obj.metadata.space if kind in SPACE_SCOPED_KINDS else ""
    return kind, space, obj.metadata.name
