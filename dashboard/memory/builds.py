"""Build requests and their execution (§6). PostgreSQL, not Redis, is the source of truth.

A request is a ``memory_builds`` row first. The partial unique index on queued rows makes
fifty simultaneous requests one build (later ones merge; full wins over quick). The RQ job
is pushed only after the requesting transaction commits (an ``after_commit`` hook); a
rollback pushes nothing. A sweeper pushes requests whose job is gone (Redis was down) and
fails running builds whose worker stopped heartbeating. RQ's job status is never read to
decide what a build's status is.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import suppress
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from flask import current_app, has_app_context
from rq import Retry
from rq.job import Job, JobStatus
from sqlalchemy import and_, case, event, exists, func, or_, select, text, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError, IntegrityError, InterfaceError, OperationalError
from sqlalchemy.orm import Session

from dashboard.auth.models import User
from dashboard.extensions import db
from dashboard.memory.models import BUILD_MODES, BUILD_TRIGGERS, MemoryBuild
from dashboard.memory.queue import build_job_id, get_build_queue, get_redis
from dashboard.pipeline.build import BUILD_LOCK_NAMESPACE, BuildResult, run_memory_build
from dashboard.pipeline.embedders import Embedder, get_embedder
from dashboard.plans.models import Plan

log = logging.getLogger(__name__)

_PENDING = "orbitpilot.pending_builds"


class BuildRequestError(ValueError):
    """A build request refused for a reason the person asking should read."""


class RateLimited(BuildRequestError):
    def __init__(self, retry_after: int) -> None:
        super().__init__(
            f"Your memory was updated a moment ago; you can ask again in {retry_after} s."
        )
        self.retry_after = retry_after


@dataclass(frozen=True)
class BuildRequest:
    build_id: int
    merged: bool  # True: joined a build already queued for this user


# -- requesting ---------------------------------------------------------------------------

def _merge_mode(excluded_mode: Any) -> Any:
    # Full wins over quick: a full rebuild does everything a quick update would.
    return case(
        (or_(MemoryBuild.mode == "full", excluded_mode == "full"), "full"), else_="quick"
    )


def request_build(
    session: Session,
    user_id: int,
    *,
    mode: str = "quick",
    trigger: str = "user",
    requested_by_id: int | None = None,
) -> BuildRequest:
    """Record a build request; the job is pushed once the caller commits."""
    if mode not in BUILD_MODES:
        raise BuildRequestError(f"mode must be one of {', '.join(BUILD_MODES)}")
    if trigger not in BUILD_TRIGGERS:
        raise BuildRequestError(f"trigger must be one of {', '.join(BUILD_TRIGGERS)}")
    stmt = pg_insert(MemoryBuild).values(
        user_id=user_id, mode=mode, trigger=trigger, status="queued",
        requested_by_id=requested_by_id,
    )
    stmt = stmt.on_conflict_do_update(
        index_elements=[MemoryBuild.user_id],
        index_where=text("status = 'queued'"),
        set_={"mode": _merge_mode(stmt.excluded.mode)},
    ).returning(MemoryBuild.id, text("(xmax = 0) AS inserted"))
    build_id, inserted = session.execute(stmt).one()
    if inserted:
        session.info.setdefault(_PENDING, set()).add(build_id)
    return BuildRequest(build_id, merged=not inserted)


def request_user_update(
    session: Session, user: User, *, mode: str = "quick", now: datetime | None = None,
    min_interval: int | None = None,
) -> BuildRequest:
    """The user's own "update my memory now", at most once per interval."""
    interval = min_interval if min_interval is not None else \
        current_app.config["USER_BUILD_INTERVAL_SECONDS"]
    now = now or datetime.now(UTC)
    last = session.scalar(
        select(func.max(MemoryBuild.created_at)).where(
            MemoryBuild.user_id == user.id, MemoryBuild.trigger == "user",
            MemoryBuild.requested_by_id == user.id,
        )
    )
    if last is not None and (now - last).total_seconds() < interval:
        raise RateLimited(max(1, int(interval - (now - last).total_seconds())))
    return request_build(session, user.id, mode=mode, trigger="user", requested_by_id=user.id)


