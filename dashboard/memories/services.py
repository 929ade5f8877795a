"""Saved memories: save, change, forget (soft delete, redact, hard delete), restore, list,
recall, export — the rules, whoever calls them (the API, the user's pages). A forget
takes the chunks away at once under the build lock (``memory.forget_chunks``) and leaves a
marker and an audit event without content (docs/architecture/erasure.md)."""

from __future__ import annotations

import base64
import binascii
import json
import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import func, or_, select, tuple_, update
from sqlalchemy.orm import Session

from dashboard.audit.models import AuditEvent
from dashboard.audit.services import Actor, record_event
from dashboard.copies import CopyCount, Erasure, erase_copies
from dashboard.holds import is_held
from dashboard.ids import INT4_MAX, parse_id
from dashboard.memories.models import (
    MEMORY_SOURCES,
    MEMORY_STATUSES,
    ForgetMarker,
    Memory,
    MemoryVersion,
)
from dashboard.memory import (
    BuildRequest,
    BuildsBusy,
    Embedder,
    MemoryChunk,
    MemoryStatus,
    RecallCut,
    build_for_change,
    count_item_chunks,
    forget_chunks,
    memory_status,
    search_memory,
    wait_for_builds,
)
from dashboard.plans.sentences import source_sentence
from dashboard.plans.services import (
    SourceState,
    UserPlans,
    get_plan_for_user,
    resolve_build_sources,
    resolve_sources,
)
from dashboard.refusals import Conflict, Forbidden, Gone, NotFound, Refusal
from dashboard.sources import SAVED

MAX_CONTENT = 20_000  # characters
MAX_METADATA_BYTES = 16_384  # the metadata object as compact JSON
MAX_REASON = 500
REDACTED = "[REDACTED]"
DEFAULT_PAGE_SIZE = 20
MAX_PAGE_SIZE = 100
MAX_RECALL_K = 50
NO_MATCH = ("No memory matches this closely enough: nothing saved or remembered is about "
            "it, as far as a search can tell.")

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


def check_scope(scopes: Scopes, operation: str) -> None:
    """Refuse ``operation`` unless ``scopes`` hold its scope (``SCOPE_FOR_OPERATION``);
    ``None`` is the owner acting on their own pages: everything but hard delete is theirs.
    Every entry point a key or token reaches calls this first (403 before 404 and 409)."""
    needed = SCOPE_FOR_OPERATION[operation]
    if scopes is None:
        if operation == "hard_delete":
            raise ScopeMissing("Permanent deletion is done through the API with a key "
                               "an administrator granted memory:hard_delete.", needed)
        return
    if needed not in scopes:
        raise ScopeMissing(f"This API key lacks the {needed} scope that "
                           f"{operation.replace('_', ' ')} needs.", needed)


def parse_memory_id(value: object) -> uuid.UUID | None:
    try:
        return uuid.UUID(str(value))
    except (ValueError, TypeError, AttributeError):
        return None


# -- reading -------------------------------------------------------------------------------

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
    query = select(Memory).where(Memory.owner_id == owner_id)
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


# -- writing -------------------------------------------------------------------------------

@dataclass
class Saved:
    memory: Memory
    build: BuildRequest
    remembered: bool
    sentence: str


def _remembered(session: Session, owner: Any) -> tuple[bool, str]:
    source, sentence = source_sentence(resolve_sources(get_plan_for_user(owner, session)),
                                       SAVED)
    return source.state is SourceState.INCLUDED, sentence


