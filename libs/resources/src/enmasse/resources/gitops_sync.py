"""GitOps sync: a directory of address manifests in, Apply with prune per space out, and a status.

In: a directory laid out the way the k8s `manifests` sidecar writes it (and the way a tenants'
git repository holds it): `<root>/<space>/**/*.yaml`, one subdirectory per address space, holding
its AddressSpace, Addresses and MessagingUsers (kustomization files are skipped). Out: one
NON-atomic `Apply` per space under one manager ("gitops"), with prune, so that:

- a bad object is refused with its reason (mapped back to `file:line`) and the rest applies;
- a file that cannot be read at all (YAML syntax error, unknown field) is refused with its
  `file:line`, and the space is then applied WITHOUT prune: the object that file held cannot be
  named, and deleting it because its manifest broke would change something the user did not ask
  to change;
- objects of other managers (`cli`, ...) are never pruned: Apply prunes only what the batch's
  manager owns;
- a space directory that disappears gets an empty Apply with prune, which removes what gitops
  owns there (the AddressSpace too, when gitops created it).

What one sync reads is bounded (`enmasse.resources.manifests`: bytes, documents and depth per
file, files and bytes per space directory and per sync, no YAML aliases): a file over a bound is
refused like an unreadable one, and every space with a file left unread is applied without prune.
The reading runs in a worker thread, so that the config service's event loop serves everyone
else meanwhile.

The outcome is a `SyncStatus` (revision, counts per action, refused objects with file:line and
reason), written as JSON (`write_status`): one simple place that a person, a probe or a test reads.

The transport is a pair of callables (`apply`, `owned_spaces`), so that the config service runs
this in-process (`enmasse-config --manifests-dir`, which follows the directory:
`enmasse.config.gitops_follow`) and `enmasse gitops sync` runs the very same code against the
config service's gRPC API. Nothing here holds a connection or a store: manifests, requests and
results of the resource model only.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import tempfile
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from enmasse.resources.kinds import AnyObject, Key, key_of
from enmasse.resources.manifests import (
    MANIFEST_SUFFIXES,
    MAX_BYTES_PER_READ,
    MAX_BYTES_PER_SPACE,
    MAX_FILE_BYTES,
    MAX_FILES_PER_SPACE,
    Manifest,
    ManifestError,
    ReadBudget,
    load_paths,
)
from enmasse.v1 import config_pb2

DEFAULT_MANAGER = "gitops"
KUSTOMIZATION_FILES = {"kustomization.yaml", "kustomization.yml", "Kustomization"}
Action = config_pb2.ApplyResult.Action
ApplyCall = Callable[[config_pb2.ApplyRequest], Awaitable[config_pb2.ApplyResponse]]
OwnedSpacesCall = Callable[[str], Awaitable[set[str]]]


@dataclass
class SpaceManifests:
    """What one space directory holds: parsed manifests and the files that could not be read."""

    space: str
    manifests: list[Manifest] = field(default_factory=list)
    errors: list[ManifestError] = field(default_factory=list)


@dataclass(frozen=True)
class Refusal:
    space: str
    kind: str
    name: str
    file: str
    line: int
    reason: str

    def __str__(self) -> str:
        what = f"{self.kind} {self.space}/{self.name}: " if self.kind else ""
        return f"{self.file}:{self.line}: {what}{self.reason}"


@dataclass
class SyncStatus:
    revision: str
    applied: dict[str, int] = field(default_factory=dict)  # action name -> count
    refused: list[Refusal] = field(default_factory=list)
    pruning_skipped: list[str] = field(default_factory=list)  # spaces with unreadable files
    error: str = ""  # the config service could not be reached: nothing was applied

    @property
    def ok(self) -> bool:
        return not self.refused and not self.error

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True) + "\n"


# ---------------------------------------------------------------- reading the directory


def read_tree(root: Path, *, budget: ReadBudget | None = None) -> list[SpaceManifests]:
    """Every space directory under `root` (hidden ones and plain files skipped), sorted, each
    within a space's budget inside one sync's `ReadBudget` (a fresh one when none is given)."""
    sync = budget if budget is not None else ReadBudget(scope="in one sync")
    return [read_space(path, budget=space_budget(sync)) for path in space_dirs(root)]


def space_budget(sync: ReadBudget) -> ReadBudget:
    """One space directory's share of a sync: a tenant cannot read what the others need."""
    return ReadBudget(
        max_files=MAX_FILES_PER_SPACE,
        max_bytes=MAX_BYTES_PER_SPACE,
        scope="from one space directory",
        within=sync,
    )


def space_dirs(root: Path) -> list[Path]:
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))


def read_space(directory: Path, *, budget: ReadBudget | None = None) -> SpaceManifests:
    files = manifest_files(directory)
    loaded = load_paths(files, default_space=directory.name, budget=budget)
    return SpaceManifests(space=directory.name, manifests=loaded.manifests, errors=loaded.errors)


def manifest_files(directory: Path) -> list[Path]:
    """The YAML files of a space directory, recursively, without kustomize's own file and
    without hidden entries (the sidecar's and git's bookkeeping)."""
    return sorted(
        path
        for path in directory.rglob("*")
        if path.is_file()
        and path.suffix in MANIFEST_SUFFIXES
        and path.name not in KUSTOMIZATION_FILES
        and not any(part.startswith(".") for part in path.relative_to(directory).parts)
    )


