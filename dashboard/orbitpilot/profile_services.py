"""Profile facts: the key/value pairs that together make the user's one profile record.

Services flush; the view commits. ``memory.changes`` requests the owner's build in the
same transaction as any change. A key is unique per user: the database's constraint is the
check (a look-up first would still lose a race), and its violation becomes a form error."""

from __future__ import annotations

import re
from collections.abc import Callable

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from dashboard.holds import keep_held_version, refuse_while_held
from dashboard.orbitpilot.models import ProfileFact
from dashboard.refusals import FieldError

MAX_KEY = 64  # the column's length
MAX_VALUE = 1_000
MAX_FACTS = 100
UNIQUE_KEY_CONSTRAINT = "uq_profile_facts_user_id_key"

# A letter or digit first, then letters, digits, spaces and . ' - _ ("preferred language",
# "date-of-birth"). Keys are stored lower-cased with single spaces, so "City" and "city "
# are the same fact.
KEY_PATTERN = re.compile(r"[^\W_][\w .'\-]*")
KEY_RULE = ("Start the key with a letter or digit, and use only letters, digits, spaces "
            "and . ' - _ in it.")


class ProfileError(FieldError):
    """A fact refused, with the form field it is about."""


def normalise_key(key: str) -> str:
    return " ".join((key or "").split()).lower()


def _clean(key: str, value: str) -> tuple[str, str]:
    key = normalise_key(key)
    # A fact is one line: line breaks and runs of spaces become one space.
    value = " ".join((value or "").split())
    if not key:
        raise ProfileError("Name the fact (for example: city).", "key")
    if len(key) > MAX_KEY:
        raise ProfileError(f"Use at most {MAX_KEY} characters for the key.", "key")
    if not KEY_PATTERN.fullmatch(key):
        raise ProfileError(KEY_RULE, "key")
    if not value:
        raise ProfileError("Write the value of the fact.", "value")
    if len(value) > MAX_VALUE:
        raise ProfileError(f"Use at most {MAX_VALUE:,} characters for the value.", "value")
    return key, value


def _is_duplicate_key(exc: IntegrityError) -> bool:
    diag = getattr(exc.orig, "diag", None)
    return getattr(diag, "constraint_name", None) == UNIQUE_KEY_CONSTRAINT


def _flush_unique(session: Session, key: str, change: Callable[[], None]) -> None:
    """Apply ``change`` and flush it in a savepoint: a duplicate key (made by this request
    or by a concurrent one that committed first) rolls back only the savepoint, and the
    person gets a form error rather than a 500."""
    try:
        with session.begin_nested():
            change()
            session.flush()
    except IntegrityError as exc:
        if not _is_duplicate_key(exc):
            raise
        raise ProfileError(f"You already have a fact called “{key}”. Edit that one "
                           "instead.", "key") from None


def list_facts(session: Session, *, user_id: int) -> list[ProfileFact]:
    return list(session.scalars(
        select(ProfileFact).where(ProfileFact.user_id == user_id)
        .order_by(ProfileFact.key).limit(MAX_FACTS)
    ))


def add_fact(session: Session, *, user_id: int, key: str, value: str) -> ProfileFact:
    key, value = _clean(key, value)
    count = session.scalar(
        select(func.count()).select_from(ProfileFact).where(ProfileFact.user_id == user_id)
    )
    if count >= MAX_FACTS:
        raise ProfileError(f"A profile holds at most {MAX_FACTS} facts; delete one first.",
                           "key")
    fact = ProfileFact(user_id=user_id, key=key, value=value)
    _flush_unique(session, key, lambda: session.add(fact))
    return fact


def update_fact(session: Session, fact: ProfileFact, *, key: str, value: str) -> ProfileFact:
    """Change a fact; under a legal hold the key and value it replaced are kept until the
    hold ends (``holds.keep_held_version``)."""
    key, value = _clean(key, value)
    before = (fact.key, fact.value)
    if before == (key, value):
        return fact

    def change() -> None:
        fact.key, fact.value = key, value

    _flush_unique(session, key, change)
    keep_held_version(session, fact.user_id, "profile_fact", fact.id, title=before[0],
                      content=before[1])
    return fact


def delete_fact(session: Session, fact: ProfileFact) -> None:
    refuse_while_held(session, fact.user_id, "a profile fact")
    session.delete(fact)
    session.flush()
