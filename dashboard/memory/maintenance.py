"""Work around builds that no single request does: the sweeper, the schedule (only a
safety net: every change requests its build in its own transaction, ``memory.changes``),
plan fan-outs, and pruning the engine's own old rows (retention asks for it).
``jobs.periodic`` runs them."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import DateTime, and_, delete, exists, func, literal, or_, select, update
from sqlalchemy.orm import Session

from dashboard.auth.models import User
from dashboard.memory.models import DeletedPart, MemoryBuild, MemoryState
from dashboard.memory.queue import BuildQueue, build_job_id, fanout_job_id
from dashboard.memory.requests import (
    Fanout,
    request_again,
    request_builds,
    request_builds_for_plan,
)
from dashboard.memory.runner import fail_running
from dashboard.plans.models import Plan
from dashboard.plans.services import effective_plan_id
from dashboard.sources import registered_sources

log = logging.getLogger(__name__)


# -- the sweeper ------------------------------------------------------------------------------

@dataclass(frozen=True)
class SweepResult:
    failed: int
    requeued: int
    fanouts: int = 0


def sweep_builds(session: Session, queue: BuildQueue, *, stale_after: float | None = None,
                 requeue_after: float | None = None) -> SweepResult:
    """Fail running builds whose worker stopped heartbeating, and queue their requests
    again; push queued builds and plan fan-outs whose job is gone. Safe to run from any
    number of processes at once. (clock_timestamp, not now(): a long-lived session's
    transaction may have started well before this pass.) The thresholds default to the
    queue's settings."""
    settings = queue.settings
    stale_after = settings.stale_seconds if stale_after is None else stale_after
    requeue_after = settings.requeue_seconds if requeue_after is None else requeue_after
    old = func.clock_timestamp() - timedelta(seconds=requeue_after)
    failed = session.execute(fail_running(
        MemoryBuild.heartbeat_at < func.clock_timestamp() - timedelta(seconds=stale_after),
        reason="worker stopped heartbeating (killed or lost)",
    ).returning(MemoryBuild.id)).scalars().all()
    waiting = session.scalars(
        select(MemoryBuild.id).where(MemoryBuild.status == "queued", MemoryBuild.created_at < old)
        .order_by(MemoryBuild.id)
    ).all()
    behind = session.scalars(
        select(Plan.id).where(
            Plan.memory_changed_at < old,
            or_(Plan.fanned_out_at.is_(None), Plan.fanned_out_at < Plan.memory_changed_at),
        ).order_by(Plan.id)
    ).all()
    # After reading what waits: these go out at the caller's commit, not now (a worker
    # handed an id before its row is committed finds no build).
    request_again(session, failed, max_attempts=settings.max_attempts)
    candidates = {build_job_id(i): ("build", i) for i in waiting}
    candidates.update({fanout_job_id(i): ("fanout", Fanout(i)) for i in behind})
    lost = queue.lost(candidates)
    session.flush()
    pushed = queue.push(lost)
    if failed:
        log.warning("sweeper failed %d build(s) whose worker stopped heartbeating", len(failed))
    fanouts = sum(1 for kind, _ in lost if kind == "fanout") if pushed else 0
    return SweepResult(failed=len(failed), requeued=pushed - fanouts, fanouts=fanouts)


# -- plan fan-out ------------------------------------------------------------------------------

def fan_out_plan_builds(session: Session, plan_id: int, *, batch_size: int,
                        mode: str = "quick", trigger: str = "plan_change",
                        requested_by_id: int | None = None) -> int:
    """Request a build for every active user of a plan, a batch per commit; then note the
    plan's latest cap or assignment change as fanned out. Idempotent: requests merge into
    builds already queued, and a change made meanwhile is fanned out again."""
    plan = session.get(Plan, plan_id)
    if plan is None:
        return 0
    changed_at = plan_change_stamp(session, plan_id)
    total = 0
    for count in request_builds_for_plan(session, plan, mode=mode, trigger=trigger,
                                         requested_by_id=requested_by_id,
                                         batch_size=batch_size):
        session.commit()
        total += count
    mark_fanned_out(session, plan_id, changed_at)
    session.commit()
    return total


