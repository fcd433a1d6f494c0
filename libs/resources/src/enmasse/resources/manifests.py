"""YAML manifests <-> `enmasse.v1.Resource`: the one format people and git speak.

In: multi-document YAML files (or directories of them), Kubernetes-like::

    apiVersion: enmasse.io/v1
    kind: Address
    metadata: {name: orders, space: shop, labels: {team: web}}
    spec: {address: orders, type: queue, plan: standard-small-queue}

Out: `Manifest`s (a `Resource` plus where it came from: file, line of the document start, and the
line of every key, so that a later rule violation can point at `spec.plan` itself) and
`ManifestError`s (`file:line: message`), never an exception: a manifests repository's CI wants every
error of every file in one run. `status` is ignored on input (controllers own it).

Spec keys may be camelCase or snake_case (protobuf's JSON mapping accepts both). Unknown fields and
wrongly typed values are found by walking the message descriptors ourselves before
`json_format.ParseDict`, because that gives the key's own line and a message people can read
("unknown field "plann" in spec of Address: expected one of address, type, plan, topic") instead of
json_format's nested "Failed to parse spec field: ..." text.

And back: `to_manifest` / `dump_yaml` render resources as the same manifests (for `get -o yaml`),
so that what `get` prints can be edited and applied again.

Which kinds exist, which message each one is and which part of it is spec or status: the one
table, `enmasse.resources.kinds`.

Bounded, because the input is not always a friend's: the GitOps sync reads every tenant's manifest
directory inside the one config service they all share, so one file must never be able to stall it.
YAML anchors and aliases are refused while the document is composed (`_BoundedLoader`), before any
tree exists, so a "billion laughs" costs what its few hundred bytes cost to read; nesting depth,
documents, nodes and bytes per file are capped, and so are the files and bytes of one read (one
sync, one `validate` or `apply`: a `ReadBudget`) and, in a sync, of one space directory (one
tenant's share). The limits are the `MAX_*` constants below; each refusal is a `ManifestError`
naming the file, the line and the limit.
"""

from __future__ import annotations

import datetime
import difflib
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import yaml
from enmasse.resources.kinds import API_VERSION, KINDS, kind_of, object_of, resource_of
from enmasse.v1 import resources_pb2
from google.protobuf import json_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor

MANIFEST_SUFFIXES = (".yaml", ".yml")

# ---------------------------------------------------------------- bounds
# A manifest is a handful of keys a few levels deep; these leave room for thousands of them and
# none for a file built to exhaust the reader.

MAX_FILE_BYTES: Final = 1 << 20
"""Bytes of one manifest file (1 MiB): thousands of addresses; a bigger file is not read at all."""
MAX_DOCUMENTS_PER_FILE: Final = 1000
"""`---`-separated documents of one file; a repository splits more across files."""
MAX_DEPTH: Final = 32
"""Nesting of mappings and lists in one document (a MessagingUser, the deepest kind, needs 6)."""
MAX_NODES_PER_FILE: Final = 100_000
"""YAML nodes (keys, values, lists, mappings) of one file: an Address is about a dozen. A node
costs the pure-Python loader some 1 KiB and 20 µs, so this caps what a 1 MiB file of one-character
values could cost (half a million nodes) at about 100 MiB and 2 s."""
MAX_FILES_PER_READ: Final = 10_000
"""Manifest files of one read: one GitOps sync (every space directory), one `validate`/`apply`."""
MAX_BYTES_PER_READ: Final = 32 << 20
"""Bytes of one read (32 MiB): what the sync parses before it applies anything."""
MAX_FILES_PER_SPACE: Final = 1000
"""Manifest files of one space directory in a GitOps sync: one tenant's share of a sync."""
MAX_BYTES_PER_SPACE: Final = 4 << 20
"""Bytes of one space directory in a GitOps sync (4 MiB): one tenant's share of a sync."""
ANCHORS_REFUSED: Final = "YAML anchors and aliases are not allowed in manifests"
"""Not bounded but refused: an alias is how a few hundred bytes expand to gigabytes."""


