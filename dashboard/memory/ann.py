"""Moving a user into the HNSW index off the build's path.

Rows entering the partial index ``… WHERE ann`` go in at 54–760 rows/s, so a build never
moves many: a user who crosses ANN_MIN_CHUNKS is built with every row ``ann = false`` (COPY
speed), and the build asks for ``jobs.builds.index_ann`` (the user id only). That job moves
the rows in, a short transaction per batch under the user's build lock, and its last batch
sets ``memory_states.ann_ready``; recall takes the index only then, the exact scan until
then. A user leaves only below the leave mark (hysteresis). docs/architecture/retrieval.md.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from dashboard.memory.locks import lock_user
from dashboard.memory.models import MemoryChunk, MemoryState
from dashboard.memory.queue import Call
from dashboard.memory.requests import defer_job
from dashboard.memory.settings import EngineSettings

INDEX_JOB = "jobs.builds.index_ann"


def index_call(user_id: int, *, rows_left: int | None = None) -> Call:
    """The indexing job of ``user_id``. One job id per user, so a request made while one
    waits replaces it; a job that continues itself (``rows_left``) takes another id, as
    its own is still running. Running it twice is harmless: it does what is left."""
    suffix = "" if rows_left is None else f"-{rows_left}"
    return Call(INDEX_JOB, (user_id,), f"ann-index-{user_id}{suffix}",
                f"memory HNSW indexing of user {user_id}")


def request_indexing(session: Session, user_id: int) -> None:
    """Push the user's indexing job when ``session``'s transaction commits."""
    defer_job(session, ("call", index_call(user_id)))


@dataclass(frozen=True)
class AnnPlan:
    """What a build does about the HNSW index, given the user's state before it:
    ``new_ann``: its new rows go into the index; ``ready``: the note's flag after it;
    ``unflag``: every kept row leaves the index; ``index``: ask for the indexing job."""

    new_ann: bool = False
    ready: bool = False
    unflag: bool = False
    index: bool = False


def plan_for_build(*, ready: bool, rows: int, ann_rows: int, rows_after: int, adding: int,
                   threshold: int, leave: int, batch: int) -> AnnPlan:
    """``ready``: the note's flag; ``rows``, ``ann_rows``: the user's rows (and how many
    are ``ann``) before the build; ``rows_after``: after it; ``adding``: new rows.

    - below the leave mark: out of the index (a plain update, cheap);
    - ready, every row in, and few new rows (at most a batch): stays; new rows go in;
    - otherwise, if ready, partly in, or at the threshold: entering — new rows are
      written outside the index, the kept rows keep their flags (no progress lost), and
      the indexing job is asked for (again: it is idempotent);
    - else (in the band between the marks, never entered): exact, nothing to do."""
    if rows_after < leave or rows_after == 0:
        return AnnPlan(unflag=ann_rows > 0)
    if ready and rows and ann_rows == rows and adding <= batch:
        return AnnPlan(new_ann=True, ready=True)
    if ready or ann_rows or rows_after >= threshold:
        return AnnPlan(index=True)
    return AnnPlan()


# -- the indexing job --------------------------------------------------------------------------

@dataclass(frozen=True)
class IndexStep:
    """One batch: how many rows it moved in; ``state``: ``indexing`` (more to do),
    ``ready`` (every row in, the flag set), ``left`` (the user fell below the leave
    mark: rows moved out instead) or ``no-note`` (never built: nothing to flag)."""

    rows: int
    state: str

    @property
    def done(self) -> bool:
        return self.state != "indexing"


def index_batch(session: Session, user_id: int, *, leave: int, batch: int) -> IndexStep:
    """Move up to ``batch`` of the user's rows into the HNSW index, in the caller's
    transaction, under the user's build lock (transaction-scoped: a build, a forget and
    a batch never interleave); the last batch sets ``ann_ready`` with it."""
    lock_user(session, user_id)
    counts = (select(func.count().label("rows"),
                     func.count().filter(MemoryChunk.ann.is_(False)).label("waiting"))
              .where(MemoryChunk.user_id == user_id).subquery())
    ready, rows, waiting = session.execute(select(
        select(MemoryState.ann_ready).where(MemoryState.user_id == user_id)
        .scalar_subquery(), counts.c.rows, counts.c.waiting)).one()
    if ready is None:
        return IndexStep(0, "no-note")
    if ready:
        return IndexStep(0, "ready")
    if rows < leave or rows == 0:
        # Fallen below the mark since the request (a forget, a build): out, not in.
        session.execute(update(MemoryChunk).where(MemoryChunk.user_id == user_id,
                                                  MemoryChunk.ann).values(ann=False))
        return IndexStep(0, "left")
    some = (select(MemoryChunk.id).where(MemoryChunk.user_id == user_id,
                                         MemoryChunk.ann.is_(False)).limit(batch))
    moved = session.execute(update(MemoryChunk).where(MemoryChunk.id.in_(some))
                            .values(ann=True)).rowcount or 0
    if waiting > batch:
        return IndexStep(moved, "indexing")
    # Under the lock nothing else wrote this user's rows: every one is in now.
    session.execute(update(MemoryState).where(MemoryState.user_id == user_id)
                    .values(ann_ready=True))
    return IndexStep(moved, "ready")


@dataclass
class IndexOutcome:
    state: str = "indexing"
    batches: int = 0
    rows: int = 0
    # Each batch's transaction, lock wait included (the bench reads them; tests never).
    seconds: list[float] = field(default_factory=list)
    continued: bool = False


def index_user_ann(session: Session, user_id: int, *, settings: EngineSettings,
                   budget_seconds: float | None = None,
                   after_batch: Callable[[IndexStep], None] | None = None) -> IndexOutcome:
    """The indexing job's work: batches of ``settings.ann_index_batch`` rows, each
    committed on its own, until the user is ready (or left). Past ``budget_seconds`` it
    stops and asks for its own continuation (pushed at that batch's commit), so a job
    never runs into its timeout. ``after_batch`` is called after each commit."""
    started = time.perf_counter()
    outcome = IndexOutcome()
    while True:
        began = time.perf_counter()
        step = index_batch(session, user_id, leave=settings.ann_leave_chunks,
                           batch=settings.ann_index_batch)
        over = not step.done and budget_seconds is not None \
            and time.perf_counter() - started > budget_seconds
        if over:
            left = session.scalar(select(func.count()).where(
                MemoryChunk.user_id == user_id, MemoryChunk.ann.is_(False)))
            defer_job(session, ("call", index_call(user_id, rows_left=left)))
        session.commit()
        outcome.seconds.append(time.perf_counter() - began)
        outcome.batches += 1 if step.rows else 0
        outcome.rows += step.rows
        outcome.state = step.state
        if after_batch is not None:
            after_batch(step)
        if step.done or over:
            outcome.continued = over
            return outcome
