"""Manifest input that cannot be weaponised: every bound of the loader, with its exact message.

A "billion laughs" (nine anchors, each a list of nine aliases of the one before: a few hundred
bytes, 9**9 strings once expanded) is refused at its first anchor, before anything is expanded;
the test prints how long the refusal took and how much memory it traced (figures, not
assertions: the machine is shared). Then a plain alias, too many documents, too deep a nesting,
too many nodes, too big a file, and a read (one sync, one space directory) that runs out of files
or bytes: each refused with the file, the line and the limit, and a space with an unread file is
never pruned.
"""

from __future__ import annotations

import time
import tracemalloc
from pathlib import Path

import pytest
from enmasse.resources import gitops_sync, manifests
from enmasse.resources.manifests import (
    MAX_DEPTH,
    MAX_DOCUMENTS_PER_FILE,
    MAX_FILE_BYTES,
    MAX_FILES_PER_SPACE,
    ReadBudget,
    load_paths,
    parse_text,
)

ADDRESS = """\
apiVersion: enmasse.io/v1
kind: Address
metadata: {{name: {name}}}
spec: {{address: {name}, type: queue, plan: standard-small-queue}}
"""


def billion_laughs() -> str:
    """The issue's file: an Address whose spec carries nine nested anchors."""
    lines = [
        "apiVersion: enmasse.io/v1",
        "kind: Address",
        "metadata: {name: lol}",
        "spec:",
        "  address: lol",
        "  type: queue",
        "  plan: standard-small-queue",
        '  a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]',
    ]
    previous = "a"
    for name in "bcdefghi":
        lines.append(f"  {name}: &{name} [" + ",".join([f"*{previous}"] * 9) + "]")
        previous = name
    return "\n".join(lines) + "\n"


def errors_of(text: str) -> list[str]:
    return [str(e) for e in parse_text(text, file="m.yaml").errors]