@dataclass(frozen=True)
class ManifestError:
    file: str
    line: int
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.message}"


@dataclass(frozen=True)
class Manifest:
    """One parsed document: the resource and where each of its keys was written."""

    resource: resources_pb2.Resource
    file: str
    line: int
    key_lines: Mapping[str, int] = field(default_factory=dict)

    @property
    def kind(self) -> str:
        return kind_of(self.resource)

    def line_of(self, path: str) -> int:
        """The line of a dotted field path (`spec.plan`, camelCase or snake_case), or the
        nearest enclosing key that exists, or the document start."""
        return _line_for(path, self.key_lines, self.line)


@dataclass
class Loaded:
    manifests: list[Manifest] = field(default_factory=list)
    errors: list[ManifestError] = field(default_factory=list)

    def extend(self, other: Loaded) -> None:
        self.manifests.extend(other.manifests)
        self.errors.extend(other.errors)


@dataclass
class ReadBudget:
    """What one read of manifests may still take, in files and bytes. Shared by every
    `load_paths` call of that read; `within` is a larger read it is part of, which is charged
    too (the GitOps sync gives each space directory its own budget within the sync's, so that
    one tenant's directory cannot use up what every other tenant's needs)."""

    max_files: int = MAX_FILES_PER_READ
    max_bytes: int = MAX_BYTES_PER_READ
    scope: str = "at once"  # how the messages name the read
    within: ReadBudget | None = None
    files_read: int = 0
    bytes_read: int = 0

    def charge(self, *, files: int = 0, size: int = 0) -> None:
        self.files_read += files
        self.bytes_read += size
        if self.within is not None:
            self.within.charge(files=files, size=size)

    def exhausted(self) -> str:
        """Why no further file may be read, or "" while one may."""
        if self.files_read >= self.max_files:
            return f"too many manifest files: at most {self.max_files} are read {self.scope}"
        return self.overspent() or (self.within.exhausted() if self.within is not None else "")

    def overspent(self) -> str:
        """Why the bytes read so far are too many, or "" while they fit."""
        if self.bytes_read > self.max_bytes:
            return (
                f"too many manifest bytes: at most {_mib(self.max_bytes)} "
                f"({self.max_bytes} bytes) are read {self.scope}"
            )
        return self.within.overspent() if self.within is not None else ""


class _Refused(Exception):
    """A bound or rule of the composer broken; stops the file where the parser stands."""

    def __init__(self, message: str, mark: yaml.Mark) -> None:
        super().__init__(message)
        self.message = message
        self.line = mark.line + 1


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's SafeLoader, refusing anchors, aliases, deep nesting and too many nodes node by
    node while it composes, so that what an alias would expand to is never built (the anchor is
    refused before its first alias is even read), no recursion goes deeper than MAX_DEPTH and no
    file builds more than MAX_NODES_PER_FILE nodes."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._nodes = 0

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        event = self.peek_event()
        anchor = getattr(event, "anchor", None)  # node events have one; None when not marked
        if anchor is not None:
            sign = "*" if isinstance(event, yaml.AliasEvent) else "&"
            raise _Refused(f"{ANCHORS_REFUSED} ({sign}{anchor})", event.start_mark)
        if self._depth >= MAX_DEPTH:
            raise _Refused(
                f"nested too deeply: a manifest may nest at most {MAX_DEPTH} levels",
                event.start_mark,
            )
        self._nodes += 1
        if self._nodes > MAX_NODES_PER_FILE:
            raise _Refused(
                f"too many YAML nodes: a manifest file may hold at most {MAX_NODES_PER_FILE} "
                "keys, values, lists and mappings",
                event.start_mark,
            )
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


class _BadManifest(Exception):
    def __init__(self, message: str, *, path: str = "", line: int = 0) -> None:
        super().__init__(message)
        self.message = message
        self.path = path
        self.line = line


