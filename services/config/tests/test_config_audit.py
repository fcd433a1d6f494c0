"""The audit trail (`enmasse.config.audit`), pure: its rate limit and what it writes."""

from __future__ import annotations

from typing import Any

from enmasse.config.audit import AuditEvent, AuditLog, RateLimiter


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Lines:
    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []

    def __call__(self, event: str, **fields: Any) -> None:
        self.events.append((event, fields))

    def named(self, event: str) -> list[dict[str, Any]]:
        return [fields for name, fields in self.events if name == event]


def refused(who: str = "mallory") -> AuditEvent:
    return AuditEvent(
        who=who,
        role="viewer",
        rpc="DeleteAddressSpace",
        kind="AddressSpace",
        space="b",
        name="b",
        outcome="PERMISSION_DENIED",
        reason="token 'mallory' (viewer of a) may not DeleteAddressSpace in address space 'b'",
        peer="ipv4:127.0.0.1:5000",
    )


def test_the_bucket_lets_a_burst_through_then_the_rate() -> None:
    limiter = RateLimiter(rate=2.0, burst=3)
    key = ("mallory", "PERMISSION_DENIED")
    assert [limiter.admit(key, now=0.0) for _ in range(5)] == [
        (True, 0),
        (True, 0),
        (True, 0),
        (False, 0),
        (False, 0),
    ]
    # Half a second later one token is back: the event goes out, with the two held back.
    assert limiter.admit(key, now=0.5) == (True, 2)
    assert limiter.admit(key, now=0.5) == (False, 0)
    # Other keys have buckets of their own.
    assert limiter.admit(("mallory", "ok"), now=0.5) == (True, 0)
    assert limiter.admit(("alice", "PERMISSION_DENIED"), now=0.5) == (True, 0)
    # A long pause refills to the burst, never beyond.
    assert [limiter.admit(key, now=100.0)[0] for _ in range(4)] == [True, True, True, False]


def test_drain_reports_what_was_held_back_once() -> None:
    limiter = RateLimiter(rate=1.0, burst=1)
    key = ("mallory", "UNAUTHENTICATED")
    limiter.admit(key, now=0.0)
    for _ in range(7):
        limiter.admit(key, now=0.0)
    assert limiter.drain() == [(key, 7)]
    assert limiter.drain() == []


def test_the_buckets_are_bounded() -> None:
    limiter = RateLimiter(rate=1.0, burst=1, max_keys=10)
    for i in range(100):
        limiter.admit((f"guess-{i}", "UNAUTHENTICATED"), now=float(i * 10))
    assert len(limiter._buckets) <= 10


def test_one_event_per_write_or_refusal_with_who_what_where_outcome() -> None:
    lines = Lines()
    audit = AuditLog(clock=Clock(), emit=lines)
    audit.record(refused())
    assert lines.events == [
        (
            "audit",
            {
                "who": "mallory",
                "role": "viewer",
                "rpc": "DeleteAddressSpace",
                "kind": "AddressSpace",
                "space": "b",
                "name": "b",
                "outcome": "PERMISSION_DENIED",
                "reason": (
                    "token 'mallory' (viewer of a) may not DeleteAddressSpace in address space 'b'"
                ),
                "peer": "ipv4:127.0.0.1:5000",
            },
        )
    ]


def test_a_flood_cannot_fill_the_disk_and_says_how_much_it_left_out() -> None:
    lines, clock = Lines(), Clock()
    audit = AuditLog(limiter=RateLimiter(rate=5.0, burst=20), clock=clock, emit=lines)
    for _ in range(10_000):
        audit.record(refused())
    audit.record(refused(who="alice"))  # somebody else is still heard
    assert len(lines.named("audit")) == 21
    assert lines.named("audit")[-1]["who"] == "alice"
    audit.flush()
    assert lines.named("audit suppressed") == [
        {"who": "mallory", "outcome": "PERMISSION_DENIED", "suppressed": 9_980}
    ]
    clock.now += 1.0  # five more a second
    for _ in range(100):
        audit.record(refused())
    assert len(lines.named("audit")) == 26
    clock.now += 1.0
    audit.record(refused())  # goes out, after a summary of the 95 held back meanwhile
    assert lines.named("audit suppressed")[-1]["suppressed"] == 95
    assert lines.events[-1][0] == "audit"
