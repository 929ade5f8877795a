"""Running one build record: claim it, run the swap, record the outcome.

RQ's job status is never read to decide what a build's status is: the record is the truth,
and every way a job can end (success, exception, retry, timeout, a killed work horse, a
dead worker) leaves it ``succeeded``, ``failed`` or ``queued`` again, with the kind of
failure and never content.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from contextlib import suppress
from typing import Any

from rq.timeouts import JobTimeoutException
from sqlalchemy import func, update
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError, IntegrityError, InterfaceError, OperationalError
from sqlalchemy.orm import Session

from dashboard.auth.models import User
from dashboard.memory.embedders import Embedder, get_embedder
from dashboard.memory.locks import hold_build_owner, release_user
from dashboard.memory.models import MemoryBuild
from dashboard.memory.pipeline import BuildResult, run_memory_build
from dashboard.memory.requests import request_again
from dashboard.memory.settings import EngineSettings
from dashboard.refusals import Refusal

log = logging.getLogger(__name__)

RETRYABLE = (OperationalError, InterfaceError)
DEAD_PREDECESSOR = "worker stopped before finishing (found still running by the next build)"


def describe_error(exc: BaseException) -> str:
    """A reason for the build record and staff pages: the kind of failure, never content
    (exception messages can quote the data they choked on)."""
    if isinstance(exc, JobTimeoutException):
        return "timed out: the build ran longer than its job timeout"
    if isinstance(exc, DBAPIError):
        code = getattr(exc.orig, "sqlstate", None)
        return f"database error {type(exc.orig).__name__}" + (f" (SQLSTATE {code})" if code
                                                                  else "")
    if isinstance(exc, Refusal):
        return exc.sentence
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


def fail_running(*where: Any, reason: str) -> Any:
    """UPDATE: the running builds matching ``where`` are failed now, with ``reason``."""
    return (update(MemoryBuild).where(MemoryBuild.status == "running", *where)
            .values(status="failed", error=reason, finished_at=func.clock_timestamp()))


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
        conn.execute(fail_running(MemoryBuild.id == build_id, reason=reason))
    return "failed"


def abandon_build(engine: Engine, build_id: int, reason: str, *,
                  max_attempts: int = EngineSettings.max_attempts) -> bool:
    """A job that ended outside our code (its work horse killed, the worker shut down or
    lost Redis) records its build failed at once instead of leaving it to the sweeper,
    and its request is queued again (``request_again``): the change that asked for it
    is still to be built. Only a running build: one still queued (its horse died waiting
    for the user's lock, or it went back to the queue for a retry) stays queued, and
    runs. True if it was running."""
    return abandon_builds(engine, [build_id], reason, max_attempts=max_attempts) == 1


def abandon_builds(engine: Engine, build_ids: list[int], reason: str, *,
                   max_attempts: int = EngineSettings.max_attempts) -> int:
    """``abandon_build`` for the builds of one job (a batch: at most one of them runs,
    and those not started stay queued, for the sweeper to push again), in one
    transaction; how many were running."""
    with Session(engine) as session, session.begin():
        failed = session.execute(fail_running(MemoryBuild.id.in_(build_ids), reason=reason)
                                 .returning(MemoryBuild.id)).scalars().all()
        request_again(session, failed, max_attempts=max_attempts)
    return len(failed)


def _claim(session: Session, build_id: int, user_id: int, embedder: Embedder):
    """queued → running, under the user's lock. Holding that lock, no other build of this
    user is alive: one still marked running lost its worker (whose lock died with its
    connection), so it is failed here rather than blocking this claim on the one-running
    index and spending this job's retries."""
    session.execute(fail_running(MemoryBuild.user_id == user_id, MemoryBuild.id != build_id,
                                 reason=DEAD_PREDECESSOR))
    return session.execute(
        update(MemoryBuild)
        .where(MemoryBuild.id == build_id, MemoryBuild.status == "queued")
        .values(status="running", started_at=func.clock_timestamp(),
                heartbeat_at=func.clock_timestamp(), attempts=MemoryBuild.attempts + 1,
                error=None, embedding_model=embedder.name)
        .returning(MemoryBuild.mode, MemoryBuild.attempts)
    ).first()


def execute_build(engine: Engine, build_id: int, *, settings: EngineSettings,
                  embedder: Embedder | None = None) -> str:
    """Claim and run one build record. Returns its final status for this attempt.

    One connection carries the whole job, with a session-level advisory lock on the user
    (a second worker picking a later build of the same user waits here, never
    interleaves; a dead worker's lock dies with its connection). The claim commits on its
    own, so "running" and the heartbeat are visible while the build's transaction, which
    swaps the chunks and writes the counts, is still open."""
    embedder = embedder or get_embedder(settings.embedder)
    with engine.connect() as conn:
        session = Session(bind=conn, expire_on_commit=False)
        user_id = hold_build_owner(session, build_id)
        if user_id is None:
            return "missing"
        try:
            claimed = _claim(session, build_id, user_id, embedder)
            session.commit()
            if claimed is None:
                return "not-queued"
            mode, attempts = claimed
            with Heartbeat(engine, build_id, settings.heartbeat_seconds):
                try:
                    user = session.get(User, user_id)
                    result = run_memory_build(user, mode, session=session, embedder=embedder,
                                              build_id=build_id,
                                              ann_threshold=settings.ann_min_chunks,
                                              ann_leave=settings.ann_leave_chunks,
                                              ann_batch=settings.ann_index_batch)
                    if not _record_success(session, build_id, result):
                        # The sweeper failed it meanwhile (a heartbeat it missed) and may
                        # have asked it again: the record says failed, so memory must not
                        # hold this build's swap either.
                        _safe_rollback(session)
                        log.warning("build %s was ended by the sweeper before it finished; "
                                    "its work is rolled back", build_id)
                        return "failed"
                    session.commit()
                    return "succeeded"
                except BaseException as exc:
                    _safe_rollback(session)
                    retry = isinstance(exc, RETRYABLE) and attempts < settings.max_attempts
                    outcome = _finish(engine, build_id, reason=describe_error(exc),
                                      requeue=retry)
                    log.warning("build %s %s: %s", build_id, outcome, describe_error(exc))
                    if outcome == "queued" or not isinstance(exc, Exception):
                        raise  # RQ retries with backoff; or a signal/exit passes through
                    return "failed"
        finally:
            # If the connection broke, its session-level lock went with it.
            with suppress(Exception):
                release_user(session, user_id)
                session.commit()
            session.close()


def execute_builds(engine: Engine, build_ids: list[int], *, settings: EngineSettings,
                   embedder: Embedder | None = None,
                   resubmit: Callable[[list[int]], Any] | None = None) -> dict[str, int]:
    """Several build records, one after another in this process: each claimed, run and
    recorded exactly as ``execute_build`` does alone (its own lock, transactions,
    heartbeat and retries), so a batch of small users pays one job and one fork, not one
    each. A build asking RQ for a retry is queued again and left to the sweeper; the rest
    go on. Past half the job's timeout no further build starts: the ones left are handed
    to ``resubmit`` (a new job), so one slow user cannot time out those after it.
    Returns how many ended in each status."""
    embedder = embedder or get_embedder(settings.embedder)
    budget = time.monotonic() + settings.job_timeout / 2
    outcomes: dict[str, int] = {}
    for done, build_id in enumerate(build_ids):
        if done and time.monotonic() > budget:
            left = list(build_ids[done:])
            if resubmit is not None:
                resubmit(left)
            outcomes["resubmitted"] = len(left)
            break
        try:
            status = execute_build(engine, build_id, settings=settings, embedder=embedder)
        except Exception:  # queued again for a retry (recorded so): the sweeper pushes it
            status = "queued"
        outcomes[status] = outcomes.get(status, 0) + 1
    return outcomes


def _safe_rollback(session: Session) -> None:
    # The connection may be what failed; marking the build failed uses another one.
    with suppress(Exception):
        session.rollback()


def _record_success(session: Session, build_id: int, result: BuildResult) -> bool:
    """Only a running build can succeed: False when another process ended it meanwhile."""
    return session.execute(
        update(MemoryBuild).where(MemoryBuild.id == build_id,
                                  MemoryBuild.status == "running").values(
            status="succeeded", finished_at=func.clock_timestamp(), error=None,
            added=result.added, removed=result.removed, kept=result.kept,
            embedded=result.embedded, reused=result.reused, resolution=result.resolution,
            source_counts=result.per_source, timings=result.timings,
            inputs_read_at=result.inputs_read_at,
        )
    ).rowcount == 1