def save_memory(session: Session, *, owner: Any, content: object, metadata: object = None,
                source: object = "api", actor: Actor, api_key_id: int | None = None,
                client_name: str | None = None, scopes: Scopes = None,
                author_id: int | None = None, oauth_client_pk: int | None = None,
                shared_from_id: uuid.UUID | None = None) -> Saved:
    """Save a memory and request a quick update for its owner (a person, or a team's
    account); says whether saved memories are remembered on the owner's plan (the status
    sentence). ``author_id``: who saved it (the owner when not given); the key or the
    registered app it came through."""
    check_scope(scopes, "save")
    memory = Memory(owner_id=owner.id, content=check_content(content),
                    metadata_=check_metadata(metadata), source=check_source(source),
                    status="active", version=1, api_key_id=api_key_id,
                    client_name=client_name,
                    author_id=author_id if author_id is not None else owner.id,
                    oauth_client_pk=oauth_client_pk, shared_from_id=shared_from_id)
    session.add(memory)
    session.flush()
    record_event(session, action="memory.create", actor=actor, owner_id=owner.id,
                 target_type="memory", target_id=str(memory.id),
                 details={"source": memory.source, "version": 1})
    build = build_for_change(session, owner.id)  # the flush's request (memory.changes)
    remembered, sentence = _remembered(session, owner)
    return Saved(memory, build, remembered, sentence)


def _snapshot(session: Session, memory: Memory) -> None:
    session.add(MemoryVersion(memory_id=memory.id, version=memory.version,
                              content=memory.content, metadata_=memory.metadata_,
                              status=memory.status))


def change_memory(session: Session, owner_id: int, memory_id: object, *,
                  content: object = None, metadata: object = None, actor: Actor,
                  scopes: Scopes = None) -> tuple[Memory, BuildRequest | None]:
    """``update_memory`` for a caller naming a memory by id: its scope (403), the values
    (422), the target among the owner's (404/410), then its state (409)."""
    check_scope(scopes, "update")
    if content is not None:
        check_content(content)
    if metadata is not None:
        check_metadata(metadata)
    memory = find_memory(session, owner_id, memory_id)
    return update_memory(session, memory, content=content, metadata=metadata, actor=actor)


def update_memory(session: Session, memory: Memory, *, content: object = None,
                  metadata: object = None, actor: Actor
                  ) -> tuple[Memory, BuildRequest | None]:
    """Change content and/or metadata of an active memory (found by the caller, whose
    scope was checked: ``change_memory``): the previous version is snapshotted, the
    version goes up by one, and a quick update is requested.

    A content change takes the old content's chunks away at once, under the build lock
    as a forget does: an edit that takes sensitive text out must not leave it recallable
    until the next build. The new content is recalled from that build on."""
    if content is None and metadata is None:
        raise InvalidMemoryInput("Give content, metadata or both.")
    new_content = check_content(content) if content is not None else None
    new_metadata = check_metadata(metadata) if metadata is not None else None
    if new_content is not None:
        wait_for_builds(session, memory.owner_id)
    # Re-read under the row lock: a hard delete that committed meanwhile is a 410.
    memory = find_memory(session, memory.owner_id, memory.id, lock=True)
    if memory.status != "active":
        raise MemoryConflict(f"Only an active memory can be changed; this one is "
                             f"{memory.status}.")
    changed = [name for name, value, now in (("content", new_content, memory.content),
                                             ("metadata", new_metadata, memory.metadata_))
               if value is not None and value != now]
    _snapshot(session, memory)
    before = memory.version
    if new_content is not None and new_content != memory.content:
        _forget_chunks(session, memory)
    if new_content is not None:
        memory.content = new_content
    if new_metadata is not None:
        memory.metadata_ = new_metadata
    memory.version += 1
    session.flush()
    # Metadata is never chunked: only new content gives the next build something to do.
    # Requested before the audit event: row writes come before the chain's lock.
    build = build_for_change(session, memory.owner_id) if "content" in changed else None
    record_event(session, action="memory.update", actor=actor, owner_id=memory.owner_id,
                 target_type="memory", target_id=str(memory.id),
                 details={"changed": changed, "before": {"version": before},
                          "after": {"version": memory.version}})
    return memory, build


