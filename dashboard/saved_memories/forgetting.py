"""Forgetting a memory (soft delete, redact, hard delete) and restoring one: the chunks go
at once under the build lock (``memory.forget_chunks``), a redaction or hard delete erases
the copies the product made, a legal hold defers an erasure; each leaves a marker and an
audit event without content (docs/architecture/erasure.md)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import func, or_, select, update
from sqlalchemy.orm import Session

from dashboard.audit.services import Actor, record_event
from dashboard.copies import CopyCount, Erasure, erase_copies
from dashboard.holds import is_held
from dashboard.memory import build_for_change, count_item_chunks, wait_for_builds
from dashboard.saved_memories.editing import drop_chunks, snapshot
from dashboard.saved_memories.models import ForgetMarker, Memory, MemoryVersion
from dashboard.saved_memories.receipts import Receipt, receipt_of
from dashboard.saved_memories.rules import (
    InvalidMemoryInput,
    MemoryConflict,
    Scopes,
    check_content,
    check_metadata,
    check_mode,
    check_reason,
    check_scope,
    find_memory,
)
from dashboard.sources import SAVED

REDACTED = "[REDACTED]"


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
    snapshot(session, memory)
    memory.status, memory.deleted_at = "deleted", datetime.now(UTC)
    if metadata is not None:
        memory.metadata_ = metadata
    memory.version += 1
    return drop_chunks(session, memory)


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
        chunks = drop_chunks(session, memory)
        receipt = _mark(session, memory, mode=mode, reason=reason, actor=actor,
                       from_status=from_status, to_status="redacted",
                       removed_versions=purged + 1, removed_chunks=chunks, copies=copies)
    else:  # hard_delete
        versions = session.scalar(select(func.count()).select_from(MemoryVersion)
                                  .where(MemoryVersion.memory_id == memory.id)) or 0
        copies = _erase_copies(session, memory, mode)
        chunks = drop_chunks(session, memory)
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
    snapshot(session, memory)
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
