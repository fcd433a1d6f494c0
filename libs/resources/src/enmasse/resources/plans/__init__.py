"""The default plans, shipped as YAML manifests inside this package, and the manifest reader.

In: `default-plans.yaml` (beside this file), documents of `apiVersion: enmasse.io/v1`, `kind`,
`metadata`, `spec`, with camelCase keys exactly as protobuf's json_format writes and reads them.
Out: `resources_pb2.Resource` messages, ready for the config service to store when it starts on an
empty store, or for `enmasse validate` to use as the catalog of plans.

Why YAML and not Python literals: they are the same manifests an operator edits and commits to
git; the service reads them with the very parser the GitOps path uses.
"""

from __future__ import annotations

from importlib import resources as package_files
from typing import Any

import yaml
from enmasse.resources.kinds import API_VERSION, KINDS, resource_of
from enmasse.v1 import resources_pb2
from google.protobuf import json_format

DEFAULT_PLANS_FILE = "default-plans.yaml"


class ManifestError(ValueError):
    """A manifest that cannot be read as a resource; the message says which field and why."""


def load_default_plans() -> list[resources_pb2.Resource]:
    """Every default AddressPlan and AddressSpacePlan, address plans first."""
    text = package_files.files(__package__).joinpath(DEFAULT_PLANS_FILE).read_text()
    return [resource_from_manifest(doc) for doc in yaml.safe_load_all(text) if doc]


def resource_from_manifest(doc: dict[str, Any]) -> resources_pb2.Resource:
    """One manifest document (a dict) as a Resource; ManifestError says what is wrong."""
    if not isinstance(doc, dict):
        raise ManifestError("a manifest must be a mapping")
    if doc.get("apiVersion") != API_VERSION:
        raise ManifestError(f"apiVersion must be {API_VERSION} (got {doc.get('apiVersion')!r})")
    kind = doc.get("kind")
    if not isinstance(kind, str) or kind not in KINDS:
        raise ManifestError(f"kind must be one of {', '.join(KINDS)} (got {kind!r})")
    message = KINDS[kind].message()
    body = {"metadata": doc.get("metadata") or {}, "spec": doc.get("spec") or {}}
    try:
        json_format.ParseDict(body, message)
    except json_format.ParseError as error:
        raise ManifestError(f"{kind}: {error}") from error
    return resource_of(message)