@dataclass
class Receipt:
    """What a forget or restore did, as the owner may read it again later."""

    marker_id: int
    memory_id: str
    mode: str
    from_status: str | None
    to_status: str | None
    version: int
    removed_versions: int
    removed_chunks: int
    audit_event_id: int | None
    audit_hash: str | None
    created_at: datetime
    vacuum_due: bool
    vacuumed_at: datetime | None
    reason: str = ""
    build: BuildRequest | None = field(default=None, compare=False)
    probed_at: datetime | None = None
    probe_rows: int | None = None
    # "legal_hold": the erasure waits for a hold to end (only soft deleted until then);
    # ``completed_by``: the receipt of the erasure once it ran.
    pending: str | None = None
    completed_by: int | None = None
    # A redaction's or hard delete's copies, by kind: {"removed": n, "left": m}; ``None``
    # when none were searched (a soft delete, a restore, an erasure waiting for a hold).
    copies: dict[str, dict[str, int]] | None = None

    @property
    def searched(self) -> list[str]:
        """What the post-delete probe counted: the item's chunks, and each kind of copy."""
        if self.probed_at is None:
            return []
        return ["chunks", *(self.copies or {})]

    @property
    def found(self) -> int:
        """Everything the probe found left: chunks and copies (0: the search was clean)."""
        return (self.probe_rows or 0) + sum(n["left"] for n in (self.copies or {}).values())

    def to_dict(self) -> dict[str, Any]:
        return {
            "marker_id": self.marker_id,
            "memory_id": self.memory_id,
            "mode": self.mode,
            "from_status": self.from_status,
            "to_status": self.to_status,
            "version": self.version,
            "reason": self.reason,
            "removed": {"versions": self.removed_versions, "chunks": self.removed_chunks,
                        **{kind: n["removed"] for kind, n in (self.copies or {}).items()}},
            "audit_event": {"id": self.audit_event_id, "hash": self.audit_hash},
            "created_at": self.created_at.isoformat(),
            "vacuum": {"due": self.vacuum_due,
                       "vacuumed_at": self.vacuumed_at.isoformat() if self.vacuumed_at
                       else None},
            # ``rows``: the item's chunks (as before copies were searched); ``found``: by
            # kind, what the exact counts found — ``searched`` names the kinds.
            "probe": {"at": self.probed_at.isoformat() if self.probed_at else None,
                      "rows": self.probe_rows,
                      "searched": self.searched,
                      "found": {"chunks": self.probe_rows,
                                **{kind: n["left"] for kind, n in (self.copies or {}).items()}}
                      if self.probed_at else None},
            "pending": self.pending,
            "completed_by": self.completed_by,
        }


def receipt_of(session: Session, marker: ForgetMarker, *,
               audit_hash: str | None = None) -> Receipt:
    if audit_hash is None and marker.audit_event_id:
        audit_hash = session.scalar(select(AuditEvent.hash).where(
            AuditEvent.id == marker.audit_event_id))
    return Receipt(marker.id, str(marker.memory_id), marker.mode, marker.from_status,
                   marker.to_status, marker.version, marker.removed_versions,
                   marker.removed_chunks, marker.audit_event_id, audit_hash,
                   marker.created_at, marker.vacuum_due, marker.vacuumed_at, marker.reason,
                   probed_at=marker.probed_at, probe_rows=marker.probe_rows,
                   pending="legal_hold" if marker.pending_hold and not marker.completed_by_id
                   else None, completed_by=marker.completed_by_id,
                   copies={c["kind"]: {"removed": c["removed"], "left": c["left"]}
                           for c in marker.copies} if marker.copies is not None else None)


def _owner_in(column: Any, owner_ids: int | Sequence[int]) -> Any:
    return column == owner_ids if isinstance(owner_ids, int) else column.in_(owner_ids)


