"""The words people type for a kind (`addr`, `addresses`, `as`) -> the kind itself.

kubectl taught everyone to write `get addresses`, `get address`, or a short name; the API speaks
`Address`. The spellings come from the one kinds table (`enmasse.resources.kinds`: each kind's
plural and short names), so `get`, `delete` and `watch` accept the same ones and refuse the rest
with the list of what would have worked.
"""

from __future__ import annotations

from enmasse.resources.kinds import KINDS, Kind


def _spellings() -> dict[str, Kind]:
    words: dict[str, Kind] = {}
    for name, kind in KINDS.items():
        for word in (name.lower(), kind.plural, *kind.short_names):
            words[word] = kind
    return words


SPELLINGS = _spellings()


class UnknownKind(ValueError):
    pass


def resolve_kind(word: str) -> Kind:
    """`addresses` -> Address; case-insensitive; the exact kind name works too."""
    kind = SPELLINGS.get(word.lower())
    if kind is None:
        raise UnknownKind(
            f'unknown kind "{word}": expected one of '
            + ", ".join(f"{k.plural} ({'/'.join(k.short_names)})" for k in KINDS.values())
        )
    return kind
