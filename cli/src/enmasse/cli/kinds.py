"""The words people type for a kind (`addr`, `addresses`, `as`) -> the kind itself.

kubectl taught everyone to write `get addresses`, `get address`, or a short name; the API speaks
`Address`. This table is the only place that knows the spellings, so `get`, `delete` and `watch`
accept the same ones and refuse the rest with the list of what would have worked.
"""

from __future__ import annotations

from enmasse.resources.manifests import KINDS, KindInfo

_SHORT = {
    "AddressSpacePlan": ("asp", "spaceplan", "spaceplans"),
    "AddressPlan": ("ap", "plan", "plans"),
    "AddressSpace": ("as", "space", "spaces"),
    "Address": ("addr", "addrs"),
    "MessagingUser": ("user", "users", "mu"),
}


def _spellings() -> dict[str, KindInfo]:
    words: dict[str, KindInfo] = {}
    for name, info in KINDS.items():
        for word in (name.lower(), info.plural, *_SHORT[name]):
            words[word] = info
    return words


SPELLINGS = _spellings()


class UnknownKind(ValueError):
    pass


def resolve_kind(word: str) -> KindInfo:
    """`addresses` -> Address; case-insensitive; the exact kind name works too."""
    info = SPELLINGS.get(word.lower())
    if info is None:
        raise UnknownKind(
            f'unknown kind "{word}": expected one of '
            + ", ".join(f"{info.plural} ({'/'.join(_SHORT[name])})" for name, info in KINDS.items())
        )
    return info
