"""Manifests in, resources out (and back): every error names the file, the line and the field."""

from __future__ import annotations

from pathlib import Path

from enmasse.resources import manifests
from enmasse.resources.manifests import dump_yaml, load_paths, parse_text, scope_of

ADDRESS = """\
apiVersion: enmasse.io/v1
kind: Address
metadata:
  name: orders
  space: shop
  labels: {team: web}
spec:
  address: orders
  type: queue
  plan: standard-small-queue
status:
  status: {phase: Active}
"""


def errors_of(text: str) -> list[str]:
    return [str(e) for e in parse_text(text, file="m.yaml").errors]


def test_an_address_manifest_becomes_an_address_resource() -> None:
    loaded = parse_text(ADDRESS, file="m.yaml")
    assert loaded.errors == []
    [manifest] = loaded.manifests
    address = manifest.resource.address
    assert (address.metadata.space, address.metadata.name) == ("shop", "orders")
    assert (address.spec.address, address.spec.type) == ("orders", "queue")
    assert address.spec.plan == "standard-small-queue"
    assert dict(address.metadata.labels) == {"team": "web"}
    assert address.status.status.phase == ""  # status is the controllers', never input
    assert (manifest.file, manifest.line, manifest.line_of("spec.plan")) == ("m.yaml", 1, 10)
    assert scope_of(manifest.resource) == "shop"


def test_snake_case_and_camel_case_keys_both_work() -> None:
    text = """\
apiVersion: enmasse.io/v1
kind: AddressPlan
metadata: {name: p1}
spec: {address_type: queue, memoryLimitBytes: 1024, broker: 0.01}
"""
    [manifest] = parse_text(text, file="m.yaml").manifests
    spec = manifest.resource.address_plan.spec
    assert (spec.address_type, spec.memory_limit_bytes, spec.broker) == ("queue", 1024, 0.01)


def test_every_document_of_a_multi_document_file_has_its_own_start_line() -> None:
    text = ADDRESS + "---\n" + ADDRESS.replace("orders", "returns")
    loaded = parse_text(text, file="m.yaml")
    assert [m.line for m in loaded.manifests] == [1, 14]
    assert [m.resource.address.metadata.name for m in loaded.manifests] == ["orders", "returns"]


def test_yaml_syntax_error_names_its_line() -> None:
    assert errors_of("apiVersion: enmasse.io/v1\nkind: Address\nmetadata: {name: [x\n") == [
        "m.yaml:4: YAML syntax error: expected ',' or ']', but got '<stream end>' "
        "(while parsing a flow sequence)"
    ]


def test_wrong_api_version_is_refused() -> None:
    assert errors_of("apiVersion: v1\nkind: Address\nmetadata: {name: a, space: s}\n") == [
        'm.yaml:1: unsupported apiVersion "v1": expected enmasse.io/v1'
    ]


def test_unknown_kind_is_refused_with_a_suggestion() -> None:
    assert errors_of("apiVersion: enmasse.io/v1\nkind: Adress\nmetadata: {name: a}\n") == [
        'm.yaml:2: unknown kind "Adress" (did you mean "Address"?): expected one of '
        "AddressSpacePlan, AddressPlan, AddressSpace, Address, MessagingUser"
    ]


def test_unknown_field_points_at_its_own_line() -> None:
    text = ADDRESS.replace("  plan: standard", "  plann: standard")
    assert errors_of(text) == [
        'm.yaml:10: unknown field "plann" in spec of Address (did you mean "plan"?): '
        "expected one of address, type, plan, topic"
    ]


def test_a_value_of_the_wrong_type_is_refused_at_its_line() -> None:
    text = (
        "apiVersion: enmasse.io/v1\nkind: AddressPlan\nmetadata: {name: p}\nspec:\n  broker: lots\n"
    )
    assert errors_of(text) == ['m.yaml:5: spec.broker: expected a number, got "lots" (a string)']


def test_a_duplicate_key_is_refused_instead_of_silently_winning() -> None:
    text = ADDRESS.replace("  plan: standard-small-queue\n", "  plan: a\n  type: topic\n")
    assert errors_of(text) == ['m.yaml:11: duplicate key "spec.type" (first on line 9)']


def test_missing_name_and_missing_space_are_refused() -> None:
    no_name = "apiVersion: enmasse.io/v1\nkind: AddressSpace\nspec: {type: standard}\n"
    no_space = "apiVersion: enmasse.io/v1\nkind: Address\nmetadata: {name: a}\n"
    assert errors_of(no_name) == ["m.yaml:1: metadata.name is required (AddressSpace)"]
    assert errors_of(no_space) == [
        "m.yaml:3: metadata.space is required (Address a): the address space it belongs to"
    ]
    loaded = parse_text(no_space, file="m.yaml", default_space="shop")
    assert loaded.manifests[0].resource.address.metadata.space == "shop"


def test_one_bad_document_does_not_hide_the_good_ones() -> None:
    text = ADDRESS + "---\napiVersion: enmasse.io/v1\nkind: Nope\n---\n" + ADDRESS
    loaded = parse_text(text, file="m.yaml")
    assert len(loaded.manifests) == 2
    assert [e.line for e in loaded.errors] == [15]


def test_a_directory_is_read_recursively_in_name_order(tmp_path: Path) -> None:
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "two.yml").write_text(ADDRESS.replace("orders", "two"))
    (tmp_path / "a.yaml").write_text(ADDRESS.replace("orders", "one"))
    (tmp_path / "notes.txt").write_text("not a manifest")
    loaded = load_paths([tmp_path])
    assert [m.resource.address.metadata.name for m in loaded.manifests] == ["one", "two"]
    assert loaded.manifests[1].file == str(tmp_path / "b" / "two.yml")


def test_a_missing_path_is_an_error_not_an_exception(tmp_path: Path) -> None:
    loaded = load_paths([tmp_path / "nope.yaml"])
    assert [str(e) for e in loaded.errors] == [
        f"{tmp_path / 'nope.yaml'}:1: no such file or directory"
    ]


def test_yaml_output_parses_back_to_the_same_resource() -> None:
    [manifest] = parse_text(ADDRESS, file="m.yaml").manifests
    text = dump_yaml([manifest.resource])
    assert "plan: standard-small-queue" in text
    [again] = parse_text(text, file="out.yaml").manifests
    assert again.resource == manifest.resource
    assert manifests.to_manifest(manifest.resource)["kind"] == "Address"
