"""Read-backs for the saved-memory tests (versions, markers, audit events), and lock waits
observed in PostgreSQL's catalogue. The factories are ``tests.factories``'."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

from sqlalchemy import func, select, text
from sqlalchemy.engine import Engine

from dashboard.audit.models import AuditEvent
from dashboard.memory import MemoryChunk
from dashboard.memory.locks import BUILD_LOCK_NAMESPACE
from dashboard.saved_memories.models import ForgetMarker, MemoryVersion
from dashboard.sources import SAVED


def saved_chunks(session, memory_id: Any) -> list[str]:
    """Contents of the stored chunks made of the memory ``memory_id``."""
    return list(session.scalars(select(MemoryChunk.content).where(
        MemoryChunk.source_key == SAVED, MemoryChunk.source_id == str(memory_id))))


def versions_of(session, memory_id: Any) -> list[tuple[int, str | None, Any, str]]:
    """(version, content, metadata, status) of every snapshot, by version — read fresh
    from the database (bulk updates bypass the identity map)."""
    return [tuple(row) for row in session.execute(
        select(MemoryVersion.version, MemoryVersion.content, MemoryVersion.metadata_,
               MemoryVersion.status)
        .where(MemoryVersion.memory_id == memory_id).order_by(MemoryVersion.version)
        .execution_options(populate_existing=True))]


def markers_of(session, memory_id: Any) -> list[ForgetMarker]:
    return list(session.scalars(select(ForgetMarker).where(ForgetMarker.memory_id == memory_id)
                                .order_by(ForgetMarker.id)
                                .execution_options(populate_existing=True)))


def audit_head(session) -> int:
    return session.scalar(select(func.coalesce(func.max(AuditEvent.seq), 0)))


def events_since(session, head: int) -> list[AuditEvent]:
    return list(session.scalars(select(AuditEvent).where(AuditEvent.seq > head)
                                .order_by(AuditEvent.seq)))


def recalled_ids(hits) -> set[str | None]:
    return {hit.memory_id for hit in hits}


def unique_canary(label: str = "CANARY") -> str:
    """A string no earlier run can have left anywhere (the audit log keeps everything)."""
    return f"{label}-{uuid.uuid4().hex}"


# -- lock waits, observed in the catalogue (never by sleeping and hoping) -------------------

def backend_pid(session) -> int:
    return session.execute(text("SELECT pg_backend_pid()")).scalar_one()


def waits_on_build_lock(engine: Engine, pid: int, user_id: int) -> bool:
    """Whether backend ``pid`` is blocked on the build lock of ``user_id`` right now."""
    with engine.connect() as probe:
        row = probe.execute(text(
            "SELECT a.wait_event_type, a.wait_event FROM pg_locks l "
            "JOIN pg_stat_activity a ON a.pid = l.pid "
            "WHERE l.pid = :pid AND l.locktype = 'advisory' AND NOT l.granted "
            "AND l.classid = :ns AND l.objid = :user AND l.objsubid = 2"),
            {"pid": pid, "ns": BUILD_LOCK_NAMESPACE, "user": user_id}).first()
        probe.rollback()
    return row is not None and tuple(row) == ("Lock", "advisory")


def lock_waiters(engine: Engine, user_id: int) -> list[int]:
    """Backends waiting (in state Lock/advisory) for ``user_id``'s build lock."""
    with engine.connect() as probe:
        return list(probe.scalars(text(
            "SELECT l.pid FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
            "WHERE l.locktype = 'advisory' AND NOT l.granted AND l.classid = :ns "
            "AND l.objid = :user AND l.objsubid = 2 AND a.wait_event_type = 'Lock' "
            "AND a.wait_event = 'advisory'"),
            {"ns": BUILD_LOCK_NAMESPACE, "user": user_id}))


def wait_until(predicate, thread: threading.Thread | None = None,
               timeout: float = 30.0) -> bool:
    """Poll ``predicate`` until it holds (True), the deadline passes or ``thread`` ends
    (False). The deadline only bounds a broken run; the result is what is asserted."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        if thread is not None and not thread.is_alive():
            return predicate()
        time.sleep(0.02)
    return False
