"""Shared helpers for the saved-memory service tests: factories and read-backs that flush,
never commit (the per-test rollback undoes them; ``committed`` callers commit themselves)."""

from __future__ import annotations

import threading
import time
import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import func, select, text
from sqlalchemy.engine import Engine

from dashboard.audit.models import AuditEvent
from dashboard.audit.services import Actor
from dashboard.memory.embedders import get_embedder
from dashboard.memory.models import MemoryChunk
from dashboard.memory.pipeline import BUILD_LOCK_NAMESPACE, BuildResult, run_memory_build
from dashboard.sources import SAVED
from dashboard.xmemo.models import ForgetMarker, Memory, MemoryVersion
from dashboard.xmemo.services import save_memory

ALL_SCOPES = ["memory:read", "memory:write", "memory:delete", "memory:redact",
              "memory:hard_delete"]


def make_memory(session, owner, content: str = "Prefers window seats on long flights.", *,
                metadata: dict[str, Any] | None = None, source: str = "api",
                actor: Actor | None = None) -> Memory:
    """A memory saved through the service (version 1, audited, a build requested)."""
    return save_memory(session, owner=owner, content=content, metadata=metadata,
                       source=source, actor=actor or Actor.of(owner)).memory


def insert_memory(session, owner, content: str, *, created_at: datetime,
                  status: str = "active") -> Memory:
    """A memory row written directly, with a chosen creation time (keyset ordering)."""
    memory = Memory(owner_id=owner.id, content=content, status=status, created_at=created_at)
    session.add(memory)
    session.flush()
    return memory


def build(session, user, mode: str = "quick", embedder: Any = None) -> BuildResult:
    return run_memory_build(user, mode, session=session,
                            embedder=embedder or get_embedder("hashing"))


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
