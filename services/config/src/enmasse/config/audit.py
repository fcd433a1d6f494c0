"""The audit trail of the ConfigService: one structured event per write and per refusal at the edge.

In: what happened at the edge of an RPC: who (the token's name and role, or `unauthenticated`),
what (the RPC and the kind), where (the address space and the object's name), the outcome (`ok`,
or the gRPC status code's name) and why (the refusal's message), and the caller's address.
Out: one log event `audit` (logger `enmasse.config.audit`) with exactly those fields, for every
write (Create / Update / Delete / status / Apply / tokens, whatever its outcome) and for every
call refused as UNAUTHENTICATED or PERMISSION_DENIED.

Why a rate limit: a client that retries a refused call in a tight loop, or somebody guessing
tokens, must not fill the disk with audit lines. Each (who, outcome) has a token bucket
(`RateLimiter`: `burst` events at once, then `rate` a second); what the bucket refuses is counted,
and the count comes out as one `audit suppressed` event, when that (who, outcome) is let through
again or at the next `flush` (the service flushes every few seconds), so the trail says how much
it left out. The limiter is pure (time is passed in), so its arithmetic is tested without a clock.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structlog

log = structlog.get_logger("enmasse.config.audit")

OK = "ok"
Emit = Callable[..., Any]
"""How an event leaves: `emit(event, **fields)` (a structlog logger's `info` by default)."""


@dataclass
class _Bucket:
    tokens: float
    updated: float
    suppressed: int = 0


class RateLimiter:
    """A token bucket per key: `burst` at once, refilled at `rate` a second."""

    def __init__(self, *, rate: float = 5.0, burst: int = 20, max_keys: int = 10_000) -> None:
        self.rate = rate
        self.burst = burst
        self._max_keys = max_keys
        self._buckets: dict[tuple[str, str], _Bucket] = {}

    def admit(self, key: tuple[str, str], *, now: float) -> tuple[bool, int]:
        """(whether this event goes out, how many of this key were suppressed before it and are
        to be reported now: 0 unless the event goes out after some were held back)."""
        bucket = self._buckets.get(key)
        if bucket is None:
            if len(self._buckets) >= self._max_keys:
                self._forget_full(now)
            bucket = self._buckets[key] = _Bucket(tokens=float(self.burst), updated=now)
        bucket.tokens = min(self.burst, bucket.tokens + (now - bucket.updated) * self.rate)
        bucket.updated = now
        if bucket.tokens < 1:
            bucket.suppressed += 1
            return False, 0
        bucket.tokens -= 1
        suppressed, bucket.suppressed = bucket.suppressed, 0
        return True, suppressed

    def drain(self) -> list[tuple[tuple[str, str], int]]:
        """Every key with suppressed events, and how many; their counts start again at 0."""
        out = []
        for key, bucket in self._buckets.items():
            if bucket.suppressed:
                out.append((key, bucket.suppressed))
                bucket.suppressed = 0
        return out

    def _forget_full(self, now: float) -> None:
        """Drops the buckets that are full again (nothing held back): they hold no news."""
        for key, bucket in list(self._buckets.items()):
            refilled = bucket.tokens + (now - bucket.updated) * self.rate
            if refilled >= self.burst and not bucket.suppressed:
                del self._buckets[key]


@dataclass(frozen=True)
class AuditEvent:
    who: str
    role: str
    rpc: str
    kind: str
    space: str
    name: str
    outcome: str
    reason: str = ""
    peer: str = ""


class AuditLog:
    def __init__(
        self,
        *,
        limiter: RateLimiter | None = None,
        clock: Callable[[], float] = time.monotonic,
        emit: Emit | None = None,
    ) -> None:
        self.limiter = limiter or RateLimiter()
        self._clock = clock
        self._emit: Emit = emit or log.info

    def record(self, event: AuditEvent) -> None:
        key = (event.who, event.outcome)
        admitted, suppressed = self.limiter.admit(key, now=self._clock())
        if suppressed:
            self._summary(key, suppressed)
        if not admitted:
            return
        self._emit(
            "audit",
            who=event.who,
            role=event.role,
            rpc=event.rpc,
            kind=event.kind,
            space=event.space,
            name=event.name,
            outcome=event.outcome,
            reason=event.reason,
            peer=event.peer,
        )

    def flush(self) -> None:
        """One `audit suppressed` event per (who, outcome) that had events held back."""
        for key, suppressed in self.limiter.drain():
            self._summary(key, suppressed)

    def _summary(self, key: tuple[str, str], suppressed: int) -> None:
        who, outcome = key
        self._emit("audit suppressed", who=who, outcome=outcome, suppressed=suppressed)
