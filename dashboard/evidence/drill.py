"""The deletion/export drill: on a sandbox account, save a synthetic memory, build and
recall it, hard-delete it, probe for what is left, VACUUM, and export the account to see
it gone. Each step leaves a receipt (ids, counts, times) — the synthetic words never
leave the sandbox."""

from __future__ import annotations

import json
import logging
import secrets
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import func, select, text
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from dashboard.audit.services import Actor, record_event
from dashboard.auth.models import User
from dashboard.evidence.checks import stamp
from dashboard.evidence.models import EvidenceDrill
from dashboard.evidence.report import abandoned
from dashboard.memory import (
    Call,
    EngineSettings,
    MemoryBuild,
    MemoryChunk,
    defer_job,
    execute_build,
    get_embedder,
)
from dashboard.saved_memories import export_memories, forget_memory, recall, save_memory
from dashboard.saved_memories.erasure import vacuum_after_erasures
from dashboard.saved_memories.models import ForgetMarker, Memory, MemoryVersion
from dashboard.teams.models import Team

log = logging.getLogger(__name__)

SANDBOX_EMAIL = "evidence-drill@sandbox.orbitpilot.invalid"
DRILL_ACTOR = Actor("system", "evidence-drill")
_DRILL_LOCK = 0x0E71DF
STEPS = ("save", "recall", "hard_delete", "probe", "vacuum", "export")
VACUUM_ATTEMPTS = 3


def sandbox_account(session: Session) -> User:
    """The drills' own account: a reserved address nobody can sign up with, no usable
    password (sign-in refuses it), made once (two drills at once: one row)."""
    session.execute(pg_insert(User).values(
        email=SANDBOX_EMAIL, display_name="Evidence drill sandbox", password_hash="!",
        role="user", active=True, kind="person").on_conflict_do_nothing(
        index_elements=[User.email]))
    return session.scalars(select(User).where(User.email == SANDBOX_EMAIL)).one()


def request_drill(session: Session, user: Any, *, team: Team | None = None,
                  actor: Actor | None = None, defer: bool = True
                  ) -> tuple[EvidenceDrill, bool]:
    """A new drill for the deployment or a team, or the one in the making (joined). Its
    job runs after the commit (``defer=False``: the caller runs it, as the CLI does)."""
    session.execute(text("SELECT pg_advisory_xact_lock(:a, :b)"),
                    {"a": _DRILL_LOCK, "b": team.id if team is not None else 0})
    scope = EvidenceDrill.team_id.is_(None) if team is None else EvidenceDrill.team_id == team.id
    pending = session.scalars(select(EvidenceDrill).where(
        scope, EvidenceDrill.status.in_(("queued", "running")))
        .execution_options(populate_existing=True).limit(1)).first()
    if pending is not None and not abandoned(pending.created_at):
        return pending, False
    if pending is not None:  # its job died: no longer running
        pending.status, pending.finished_at = "failed", datetime.now(UTC)
        pending.steps = [*pending.steps, {"step": "abandoned", "ok": False, "at": stamp()}]
    drill = EvidenceDrill(team_id=team.id if team is not None else None,
                          requested_by_id=user.id if user is not None else None,
                          status="queued", steps=[])
    session.add(drill)
    session.flush()
    record_event(session, action="evidence.drill_request", actor=actor or Actor.of(user),
                 owner_id=team.id if team is not None else None, target_type="evidence_drill",
                 target_id=drill.id, details={})
    if defer:
        defer_job(session, ("call", Call("jobs.evidence.run_drill", (drill.id,),
                                         f"evidence-drill-{drill.id}",
                                         f"evidence drill {drill.id}")))
    return drill, True


def _wait_for_build(session: Session, build_id: int, seconds: float = 60.0) -> str:
    deadline = time.monotonic() + seconds
    while True:
        session.expire_all()
        status = session.scalar(select(MemoryBuild.status).where(MemoryBuild.id == build_id))
        if status not in ("queued", "running") or time.monotonic() > deadline:
            return str(status)
        session.rollback()
        time.sleep(0.2)


