"""`enmasse diff`: what an apply of these manifests would create, change, prune, or refuse.

In: the results of a dry-run Apply per scope (the server's own verdict, computed with the rules and
against the store the apply would meet, so the preview cannot disagree with the apply), and, for
each resource the server would change, the live object beside the desired one. Out: one line per
resource that would not stay as it is, kubectl-diff style, with a unified diff of what changes:

    + address/orders (space demo) would be created
    ~ address/prices (space demo) would change
        --- live
        +++ manifests
        @@ -1,4 +1,4 @@
        ...
    - address/old (space demo) would be pruned
    ! address/bad (space demo) would be refused: unknown plan "no-such"

and a closing count. Only what people write is compared (labels, annotations, spec): the
bookkeeping the server keeps (versions, uid, status) is not theirs to change. Passwords never
appear: the store holds a hash, and a diff is no place for the clear text either.

Pure functions: main.py makes the calls.
"""

from __future__ import annotations

import difflib
from collections import Counter
from collections.abc import Iterable
from typing import Any

import yaml
from enmasse.resources.manifests import to_manifest
from enmasse.v1 import config_pb2, resources_pb2

Action = config_pb2.ApplyResult
_SIGNS = {Action.CREATED: "+", Action.UPDATED: "~", Action.PRUNED: "-", Action.REFUSED: "!"}
_VERBS = {
    Action.CREATED: "would be created",
    Action.UPDATED: "would change",
    Action.PRUNED: "would be pruned",
    Action.REFUSED: "would be refused",
}
_COUNT_WORDS = (
    (Action.CREATED, "to create"),
    (Action.UPDATED, "to change"),
    (Action.PRUNED, "to prune"),
    (Action.REFUSED, "refused"),
    (Action.UNCHANGED, "unchanged"),
)
_SECRETS = ("password", "passwordHash")


def change_line(result: config_pb2.ApplyResult) -> str | None:
    """`+ address/orders (space demo) would be created`; None for what stays unchanged."""
    sign = _SIGNS.get(result.action)
    if sign is None:
        return None
    where = f" (space {result.ref.space})" if result.ref.space else ""
    line = f"{sign} {result.kind.lower()}/{result.ref.name}{where} {_VERBS[result.action]}"
    if result.action == Action.REFUSED and result.message:
        line += f": {result.message}"
    return line


def summary_line(results: Iterable[config_pb2.ApplyResult]) -> str:
    """`1 to create, 1 to change, 0 to prune, 0 refused, 5 unchanged`."""
    counts = Counter(result.action for result in results)
    return ", ".join(f"{counts[action]} {words}" for action, words in _COUNT_WORDS)


def comparable(resource: resources_pb2.Resource) -> dict[str, Any]:
    """What a person writes of a resource: labels, annotations and spec, secrets left out."""
    manifest = to_manifest(resource)
    metadata = manifest.get("metadata", {})
    spec = {k: v for k, v in manifest.get("spec", {}).items() if k not in _SECRETS}
    kept = {k: metadata[k] for k in ("labels", "annotations") if metadata.get(k)}
    return {"metadata": kept, "spec": spec} if kept else {"spec": spec}


def spec_diff(live: resources_pb2.Resource, desired: resources_pb2.Resource) -> list[str]:
    """The unified diff (live -> manifests) of what a person wrote, as YAML lines."""
    before = yaml.safe_dump(comparable(live), sort_keys=True).splitlines()
    after = yaml.safe_dump(comparable(desired), sort_keys=True).splitlines()
    return list(difflib.unified_diff(before, after, "live", "manifests", lineterm=""))
