"""Copies of a remembered item's words that the product made elsewhere — a chat reply that
quoted it, the "Drew on" records naming it, an export that holds it — and how an erasure
reaches them. Each domain that makes copies defines a keeper; ``dashboard.catalog``
installs them here, so the memories domain erases every copy without importing the
domains that made them (docs/architecture/erasure.md)."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from sqlalchemy.orm import Session

# A sentence shorter than this (once stripped) is not a pattern on its own: "Yes." would
# blank words a reply said for itself. The whole text and its chunks are patterns anyway.
MIN_SENTENCE = 4
_SENTENCE_END = re.compile(r"(?<=[.!?…])\s+|\n+")


@dataclass(frozen=True)
class Erasure:
    """An item being redacted or hard-deleted: whose, which (``source_key``/``source_id``,
    as "Drew on" records and chunks name it), every text it held (its content and its
    earlier versions', read before they were erased) and the marker that replaces them.
    ``holders``: the people other than the owner whose own data a keeper found a copy in
    (a member's chat reply that quoted a team's memory), for the keepers after it (their
    exports are withdrawn too); keepers add to it, in order."""

    owner_id: int
    source_key: str
    source_id: str
    texts: tuple[str, ...]
    mode: str  # "redact" or "hard_delete"
    marker: str
    holders: set[int] = field(default_factory=set, compare=False)


@dataclass(frozen=True)
class CopyCount:
    """What an erasure did to one kind of copy, and the probe: what an exact count found
    left, after it, in the same transaction. Counts only, never text."""

    kind: str
    removed: int
    left: int


# A keeper: erase its copies of the item, then count what is left (after its own writes,
# in the caller's transaction; row writes only — the caller records the audit event).
Keeper = Callable[[Session, Erasure], list[CopyCount]]

_keepers: tuple[Keeper, ...] | None = None


def install_keepers(keepers: Iterable[Keeper]) -> None:
    global _keepers
    _keepers = tuple(keepers)


def erase_copies(session: Session, erasure: Erasure) -> list[CopyCount]:
    """Every installed keeper's copies of the item, erased and counted again."""
    if _keepers is None:
        raise RuntimeError("no copy keepers are installed: import dashboard.catalog first")
    counts: list[CopyCount] = []
    for keeper in _keepers:
        counts += keeper(session, erasure)
    return counts


# -- what counts as the item's words in a copy ------------------------------------------------

def sentences(text: str) -> list[str]:
    """The text's sentences and lines, each stripped; the short ones left out."""
    return [part.strip() for part in _SENTENCE_END.split(text)
            if len(part.strip()) >= MIN_SENTENCE and any(c.isalnum() for c in part)]


def flexible(pattern: str) -> str:
    """A regular expression for ``pattern`` whatever whitespace separates its words (a
    quote flattened onto one line, a line broken elsewhere)."""
    return r"\s+".join(re.escape(word) for word in pattern.split())


def words_pattern(forms: Iterable[str]) -> re.Pattern[str] | None:
    """One expression matching any of ``forms``, the longest first (so a whole quote is
    replaced as one, not sentence by sentence); ``None`` when there is nothing to match."""
    unique = sorted({" ".join(form.split()) for form in forms if form.strip()},
                    key=len, reverse=True)
    return re.compile("|".join(flexible(form) for form in unique)) if unique else None


def literal_forms(forms: Iterable[str]) -> list[str]:
    """The forms as a plain substring search sees them: as given and with whitespace
    flattened (an exact probe independent of the expression that replaced them)."""
    found = set()
    for form in forms:
        if form.strip():
            found |= {form.strip(), " ".join(form.split())}
    return sorted(found)
