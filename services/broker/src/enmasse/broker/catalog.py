"""The address catalog: which queues and topics this broker has, with their plans, and the durable
subscriptions of each topic (with their JMS selectors), kept in the data directory as a snapshot
plus an append-only log.

Changes flow in from BrokerAdmin, the start-up YAML and durable subscribers attaching, one small
record each (`put_queue`, `drop_topic`, `add_subscription` ...); they are buffered until `commit()`,
which appends them all with one write and one fsync. That is what makes thousands of EnsureQueue
calls cheap: the cost of a commit no longer grows with the catalog (the old design rewrote the
whole JSON file per call), and callers that arrive together share one fsync (group commit).
The catalog flows out at the next start, before the journal is replayed, so recovered messages
find their queues: `load()` reads the snapshot (`addresses.json`) and replays the log
(`addresses.log`) over it.

A log line is `<crc32 hex> <json>\n`. A crash can tear the last line; `load()` keeps every line
up to the first one that is incomplete or fails its checksum and cuts the file there, so later
appends never sit behind garbage. Every record sets or removes one key whole, so replaying a log
over a snapshot that already holds it changes nothing: compaction (snapshot written to a temporary
file, fsync'd, renamed, then the log emptied) is crash-safe at every step without a generation
number. An in-memory broker (no data directory) keeps the same state and writes nothing.
"""

from __future__ import annotations

import json
import os
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog
from enmasse.broker.plan import Plan

log = structlog.get_logger(__name__)

# compact once the log holds this many records beyond twice the live catalog: a bounded log,
# and a snapshot rewrite at most once per ~N changes, so its cost is spread thin
COMPACT_SLACK = 1024


@dataclass
class CatalogData:
    queues: dict[str, Plan] = field(default_factory=dict)
    topics: dict[str, Plan] = field(default_factory=dict)
    durable_subscriptions: dict[str, list[str]] = field(default_factory=dict)  # topic -> ids
    subscription_selectors: dict[str, dict[str, str]] = field(default_factory=dict)  # topic -> id
    # topic -> id -> wall-clock ms after which a durable subscription whose subscriber went away
    # with a terminus timeout is removed, unless it came back (leases.py)
    subscription_leases: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def size(self) -> int:
        return (
            len(self.queues)
            + len(self.topics)
            + sum(len(ids) for ids in self.durable_subscriptions.values())
        )


class CatalogError(ValueError):
    """A catalog record that cannot be applied (a bug or a hand-edited file)."""


def encode_record(record: dict[str, Any]) -> bytes:
    body = json.dumps(record, separators=(",", ":"), sort_keys=True).encode()
    return b"%08x %s\n" % (zlib.crc32(body), body)


def decode_record(line: bytes) -> dict[str, Any] | None:
    """The record of one complete log line (newline included), or None when torn or corrupt."""
    if len(line) < 10 or not line.endswith(b"\n") or line[8:9] != b" ":
        return None
    body = line[9:-1]
    try:
        if int(line[:8], 16) != zlib.crc32(body):
            return None
        record = json.loads(body)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def apply_record(data: CatalogData, record: dict[str, Any]) -> None:
    """Applies one record to the catalog state; every record sets or removes one key whole."""
    op = record.get("op")
    if op == "queue":
        data.queues[record["name"]] = Plan.from_dict(record["plan"])
    elif op == "queue-":
        data.queues.pop(record["name"], None)
    elif op == "topic":
        data.topics[record["name"]] = Plan.from_dict(record["plan"])
    elif op == "topic-":
        data.topics.pop(record["name"], None)
        data.durable_subscriptions.pop(record["name"], None)
        data.subscription_selectors.pop(record["name"], None)
        data.subscription_leases.pop(record["name"], None)
    elif op == "sub":
        ids = data.durable_subscriptions.setdefault(record["topic"], [])
        if record["id"] not in ids:
            ids.append(record["id"])
        _set_selector(data, record["topic"], record["id"], record.get("selector"))
    elif op == "sub-":
        ids = data.durable_subscriptions.get(record["topic"], [])
        if record["id"] in ids:
            ids.remove(record["id"])
        if not ids:
            data.durable_subscriptions.pop(record["topic"], None)
        _set_selector(data, record["topic"], record["id"], None)
        _set_lease(data, record["topic"], record["id"], None)
    elif op == "lease":
        _set_lease(data, record["topic"], record["id"], record.get("until_ms"))
    else:
        raise CatalogError(f"unknown catalog record {op!r}")


def _set_selector(data: CatalogData, topic: str, identity: str, selector: str | None) -> None:
    selectors = data.subscription_selectors.setdefault(topic, {})
    if selector is None:
        selectors.pop(identity, None)
    else:
        selectors[identity] = selector
    if not selectors:
        data.subscription_selectors.pop(topic, None)


def _set_lease(data: CatalogData, topic: str, identity: str, until_ms: int | None) -> None:
    leases = data.subscription_leases.setdefault(topic, {})
    if until_ms is None:
        leases.pop(identity, None)
    else:
        leases[identity] = int(until_ms)
    if not leases:
        data.subscription_leases.pop(topic, None)