def test_a_billion_laughs_is_refused_at_its_first_anchor(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = billion_laughs()
    assert 450 < len(text.encode()) < 512
    bomb = tmp_path / "shop" / "bomb.yaml"
    bomb.parent.mkdir()
    bomb.write_text(text)
    tracemalloc.start()
    started = time.perf_counter()
    loaded = load_paths([bomb], default_space="shop")
    elapsed = time.perf_counter() - started
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert [str(e) for e in loaded.errors] == [
        f"{bomb}:8: YAML anchors and aliases are not allowed in manifests (&a)"
    ]
    assert loaded.manifests == []
    with capsys.disabled():
        print(
            f"\n[billion laughs, {len(text.encode())} bytes] refused in {elapsed * 1000:.1f} ms, "
            f"traced peak {peak / 1024:.0f} KiB"
        )


def test_an_alias_is_refused_where_it_stands() -> None:
    text = ADDRESS.format(name="orders") + "---\n" + "apiVersion: enmasse.io/v1\nkind: *kind\n"
    loaded = parse_text(text, file="m.yaml", default_space="shop")
    assert [str(e) for e in loaded.errors] == [
        "m.yaml:7: YAML anchors and aliases are not allowed in manifests (*kind)"
    ]
    # The documents before it are still read, as after a syntax error.
    assert [m.resource.address.metadata.name for m in loaded.manifests] == ["orders"]


def test_a_merge_key_is_an_alias_too() -> None:
    text = """\
apiVersion: enmasse.io/v1
kind: Address
metadata: {name: orders, space: shop}
spec:
  <<: &queue {type: queue, plan: standard-small-queue}
  address: orders
"""
    assert errors_of(text) == [
        "m.yaml:5: YAML anchors and aliases are not allowed in manifests (&queue)"
    ]


def test_too_many_documents_in_one_file() -> None:
    text = "---\n" * (MAX_DOCUMENTS_PER_FILE + 5)
    assert errors_of(text) == [
        f"m.yaml:{MAX_DOCUMENTS_PER_FILE + 1}: too many documents: a manifest file may hold "
        f"at most {MAX_DOCUMENTS_PER_FILE}"
    ]
    assert errors_of("---\n" * MAX_DOCUMENTS_PER_FILE) == []


def test_too_deep_a_nesting() -> None:
    deepest = "spec: " + "[" * (MAX_DEPTH - 1) + "]" * (MAX_DEPTH - 1) + "\n"
    # MAX_DEPTH levels (the document's mapping and 31 lists) compose; the rules refuse the rest.
    assert errors_of(deepest) == ["m.yaml:1: missing apiVersion (expected enmasse.io/v1)"]
    too_deep = "apiVersion: enmasse.io/v1\nspec: " + "[" * MAX_DEPTH + "]" * MAX_DEPTH + "\n"
    assert errors_of(too_deep) == [
        f"m.yaml:2: nested too deeply: a manifest may nest at most {MAX_DEPTH} levels"
    ]


def test_too_many_nodes_in_one_file(monkeypatch: pytest.MonkeyPatch) -> None:
    # A lower cap than the real one (100,000 nodes take seconds on a shared machine): the same
    # count, the same refusal.
    monkeypatch.setattr(manifests, "MAX_NODES_PER_FILE", 200)
    # The document's mapping, two keys, apiVersion's value, the list, then its items.
    text = "apiVersion: enmasse.io/v1\nmetadata:\n" + "- 1\n" * (200 - 5)
    assert errors_of(text) == [  # exactly the cap: composed, then the rules speak
        "m.yaml:1: missing kind (expected one of AddressSpacePlan, AddressPlan, AddressSpace, "
        "Address, MessagingUser)"
    ]
    assert errors_of(text + "- 1\n") == [
        "m.yaml:198: too many YAML nodes: a manifest file may hold at most 200 keys, values, "
        "lists and mappings"
    ]
    # Per file, not per document.
    split = "apiVersion: enmasse.io/v1\nmetadata:\n" + "- 1\n" * 100 + "---\n" + text
    assert "too many YAML nodes" in errors_of(split)[-1]


def test_too_big_a_file_is_not_read(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    big.write_bytes(b"# padding\n" * (MAX_FILE_BYTES // 10) + b"#" * (MAX_FILE_BYTES % 10 + 1))
    assert big.stat().st_size == MAX_FILE_BYTES + 1
    fits = tmp_path / "fits.yaml"
    fits.write_text(ADDRESS.format(name="orders"))
    loaded = load_paths([tmp_path], default_space="shop")
    assert [str(e) for e in loaded.errors] == [
        f"{big}:1: file too large: a manifest file may hold at most 1 MiB (1048576 bytes)"
    ]
    assert [m.resource.address.metadata.name for m in loaded.manifests] == ["orders"]
    assert errors_of("#" * (MAX_FILE_BYTES + 1)) == [
        "m.yaml:1: file too large: a manifest file may hold at most 1 MiB (1048576 bytes)"
    ]


def write_space(root: Path, space: str, names: list[str]) -> None:
    (root / space).mkdir(parents=True)
    for name in names:
        (root / space / f"{name}.yaml").write_text(ADDRESS.format(name=name))


def test_a_sync_out_of_files_leaves_every_later_space_unpruned(tmp_path: Path) -> None:
    write_space(tmp_path, "a", ["a1", "a2"])
    write_space(tmp_path, "b", ["b1", "b2"])
    write_space(tmp_path, "c", ["c1"])
    spaces = gitops_sync.read_tree(tmp_path, budget=ReadBudget(max_files=3))
    errors = {s.space: [str(e) for e in s.errors] for s in spaces}
    assert errors == {
        "a": [],
        "b": [
            f"{tmp_path}/b/b2.yaml:1: too many manifest files: at most 3 are read at once: "
            "this file and the 0 after it were not read"
        ],
        "c": [
            f"{tmp_path}/c/c1.yaml:1: too many manifest files: at most 3 are read at once: "
            "this file and the 0 after it were not read"
        ],
    }
    requests = {s.space: gitops_sync.space_request(s, manager="gitops") for s in spaces}
    assert {space: r.prune for space, r in requests.items()} == {"a": True, "b": False, "c": False}
    assert [r.address.metadata.name for r in requests["b"].resources] == ["b1"]


def test_one_space_directory_cannot_use_up_the_sync(tmp_path: Path) -> None:
    (tmp_path / "greedy").mkdir()
    for index in range(MAX_FILES_PER_SPACE + 1):
        (tmp_path / "greedy" / f"{index:04d}.yaml").write_text("# nothing\n")
    write_space(tmp_path, "shop", ["orders"])
    greedy, shop = gitops_sync.read_tree(tmp_path)
    assert [str(e) for e in greedy.errors] == [
        f"{tmp_path}/greedy/{MAX_FILES_PER_SPACE:04d}.yaml:1: too many manifest files: at most "
        f"{MAX_FILES_PER_SPACE} are read from one space directory: this file and the 0 after it "
        "were not read"
    ]
    assert (shop.errors, [m.resource.address.metadata.name for m in shop.manifests]) == (
        [],
        ["orders"],
    )


def test_a_sync_out_of_bytes_refuses_the_file_that_does_not_fit(tmp_path: Path) -> None:
    write_space(tmp_path, "a", ["a1", "a2", "a3"])
    size = (tmp_path / "a" / "a1.yaml").stat().st_size
    [space] = gitops_sync.read_tree(tmp_path, budget=ReadBudget(max_bytes=2 * size))
    assert [str(e) for e in space.errors] == [
        f"{tmp_path}/a/a3.yaml:1: too many manifest bytes: at most {2 * size / (1 << 20):g} MiB "
        f"({2 * size} bytes) are read at once"
    ]
    assert [m.resource.address.metadata.name for m in space.manifests] == ["a1", "a2"]


def test_the_revision_of_a_tree_reads_no_more_of_a_big_file_than_the_limit(
    tmp_path: Path,
) -> None:
    write_space(tmp_path, "a", ["a1"])
    big = tmp_path / "a" / "big.yaml"
    big.write_bytes(b"#" * (MAX_FILE_BYTES + 10))
    before = gitops_sync.tree_revision(tmp_path)
    assert gitops_sync.tree_revision(tmp_path) == before
    big.write_bytes(b"#" * (MAX_FILE_BYTES + 20))  # the same head: told apart by its size
    assert gitops_sync.tree_revision(tmp_path) != before