# ---------------------------------------------------------------- resource helpers


def scope_of(resource: resources_pb2.Resource) -> str:
    """The Apply scope a resource belongs to: "" for plans, the space name otherwise."""
    kind = kind_of(resource)
    meta = object_of(resource).metadata
    if kind == "AddressSpace":
        return str(meta.name)
    return str(meta.space) if KINDS[kind].space_scoped else ""


def display_name(resource: resources_pb2.Resource) -> str:
    """`address/orders`, the way apply and delete report a resource (kubectl's form)."""
    return f"{kind_of(resource).lower()}/{object_of(resource).metadata.name}"


# ---------------------------------------------------------------- loading


def load_paths(
    paths: Iterable[str | Path], *, default_space: str = "", budget: ReadBudget | None = None
) -> Loaded:
    """Every manifest of the given files and directories (recursively, *.yaml / *.yml, sorted),
    within `budget` (a fresh one when none is given). Once the budget is spent, the first file
    left unread gets an error naming the limit and how many files were not read, so that no
    caller mistakes an unread file for a deleted one."""
    budget = budget if budget is not None else ReadBudget()
    loaded = Loaded()
    files = [file for path in paths for file in _manifest_files(Path(path), loaded)]
    for index, file in enumerate(files):
        if spent := budget.exhausted():
            unread = f"this file and the {len(files) - index - 1} after it were not read"
            loaded.errors.append(ManifestError(str(file), 1, f"{spent}: {unread}"))
            break
        text = _read_manifest_file(file, budget, loaded)
        if text is not None:
            loaded.extend(parse_text(text, file=str(file), default_space=default_space))
    return loaded


def _read_manifest_file(file: Path, budget: ReadBudget, loaded: Loaded) -> str | None:
    """The file's text, read no further than MAX_FILE_BYTES; None (and an error) when it cannot
    be read, is too big, or does not fit in what the budget has left."""
    budget.charge(files=1)
    try:
        with file.open("rb") as stream:
            # Sized by the file (a read of n bytes allocates n), and never past the limit.
            size = os.fstat(stream.fileno()).st_size
            data = stream.read(min(size, MAX_FILE_BYTES) + 1)
            if size < len(data) <= MAX_FILE_BYTES:  # it grew meanwhile: the rest, to the limit
                data += stream.read(MAX_FILE_BYTES + 1 - len(data))
    except OSError as exc:
        loaded.errors.append(ManifestError(str(file), 1, f"cannot read file: {exc}"))
        return None
    if len(data) > MAX_FILE_BYTES:
        loaded.errors.append(ManifestError(str(file), 1, _too_large_message()))
        return None
    budget.charge(size=len(data))
    if spent := budget.overspent():
        loaded.errors.append(ManifestError(str(file), 1, spent))
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        loaded.errors.append(ManifestError(str(file), 1, f"cannot read file: {exc}"))
        return None


def _too_large_message() -> str:
    return (
        f"file too large: a manifest file may hold at most {_mib(MAX_FILE_BYTES)} "
        f"({MAX_FILE_BYTES} bytes)"
    )


def _mib(size: int) -> str:
    return f"{size / (1 << 20):g} MiB"


def _manifest_files(path: Path, loaded: Loaded) -> list[Path]:
    if path.is_dir():
        files = sorted(
            p
            for p in path.rglob("*")
            if p.is_file()
            and p.suffix in MANIFEST_SUFFIXES
            and not any(part.startswith(".") for part in p.relative_to(path).parts)
        )
        if not files:
            loaded.errors.append(ManifestError(str(path), 1, "no *.yaml or *.yml files here"))
        return files
    if not path.exists():
        loaded.errors.append(ManifestError(str(path), 1, "no such file or directory"))
        return []
    return [path]