def snapshot_text(data: CatalogData) -> str:
    return json.dumps(
        {
            "queues": {k: v.to_dict() for k, v in sorted(data.queues.items())},
            "topics": {k: v.to_dict() for k, v in sorted(data.topics.items())},
            "durable_subscriptions": {
                k: sorted(v) for k, v in sorted(data.durable_subscriptions.items()) if v
            },
            "subscription_selectors": {
                k: dict(sorted(v.items())) for k, v in sorted(data.subscription_selectors.items())
            },
            "subscription_leases": {
                k: dict(sorted(v.items())) for k, v in sorted(data.subscription_leases.items())
            },
        },
        indent=1,
    )


def parse_snapshot(text: str) -> CatalogData:
    raw = json.loads(text)
    return CatalogData(
        queues={k: Plan.from_dict(v) for k, v in raw.get("queues", {}).items()},
        topics={k: Plan.from_dict(v) for k, v in raw.get("topics", {}).items()},
        durable_subscriptions={k: list(v) for k, v in raw.get("durable_subscriptions", {}).items()},
        subscription_selectors={
            k: dict(v) for k, v in raw.get("subscription_selectors", {}).items()
        },
        subscription_leases={
            k: {i: int(ms) for i, ms in v.items()}
            for k, v in raw.get("subscription_leases", {}).items()
        },
    )


class Catalog:
    def __init__(self, path: Path | None) -> None:
        self.path = path  # the snapshot; None: an in-memory broker (tests), nothing is written
        self.log_path = path.with_suffix(".log") if path is not None else None
        self.data = CatalogData()
        self.torn_bytes = 0  # cut from the log's tail at load (a crash mid-append)
        self._pending: list[bytes] = []
        self._log_records = 0
        self._log_fd: int | None = None

    # ------------------------------------------------------------------ start and stop

    def load(self) -> CatalogData:
        """The snapshot with the log replayed over it; a torn log tail is cut off."""
        if self.path is not None and self.path.exists():
            self.data = parse_snapshot(self.path.read_text())
        if self.log_path is not None and self.log_path.exists():
            self._replay_log()
        return self.data

    def close(self) -> None:
        if self._log_fd is not None:
            os.close(self._log_fd)
            self._log_fd = None

    def _replay_log(self) -> None:
        assert self.log_path is not None
        raw = self.log_path.read_bytes()
        good = 0
        for line in raw.splitlines(keepends=True):
            record = decode_record(line)
            if record is None:
                break
            apply_record(self.data, record)
            good += len(line)
            self._log_records += 1
        self.torn_bytes = len(raw) - good
        if self.torn_bytes:
            log.warning(
                "catalog log tail torn; cut", path=str(self.log_path), bytes=self.torn_bytes
            )
            with open(self.log_path, "r+b") as f:
                f.truncate(good)
                os.fsync(f.fileno())

    # ------------------------------------------------------------------ changes

    def put_queue(self, name: str, plan: Plan) -> None:
        self._change({"op": "queue", "name": name, "plan": plan.to_dict()})

    def drop_queue(self, name: str) -> None:
        self._change({"op": "queue-", "name": name})

    def put_topic(self, name: str, plan: Plan) -> None:
        self._change({"op": "topic", "name": name, "plan": plan.to_dict()})

    def drop_topic(self, name: str) -> None:
        self._change({"op": "topic-", "name": name})

    def add_subscription(self, topic: str, identity: str, *, selector: str | None = None) -> None:
        """A durable subscription (again, with its JMS selector: the record sets it whole)."""
        record: dict[str, Any] = {"op": "sub", "topic": topic, "id": identity}
        if selector is not None:
            record["selector"] = selector
        self._change(record)

    def drop_subscription(self, topic: str, identity: str) -> None:
        self._change({"op": "sub-", "topic": topic, "id": identity})

    def lease_subscription(self, topic: str, identity: str, *, until_ms: int | None) -> None:
        """A durable subscription ends at `until_ms` unless its subscriber returns (None: it
        returned, or never left: no end)."""
        record: dict[str, Any] = {"op": "lease", "topic": topic, "id": identity}
        if until_ms is not None:
            record["until_ms"] = until_ms
        self._change(record)

    def _change(self, record: dict[str, Any]) -> None:
        apply_record(self.data, record)
        if self.path is not None:
            self._pending.append(encode_record(record))

    # ------------------------------------------------------------------ writing

    @property
    def uncommitted(self) -> int:
        return len(self._pending)

    def commit(self) -> None:
        """Makes every change so far durable: one append and one fsync for all of them."""
        if not self._pending:
            return
        fd = self._open_log()
        chunk = b"".join(self._pending)
        written = 0
        while written < len(chunk):
            written += os.write(fd, chunk[written:])
        os.fdatasync(fd)
        self._log_records += len(self._pending)
        self._pending.clear()
        if self._log_records > 2 * self.data.size + COMPACT_SLACK:
            self.compact()

    def compact(self) -> None:
        """Folds the log into a new snapshot, then empties the log (pending changes committed)."""
        if self.path is None:
            return
        self.commit()
        tmp = self.path.with_suffix(".tmp")
        with open(tmp, "w") as f:
            f.write(snapshot_text(self.data))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        _sync_directory(self.path.parent)
        fd = self._open_log()
        # a crash before this truncate replays the old log over the new snapshot: harmless
        os.ftruncate(fd, 0)
        os.fsync(fd)
        self._log_records = 0

    def _open_log(self) -> int:
        if self._log_fd is None:
            assert self.log_path is not None
            created = not self.log_path.exists()
            self._log_fd = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            if created:
                os.fsync(self._log_fd)
                _sync_directory(self.log_path.parent)
        return self._log_fd


def _sync_directory(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
