"""The source registry: each content domain defines its sources (``<domain>/source.py``:
label, default, the extractor that turns a user's rows into records, the writes it
*watches*), and ``dashboard.catalog`` installs them here in rank order, so the engine,
plans and pages read them without importing the domains. Nothing forgotten comes back:
excluded Blinks, memories not ``active`` and flagged chat pairs are filtered in SQL."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, exists, false, or_
from sqlalchemy.orm import Session


@dataclass(frozen=True)
class Record:
    source_key: str
    source_id: str
    text: str
    # When the record was made (a pair: its question), for a plan's retention window;
    # ``None``: it does not age (the profile).
    at: datetime | None = None


# The records of many users in one query: each user's (a user with none: absent).
ManyExtractor = Callable[[Session, list[int]], dict[int, list[Record]]]


def by_user(rows: Any, make: Callable[[Any], Record]) -> dict[int, list[Record]]:
    """Rows whose first column is the user id, ordered by it: each user's records."""
    found: dict[int, list[Record]] = {}
    for row in rows:
        found.setdefault(row[0], []).append(make(row))
    return found


@dataclass(frozen=True)
class Watch:
    """Writes to ``model`` that change its owner's records of a source.

    ``fields``: the columns whose change matters on an UPDATE (empty: none do);
    ``on_insert`` / ``on_delete``: whether a new or deleted row does. ``stamp`` is the
    column the schedule compares with the last build (``None``: deletes only, which no
    timestamp can show, so they always request a build in their own transaction)."""

    model: type
    owner: str
    fields: frozenset[str] = frozenset()
    on_insert: bool = True
    on_delete: bool = True
    stamp: str | None = "updated_at"

    def owner_column(self) -> Any:
        return getattr(self.model, self.owner)


@dataclass(frozen=True)
class Parts:
    """A source whose records come in parts (``source_id`` is ``"<part id>:<n>"``), each
    part a row of ``model`` whose ``stamp`` column holds the transaction that last wrote
    it: a quick build re-reads only the parts the last build could not see."""

    model: type
    owner: str
    stamp: str
    extract: Callable[[Session, int, list[int]], list[Record]]  # the records of some parts


@dataclass(frozen=True)
class Source:
    key: str
    label: str
    default_visible: bool
    records: str  # what one record is, in words (staff pages)
    extract_many: ManyExtractor  # a batch of users at once (the truth check)
    watches: tuple[Watch, ...]
    parts: Parts | None = None
    # How many of a user's items the user marked "do not remember" (the status page).
    not_remembered: Callable[[Session, int], int] | None = None
    # Its records carry their time (``Record.at``): a plan may keep only the last N days.
    aged: bool = True

    def extract(self, session: Session, user_id: int) -> list[Record]:
        """One user's records (a build): the batch query with one id."""
        return self.extract_many(session, [user_id]).get(user_id, [])

    def changed_since(self, user_id: ColumnElement[int],
                      since: ColumnElement[datetime]) -> ColumnElement[bool]:
        """SQL: some watched row of this user was written after ``since``."""
        probes = [
            exists().where(w.owner_column() == user_id, getattr(w.model, w.stamp) > since)
            for w in self.watches if w.stamp
        ]
        return or_(*probes) if probes else false()


# -- the keys, and the registry -----------------------------------------------------------

PROFILE = "orbitpilot.profile"
BLINKS = "blink.blinks"
SAVED = "xmemo.saved"
CHAT_HISTORY = "orbitpilot.chat_history"
DOCUMENTS = "docs.documents"

_installed: tuple[Source, ...] = ()
_by_key: dict[str, Source] = {}


def install(sources: tuple[Source, ...]) -> None:
    """Install the product's sources, in rank order (``dashboard.catalog`` does, once)."""
    global _installed, _by_key
    if _installed and _installed != sources:
        raise RuntimeError("another set of sources is installed already")
    _installed, _by_key = sources, {s.key: s for s in sources}


def registered_sources() -> tuple[Source, ...]:
    """Every source, in rank order."""
    if not _installed:
        raise RuntimeError("no sources are installed: import dashboard.catalog first")
    return _installed


def source_keys() -> tuple[str, ...]:
    return tuple(s.key for s in registered_sources())


def get_source(key: str) -> Source:
    registered_sources()
    try:
        return _by_key[key]
    except KeyError:
        raise KeyError(f"unknown source {key!r}; known: {', '.join(source_keys())}") from None


def extract(session: Session, user_id: int, source_keys: tuple[str, ...]) -> list[Record]:
    records: list[Record] = []
    for key in source_keys:
        records.extend(get_source(key).extract(session, user_id))
    return records