def find_receipt(session: Session, owner_ids: int | Sequence[int], marker_id: object, *,
                 scopes: Scopes = None) -> Receipt:
    """The owner's (or one of the owners': a person's teams) erasure receipt
    ``marker_id`` (404 alike for someone else's)."""
    check_scope(scopes, "receipts")
    # ASCII digits within the integer column only: "١", "1_0" or 2**40 name no marker.
    id_ = marker_id if type(marker_id) is int else parse_id(str(marker_id))
    marker = session.scalars(select(ForgetMarker).where(
        ForgetMarker.id == id_, _owner_in(ForgetMarker.owner_id, owner_ids))).first() \
        if id_ is not None and 0 < id_ <= INT4_MAX else None
    if marker is None:
        raise MemoryNotFound("There is no such erasure receipt among yours.")
    return receipt_of(session, marker)


def receipts_of_memory(session: Session, owner_ids: int | Sequence[int], memory_id: object,
                       *, scopes: Scopes = None) -> list[Receipt]:
    check_scope(scopes, "receipts")
    parsed = parse_memory_id(memory_id)
    if parsed is None:
        return []
    rows = session.execute(
        select(ForgetMarker, AuditEvent.hash)
        .outerjoin(AuditEvent, AuditEvent.id == ForgetMarker.audit_event_id)
        .where(ForgetMarker.memory_id == parsed,
               _owner_in(ForgetMarker.owner_id, owner_ids))
        .order_by(ForgetMarker.id))
    return [receipt_of(session, marker, audit_hash=hash_) for marker, hash_ in rows]


def _forget_chunks(session: Session, memory: Memory) -> int:
    # The caller took the build lock first (wait_for_builds), before any row write.
    return forget_chunks(session, memory.owner_id, SAVED, [str(memory.id)], locked=True)


@dataclass(frozen=True)
class _Gone:
    """What a marker needs of a memory that was just deleted."""

    id: uuid.UUID
    owner_id: int
    version: int


def _mark(session: Session, memory: Memory | _Gone, *, mode: str, reason: str, actor: Actor,
          from_status: str, to_status: str | None, removed_versions: int = 0,
          removed_chunks: int = 0, pending_hold: bool = False,
          copies: list[CopyCount] | None = None) -> Receipt:
    """The marker and its audit event; the receipt, with the event's hash as written.
    ``copies``: what the erasure of its copies did and found (counts)."""
    marker = ForgetMarker(
        memory_id=memory.id, owner_id=memory.owner_id, mode=mode, reason=reason,
        actor_type=actor.kind, actor_id=str(actor.id), version=memory.version,
        from_status=from_status, to_status=to_status, removed_versions=removed_versions,
        removed_chunks=removed_chunks, pending_hold=pending_hold,
        vacuum_due=mode in ("redact", "hard_delete") and not pending_hold,
        copies=[{"kind": c.kind, "removed": c.removed, "left": c.left} for c in copies]
        if copies is not None else None)
    if mode != "restore":
        # Proof, not belief: after the delete, an exact count (no index that could miss
        # a row) of the owner's chunks of this memory, in this same transaction.
        marker.probe_rows = count_item_chunks(session, memory.owner_id, SAVED,
                                              str(memory.id))
        marker.probed_at = datetime.now(UTC)
    session.add(marker)
    session.flush()
    event = record_event(
        session, action=f"memory.{mode}", actor=actor, owner_id=memory.owner_id,
        target_type="memory", target_id=str(memory.id), mode=mode,
        details={"marker_id": marker.id, "before": {"status": from_status},
                 "after": {"status": to_status}, "version": memory.version,
                 "removed": {"versions": removed_versions, "chunks": removed_chunks,
                             **{c.kind: c.removed for c in copies or ()}},
                 **({"pending": "legal_hold"} if pending_hold else {})})
    marker.audit_event_id = event.id
    session.flush()
    return receipt_of(session, marker, audit_hash=event.hash)


def _soft_delete(session: Session, memory: Memory, metadata: Any) -> int:
    """Snapshot, mark deleted, version + 1, chunks gone: how many chunks went."""
    _snapshot(session, memory)
    memory.status, memory.deleted_at = "deleted", datetime.now(UTC)
    if metadata is not None:
        memory.metadata_ = metadata
    memory.version += 1
    return _forget_chunks(session, memory)


