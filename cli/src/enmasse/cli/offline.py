"""`enmasse validate`: every error of a manifests directory, offline, as `file:line: message`.

In: what `manifests.load_paths` found (parse errors and parsed manifests). The parsed ones are
checked as one batch with the very rules the ConfigService applies
(`enmasse.resources.validation.validate_batch`) against a catalog holding the default plans; the
batch's own plans and address spaces count as existing (that is how validate_batch reads a batch),
so a manifests repository's CI refuses what the server would refuse, before anything is pushed.

Out: `file:line: message` lines sorted by file and line, each pointing at the offending key when
the rule names a field, else at the document start.
"""

from __future__ import annotations

from enmasse.resources import plans, validation
from enmasse.resources.manifests import Loaded


def default_catalog() -> validation.Catalog:
    catalog = validation.Catalog()
    for plan in plans.load_default_plans():
        catalog.put(plan)
    return catalog


def check(loaded: Loaded) -> list[str]:
    found = [(e.file, e.line, e.message) for e in loaded.errors]
    resources = [m.resource for m in loaded.manifests]
    verdicts = validation.validate_batch(resources, catalog=default_catalog()) if resources else []
    for manifest, violations in zip(loaded.manifests, verdicts, strict=True):
        for violation in violations:
            found.append((manifest.file, manifest.line_of(violation.field), str(violation)))
    return [f"{file}:{line}: {message}" for file, line, message in sorted(found)]