def parse_text(text: str, *, file: str, default_space: str = "") -> Loaded:
    """Every document of one YAML text. A YAML syntax error, an anchor or alias, or a broken
    bound stops the file there (the parser cannot resynchronise); the documents before it are
    still returned. A text over MAX_FILE_BYTES is not parsed at all."""
    loaded = Loaded()
    if len(text) > MAX_FILE_BYTES or len(text.encode("utf-8")) > MAX_FILE_BYTES:
        loaded.errors.append(ManifestError(file, 1, _too_large_message()))
        return loaded
    loader = _BoundedLoader(text)
    documents = 0
    try:
        while loader.check_node():
            documents += 1
            if documents > MAX_DOCUMENTS_PER_FILE:
                raise _Refused(
                    f"too many documents: a manifest file may hold at most "
                    f"{MAX_DOCUMENTS_PER_FILE}",
                    loader.peek_event().start_mark,
                )
            node = loader.get_node()
            if node is None:
                continue
            data = loader.construct_document(node)
            line = node.start_mark.line + 1
            if data is None:
                continue  # an empty document (a stray `---`)
            key_lines: dict[str, int] = {}
            try:
                key_lines = _key_lines(node)
                resource = parse_document(data, default_space=default_space)
            except _BadManifest as bad:
                where = bad.line or _line_for(bad.path, key_lines, line)
                loaded.errors.append(ManifestError(file, where, bad.message))
                continue
            loaded.manifests.append(
                Manifest(resource=resource, file=file, line=line, key_lines=key_lines)
            )
    except _Refused as refused:
        loaded.errors.append(ManifestError(file, refused.line, refused.message))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        where = mark.line + 1 if mark is not None else 1
        problem = getattr(exc, "problem", None) or str(exc)
        context = getattr(exc, "context", None)
        message = f"YAML syntax error: {problem}" + (f" ({context})" if context else "")
        loaded.errors.append(ManifestError(file, where, message))
    finally:
        loader.dispose()
    return loaded


def _key_lines(node: yaml.Node, prefix: str = "") -> dict[str, int]:
    """Dotted snake_case path -> line, for every key of a document. Also refuses duplicate
    keys, which YAML loaders otherwise resolve silently (the last one wins). The tree is a tree
    (no aliases) at most MAX_DEPTH deep: the loader saw to that."""
    lines: dict[str, int] = {}
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, int] = {}
        for key_node, value_node in node.value:
            raw, line = str(key_node.value), key_node.start_mark.line + 1
            path = f"{prefix}.{_snake(raw)}" if prefix else _snake(raw)
            if raw in seen:
                where = f"{prefix}.{raw}" if prefix else raw
                raise _BadManifest(
                    f'duplicate key "{where}" (first on line {seen[raw]})', line=line
                )
            seen[raw] = lines[path] = line
            lines.update(_key_lines(value_node, path))
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            path = f"{prefix}.{index}"
            lines[path] = item.start_mark.line + 1
            lines.update(_key_lines(item, path))
    return lines


def _line_for(path: str, key_lines: Mapping[str, int], default: int) -> int:
    # Rules name list items the Python way (`spec.address_plans[0]`); key_lines has `.0`.
    parts = [_snake(p) for p in path.replace("[", ".").replace("]", "").split(".") if p]
    while parts:
        if (line := key_lines.get(".".join(parts))) is not None:
            return line
        parts.pop()
    return default


