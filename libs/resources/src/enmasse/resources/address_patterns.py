"""Address patterns for receivers: one link that follows every address a pattern matches.

What flows in: a pattern (MQTT topic filter syntax, below) and an address; for authorization,
the pattern and a check `may_recv(address) -> bool` over a user's rules. What flows out:
`matches(pattern, address)`, `pattern_problem(pattern)` (why a string is not a pattern), and the
probes `recv_probes` whose every one a user must be allowed to receive from for the pattern to
be theirs. Plus the names of the contract between the router and whoever attaches a pattern
receiver (the MQTT gateway, or any AMQP client).

The syntax is MQTT's (3.1.1 4.7, 5.0 4.7), so a topic filter is a pattern as it is: an address
is made of levels separated by `/` (`.` is no separator here: `sensors/a.b` has two levels);
`+` as a whole level matches exactly one level (any text, `.` included, empty included); `#`
as the whole last level matches any number of levels, none included (`sensors/#` matches
`sensors`, `sensors/kitchen`, `sensors/kitchen/temp`); `#` alone matches every address; an
address starting with `$` is matched only by a pattern that starts with the same literal level.
Anything else matches itself.

The contract (a receiver, not a message, so the per-message path of the router is untouched):
- A client attaches a receiver whose source address is the pattern and whose source
  capabilities hold `PATTERN_CAPABILITY`. The router checks, at attach, that the user may
  receive from every address the pattern can match (`recv_probes`; refused with
  `amqp:unauthorized-access` and a description naming the pattern otherwise), and accepts.
- The router then sends on that link one pre-settled, empty message per address of the space
  the pattern matches (types in `PATTERN_TYPES`) and the user may receive from, with
  application properties `event` = `MATCHED`, `address` = the address and `type` = its type;
  then one with `event` = `CURRENT` (the addresses that existed at attach are all told). When
  the space's configuration changes, a new matching address is told with `MATCHED` and one that
  went away (or changed type, or that the user lost the right to) with `UNMATCHED`. A pattern
  that matches nothing is no error: the link waits.
- The client receives from each told address on a link of its own (an ordinary receiver,
  authorized and routed like any other), so each message arrives on the link of its address,
  with that address's semantics (a multicast copy, a topic subscription on the brokers).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

PATTERN_CAPABILITY: Final = "enmasse:address-pattern"
"""The source capability that makes a receiver a pattern receiver."""

SEPARATOR: Final = "/"
ONE_LEVEL: Final = "+"
ANY_LEVELS: Final = "#"

PATTERN_TYPES: Final = frozenset({"multicast", "topic"})
"""The address types a pattern matches: those every receiver gets every message of. (A queue or
anycast address gives each message to one consumer: a pattern over them would take messages
from consumers that asked for that address by name.)"""

# The application properties of the router's messages on a pattern link.
EVENT: Final = "event"
ADDRESS: Final = "address"
TYPE: Final = "type"
MATCHED: Final = "matched"
UNMATCHED: Final = "unmatched"
CURRENT: Final = "current"


def is_pattern(address: str) -> bool:
    """True when `address` holds a wildcard level (a literal address is a pattern too, when a
    receiver asks for it with `PATTERN_CAPABILITY`: it matches itself)."""
    return any(level in (ONE_LEVEL, ANY_LEVELS) for level in address.split(SEPARATOR))


def pattern_problem(pattern: str) -> str | None:
    """Why `pattern` is not an address pattern, or None when it is."""
    if not pattern:
        return "an address pattern must not be empty"
    levels = pattern.split(SEPARATOR)
    for index, level in enumerate(levels):
        if ANY_LEVELS in level and (level != ANY_LEVELS or index != len(levels) - 1):
            return f"'{pattern}': '#' must be the whole last level (as in 'sensors/#')"
        if ONE_LEVEL in level and level != ONE_LEVEL:
            return f"'{pattern}': '+' must be a whole level (as in 'sensors/+/temp')"
    return None


def matches(pattern: str, address: str) -> bool:
    """True when `pattern` matches `address` (see the module docstring)."""
    levels = pattern.split(SEPARATOR)
    if address.startswith("$") and levels[0] in (ONE_LEVEL, ANY_LEVELS):
        return False
    parts = address.split(SEPARATOR)
    for index, level in enumerate(levels):
        if level == ANY_LEVELS:
            return True
        if index >= len(parts) or (level != ONE_LEVEL and level != parts[index]):
            return False
    return len(levels) == len(parts)


def recv_probes(pattern: str, *, depth: int) -> list[str]:
    """The addresses a user must be allowed to receive from for `pattern` to be theirs: the
    pattern with each `+` kept as a literal level (which only a rule's whole-level `*` or `#`
    matches), and for a trailing `#`, the pattern cut there and extended by 1 to `depth` such
    levels (`depth` past the rules' longest pattern, so that only a rule's `#` covers the last).
    A rule covers the pattern when it covers every probe."""
    levels = pattern.split(SEPARATOR)
    if levels[-1] != ANY_LEVELS:
        return [pattern]
    base = levels[:-1]
    probes = [SEPARATOR.join(base)] if base else []
    probes.extend(SEPARATOR.join(base + [ONE_LEVEL] * n) for n in range(1, depth + 1))
    return probes


def may_receive_all(pattern: str, *, may_recv: Callable[[str], bool], depth: int) -> bool:
    """True when `may_recv` allows every probe of `pattern` (`recv_probes`)."""
    return all(may_recv(probe) for probe in recv_probes(pattern, depth=depth))