def forget_memory(session: Session, owner_id: int, memory_id: object, *, mode: object,
                  actor: Actor, scopes: Scopes = None, reason: object = None,
                  replacement_content: object = None, metadata: object = None) -> Receipt:
    """Soft delete, redact or hard delete the owner's memory, in the caller's
    transaction: checks in the API's order (the mode's scope, then the target, then its
    state), then removes its chunks at once and leaves the marker and audit event."""
    mode = check_mode(mode)
    check_scope(scopes, mode)
    reason = check_reason(reason)
    if replacement_content is not None:
        if mode != "redact":
            raise InvalidMemoryInput("replacement_content is only for mode redact.",
                                     "replacement_content")
        replacement_content = check_content(replacement_content, "replacement_content")
    if metadata is not None:
        if mode == "hard_delete":
            raise InvalidMemoryInput("metadata cannot be given with hard_delete: nothing "
                                     "of the memory remains.", "metadata")
        metadata = check_metadata(metadata)
    find_memory(session, owner_id, memory_id)  # 404/410 before waiting on any lock
    # The build's lock first, then the row: a running build of this owner finishes (and
    # commits what it wrote) before we delete; a later one reads the memory as forgotten.
    wait_for_builds(session, owner_id)
    memory = find_memory(session, owner_id, memory_id, lock=True)
    from_status = memory.status
    if mode != "soft_delete" and is_held(session, owner_id):
        return _defer_for_hold(session, memory, mode=mode, reason=reason, actor=actor,
                               replacement=replacement_content, metadata=metadata)

    if mode == "soft_delete":
        if memory.status != "active":
            raise MemoryConflict(f"Only an active memory can be deleted; this one is "
                                 f"{memory.status}.")
        chunks = _soft_delete(session, memory, metadata)
        receipt = _mark(session, memory, mode=mode, reason=reason, actor=actor,
                       from_status=from_status, to_status="deleted", removed_chunks=chunks)
    elif mode == "redact":
        if memory.status == "redacted":
            raise MemoryConflict("This memory is already redacted.")
        copies = _erase_copies(session, memory, mode)
        # Every earlier version loses its content and metadata; the redacted version is
        # recorded as a snapshot without them (which version, in which state).
        purged = session.execute(
            update(MemoryVersion)
            .where(MemoryVersion.memory_id == memory.id,
                   or_(MemoryVersion.content.is_not(None), MemoryVersion.metadata_.is_not(None)))
            .values(content=None, metadata_=None)).rowcount or 0
        session.add(MemoryVersion(memory_id=memory.id, version=memory.version, content=None,
                                  metadata_=None, status=memory.status))
        memory.content = replacement_content or REDACTED
        memory.metadata_ = metadata if metadata is not None else {}
        memory.status, memory.redacted_at = "redacted", datetime.now(UTC)
        memory.version += 1
        chunks = _forget_chunks(session, memory)
        receipt = _mark(session, memory, mode=mode, reason=reason, actor=actor,
                       from_status=from_status, to_status="redacted",
                       removed_versions=purged + 1, removed_chunks=chunks, copies=copies)
    else:  # hard_delete
        versions = session.scalar(select(func.count()).select_from(MemoryVersion)
                                  .where(MemoryVersion.memory_id == memory.id)) or 0
        copies = _erase_copies(session, memory, mode)
        chunks = _forget_chunks(session, memory)
        gone = _Gone(memory.id, memory.owner_id, memory.version)
        # The delete (and the build request its flush makes) before the marker: every
        # row write must come before the audit chain's lock (record_event), or two
        # transactions can each wait for the other.
        session.delete(memory)  # its versions go with it (ON DELETE CASCADE)
        session.flush()
        receipt = _mark(session, gone, mode=mode, reason=reason, actor=actor,
                       from_status=from_status, to_status=None,
                       removed_versions=versions + 1, removed_chunks=chunks, copies=copies)
    return receipt