def parse_document(data: object, *, default_space: str = "") -> resources_pb2.Resource:
    """One YAML document (already a Python value) as a Resource; raises _BadManifest."""
    if not isinstance(data, dict):
        raise _BadManifest(f"a manifest must be a mapping, got {_type_word(data)}")
    unknown = sorted(set(map(str, data)) - {"apiVersion", "kind", "metadata", "spec", "status"})
    if unknown:
        raise _BadManifest(
            f'unknown top-level field "{unknown[0]}": expected apiVersion, kind, metadata, spec',
            path=unknown[0],
        )
    api_version = data.get("apiVersion")
    if api_version is None:
        raise _BadManifest(f"missing apiVersion (expected {API_VERSION})")
    if api_version != API_VERSION:
        raise _BadManifest(
            f'unsupported apiVersion "{api_version}": expected {API_VERSION}', path="apiVersion"
        )
    kind = data.get("kind")
    if kind is None:
        raise _BadManifest(f"missing kind (expected one of {', '.join(KINDS)})")
    if kind not in KINDS:
        raise _BadManifest(_unknown_kind_message(str(kind)), path="kind")
    info = KINDS[kind]
    body = {"metadata": data.get("metadata") or {}, "spec": data.get("spec") or {}}
    if not isinstance(body["metadata"], dict):
        raise _BadManifest("metadata must be a mapping", path="metadata")
    body["metadata"] = _plain(body["metadata"])
    body["spec"] = _plain(body["spec"])
    message = info.message()
    _check_fields(body, message.DESCRIPTOR, path="", kind=kind)
    try:
        json_format.ParseDict(body, message)
    except json_format.ParseError as exc:  # what our own walk did not foresee
        raise _BadManifest(_readable_parse_error(str(exc))) from None
    meta = message.metadata  # type: ignore[attr-defined]
    if not meta.name:
        raise _BadManifest(f"metadata.name is required ({kind})", path="metadata")
    if info.space_scoped and not meta.space:
        if not default_space:
            raise _BadManifest(
                f"metadata.space is required ({kind} {meta.name}): the address space it belongs to",
                path="metadata",
            )
        meta.space = default_space
    return resource_of(message)


def _unknown_kind_message(kind: str) -> str:
    close = difflib.get_close_matches(kind, list(KINDS), n=1)
    hint = f' (did you mean "{close[0]}"?)' if close else ""
    return f'unknown kind "{kind}"{hint}: expected one of {", ".join(KINDS)}'