def _on_plan(plan: Plan) -> Any:
    """The condition for a plan's users: the default plan also has everyone on none."""
    if plan.is_default:
        return or_(User.plan_id.is_(None), User.plan_id == plan.id)
    return User.plan_id == plan.id


def request_builds_for_plan(
    session: Session, plan: Plan, *, mode: str = "quick", requested_by_id: int | None = None,
    batch_size: int | None = None,
) -> Iterator[int]:
    """Fan out one request per active user of ``plan``, a batch at a time. Yields the
    number requested in each batch; the caller commits after each (so jobs start flowing
    before the whole plan is done, and no transaction holds thousands of rows)."""
    batch_size = batch_size or current_app.config["BUILD_FANOUT_BATCH"]
    after = 0
    while True:
        ids = session.scalars(
            select(User.id).where(_on_plan(plan), User.active, User.id > after)
            .order_by(User.id).limit(batch_size)
        ).all()
        if not ids:
            return
        for user_id in ids:
            request_build(session, user_id, mode=mode, trigger="admin",
                          requested_by_id=requested_by_id)
        after = ids[-1]
        yield len(ids)


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
    for user_id in user_ids:
        request_build(session, user_id, trigger="conversation_idle")
    return len(user_ids)


def request_scheduled_builds(session: Session, *, everyone: bool = False) -> int:
    """The periodic safety net: a quick build for each active user whose content, plan or
    assignments changed since their last successful build (or everyone)."""
    from dashboard.blinks.models import Blink
    from dashboard.documents.models import Document
    from dashboard.orbitpilot.models import Message, ProfileFact
    from dashboard.plans.models import SourceAssignment
    from dashboard.xmemo.models import Memory

    last_success = (
        select(func.max(MemoryBuild.finished_at))
        .where(MemoryBuild.user_id == User.id, MemoryBuild.status == "succeeded")
        .scalar_subquery()
    )
    if everyone:
        condition = User.active
    else:
        def changed(owner_column, stamp) -> Any:
            return exists().where(owner_column == User.id,
                                  or_(last_success.is_(None), stamp > last_success))

        default_plan_id = select(Plan.id).where(Plan.is_default).scalar_subquery()
        plan_id = func.coalesce(User.plan_id, default_plan_id)
        condition = and_(User.active, or_(
            changed(Message.user_id, Message.updated_at),
            changed(Blink.user_id, Blink.updated_at),
            changed(Memory.owner_id, Memory.updated_at),
            changed(Document.user_id, Document.updated_at),
            changed(ProfileFact.user_id, ProfileFact.updated_at),
            and_(last_success.is_not(None), or_(
                exists().where(Plan.id == plan_id, Plan.updated_at > last_success),
                exists().where(SourceAssignment.plan_id == plan_id,
                               SourceAssignment.updated_at > last_success),
            )),
        ))
    user_ids = session.scalars(select(User.id).where(condition).order_by(User.id)).all()
    for user_id in user_ids:
        request_build(session, user_id, trigger="schedule")
    return len(user_ids)


# -- pushing to RQ after commit ---------------------------------------------------------

def enqueue_build_jobs(build_ids: list[int]) -> int:
    """Push jobs for these builds; ids only, never content. Returns how many were pushed.

    A Redis failure is logged (without content) and left to the sweeper."""
    if not build_ids or not has_app_context():
        return 0
    config = current_app.config
    try:
        queue = get_build_queue()
        for build_id in build_ids:
            queue.enqueue(
                "jobs.builds.run_build",
                build_id,
                job_id=build_job_id(build_id),
                job_timeout=config["BUILD_JOB_TIMEOUT"],
                retry=Retry(max=max(1, config["BUILD_MAX_ATTEMPTS"] - 1),
                            interval=config["BUILD_RETRY_INTERVALS"]),
                result_ttl=3600,
                failure_ttl=7 * 24 * 3600,
                description=f"memory build {build_id}",
            )
    except Exception as exc:  # Redis down, refused, timed out: the row is safe in PostgreSQL
        log.warning("build queue unavailable (%s); %d build(s) left for the sweeper",
                    type(exc).__name__, len(build_ids))
        return 0
    return len(build_ids)


