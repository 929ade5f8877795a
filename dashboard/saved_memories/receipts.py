"""Erasure receipts: what a forget or restore did (its marker and audit event), as the
owner may read it again later."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from dashboard.audit.models import AuditEvent
from dashboard.ids import INT4_MAX, parse_id
from dashboard.memory import BuildRequest
from dashboard.saved_memories.models import ForgetMarker
from dashboard.saved_memories.rules import MemoryNotFound, Scopes, check_scope, parse_memory_id


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
