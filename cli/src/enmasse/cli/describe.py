"""`enmasse describe KIND NAME`: one resource as a person reads it, with its recent history.

In: the resource as the config service answers it, and the config service's audit trail when
this machine has it (`<var>/log/config.log` and its rotated `config.log.1`, `.2`, written by the
config program `enmasse up` runs; JSON lines whose `event` is `audit`: who did what to which
object, and the outcome). Out: kubectl-describe-like text: the name block (kind, space, labels,
annotations, who manages it, when it was made, generation and version), the spec as YAML, the
status (phase, the generation it speaks of, its messages as conditions), the placement (an
address's brokers) or endpoints (a space's), then the last audit events about the object.

Why the audit log and not an events API: the config service keeps no events; what it records
is the audit trail, one line per write and per refusal. With a config service elsewhere (no log
here) the Events section says where it looked. Pure except for `audit_events` reading files.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from enmasse.resources.kinds import Kind, object_of
from enmasse.resources.manifests import to_manifest
from enmasse.v1 import resources_pb2

AUDIT_EVENT = "audit"
RECENT_EVENTS = 10
_ROTATED = 3  # supervisord keeps config.log.1 and .2 (stdout_logfile_backups = 2)


@dataclass(frozen=True)
class AuditLine:
    """One audit event about an object, as the config service logged it."""

    timestamp: str
    who: str
    rpc: str
    outcome: str
    reason: str

    def row(self) -> str:
        why = f": {self.reason}" if self.reason else ""
        return f"  {self.timestamp:<28} {self.who:<20} {self.rpc:<20} {self.outcome}{why}"


def audit_log_files(log_dir: Path) -> list[Path]:
    """The config service's log files, oldest first."""
    names = [f"config.log.{n}" for n in range(_ROTATED - 1, 0, -1)] + ["config.log"]
    return [log_dir / name for name in names if (log_dir / name).is_file()]


def audit_events(
    files: Iterable[Path], *, kind: str, space: str, name: str, limit: int = RECENT_EVENTS
) -> list[AuditLine]:
    """The last `limit` audit events of the object (kind, space, name), oldest first."""
    found: list[AuditLine] = []
    for file in files:
        with file.open(errors="replace") as lines:
            for line in lines:
                event = _audit_event(line)
                if event is None or (event.get("kind"), event.get("name")) != (kind, name):
                    continue
                if event.get("space", "") != space:
                    continue
                found.append(
                    AuditLine(
                        timestamp=str(event.get("timestamp", "")),
                        who=str(event.get("who", "")),
                        rpc=str(event.get("rpc", "")),
                        outcome=str(event.get("outcome", "")),
                        reason=str(event.get("reason", "")),
                    )
                )
    return found[-limit:]


def _audit_event(line: str) -> dict[str, Any] | None:
    if f'"{AUDIT_EVENT}"' not in line:  # most lines are not: skip the parse
        return None
    try:
        event = json.loads(line)
    except ValueError:
        return None
    return event if isinstance(event, dict) and event.get("event") == AUDIT_EVENT else None


def _block(title: str, value: Any) -> list[str]:
    text = yaml.safe_dump(value, sort_keys=False, default_flow_style=False).rstrip("\n")
    return [f"{title}:", *(f"  {line}" for line in text.splitlines())]


def _pairs(title: str, mapping: Any) -> list[str]:
    if not mapping:
        return [f"{title:<17}<none>"]
    items = sorted(mapping.items())
    first, *rest = (f"{key}={value}" for key, value in items)
    return [f"{title:<17}{first}", *(f"{'':<17}{pair}" for pair in rest)]


def describe(
    info: Kind,
    resource: resources_pb2.Resource,
    *,
    events: Sequence[AuditLine] | None,
    events_source: str,
) -> str:
    """The text of `enmasse describe`. `events` None: no audit log was found (`events_source`
    says where it was looked for)."""
    message = object_of(resource)
    meta = message.metadata
    manifest = to_manifest(resource)
    lines = [f"{'Name:':<17}{meta.name}", f"{'Kind:':<17}{info.name}"]
    if info.space_scoped:
        lines.append(f"{'Space:':<17}{meta.space}")
    lines += _pairs("Labels:", meta.labels)
    lines += _pairs("Annotations:", meta.annotations)
    lines.append(f"{'Managed-By:':<17}{meta.managed_by or '<none>'}")
    created = meta.created_at.ToJsonString() if meta.HasField("created_at") else "<unknown>"
    lines.append(f"{'Created:':<17}{created}")
    lines.append(f"{'Generation:':<17}{meta.generation}")
    lines.append(f"{'Resource-Version:':<17}{meta.resource_version}")
    lines += _block("Spec", manifest.get("spec", {}) or {})
    if info.status:
        lines += _status_lines(message)
    lines += _placement_lines(info, message)
    lines += _event_lines(events, events_source)
    return "\n".join(lines)


def _status_lines(message: Any) -> list[str]:
    status = message.status.status
    phase = status.phase or "<none>"
    observed = status.observed_generation
    current = message.metadata.generation
    lines = ["Status:", f"  {'Phase:':<15}{phase}"]
    lines.append(f"  {'Observed:':<15}generation {observed} of {current}")
    lines.append("Conditions:")
    lines.append(f"  {'TYPE':<10}{'STATUS':<8}MESSAGE")
    ready = "True" if status.phase == "Active" else "False"
    why = "; ".join(status.messages) or ("-" if ready == "True" else f"phase is {phase}")
    lines.append(f"  {'Ready':<10}{ready:<8}{why}")
    synced = "True" if observed >= current else "False"
    lag = "-" if synced == "True" else f"the status speaks of generation {observed}, not {current}"
    lines.append(f"  {'Observed':<10}{synced:<8}{lag}")
    return lines


def _placement_lines(info: Kind, message: Any) -> list[str]:
    if info.name == "Address":
        placed = message.status.brokers
        if not placed:
            return ["Placement:       <none>"]
        lines = ["Placement:", f"  {'BROKER':<24}{'STATE':<10}{'WAITING':<9}REASON"]
        for broker in placed:
            waiting = "yes" if broker.waiting else "no"
            lines.append(
                f"  {broker.broker:<24}{broker.state:<10}{waiting:<9}{broker.reason or '-'}"
            )
        return lines
    if info.name == "AddressSpace":
        endpoints = message.status.endpoints
        if not endpoints:
            return ["Endpoints:       <none>"]
        return ["Endpoints:", *(f"  {e.name:<8}{e.host}:{e.port}" for e in endpoints)]
    return []


def _event_lines(events: Sequence[AuditLine] | None, source: str) -> list[str]:
    if events is None:
        return [f"Events:          <none: no audit log at {source}>"]
    if not events:
        return [f"Events:          <none in {source}>"]
    header = f"  {'TIME':<28} {'WHO':<20} {'RPC':<20} OUTCOME"
    return [f"Events (audit log {source}):", header, *(e.row() for e in events)]
