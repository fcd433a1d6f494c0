"""Who may do what on which address: a MessagingUser's authorization rules, and the one matcher.

What flows in: a user's rules (each a list of address patterns and a list of operations: `send`,
`recv` on the message plane, `view`, `manage` on the admin side), an operation and an address.
What flows out: `allows(rules, operation, address) -> bool`, and for the places that take rules
in (the config service's validation, the router's configuration) `pattern_problem(pattern)`:
why a string is not a pattern, or None. Validation, the routers and a brokered space's broker
share this module (through `permissions`), so a pattern means the same thing wherever it is read.

The pattern syntax (DESIGN §9): an address is made of segments separated by `/` or `.`; a pattern
is segments with the same separators, where
- `*` as a whole segment matches exactly one segment: `sensors.*` matches `sensors.temp`, not
  `sensors` nor `sensors.temp.max`;
- `*` inside a segment matches any run of characters within that segment: `orders*` matches
  `orders` and `orders-eu`, not `orders/eu`;
- `#` as a whole segment matches any number of segments, none included: `orders/#` matches
  `orders`, `orders/eu` and `orders/eu.north`; `#` alone matches every address;
- anything else matches itself, separators included (`sensors.*` does not match `sensors/temp`).
No rule allows nothing: a user with no rules may neither send nor receive.

Why so: one syntax that reads like the topic wildcards of MQTT and AMQP brokers, checked segment
by segment so that a pattern never grants more than its author could see in it (`*` never
crosses a separator). A pattern becomes one regular expression, compiled once per pattern
(`_compiled` keeps them), so a check is O(rules) regex matches against a string of at most 255
characters; the router checks once per link at attach and keeps the answer on the link.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Final, Protocol

SEND: Final = "send"
RECV: Final = "recv"
VIEW: Final = "view"  # browsing: seeing messages without taking them

EVERYTHING: Final = "#"
"""The pattern that matches every address."""
MAX_PATTERN_LENGTH: Final = 255
PATTERN_CHARACTERS: Final = "letters, digits and _ . - / # *"

_SEPARATORS = re.compile(r"([/.])")
_OUTSIDE = re.compile(r"[^A-Za-z0-9_.\-/#*]")  # the first character a pattern may not hold
_ONE_SEGMENT = r"[^/.]+"
_WITHIN_SEGMENT = r"[^/.]*"


class RuleLike(Protocol):
    """What `allows` reads of a rule: a `Rule`, or a protobuf `AuthorizationRule` as it is."""

    @property
    def addresses(self) -> Sequence[str]: ...

    @property
    def operations(self) -> Collection[str]: ...


@dataclass(frozen=True)
class Rule:
    """One authorization rule: these address patterns, for these operations."""

    addresses: tuple[str, ...]
    operations: frozenset[str]


def allows(rules: Iterable[RuleLike], operation: str, address: str) -> bool:
    """True when some rule grants `operation` and has a pattern matching `address`."""
    for rule in rules:
        if operation in rule.operations:
            for pattern in rule.addresses:
                if _compiled(pattern).fullmatch(address) is not None:
                    return True
    return False


def allows_everything(rules: Iterable[RuleLike], operation: str) -> bool:
    """True when the rules grant `operation` on every address (a rule with the pattern `#`):
    whoever holds them needs no check per address."""
    return any(operation in r.operations and EVERYTHING in r.addresses for r in rules)


def pattern_problem(pattern: str) -> str | None:
    """Why `pattern` is not an address pattern, or None when it is; the text reads after the
    field it is about: `spec.authorization[0].addresses: 'a..b' has an empty segment`."""
    if not pattern:
        return "a pattern must not be empty"
    if len(pattern) > MAX_PATTERN_LENGTH:
        return f"a pattern must be at most {MAX_PATTERN_LENGTH} characters (got {len(pattern)})"
    if found := _OUTSIDE.search(pattern):
        shown = repr(found.group())[1:-1]
        return f"'{pattern}' holds '{shown}': a pattern is {PATTERN_CHARACTERS}"
    segments = _SEPARATORS.split(pattern)[::2]
    if "" in segments:
        return f"'{pattern}' has an empty segment"
    for index, segment in enumerate(segments):
        if "#" in segment and segment != EVERYTHING:
            return (
                f"'{pattern}': '#' stands for any number of whole segments and must stand "
                "alone between separators (as in 'orders/#')"
            )
        if segment == EVERYTHING and index and segments[index - 1] == EVERYTHING:
            return f"'{pattern}' repeats '#': one already matches any number of segments"
    return None


@functools.lru_cache(maxsize=4096)
def _compiled(pattern: str) -> re.Pattern[str]:
    """The regular expression of a pattern (see the module docstring). A pattern that
    `pattern_problem` refuses still compiles to something that matches only what its plain
    reading would: nothing here raises."""
    tokens = _SEPARATORS.split(pattern)  # segment, separator, segment, ...
    segments, separators = tokens[::2], tokens[1::2]
    parts: list[str] = []
    for index, segment in enumerate(segments):
        before = re.escape(separators[index - 1]) if index else ""
        if segment == EVERYTHING:
            parts.append(_any_segments(index, separators))
            continue
        if index and segments[index - 1] == EVERYTHING and index - 1 == 0:
            before = ""  # a leading `#` took the separator after it
        parts.append(before + _segment(segment))
    return re.compile("".join(parts), re.DOTALL)


def _any_segments(index: int, separators: list[str]) -> str:
    """`#`: zero or more segments, with the separator that joins it to its neighbour."""
    if not separators:
        return ".+"  # the whole pattern: every address
    if index == 0:
        return f"(?:.+{re.escape(separators[0])})?"  # `#/b`: `b`, `x/b`, `x.y/b`
    return f"(?:{re.escape(separators[index - 1])}.+)?"  # `a/#`: `a`, `a/x`, `a/x.y`


def _segment(segment: str) -> str:
    if segment == "*":
        return _ONE_SEGMENT
    return _WITHIN_SEGMENT.join(re.escape(piece) for piece in segment.split("*"))