def _erase_copies(session: Session, memory: Memory, mode: str) -> list[CopyCount]:
    """Before its content and versions go: every text the memory held (a redacted one's
    was erased already), then every copy the product made of them (``dashboard.copies``:
    chat replies, "Drew on" records, exports), erased and counted again."""
    texts = [] if memory.status == "redacted" else [memory.content]
    texts += session.scalars(select(MemoryVersion.content).where(
        MemoryVersion.memory_id == memory.id, MemoryVersion.content.is_not(None))
        .order_by(MemoryVersion.version))
    return erase_copies(session, Erasure(memory.owner_id, SAVED, str(memory.id),
                                         tuple(dict.fromkeys(texts)), mode, REDACTED))


HELD_WITH_REPLACEMENT = (
    "This account is under a legal hold: a redaction waits until the hold ends, and no "
    "replacement text is kept for it meanwhile. Redact without replacement_content, or "
    "delete the memory (recall stops at once either way).")
HELD_ALREADY = "An erasure of this memory already waits for the legal hold to end."
HELD_RESTORE = ("This memory's erasure waits for a legal hold to end; it cannot be restored "
                "meanwhile.")


def _waiting_for_hold(session: Session, memory: Memory) -> bool:
    return session.scalar(select(ForgetMarker.id).where(
        ForgetMarker.memory_id == memory.id, ForgetMarker.owner_id == memory.owner_id,
        ForgetMarker.pending_hold, ForgetMarker.completed_by_id.is_(None)).limit(1)) is not None


def _defer_for_hold(session: Session, memory: Memory, *, mode: str, reason: str,
                    actor: Actor, replacement: str | None, metadata: Any) -> Receipt:
    """A redact or hard delete under a legal hold: the memory is soft deleted now (its
    chunks go, recall stops) and the erasure waits, as a pending receipt, for the hold's
    end (``dashboard.retention.complete_released``)."""
    if replacement is not None:
        raise MemoryConflict(HELD_WITH_REPLACEMENT)
    if _waiting_for_hold(session, memory):
        raise MemoryConflict(HELD_ALREADY)
    from_status, chunks = memory.status, 0
    if memory.status == "active":
        chunks = _soft_delete(session, memory, metadata)
    session.flush()
    return _mark(session, memory, mode=mode, reason=reason, actor=actor,
                 from_status=from_status, to_status=memory.status, removed_chunks=chunks,
                 pending_hold=True)


def restore_memory(session: Session, owner_id: int, memory_id: object, *, actor: Actor,
                   scopes: Scopes = None, reason: object = None,
                   metadata: object = None) -> Receipt:
    """Undo a soft delete: active again, version + 1, and a quick update requested so
    the memory is recalled again after the next build. Redacted: 409; hard-deleted: 410."""
    check_scope(scopes, "restore")
    reason = check_reason(reason)
    metadata = check_metadata(metadata) if metadata is not None else None
    memory = find_memory(session, owner_id, memory_id, lock=True)
    if memory.status == "redacted":
        raise MemoryConflict("A redacted memory cannot be restored: its content is gone.")
    if memory.status != "deleted":
        raise MemoryConflict("Only a deleted memory can be restored; this one is active.")
    if _waiting_for_hold(session, memory):
        raise MemoryConflict(HELD_RESTORE)
    _snapshot(session, memory)
    memory.status, memory.deleted_at = "active", None
    if metadata is not None:
        memory.metadata_ = metadata
    memory.version += 1
    session.flush()
    build = build_for_change(session, owner_id)  # the flush's request (memory.changes)
    receipt = _mark(session, memory, mode="restore", reason=reason, actor=actor,
                    from_status="deleted", to_status="active")
    receipt.build = build
    return receipt


# -- recall and export -----------------------------------------------------------------------

@dataclass(frozen=True)
class Recalled:
    content: str
    distance: float
    source_key: str  # the memory source
    source: str  # who it came from: chatgpt, codex, … for saved memories; else the source key
    memory_id: str | None
    source_id: str
    chunk_index: int
    owner_id: int = 0  # whose memory: the caller's own, or a team's account
    # How it matched: "semantic", "lexical" (it holds a name or code of the query, kept
    # even beyond the cut) or "both" (``memory.search``).
    match: str = "semantic"