def run_drill(session: Session, drill_id: int, *, engine: Engine, settings: EngineSettings,
              commit: Callable[[], None]) -> EvidenceDrill | None:
    """Run the drill's six steps, committing between them (a VACUUM sees only what is
    committed). A step that cannot run is a failed step, never an exception text."""
    drill = session.get(EvidenceDrill, drill_id)
    if drill is None or drill.status not in ("queued", "running"):
        return drill
    drill.status = "running"
    commit()
    steps: list[dict[str, Any]] = []

    def record(name: str, ok: bool, **measured: Any) -> bool:
        steps.append({"step": name, "ok": bool(ok), "at": stamp(), **measured})
        return bool(ok)

    try:
        _steps(session, engine, settings, commit, record)
    except Exception as exc:  # a step that could not run fails the drill, with no text
        session.rollback()
        log.warning("evidence drill %s: a step could not run (%s)", drill_id,
                    type(exc).__name__)
        done = {s["step"] for s in steps}
        failed_step = next((name for name in STEPS if name not in done), "export")
        record(failed_step, False, error="the step could not run")
    drill = session.get(EvidenceDrill, drill_id)
    ok = len(steps) == len(STEPS) and all(s["ok"] for s in steps)
    drill.steps, drill.ok = steps, ok
    drill.status = "ready" if ok else "failed"
    drill.finished_at = datetime.now(UTC)
    record_event(session, action="evidence.drill", actor=DRILL_ACTOR, owner_id=drill.team_id,
                 target_type="evidence_drill", target_id=drill.id,
                 details={"ok": ok, "failed_steps": [s["step"] for s in steps if not s["ok"]]})
    commit()
    return drill


def _steps(session: Session, engine: Engine, settings: EngineSettings,
           commit: Callable[[], None], record: Callable[..., bool]) -> None:
    sandbox = sandbox_account(session)
    token = secrets.token_hex(12)
    words = f"Evidence drill {token}: a synthetic memory, never a person's words."
    saved = save_memory(session, owner=sandbox, content=words, source="api",
                        actor=DRILL_ACTOR)
    memory_id, build_id = saved.memory.id, saved.build.build_id
    commit()
    record("save", True, memory_id=str(memory_id), account_id=sandbox.id)

    status = execute_build(engine, build_id, settings=settings)
    if status == "not-queued":  # a worker took it first: wait for its outcome
        status = _wait_for_build(session, build_id)
    session.expire_all()
    hits = recall(session, sandbox.id, words, 5, embedder=get_embedder(settings.embedder))
    found = [h for h in hits if h.memory_id == str(memory_id)]
    if not record("recall", bool(found), build_status=status, hits=len(hits),
                  memory_recalled=bool(found)):
        return

    # The system's own hard delete, as the retention run's purge is (scope given).
    receipt = forget_memory(session, sandbox.id, memory_id, mode="hard_delete",
                            actor=DRILL_ACTOR, scopes=["memory:hard_delete"])
    commit()
    marker = session.get(ForgetMarker, receipt.marker_id)
    if not record("hard_delete", marker.mode == "hard_delete" and not marker.pending_hold,
                  marker_id=marker.id, to_status=marker.to_status,
                  pending_hold=marker.pending_hold, removed_chunks=marker.removed_chunks):
        return

    left = {
        "memories": session.scalar(select(func.count()).select_from(Memory)
                                   .where(Memory.id == memory_id)),
        "versions": session.scalar(select(func.count()).select_from(MemoryVersion)
                                   .where(MemoryVersion.memory_id == memory_id)),
        "chunks": session.scalar(select(func.count()).select_from(MemoryChunk).where(
            MemoryChunk.user_id == sandbox.id, MemoryChunk.source_id == str(memory_id))),
    }
    record("probe", marker.probe_rows == 0 and not any(left.values()),
           receipt_probe_rows=marker.probe_rows, rows_left=left)
    commit()  # no snapshot of ours may hold the VACUUM back

    result = None
    for _ in range(VACUUM_ATTEMPTS):
        result = vacuum_after_erasures(session)
        session.expire_all()
        if session.get(ForgetMarker, marker.id).vacuumed_at is not None:
            break
        session.rollback()
        time.sleep(0.5)
    vacuumed_at = session.get(ForgetMarker, marker.id).vacuumed_at
    record("vacuum", vacuumed_at is not None,
           vacuumed_at=stamp(vacuumed_at) if vacuumed_at else None,
           tables=list(result.vacuumed) if result else [],
           refused=list(result.refused) if result else [])

    export = export_memories(session, sandbox.id)
    listed = any(m["id"] == str(memory_id) for m in export["memories"])
    chunked = any(chunk["source_id"] == str(memory_id) for chunk in export["chunks"])
    words_found = token in json.dumps(export)
    record("export", not (listed or chunked or words_found), memory_listed=listed,
           chunks_listed=chunked, words_found=words_found,
           memories_exported=len(export["memories"]))
    commit()
