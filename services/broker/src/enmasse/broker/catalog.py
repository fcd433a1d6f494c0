"""The address catalog: which queues and topics this broker has, with their plans, and the durable
subscriptions of each topic, in one small JSON file in the data directory.

It flows in from BrokerAdmin, the start-up YAML and durable subscribers attaching, and out at the
next start, before the journal is replayed, so recovered messages find their queues. Written whole
to a temporary file, fsync'd and renamed over the old one: a crash leaves the old or the new
catalog, never half of one. Changes are rare (admin calls, new durable subscribers), so
rewriting is cheap.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from enmasse.broker.plan import Plan


@dataclass
class CatalogData:
    queues: dict[str, Plan] = field(default_factory=dict)
    topics: dict[str, Plan] = field(default_factory=dict)
    durable_subscriptions: dict[str, list[str]] = field(default_factory=dict)  # topic -> ids


class Catalog:
    def __init__(self, path: Path | None) -> None:
        self.path = path  # None: an in-memory broker (tests), nothing is written

    def load(self) -> CatalogData:
        if self.path is None or not self.path.exists():
            return CatalogData()
        raw = json.loads(self.path.read_text())
        return CatalogData(
            queues={k: Plan.from_dict(v) for k, v in raw.get("queues", {}).items()},
            topics={k: Plan.from_dict(v) for k, v in raw.get("topics", {}).items()},
            durable_subscriptions={
                k: list(v) for k, v in raw.get("durable_subscriptions", {}).items()
            },
        )

    def save(self, data: CatalogData) -> None:
        if self.path is None:
            return
        text = json.dumps(
            {
                "queues": {k: v.to_dict() for k, v in sorted(data.queues.items())},
                "topics": {k: v.to_dict() for k, v in sorted(data.topics.items())},
                "durable_subscriptions": {
                    k: sorted(v) for k, v in sorted(data.durable_subscriptions.items()) if v
                },
            },
            indent=1,
        )
        tmp = self.path.with_suffix(".tmp")
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        fd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
