"""`enmasse apply`: manifests -> one atomic Apply per scope -> kubectl-like lines.

The ConfigService applies a batch per scope (plans: space ""; one address space: the
AddressSpace of that name plus its addresses and users), so `batches` groups what the files hold:
plans first (the spaces need them), then each space in the order it first appears. `outcome_line`
turns each ApplyResult into `address/orders created`.

Both are pure: the network call sits in main.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from enmasse.resources.manifests import Manifest, scope_of
from enmasse.v1 import config_pb2, resources_pb2

_WORDS = {
    config_pb2.ApplyResult.CREATED: "created",
    config_pb2.ApplyResult.UPDATED: "configured",
    config_pb2.ApplyResult.UNCHANGED: "unchanged",
    config_pb2.ApplyResult.PRUNED: "pruned",
    config_pb2.ApplyResult.REFUSED: "refused",
}


@dataclass
class Batch:
    space: str
    resources: list[resources_pb2.Resource] = field(default_factory=list)


def batches(manifests: Sequence[Manifest]) -> list[Batch]:
    by_scope: dict[str, Batch] = {"": Batch(space="")}
    for manifest in manifests:
        scope = scope_of(manifest.resource)
        by_scope.setdefault(scope, Batch(space=scope)).resources.append(manifest.resource)
    return [batch for batch in by_scope.values() if batch.resources]


def outcome_line(result: config_pb2.ApplyResult, *, dry_run: bool = False) -> str:
    line = f"{result.kind.lower()}/{result.ref.name} {_WORDS.get(result.action, 'unknown')}"
    if result.action == config_pb2.ApplyResult.REFUSED and result.message:
        line += f": {result.message}"
    return line + (" (dry run)" if dry_run else "")