@event.listens_for(Session, "after_commit")
def _push_after_commit(session: Session) -> None:
    pending = session.info.pop(_PENDING, None)
    if pending:
        enqueue_build_jobs(sorted(pending))


@event.listens_for(Session, "after_rollback")
def _drop_after_rollback(session: Session) -> None:
    session.info.pop(_PENDING, None)


# -- running ------------------------------------------------------------------------------

RETRYABLE = (OperationalError, InterfaceError)


def describe_error(exc: BaseException) -> str:
    """A reason for the build record and staff pages: the kind of failure, never content
    (exception messages can quote the data they choked on)."""
    from rq.timeouts import JobTimeoutException

    if isinstance(exc, JobTimeoutException):
        return "timed out: the build ran longer than its job timeout"
    if isinstance(exc, DBAPIError):
        code = getattr(exc.orig, "sqlstate", None)
        return f"database error {type(exc.orig).__name__}" + (f" (SQLSTATE {code})" if code
                                                                  else "")
    if isinstance(exc, BuildRequestError):
        return str(exc)
    return f"{type(exc).__name__} during the build"


class Heartbeat:
    """Stamps ``heartbeat_at`` from a thread with its own connection while a build runs."""

    def __init__(self, engine: Engine, build_id: int, interval: float) -> None:
        self.engine, self.build_id, self.interval = engine, build_id, interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"heartbeat-{build_id}",
                                        daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                with self.engine.begin() as conn:
                    conn.execute(
                        update(MemoryBuild)
                        .where(MemoryBuild.id == self.build_id, MemoryBuild.status == "running")
                        .values(heartbeat_at=func.clock_timestamp())
                    )
            except Exception as exc:
                log.warning("heartbeat for build %s failed: %s", self.build_id,
                            type(exc).__name__)

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=self.interval + 5)


def _finish(engine: Engine, build_id: int, *, reason: str, requeue: bool) -> str:
    """Mark a build failed, or queued again for RQ's retry. Its own short transaction:
    the build's connection may be the thing that broke."""
    with engine.begin() as conn:
        if requeue:
            try:
                with conn.begin_nested():
                    conn.execute(
                        update(MemoryBuild).where(MemoryBuild.id == build_id)
                        .values(status="queued", error=reason, heartbeat_at=None)
                    )
                return "queued"
            except IntegrityError:
                # A newer request is already queued for this user; it will do the work.
                reason = f"{reason}; superseded by a newer queued build"
        conn.execute(
            update(MemoryBuild)
            .where(MemoryBuild.id == build_id, MemoryBuild.status.in_(("queued", "running")))
            .values(status="failed", error=reason, finished_at=func.clock_timestamp())
        )
    return "failed"


def fail_build(build_id: int, reason: str) -> None:
    """Used by the worker when a job dies outside our code (killed work horse)."""
    _finish(db.engine, build_id, reason=reason, requeue=False)