def tree_revision(root: Path) -> str:
    """A content hash of the directory (paths and bytes): the revision when no git commit names
    it. The sidecar rewrites files in place; equal bytes mean nothing to apply.

    Bounded as the sync's reading is: at most MAX_FILE_BYTES + 1 of a file and MAX_BYTES_PER_READ
    in all are hashed; beyond that a file counts by its size and modification time (the sync
    refuses it anyway, and notices when it shrinks back)."""
    digest = hashlib.sha256()
    left = MAX_BYTES_PER_READ
    for space in space_dirs(root):
        for path in manifest_files(space):
            digest.update(str(path.relative_to(root)).encode() + b"\0")
            head = _head(path, limit=min(MAX_FILE_BYTES + 1, max(left, 0)))
            left -= len(head)
            digest.update(head + b"\0")
    return "sha256:" + digest.hexdigest()[:16]


def _head(path: Path, *, limit: int) -> bytes:
    """The file's first `limit` bytes, and its size and mtime when it holds more."""
    stat = path.stat()
    with path.open("rb") as stream:
        head = stream.read(limit)
    if stat.st_size > len(head):
        head += f"\0{stat.st_size}:{stat.st_mtime_ns}".encode()
    return head


# ---------------------------------------------------------------- requests and results


def space_request(space: SpaceManifests, *, manager: str) -> config_pb2.ApplyRequest:
    return config_pb2.ApplyRequest(
        space=space.space,
        manager=manager,
        resources=[m.resource for m in space.manifests],
        prune=not space.errors,
        atomic=False,
    )


def prune_request(space: str, *, manager: str) -> config_pb2.ApplyRequest:
    """A space whose directory is gone: keep nothing of what `manager` owns there."""
    return config_pb2.ApplyRequest(space=space, manager=manager, prune=True, atomic=False)


def record_results(
    status: SyncStatus,
    *,
    space: SpaceManifests,
    response: config_pb2.ApplyResponse,
) -> None:
    """Counts the response's actions and maps each refusal to the file:line that declared it."""
    where = {key_of(m.resource): (m.file, m.line) for m in space.manifests}
    for result in response.results:
        name = config_pb2.ApplyResult.Action.Name(result.action)
        status.applied[name] = status.applied.get(name, 0) + 1
        if result.action != Action.REFUSED:
            continue
        file, line = where.get((result.kind, result.ref.space, result.ref.name), ("", 0))
        status.refused.append(
            Refusal(
                space=space.space,
                kind=result.kind,
                name=result.ref.name,
                file=file,
                line=line,
                reason=result.message,
            )
        )


def record_unreadable(status: SyncStatus, *, space: SpaceManifests) -> None:
    for error in space.errors:
        status.refused.append(
            Refusal(
                space=space.space,
                kind="",
                name="",
                file=error.file,
                line=error.line,
                reason=error.message,
            )
        )
    if space.errors:
        status.pruning_skipped.append(space.space)


# ---------------------------------------------------------------- one sync


async def sync_tree(
    root: Path,
    *,
    apply: ApplyCall,
    owned_spaces: OwnedSpacesCall,
    manager: str = DEFAULT_MANAGER,
    revision: str = "",
    on_result: Callable[[str, config_pb2.ApplyResult], None] | None = None,
) -> SyncStatus:
    """Applies every space directory under `root`, prunes the spaces that disappeared, and
    returns what happened. gRPC errors propagate: the caller decides to retry."""
    spaces = await asyncio.to_thread(read_tree, root)
    status = SyncStatus(revision=revision or tree_revision(root))
    for space in spaces:
        record_unreadable(status, space=space)
        response = await apply(space_request(space, manager=manager))
        record_results(status, space=space, response=response)
        _report(on_result, space.space, response.results)
    present = {space.space for space in spaces}
    for gone in sorted(await owned_spaces(manager) - present):
        response = await apply(prune_request(gone, manager=manager))
        empty = SpaceManifests(space=gone)
        record_results(status, space=empty, response=response)
        _report(on_result, gone, response.results)
    return status


def _report(
    on_result: Callable[[str, config_pb2.ApplyResult], None] | None,
    space: str,
    results: Iterable[config_pb2.ApplyResult],
) -> None:
    if on_result is not None:
        for result in results:
            on_result(space, result)


def write_status(path: Path, status: SyncStatus) -> None:
    """Atomically, so that a reader never sees half a status."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, partial = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".partial")
    try:
        with os.fdopen(fd, "w") as file:
            file.write(status.to_json())
        os.replace(partial, path)
    except BaseException:
        Path(partial).unlink(missing_ok=True)
        raise


def result_line(space: str, result: config_pb2.ApplyResult) -> str:
    """`shop: address/orders created`, or with the refusal's reason."""
    action = config_pb2.ApplyResult.Action.Name(result.action).lower()
    line = f"{space}: {result.kind.lower()}/{result.ref.name} {action}"
    return f"{line}: {result.message}" if result.message else line


def owned_spaces_of(objects: Iterable[tuple[Key, AnyObject]], *, manager: str) -> set[str]:
    """The spaces in which `manager` owns anything (the space itself, an address, a user)."""
    spaces: set[str] = set()
    for (kind, space, name), obj in objects:
        if obj.metadata.managed_by != manager:
            continue
        if kind == "AddressSpace":
            spaces.add(name)
        elif space:
            spaces.add(space)
    return spaces
