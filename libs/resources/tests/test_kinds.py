"""The kinds table is complete and each of its rows holds together (pure, no network).

Complete: every kind the `Resource` oneof can hold has a row, with the oneof's own field and
message. Holding together: a sample object of every kind wraps into a Resource and back, is
named by its key, and survives the trip through a manifest (YAML out, YAML in) unchanged; the
parts and columns a row names exist on its message.
"""

from __future__ import annotations

import pytest
from enmasse.resources import contracts, manifests
from enmasse.resources.kinds import (
    KINDS,
    SPACE_SCOPED_KINDS,
    Kind,
    key_of,
    kind_of,
    object_of,
    resource_of,
)
from enmasse.v1 import resources_pb2
from google.protobuf import json_format
from google.protobuf.descriptor import FieldDescriptor

ONEOF = resources_pb2.Resource.DESCRIPTOR.oneofs_by_name["kind"]


def sample(kind: Kind) -> object:
    """An object of the kind: named (in space `shop` when space-scoped), every string field of
    its spec set, no status (status is the controllers', and manifests drop it on input)."""
    metadata = {"name": "sample", "labels": {"team": "web"}}
    if kind.space_scoped:
        metadata["space"] = "shop"
    spec_type = kind.message.DESCRIPTOR.fields_by_name[kind.spec].message_type
    spec = {
        f.json_name: f"{f.name}-value"
        for f in spec_type.fields
        if f.type == FieldDescriptor.TYPE_STRING and not f.is_repeated
    }
    return json_format.ParseDict({"metadata": metadata, "spec": spec}, kind.message())


def test_every_kind_of_the_resource_oneof_has_a_row() -> None:
    by_field = {kind.field: kind for kind in KINDS.values()}
    assert set(by_field) == {f.name for f in ONEOF.fields}
    for field in ONEOF.fields:
        kind = by_field[field.name]
        assert kind.message.DESCRIPTOR is field.message_type
        assert kind.name == field.message_type.name


@pytest.mark.parametrize("name", list(KINDS))
def test_a_row_names_what_its_message_has(name: str) -> None:
    kind = KINDS[name]
    fields = kind.message.DESCRIPTOR.fields_by_name
    assert {"metadata", kind.spec} <= set(fields)
    assert kind.status == "" or kind.status in fields
    assert set(kind.key) <= set(resources_pb2.Metadata.DESCRIPTOR.fields_by_name)
    assert "name" in kind.key
    items = kind.list_message.DESCRIPTOR.fields_by_name["items"]
    assert items.message_type is kind.message.DESCRIPTOR
    assert kind.plural == kind.plural.lower()
    for column in kind.columns:
        descriptor = kind.message.DESCRIPTOR
        for part in column.path.split("."):
            field = descriptor.fields_by_name[part]
            descriptor = field.message_type
    assert (name in SPACE_SCOPED_KINDS) == kind.space_scoped


@pytest.mark.parametrize("name", list(KINDS))
def test_wrap_and_unwrap_round_trip(name: str) -> None:
    kind = KINDS[name]
    obj = sample(kind)
    resource = resource_of(obj)
    assert resource.WhichOneof("kind") == kind.field
    assert kind_of(resource) == kind_of(obj) == name
    assert object_of(resource) == obj
    space = "shop" if kind.space_scoped else ""
    assert key_of(resource) == key_of(obj) == (name, space, "sample")


@pytest.mark.parametrize("name", list(KINDS))
def test_a_manifest_round_trips(name: str) -> None:
    resource = resource_of(sample(KINDS[name]))
    document = manifests.to_manifest(resource)
    assert document["kind"] == name
    assert manifests.parse_document(document) == resource
    loaded = manifests.parse_text(manifests.dump_yaml([resource]), file="kinds.yaml")
    assert not loaded.errors
    assert [m.resource for m in loaded.manifests] == [resource]


def test_wrapping_refuses_what_is_no_kind() -> None:
    with pytest.raises(TypeError, match="not a resource message"):
        resource_of(resources_pb2.Metadata(name="x"))
    with pytest.raises(ValueError, match="holds no object"):
        object_of(resources_pb2.Resource())


def test_the_address_types_are_direct_or_stored() -> None:
    assert set(contracts.ADDRESS_TYPES) == contracts.DIRECT_TYPES | contracts.STORED_TYPES
    assert not contracts.DIRECT_TYPES & contracts.STORED_TYPES
    for types in contracts.TYPES_BY_SPACE_TYPE.values():
        assert set(types) <= set(contracts.ADDRESS_TYPES)
    assert set(contracts.TYPES_BY_SPACE_TYPE) == set(contracts.SPACE_TYPES)