def execute_build(build_id: int, *, embedder: Embedder | None = None) -> str:
    """Claim and run one build record. Returns its final status for this attempt.

    One connection carries the whole job, with a session-level advisory lock on the user
    (a second worker picking a later build of the same user waits here, never
    interleaves; a dead worker's lock dies with its connection). The claim commits on its
    own, so "running" and the heartbeat are visible while the build's transaction, which
    swaps the chunks and writes the counts, is still open."""
    config = current_app.config
    engine = db.engine
    embedder = embedder or get_embedder(config["EMBEDDER"])
    with engine.connect() as conn:
        session = Session(bind=conn, expire_on_commit=False)
        user_id = session.scalar(select(MemoryBuild.user_id).where(MemoryBuild.id == build_id))
        if user_id is None:
            return "missing"
        session.execute(select(func.pg_advisory_lock(BUILD_LOCK_NAMESPACE, user_id)))
        session.commit()
        try:
            claimed = session.execute(
                update(MemoryBuild)
                .where(MemoryBuild.id == build_id, MemoryBuild.status == "queued")
                .values(status="running", started_at=func.clock_timestamp(),
                        heartbeat_at=func.clock_timestamp(),
                        attempts=MemoryBuild.attempts + 1, error=None,
                        embedding_model=embedder.name)
                .returning(MemoryBuild.mode, MemoryBuild.attempts)
            ).first()
            session.commit()
            if claimed is None:
                return "not-queued"
            mode, attempts = claimed
            with Heartbeat(engine, build_id, config["BUILD_HEARTBEAT_SECONDS"]):
                try:
                    user = session.get(User, user_id)
                    result = run_memory_build(user, mode, session=session, embedder=embedder,
                                              build_id=build_id)
                    _record_success(session, build_id, result)
                    session.commit()
                    return "succeeded"
                except BaseException as exc:
                    _safe_rollback(session)
                    retry = isinstance(exc, RETRYABLE) and attempts < config["BUILD_MAX_ATTEMPTS"]
                    outcome = _finish(engine, build_id, reason=describe_error(exc),
                                      requeue=retry)
                    log.warning("build %s %s: %s", build_id, outcome, describe_error(exc))
                    if outcome == "queued" or not isinstance(exc, Exception):
                        raise  # RQ retries with backoff; or a signal/exit passes through
                    return "failed"
        finally:
            # If the connection broke, its session-level lock went with it.
            with suppress(Exception):
                session.execute(select(func.pg_advisory_unlock(BUILD_LOCK_NAMESPACE, user_id)))
                session.commit()
            session.close()


def _safe_rollback(session: Session) -> None:
    # The connection may be what failed; marking the build failed uses another one.
    with suppress(Exception):
        session.rollback()


def _record_success(session: Session, build_id: int, result: BuildResult) -> None:
    session.execute(
        update(MemoryBuild).where(MemoryBuild.id == build_id).values(
            status="succeeded", finished_at=func.clock_timestamp(), error=None,
            added=result.added, removed=result.removed, kept=result.kept,
            embedded=result.embedded, reused=result.reused, resolution=result.resolution,
            source_counts=result.per_source, timings=result.timings,
        )
    )


# -- sweeping -----------------------------------------------------------------------------

@dataclass(frozen=True)
class SweepResult:
    failed: int
    requeued: int


_LIVE_JOB_STATES = {JobStatus.QUEUED, JobStatus.STARTED, JobStatus.SCHEDULED,
                    JobStatus.DEFERRED}


def sweep_builds(session: Session, *, stale_after: float | None = None,
                 requeue_after: float | None = None) -> SweepResult:
    """Fail running builds whose worker stopped heartbeating; push queued builds whose job
    is gone. Safe to run from any number of processes at once. (clock_timestamp, not
    now(): a long-lived session's transaction may have started well before this pass.)"""
    config = current_app.config
    stale_after = stale_after if stale_after is not None else config["BUILD_STALE_SECONDS"]
    requeue_after = requeue_after if requeue_after is not None \
        else config["BUILD_REQUEUE_SECONDS"]
    failed = session.execute(
        update(MemoryBuild)
        .where(MemoryBuild.status == "running",
               MemoryBuild.heartbeat_at < func.clock_timestamp() - timedelta(seconds=stale_after))
        .values(status="failed", finished_at=func.clock_timestamp(),
                error="worker stopped heartbeating (killed or lost)")
        .returning(MemoryBuild.id)
    ).scalars().all()
    waiting = session.scalars(
        select(MemoryBuild.id).where(
            MemoryBuild.status == "queued",
            MemoryBuild.created_at < func.clock_timestamp() - timedelta(seconds=requeue_after),
        ).order_by(MemoryBuild.id)
    ).all()
    lost: list[int] = []
    if waiting:
        try:
            redis = get_redis()
            for build_id in waiting:
                status = Job.fetch(build_job_id(build_id), connection=redis).get_status() \
                    if Job.exists(build_job_id(build_id), connection=redis) else None
                if status not in _LIVE_JOB_STATES:
                    lost.append(build_id)
        except Exception as exc:
            log.warning("sweeper cannot reach the build queue (%s)", type(exc).__name__)
            lost = []
    session.flush()
    requeued = enqueue_build_jobs(lost)
    if failed:
        log.warning("sweeper failed %d build(s) whose worker stopped heartbeating", len(failed))
    return SweepResult(failed=len(failed), requeued=requeued)