def recall(session: Session, owner_ids: int | Sequence[int], query: str, k: int, *,
           embedder: Embedder, max_distance: RecallCut = None,
           scopes: Scopes = None) -> list[Recalled]:
    """Top-k over the owners' chunks (every source; a person's and their teams' in one
    search), each naming where it came from; a query with nothing to search on is refused
    (``NothingToSearch``, field "query")."""
    check_scope(scopes, "search")
    query = check_content(query, "query")
    owners = [owner_ids] if isinstance(owner_ids, int) else list(owner_ids)
    hits = search_memory(session, owners, query, max(1, min(int(k), MAX_RECALL_K)),
                         embedder=embedder, max_distance=max_distance)
    saved_ids = [parse_memory_id(h.source_id) for h in hits if h.source_key == SAVED]
    origins: dict[str, str] = {}
    if saved_ids:
        origins = {str(id_): source for id_, source in session.execute(
            select(Memory.id, Memory.source).where(
                Memory.id.in_([i for i in saved_ids if i is not None]),
                Memory.owner_id.in_(owners), Memory.status == "active"))}
    out = []
    for hit in hits:
        if hit.source_key == SAVED:
            if hit.source_id not in origins:
                continue  # forgotten in a transaction this one already sees
            out.append(Recalled(hit.content, hit.distance, hit.source_key,
                                origins[hit.source_id], hit.source_id, hit.source_id,
                                hit.chunk_index, hit.owner_id, hit.match))
        else:
            out.append(Recalled(hit.content, hit.distance, hit.source_key, hit.source_key,
                                None, hit.source_id, hit.chunk_index, hit.owner_id,
                                hit.match))
    return out


def memory_dict(memory: Memory) -> dict[str, Any]:
    return {
        "id": str(memory.id),
        "content": memory.content,
        "metadata": memory.metadata_ or {},
        "source": memory.source,
        "client_name": memory.client_name,
        "status": memory.status,
        "version": memory.version,
        "created_at": memory.created_at.isoformat(),
        "updated_at": memory.updated_at.isoformat() if memory.updated_at else None,
        "deleted_at": memory.deleted_at.isoformat() if memory.deleted_at else None,
        "redacted_at": memory.redacted_at.isoformat() if memory.redacted_at else None,
    }


def export_memories(session: Session, owner_id: int, *, scopes: Scopes = None
                    ) -> dict[str, Any]:
    """Everything remembered about the owner: the saved memories (every status; redacted
    ones as they are now) and every memory chunk the last builds stored, by source."""
    check_scope(scopes, "export")
    memories = session.scalars(select(Memory).where(Memory.owner_id == owner_id)
                               .order_by(Memory.created_at, Memory.id))
    chunks = session.execute(
        select(MemoryChunk.source_key, MemoryChunk.source_id, MemoryChunk.chunk_index,
               MemoryChunk.content, MemoryChunk.created_at)
        .where(MemoryChunk.user_id == owner_id)
        .order_by(MemoryChunk.source_key, MemoryChunk.source_id, MemoryChunk.chunk_index))
    return {
        "owner_id": owner_id,
        "exported_at": datetime.now(UTC).isoformat(),
        "memories": [memory_dict(m) for m in memories],
        "chunks": [{"source_key": key, "source_id": sid, "chunk_index": index,
                    "content": content, "created_at": created.isoformat()}
                   for key, sid, index, content, created in chunks],
    }


def status_of(session: Session, user: Any, *, embedder_name: str,
              scopes: Scopes = None) -> MemoryStatus:
    """The Memory Status page's truth for ``user``, for a caller holding memory:read."""
    check_scope(scopes, "status")
    return memory_status(session, user, resolution=resolve_build_sources(user, UserPlans(session)),
                         embedder_name=embedder_name)
