"""The rules every operation on saved memories starts with, whoever calls it (the API,
the MCP tools, the user's pages): the scope each operation needs, the refusals, the checks
of what a caller sent, and finding the owner's memory by id."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from dashboard.memory import BuildsBusy
from dashboard.refusals import Conflict, Forbidden, Gone, NotFound, Refusal
from dashboard.saved_memories.models import MEMORY_SOURCES, ForgetMarker, Memory

MAX_CONTENT = 20_000  # characters
MAX_METADATA_BYTES = 16_384  # the metadata object as compact JSON
MAX_REASON = 500

FORGET_MODES = ("soft_delete", "redact", "hard_delete")
# The scope each operation needs, whoever asks (the /v1 routes, the MCP tools, stdio): the
# one table, checked by the services below. Restoring undoes a soft delete: the same scope.
SCOPE_FOR_OPERATION = {
    "save": "memory:write",
    "update": "memory:write",
    "get": "memory:read",
    "list": "memory:read",
    "search": "memory:read",
    "status": "memory:read",
    "export": "memory:read",
    "receipts": "memory:read",
    "soft_delete": "memory:delete",
    "restore": "memory:delete",
    "redact": "memory:redact",
    "hard_delete": "memory:hard_delete",
}
# The scopes a credential (API key, connection) carries; None: the owner on their own pages.
Scopes = list[str] | tuple[str, ...] | None


# -- refusals: kinds, never HTTP statuses (each edge maps them) -----------------------------

class InvalidMemoryInput(Refusal):
    """A value refused, naming its field."""


class ScopeMissing(Forbidden):
    """The credential (or the owner's own pages) may not do this; ``scope`` is needed."""

    def __init__(self, sentence: str, scope: str) -> None:
        super().__init__(sentence)
        self.scope = scope


class MemoryNotFound(NotFound):
    pass


class MemoryGone(Gone):
    pass


class MemoryConflict(Conflict):
    pass


# A build of the owner held its lock longer than a forget or an edit may wait.
MemoryBusy = BuildsBusy
NOT_FOUND = "There is no memory with this id among yours."
GONE = "This memory was permanently deleted; only its erasure record remains."


# -- validation ----------------------------------------------------------------------------

# A JSON escape of NUL: ``\u0000`` after an even number of backslashes (``\\u0000`` is a
# backslash followed by the text "u0000", which is fine).
_JSON_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


def _is_utf8(text: str) -> bool:
    # A lone surrogate ("\ud800" in a JSON body) is a valid Python string but not text
    # PostgreSQL can store: sending it would fail the statement (a 500, not a 422).
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_content(content: object, field: str = "content") -> str:
    if not isinstance(content, str):
        raise InvalidMemoryInput(f"{field} must be a string.", field)
    if not content.strip():
        raise InvalidMemoryInput(f"{field} must not be empty.", field)
    if len(content) > MAX_CONTENT:
        raise InvalidMemoryInput(f"{field} is longer than {MAX_CONTENT:,} characters.", field)
    if "\x00" in content:
        raise InvalidMemoryInput(f"{field} must not contain NUL characters.", field)
    if not _is_utf8(content):
        raise InvalidMemoryInput(f"{field} must be valid Unicode text (no lone surrogates).",
                                 field)
    return content


def check_metadata(metadata: object) -> dict[str, Any]:
    if metadata is None:
        return {}
    if not isinstance(metadata, Mapping):
        raise InvalidMemoryInput("metadata must be a JSON object.", "metadata")
    try:
        encoded = json.dumps(metadata, separators=(",", ":"), allow_nan=False,
                             ensure_ascii=False)
    except (TypeError, ValueError, RecursionError) as exc:
        raise InvalidMemoryInput("metadata must be plain JSON (no NaN or infinity, not "
                                 "nested hundreds deep).", "metadata") from exc
    if not _is_utf8(encoded):  # jsonb refuses an unpaired surrogate escape too
        raise InvalidMemoryInput("metadata must be valid Unicode text (no lone surrogates).",
                                 "metadata")
    if len(encoded.encode()) > MAX_METADATA_BYTES:
        raise InvalidMemoryInput(f"metadata is larger than {MAX_METADATA_BYTES:,} bytes.",
                                 "metadata")
    if _JSON_NUL.search(encoded):  # PostgreSQL's jsonb refuses NUL in strings
        raise InvalidMemoryInput("metadata must not contain NUL characters.", "metadata")
    return json.loads(encoded)


def check_source(source: object) -> str:
    if source not in MEMORY_SOURCES:
        raise InvalidMemoryInput(f"source must be one of {', '.join(MEMORY_SOURCES)}.",
                                 "source")
    return str(source)


def check_reason(reason: object) -> str:
    if reason is None:
        return ""
    if not isinstance(reason, str):
        raise InvalidMemoryInput("reason must be a string.", "reason")
    if len(reason) > MAX_REASON or "\x00" in reason or not _is_utf8(reason):
        raise InvalidMemoryInput(f"reason must be at most {MAX_REASON} characters of "
                                 "text, without NUL.", "reason")
    return reason.strip()


def check_mode(mode: object, allowed: tuple[str, ...] = FORGET_MODES) -> str:
    if mode not in allowed:
        raise InvalidMemoryInput(f"mode must be one of {', '.join(allowed)}.", "mode")
    return str(mode)


def allows(scopes: Scopes, operation: str) -> bool:
    """Whether ``scopes`` hold ``operation``'s scope (``None``: the owner, on their own
    pages, may do all but a hard delete)."""
    if scopes is None:
        return operation != "hard_delete"
    return SCOPE_FOR_OPERATION[operation] in scopes


def check_scope(scopes: Scopes, operation: str) -> None:
    """Refuse ``operation`` unless ``scopes`` hold its scope (``SCOPE_FOR_OPERATION``);
    ``None`` is the owner acting on their own pages: everything but hard delete is theirs.
    Every entry point a key or token reaches calls this first (403 before 404 and 409)."""
    if allows(scopes, operation):
        return
    needed = SCOPE_FOR_OPERATION[operation]
    if scopes is None:
        raise ScopeMissing("Permanent deletion is done through the API with a key "
                           "an administrator granted memory:hard_delete.", needed)
    raise ScopeMissing(f"This API key lacks the {needed} scope that "
                       f"{operation.replace('_', ' ')} needs.", needed)


def parse_memory_id(value: object) -> uuid.UUID | None:
    try:
        return uuid.UUID(str(value))
    except (ValueError, TypeError, AttributeError):
        return None


# -- finding a memory by id ------------------------------------------------------------

def find_memory(session: Session, owner_id: int, memory_id: object, *,
                lock: bool = False, scopes: Scopes = None) -> Memory:
    """The owner's memory, or MemoryNotFound (the same for someone else's and for none at
    all) or MemoryGone (this owner hard-deleted it)."""
    check_scope(scopes, "get")
    parsed = parse_memory_id(memory_id)
    if parsed is None:
        raise MemoryNotFound(NOT_FOUND)
    query = select(Memory).where(Memory.id == parsed, Memory.owner_id == owner_id)
    if lock:
        # populate_existing: the row as locked now, not the copy an earlier read in this
        # session left in the identity map (a forget that raced must see the state it lost to).
        query = query.with_for_update().execution_options(populate_existing=True)
    memory = session.scalars(query).first()
    if memory is not None:
        return memory
    gone = session.scalar(select(ForgetMarker.id).where(
        ForgetMarker.memory_id == parsed, ForgetMarker.owner_id == owner_id,
        ForgetMarker.mode == "hard_delete").limit(1))
    raise MemoryGone(GONE) if gone else MemoryNotFound(NOT_FOUND)
