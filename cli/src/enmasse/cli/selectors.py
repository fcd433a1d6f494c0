"""`-l` label selectors and `--field-selector`s of `enmasse get` / `watch`, as kubectl reads them.

In: the selector text the user typed. Out: a predicate over resources, or a `CliError` naming the
part that could not be read. The config service lists a kind whole (by space at most), so the CLI
filters what it lists: the same answer kubectl's server-side selectors give, at the scale of a
local installation.

Label selectors (comma-separated requirements, all must hold): `key=value`, `key==value`,
`key!=value`, `key` (has the label), `!key` (has not), `key in (a,b)`, `key notin (a,b)`.
Field selectors: `path=value`, `path==value`, `path!=value`, where path is a field as the manifest
(`-o yaml`) spells it: `metadata.name`, `spec.type`, `spec.plan`, `status.status.phase`, or
`status.phase` for short. A field the object does not have compares as "".
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from enmasse.cli.client import CliError
from enmasse.resources.kinds import object_of
from enmasse.resources.manifests import to_manifest
from enmasse.v1 import resources_pb2

Predicate = Callable[[resources_pb2.Resource], bool]

_KEY = r"[A-Za-z0-9]([-A-Za-z0-9_./]*[A-Za-z0-9])?"
_SET = re.compile(rf"^\s*(?P<key>{_KEY})\s+(?P<op>in|notin)\s*\((?P<values>[^()]*)\)\s*$")
_COMPARE = re.compile(rf"^\s*(?P<key>{_KEY})\s*(?P<op>==|!=|=)\s*(?P<value>[^=!,\s]*)\s*$")
_EXISTS = re.compile(rf"^\s*(?P<neg>!?)\s*(?P<key>{_KEY})\s*$")
_FIELD = re.compile(r"^\s*(?P<path>[A-Za-z][A-Za-z0-9_.]*)\s*(?P<op>==|!=|=)\s*(?P<value>.*?)\s*$")


@dataclass(frozen=True)
class Requirement:
    key: str
    op: str  # "=", "!=", "in", "notin", "exists", "!exists"
    values: frozenset[str] = frozenset()

    def holds(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key)
        if self.op == "exists":
            return present
        if self.op == "!exists":
            return not present
        if self.op in ("=", "in"):
            return present and value in self.values
        return not present or value not in self.values  # != and notin: as kubectl


def _split(text: str) -> list[str]:
    """Commas separate requirements, except inside `in (a,b)`."""
    parts, depth, current = [], 0, ""
    for char in text:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    parts.append(current)
    return parts


def parse_labels(text: str) -> list[Requirement]:
    """The requirements of a label selector; CliError on the first part that is not one."""
    requirements = []
    for part in _split(text):
        if found := _SET.match(part):
            values = frozenset(v.strip() for v in found["values"].split(",") if v.strip())
            requirements.append(Requirement(found["key"], found["op"], values))
        elif found := _COMPARE.match(part):
            op = "!=" if found["op"] == "!=" else "="
            requirements.append(Requirement(found["key"], op, frozenset([found["value"]])))
        elif found := _EXISTS.match(part):
            op = "!exists" if found["neg"] else "exists"
            requirements.append(Requirement(found["key"], op))
        else:
            raise CliError(
                f"invalid label selector {text!r}: cannot read {part.strip()!r} "
                "(expected key=value, key!=value, key, !key, key in (a,b) or key notin (a,b))"
            )
    return requirements


@dataclass(frozen=True)
class FieldRequirement:
    path: tuple[str, ...]
    equal: bool
    value: str

    def holds(self, manifest: Mapping[str, Any]) -> bool:
        return (_lookup(manifest, self.path) == self.value) is self.equal


def _lookup(manifest: Mapping[str, Any], path: tuple[str, ...]) -> str:
    value: Any = manifest
    for part in path:
        if not isinstance(value, Mapping) or part not in value:
            return ""
        value = value[part]
    if isinstance(value, bool):
        return "true" if value else "false"
    return "" if isinstance(value, Mapping | list) else str(value)


def parse_fields(text: str) -> list[FieldRequirement]:
    requirements = []
    for part in text.split(","):
        found = _FIELD.match(part)
        if found is None:
            raise CliError(
                f"invalid field selector {text!r}: cannot read {part.strip()!r} "
                "(expected path=value or path!=value, e.g. status.phase=Active)"
            )
        path = tuple(found["path"].split("."))
        if path == ("status", "phase"):  # kubectl's spelling; ours nests the shared Status
            path = ("status", "status", "phase")
        requirements.append(FieldRequirement(path, found["op"] != "!=", found["value"]))
    return requirements


def predicate(*, labels: str = "", fields: str = "") -> Predicate | None:
    """One predicate for both selectors; None when neither was given (keep everything)."""
    if not labels and not fields:
        return None
    label_requirements = parse_labels(labels) if labels else []
    field_requirements = parse_fields(fields) if fields else []

    def selected(resource: resources_pb2.Resource) -> bool:
        own = object_of(resource).metadata.labels
        if not all(r.holds(own) for r in label_requirements):
            return False
        if not field_requirements:
            return True
        manifest = to_manifest(resource)
        return all(r.holds(manifest) for r in field_requirements)

    return selected