def _plain(value: Any) -> Any:
    """YAML's timestamps back to the RFC 3339 strings protobuf's JSON mapping expects."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, datetime.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=datetime.UTC)
        return value.isoformat().replace("+00:00", "Z")
    return value


def _check_fields(value: Any, descriptor: Descriptor | Any, *, path: str, kind: str) -> None:
    if not isinstance(value, dict):
        raise _BadManifest(
            f"{path or kind}: expected a mapping, got {_type_word(value)}", path=path
        )
    by_name = {f.name: f for f in descriptor.fields}
    by_name.update({f.json_name: f for f in descriptor.fields})
    for key, item in value.items():
        key_path = f"{path}.{key}" if path else str(key)
        fd = by_name.get(str(key))
        if fd is None:
            where = f" in {path}" if path else ""
            known = ", ".join(f.json_name for f in descriptor.fields)
            close = difflib.get_close_matches(str(key), [f.json_name for f in descriptor.fields])
            hint = f' (did you mean "{close[0]}"?)' if close else ""
            raise _BadManifest(
                f'unknown field "{key}"{where} of {kind}{hint}: expected one of {known}',
                path=key_path,
            )
        if item is None:
            continue
        _check_value(item, fd, path=key_path, kind=kind)


def _check_value(item: Any, fd: FieldDescriptor, *, path: str, kind: str) -> None:
    if fd.message_type is not None and fd.message_type.GetOptions().map_entry:
        if not isinstance(item, dict):
            raise _BadManifest(f"{path}: expected a mapping, got {_type_word(item)}", path=path)
        value_fd = fd.message_type.fields_by_name["value"]
        for key, entry in item.items():
            _check_scalar(entry, value_fd, path=f"{path}.{key}", kind=kind)
        return
    if _is_repeated(fd):
        if not isinstance(item, list):
            raise _BadManifest(f"{path}: expected a list, got {_type_word(item)}", path=path)
        for index, entry in enumerate(item):
            _check_scalar(entry, fd, path=f"{path}.{index}", kind=kind)
        return
    _check_scalar(item, fd, path=path, kind=kind)


def _is_repeated(fd: FieldDescriptor) -> bool:
    return bool(fd.is_repeated)


_INTS = {
    FieldDescriptor.TYPE_INT32,
    FieldDescriptor.TYPE_INT64,
    FieldDescriptor.TYPE_UINT32,
    FieldDescriptor.TYPE_UINT64,
    FieldDescriptor.TYPE_SINT32,
    FieldDescriptor.TYPE_SINT64,
}
_FLOATS = {FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT}


def _check_scalar(item: Any, fd: FieldDescriptor, *, path: str, kind: str) -> None:
    if fd.type == FieldDescriptor.TYPE_MESSAGE:
        assert fd.message_type is not None  # a message field always has its type
        if fd.message_type.full_name == "google.protobuf.Timestamp":
            if not isinstance(item, str):
                raise _BadManifest(f"{path}: expected an RFC 3339 timestamp", path=path)
            return
        _check_fields(item, fd.message_type, path=path, kind=kind)
        return
    ok = True
    if fd.type == FieldDescriptor.TYPE_STRING:
        ok, expected = isinstance(item, str), "a string"
    elif fd.type == FieldDescriptor.TYPE_BOOL:
        ok, expected = isinstance(item, bool), "true or false"
    elif fd.type in _INTS:
        # protobuf's JSON writes 64-bit integers as strings ("3"), so `get -o yaml` output does too
        ok, expected = _is_int(item), "an integer"
    elif fd.type in _FLOATS:
        ok, expected = _is_number(item), "a number"
    if not ok:
        raise _BadManifest(f"{path}: expected {expected}, got {_type_word(item)}", path=path)


def _is_int(item: object) -> bool:
    if isinstance(item, str):
        return item.strip().lstrip("-").isdigit()
    return isinstance(item, int) and not isinstance(item, bool)


def _is_number(item: object) -> bool:
    if isinstance(item, str):
        try:
            float(item)
        except ValueError:
            return False
        return True
    return isinstance(item, int | float) and not isinstance(item, bool)


def _type_word(value: object) -> str:
    if value is None:
        return "nothing"
    if isinstance(value, bool):
        return f"{str(value).lower()} (a boolean)"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, str):
        return f'"{value}" (a string)'
    if isinstance(value, int | float):
        return f"{value} (a number)"
    return type(value).__name__


def _readable_parse_error(text: str) -> str:
    # "Failed to parse spec field: Failed to parse broker field: <why>." -> "spec.broker: <why>"
    path: list[str] = []
    prefix = "Failed to parse "
    while text.startswith(prefix) and " field: " in text:
        name, text = text[len(prefix) :].split(" field: ", 1)
        path.append(name)
    return f"{'.'.join(path)}: {text.rstrip('.')}" if path else text


def _snake(name: str) -> str:
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in name)


# ---------------------------------------------------------------- rendering


def to_manifest(resource: resources_pb2.Resource) -> dict[str, Any]:
    """A Resource as the manifest dict people write (camelCase keys, empty fields left out)."""
    message = object_of(resource)
    kind = KINDS[kind_of(resource)]
    out: dict[str, Any] = {"apiVersion": API_VERSION, "kind": kind.name}
    for part in ("metadata", kind.spec, kind.status):
        if part and message.HasField(part):
            out[part] = json_format.MessageToDict(getattr(message, part))
    out.setdefault("metadata", {})
    out.setdefault("spec", {})
    return out


def dump_yaml(resources: Sequence[resources_pb2.Resource]) -> str:
    """Multi-document YAML (documents separated by `---`): what `apply -f` reads back."""
    return yaml.safe_dump_all(
        [to_manifest(r) for r in resources], sort_keys=False, default_flow_style=False
    )


def dump_json(resources: Sequence[resources_pb2.Resource], *, single: bool = False) -> str:
    """One manifest object (single) or a JSON list of them."""
    docs = [to_manifest(r) for r in resources]
    return json.dumps(docs[0] if single and docs else docs, indent=2)
