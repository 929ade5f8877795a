"""Record ids from request values, and the signed-in user's own record an id names.

An id arrives as text (``?id=``, a form field, a path segment). Only ASCII digits count —
no sign, space, underscore or other script's digits — and only a number a PostgreSQL
column can hold: a larger one names no row, and sending it would make the database refuse
the statement (a ``DataError``) rather than answer "none"."""

from __future__ import annotations

import re
from typing import Any, TypeVar

from sqlalchemy import select
from sqlalchemy.orm import Session

INT4_MAX = 2**31 - 1  # PostgreSQL ``integer``
INT8_MAX = 2**63 - 1  # PostgreSQL ``bigint``
_MAXIMUM = {32: INT4_MAX, 64: INT8_MAX}
_DIGITS = re.compile(r"[0-9]{1,19}")

Model = TypeVar("Model")


def parse_int(raw: object, minimum: int, maximum: int) -> int | None:
    """The whole number ``raw`` spells in ASCII digits, when it lies within
    ``minimum``..``maximum``; ``None`` for anything else (not text, a sign, a space,
    another script's digits, out of range)."""
    if not isinstance(raw, str) or not _DIGITS.fullmatch(raw):
        return None
    value = int(raw)
    return value if minimum <= value <= maximum else None


def parse_id(raw: object, *, bits: int = 32) -> int | None:
    """A positive id that could exist in an ``integer`` (``bits=32``) or ``bigint``
    (``bits=64``) column; ``None`` otherwise."""
    return parse_int(raw, 1, _MAXIMUM[bits])


def find_owned(session: Session, model: type[Model], raw_id: object, user_id: int, *,
               lock: bool = False, bits: int = 32) -> Model | None:
    """The row of ``model`` that ``raw_id`` names and whose ``user_id`` is ``user_id``;
    ``None`` for a malformed id, no such row, or someone else's (the caller cannot tell
    them apart, and neither can the person asking). ``lock``: ``SELECT … FOR UPDATE``."""
    record_id = parse_id(raw_id, bits=bits)
    if record_id is None:
        return None
    query: Any = select(model).where(model.id == record_id, model.user_id == user_id)
    if lock:
        query = query.with_for_update()
    return session.scalars(query).first()
