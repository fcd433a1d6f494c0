"""The settings a queue or topic is created with: the broker's slice of an `AddressPlanSpec`.

They flow in from BrokerAdmin (`EnsureQueue`/`EnsureTopic` carry an `AddressPlanSpec`) or from the
start-up YAML, and flow out into the address catalog file so that a restarted broker has the same
queues with the same rules before any controller talks to it again.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from enmasse.v1 import resources_pb2


@dataclass(frozen=True, slots=True)
class Plan:
    persistent: bool = True
    memory_limit_bytes: int = 0  # 0: only the broker-wide budget applies
    default_ttl_ms: int = 0  # 0: messages live until consumed unless they say otherwise
    max_delivery_attempts: int = 0  # 0: redeliver forever
    dead_letter_address: str = ""
    expiry_address: str = ""

    @classmethod
    def from_proto(cls, spec: resources_pb2.AddressPlanSpec) -> Plan:
        return cls(
            persistent=spec.persistent,
            memory_limit_bytes=spec.memory_limit_bytes,
            default_ttl_ms=spec.default_ttl_ms,
            max_delivery_attempts=spec.max_delivery_attempts,
            dead_letter_address=spec.dead_letter_address,
            expiry_address=spec.expiry_address,
        )

    def to_proto(self) -> resources_pb2.AddressPlanSpec:
        return resources_pb2.AddressPlanSpec(**asdict(self))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Plan:
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        unknown = sorted(set(data) - set(cls.__dataclass_fields__))
        if unknown:
            raise ValueError(f"unknown plan setting(s): {', '.join(unknown)}")
        return cls(**known)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def problems(self) -> list[str]:
        """Why this plan cannot be used, for INVALID_ARGUMENT; empty when it is fine."""
        found = []
        if self.memory_limit_bytes < 0:
            found.append("memory_limit_bytes must be >= 0")
        if self.default_ttl_ms < 0:
            found.append("default_ttl_ms must be >= 0")
        if self.max_delivery_attempts < 0:
            found.append("max_delivery_attempts must be >= 0")
        return found
