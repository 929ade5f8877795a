"""Periodic work around builds: the sweeper, idle conversations, the schedule, plan
fan-outs — and the leases that make each run once per interval across every worker.

The schedule is only a safety net: every change that alters a user's next build requests
that build in its own transaction (``memory.changes``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from flask import current_app
from rq.job import Job, JobStatus
from sqlalchemy import DateTime, and_, exists, func, literal, or_, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.orm import Session

from dashboard.audit.services import checkpoint_chain
from dashboard.auth.models import User
from dashboard.memory.models import MaintenanceLease, MemoryBuild
from dashboard.memory.queue import build_job_id, fanout_job_id, get_redis
from dashboard.memory.requests import (
    Fanout,
    push_jobs,
    request_builds,
    request_builds_for_plan,
)
from dashboard.memory.runner import fail_running
from dashboard.plans.models import Plan
from dashboard.plans.services import effective_plan_id
from dashboard.sources import SOURCES
from dashboard.xmemo.erasure import vacuum_after_erasures

log = logging.getLogger(__name__)


# -- the sweeper ------------------------------------------------------------------------------

@dataclass(frozen=True)
class SweepResult:
    failed: int
    requeued: int
    fanouts: int = 0


_LIVE_JOB_STATES = {JobStatus.QUEUED, JobStatus.STARTED, JobStatus.SCHEDULED,
                    JobStatus.DEFERRED}


def _lost_jobs(job_ids: dict[str, tuple[str, int]]) -> list[tuple[str, int]]:
    """Of these jobs, the ones Redis no longer has alive (none if Redis is unreachable)."""
    if not job_ids:
        return []
    try:
        redis = get_redis()
        lost = []
        for job_id, job in job_ids.items():
            status = Job.fetch(job_id, connection=redis).get_status() \
                if Job.exists(job_id, connection=redis) else None
            if status not in _LIVE_JOB_STATES:
                lost.append(job)
        return lost
    except Exception as exc:
        log.warning("sweeper cannot reach the build queue (%s)", type(exc).__name__)
        return []


def sweep_builds(session: Session, *, stale_after: float | None = None,
                 requeue_after: float | None = None) -> SweepResult:
    """Fail running builds whose worker stopped heartbeating; push queued builds and plan
    fan-outs whose job is gone. Safe to run from any number of processes at once.
    (clock_timestamp, not now(): a long-lived session's transaction may have started well
    before this pass.)"""
    config = current_app.config
    stale_after = stale_after if stale_after is not None else config["BUILD_STALE_SECONDS"]
    requeue_after = requeue_after if requeue_after is not None \
        else config["BUILD_REQUEUE_SECONDS"]
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
    candidates = {build_job_id(i): ("build", i) for i in waiting}
    candidates.update({fanout_job_id(i): ("fanout", Fanout(i)) for i in behind})
    lost = _lost_jobs(candidates)
    session.flush()
    pushed = push_jobs(lost)
    if failed:
        log.warning("sweeper failed %d build(s) whose worker stopped heartbeating", len(failed))
    fanouts = sum(1 for kind, _ in lost if kind == "fanout") if pushed else 0
    return SweepResult(failed=len(failed), requeued=pushed - fanouts, fanouts=fanouts)


# -- plan fan-out ------------------------------------------------------------------------------

def fan_out_plan_builds(session: Session, plan_id: int, *, mode: str = "quick",
                        trigger: str = "plan_change", requested_by_id: int | None = None) -> int:
    """Request a build for every active user of a plan, a batch per commit; then note the
    plan's latest cap or assignment change as fanned out. Idempotent: requests merge into
    builds already queued, and a change made meanwhile is fanned out again."""
    plan = session.get(Plan, plan_id)
    if plan is None:
        return 0
    changed_at = plan.memory_changed_at
    total = 0
    for count in request_builds_for_plan(session, plan, mode=mode, trigger=trigger,
                                         requested_by_id=requested_by_id):
        session.commit()
        total += count
    if changed_at is not None:
        session.execute(
            update(Plan).where(Plan.id == plan_id,
                               or_(Plan.fanned_out_at.is_(None), Plan.fanned_out_at < changed_at))
            .values(fanned_out_at=changed_at)
        )
    session.commit()
    return total


# -- idle conversations and the schedule ---------------------------------------------------

def request_idle_conversation_builds(session: Session, *, idle_minutes: int,
                                     now: datetime | None = None) -> int:
    """A quick build for every user with a conversation idle since their last request."""
    from dashboard.orbitpilot.models import Conversation

    now = now or datetime.now(UTC)
    cutoff = now - timedelta(minutes=idle_minutes)
    last_request = (
        select(func.max(MemoryBuild.created_at))
        .where(MemoryBuild.user_id == Conversation.user_id)
        .scalar_subquery()
    )
    user_ids = session.scalars(
        select(Conversation.user_id).distinct().where(
            Conversation.status == "open",
            Conversation.last_activity_at < cutoff,
            or_(last_request.is_(None), Conversation.last_activity_at > last_request),
        )
    ).all()
    request_builds(session, user_ids, trigger="conversation_idle")
    return len(user_ids)


def request_scheduled_builds(session: Session, *, everyone: bool = False,
                             margin_seconds: float | None = None) -> int:
    """The periodic safety net: a quick build for each active user whose content, plan or
    plan settings changed since their last successful build read its inputs (or everyone).

    A row's ``updated_at`` is its writer's transaction start, and a writer that started
    before the build read its inputs may commit after; ``margin_seconds`` covers that (at
    worst one extra build that finds nothing to do)."""
    if margin_seconds is None:
        margin_seconds = current_app.config["BUILD_SCHEDULE_MARGIN_SECONDS"]
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
        content_changed = or_(*[source.changed_since(User.id, since) for source in SOURCES])
        plan_changed = and_(last_read.is_not(None), or_(
            User.plan_changed_at > since,
            exists().where(Plan.id == effective_plan_id(), Plan.memory_changed_at > since),
        ))
        condition = and_(User.active, or_(content_changed, plan_changed))
    user_ids = session.scalars(select(User.id).where(condition).order_by(User.id)).all()
    request_builds(session, user_ids, trigger="schedule")
    return len(user_ids)


# -- once per interval, across every worker -----------------------------------------------

def claim_lease(session: Session, task: str, every_seconds: float, holder: str = "") -> bool:
    """True for exactly one caller per interval, however many workers ask at once.

    Commits the claim on its own: the task that follows runs in later transactions."""
    stmt = pg_insert(MaintenanceLease).values(task=task, last_run_at=func.clock_timestamp(),
                                              holder=holder[:128])
    stmt = stmt.on_conflict_do_update(
        index_elements=[MaintenanceLease.task],
        set_={"last_run_at": func.clock_timestamp(), "holder": stmt.excluded.holder},
        where=MaintenanceLease.last_run_at
        <= func.clock_timestamp() - timedelta(seconds=every_seconds),
    ).returning(MaintenanceLease.task)
    won = session.execute(stmt).first() is not None
    session.commit()
    return won


def _erasure_vacuum(session: Session, config: Any) -> object:
    # End the session's transaction first: the VACUUM runs on a connection of its own, and
    # a snapshot held here would keep back the very row versions it is meant to remove.
    session.commit()
    return vacuum_after_erasures(session)


@dataclass(frozen=True)
class PeriodicTask:
    name: str
    setting: str  # the config key holding its interval in seconds (0: off)
    run: Callable[[Session, Any], object]


PERIODIC_TASKS: tuple[PeriodicTask, ...] = (
    PeriodicTask("sweep", "BUILD_SWEEP_SECONDS", lambda session, config: sweep_builds(session)),
    PeriodicTask("idle_conversations", "BUILD_SWEEP_SECONDS",
                 lambda session, config: request_idle_conversation_builds(
                     session, idle_minutes=config["CONVERSATION_IDLE_MINUTES"])),
    PeriodicTask("schedule", "BUILD_SCHEDULE_SECONDS",
                 lambda session, config: request_scheduled_builds(session)),
    PeriodicTask("audit_checkpoint", "AUDIT_CHECKPOINT_SECONDS",
                 lambda session, config: checkpoint_chain(session)),
    PeriodicTask("erasure_vacuum", "ERASURE_VACUUM_SECONDS", _erasure_vacuum),
)


def run_due_tasks(session: Session, config: Any, *, holder: str = "") -> list[str]:
    """Run each periodic task whose interval has passed and whose lease this caller wins.
    A failing task is logged by kind and does not stop the others."""
    ran = []
    for task in PERIODIC_TASKS:
        every = config[task.setting]
        if not every:
            continue
        try:
            if not claim_lease(session, task.name, every, holder):
                continue
            task.run(session, config)
            session.commit()
            ran.append(task.name)
        except Exception as exc:
            session.rollback()
            log.warning("periodic task %s failed: %s", task.name, type(exc).__name__)
    return ran