def plan_change_stamp(session: Session, plan_id: int) -> Any:
    """The plan's latest cap or assignment change, read from the table (a trigger writes
    it, behind the ORM's back): taken before a fan-out starts."""
    return session.scalar(select(Plan.memory_changed_at).where(Plan.id == plan_id))


def mark_fanned_out(session: Session, plan_id: int, changed_at: Any) -> None:
    """The change read before the fan-out is done; a later one stays due (the sweeper
    pushes its fan-out again)."""
    if changed_at is not None:
        session.execute(
            update(Plan).where(Plan.id == plan_id,
                               or_(Plan.fanned_out_at.is_(None), Plan.fanned_out_at < changed_at))
            .values(fanned_out_at=changed_at)
        )


# -- the schedule ---------------------------------------------------

def request_scheduled_builds(session: Session, *, margin_seconds: float,
                             everyone: bool = False) -> int:
    """The periodic safety net: a quick build for each active user whose content, plan or
    plan settings changed since their last successful build read its inputs (or everyone).

    A row's ``updated_at`` is its writer's transaction start, and a writer that started
    before the build read its inputs may commit after; ``margin_seconds`` covers that (at
    worst one extra build that finds nothing to do)."""
    if everyone:
        condition = User.active
    else:
        last_read = (
            select(func.max(MemoryBuild.inputs_read_at))
            .where(MemoryBuild.user_id == User.id, MemoryBuild.status == "succeeded")
            .scalar_subquery()
        )
        # Never built: any content at all counts as a change.
        since = func.coalesce(last_read - timedelta(seconds=margin_seconds),
                              literal("-infinity").cast(DateTime(timezone=True)))
        content_changed = or_(*[source.changed_since(User.id, since)
                                for source in registered_sources()])
        # A plan change whose fan-out ran is settled for every user of the plan: applied
        # in bulk (a ``bulk`` record) or a build asked for each, in their transactions.
        # Counting it again would ask a build of every user after each plan change.
        plan_changed = and_(last_read.is_not(None), or_(
            User.plan_changed_at > since,
            exists().where(Plan.id == effective_plan_id(), Plan.memory_changed_at > since,
                           or_(Plan.fanned_out_at.is_(None),
                               Plan.fanned_out_at < Plan.memory_changed_at)),
        ))
        condition = and_(User.active, or_(content_changed, plan_changed))
    user_ids = session.scalars(select(User.id).where(condition).order_by(User.id)).all()
    request_builds(session, user_ids, trigger="schedule")
    return len(user_ids)


# -- pruning ----------------------------------------------------------------------------------

def prune_build_records(session: Session, *, before: datetime, limit: int) -> int:
    """Delete up to ``limit`` finished build records created before ``before``; how many
    went. Each user's latest succeeded build stays: the truth check and Memory Status
    read it."""
    latest = (select(func.max(MemoryBuild.id)).where(MemoryBuild.status == "succeeded")
              .group_by(MemoryBuild.user_id))
    batch = (select(MemoryBuild.id).where(
        MemoryBuild.status.in_(("succeeded", "failed")), MemoryBuild.created_at < before,
        MemoryBuild.id.not_in(latest)).limit(limit))
    return session.execute(delete(MemoryBuild).where(MemoryBuild.id.in_(batch))).rowcount or 0


def prune_tombstones(session: Session, *, now: datetime) -> int:
    """Delete the tombstones of deleted conversations once a build that read after them
    ran (a day later, well past any snapshot of the deleting transaction), and those of
    a deleted user; how many went."""
    return session.execute(delete(DeletedPart).where(
        DeletedPart.deleted_at < now - timedelta(days=7),
        ~exists().where(User.id == DeletedPart.user_id)
        | exists().where(MemoryState.user_id == DeletedPart.user_id,
                         MemoryState.inputs_read_at > DeletedPart.deleted_at
                         + timedelta(days=1)))).rowcount or 0
