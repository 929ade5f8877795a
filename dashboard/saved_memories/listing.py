"""The owner's saved memories, a page at a time (keyset pagination with an opaque
cursor)."""

from __future__ import annotations

import base64
import binascii
import json
import uuid
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Select, select, tuple_
from sqlalchemy.orm import Session

from dashboard.saved_memories.models import MEMORY_STATUSES, Memory
from dashboard.saved_memories.rules import InvalidMemoryInput, Scopes, check_scope

DEFAULT_PAGE_SIZE = 20
MAX_PAGE_SIZE = 100


@dataclass(frozen=True)
class Page:
    items: list[Memory]
    next_cursor: str | None


def encode_cursor(memory: Memory) -> str:
    raw = json.dumps([memory.created_at.isoformat(), str(memory.id)]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, uuid.UUID]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        created, id_ = json.loads(raw)
        at = datetime.fromisoformat(created)
        if at.tzinfo is None:
            raise ValueError
        return at, uuid.UUID(id_)
    except (binascii.Error, ValueError, TypeError, UnicodeDecodeError, AttributeError,
            RecursionError):  # a JSON number for the id, JSON nested past the stack
        raise InvalidMemoryInput("cursor is not one this API gave out.", "cursor") from None


def clamp_limit(limit: object) -> int:
    """Page sizes are clamped on the server: anything out of range becomes the
    nearest allowed size; what is not a number is refused."""
    if limit is None or limit == "":
        return DEFAULT_PAGE_SIZE
    try:
        value = int(str(limit))
    except ValueError:
        raise InvalidMemoryInput("limit must be a whole number.", "limit") from None
    return max(1, min(value, MAX_PAGE_SIZE))


def list_memories(session: Session, owner_id: int, *, status: str | None = None,
                  limit: object = None, cursor: str | None = None,
                  scopes: Scopes = None) -> Page:
    """The owner's memories, newest first, a page at a time (keyset: stable under
    inserts, no offset to skip through)."""
    check_scope(scopes, "list")
    size = clamp_limit(limit)
    return page_of(session, select(Memory).where(Memory.owner_id == owner_id), size,
                   status=status, cursor=cursor)


def page_of(session: Session, query: Select[tuple[Memory]], size: int, *,
            status: str | None, cursor: str | None) -> Page:
    """A page of ``query``'s memories in ``status`` after ``cursor``, newest first: the
    owner's own list and a caller's reach (``reach.list_for``) page alike."""
    if status is not None:
        if status not in MEMORY_STATUSES:
            raise InvalidMemoryInput(f"status must be one of {', '.join(MEMORY_STATUSES)}.",
                                     "status")
        query = query.where(Memory.status == status)
    if cursor:
        at, id_ = decode_cursor(cursor)
        query = query.where(tuple_(Memory.created_at, Memory.id) < tuple_(at, id_))
    rows = list(session.scalars(
        query.order_by(Memory.created_at.desc(), Memory.id.desc()).limit(size + 1)))
    more = len(rows) > size
    rows = rows[:size]
    return Page(rows, encode_cursor(rows[-1]) if more and rows else None)
