"""The truth check: per user, the stored chunks hold nothing the resolution, the flags,
the records' statuses and the plan's retention do not allow, their counts are what the
last build stored, and the ``ann`` flags agree with the note's ``ann_ready`` and the
marks (``_judge_ann``). A violation is an audit event (counts and ids only) and a repair
build; each run leaves a ``MemoryVerification`` row.

A user with a build queued or running is not judged: that build settles every change
made so far (each change asks for one in its own transaction)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from sqlalchemy import func, select
from sqlalchemy.dialects.postgresql import distinct_on
from sqlalchemy.orm import Session

from dashboard.audit.services import SYSTEM, Actor, record_event
from dashboard.auth.models import User
from dashboard.memory.ann import request_indexing
from dashboard.memory.models import MemoryBuild, MemoryChunk, MemoryState, MemoryVerification
from dashboard.memory.pipeline import fresh_chunks
from dashboard.memory.requests import request_builds
from dashboard.memory.settings import ann_leave_mark
from dashboard.plans.services import every_plan, resolve_sources
from dashboard.sources import get_source

BATCH_SIZE = 500
VERIFY_ACTION = "memory.verify"

# What each kind of violation means, for the staff home and the command's report.
KINDS = {
    "source_not_included": "chunks of a source the user's plan does not include now",
    "not_allowed": "chunks no current record allows (a flagged pair, an excluded Blink, "
                   "a memory not active, a deleted document, changed content, or a record "
                   "older than the plan's retention window keeps)",
    "count_mismatch": "a chunk count other than what the last build stored",
    "ann_flag": "rows whose ann flag disagrees with the user's ann_ready note (every row "
                "of a ready user in the HNSW index, none of a user below the leave mark)",
}


@dataclass(frozen=True)
class Violation:
    user_id: int
    kind: str
    source_key: str | None
    count: int


@dataclass
class VerifyReport:
    started_at: datetime
    users_checked: int = 0
    users_pending: int = 0
    chunks_checked: int = 0
    violations: list[Violation] = field(default_factory=list)
    repairs_requested: int = 0
    # Users entering the HNSW index (not ready, at the threshold or partly in): not
    # findings; their indexing job is asked for again when repairing (it is idempotent).
    users_indexing: int = 0

    @property
    def users_with_violations(self) -> int:
        return len({v.user_id for v in self.violations})


def _last_counts(session: Session, user_ids: list[int]) -> dict[int, dict[str, int]]:
    """Per user, what the last succeeded build left stored per source (added + kept)."""
    rows = session.execute(
        select(MemoryBuild.user_id, MemoryBuild.source_counts)
        .where(MemoryBuild.user_id.in_(user_ids), MemoryBuild.status == "succeeded")
        .ext(distinct_on(MemoryBuild.user_id))
        .order_by(MemoryBuild.user_id, MemoryBuild.finished_at.desc().nulls_last(),
                  MemoryBuild.id.desc())
    ).all()
    # A build recorded without its counts (an older release's) leaves them unknown.
    return {user_id: {key: int(c.get("added", 0)) + int(c.get("kept", 0))
                      for key, c in counts.items()}
            for user_id, counts in rows if isinstance(counts, dict)}


def _judge(user_id: int, included: set[str], stored: dict[str, list[int]],
           extra: dict[str, int], last: dict[str, int] | None,
           ann_marks: tuple[int, int], ready: bool = False) -> list[Violation]:
    """``stored``: per source, [rows, ann rows]; ``extra``: per included source, the
    stored chunks no current record allows; ``ann_marks``: (threshold, leave mark);
    ``ready``: the note's ``ann_ready``."""
    found = [Violation(user_id, "source_not_included", key, rows)
             for key, (rows, _) in sorted(stored.items()) if key not in included]
    found += [Violation(user_id, "not_allowed", key, n) for key, n in sorted(extra.items())]
    if last is not None:
        for key in sorted(set(stored) | set(last)):
            have, had = stored.get(key, [0, 0])[0], last.get(key, 0)
            if have != had:
                found.append(Violation(user_id, "count_mismatch", key, have - had))
    total = sum(rows for rows, _ in stored.values())
    ann_rows = sum(ann for _, ann in stored.values())
    wrong = _judge_ann(total, ann_rows, ready, ann_marks[1])
    if wrong:
        found.append(Violation(user_id, "ann_flag", None, wrong))
    return found


def _judge_ann(total: int, ann_rows: int, ready: bool, leave: int) -> int:
    """How many rows' ``ann`` flag is wrong. Ready: every row in, and at least the leave
    mark of them. Not ready: below the leave mark, no row in; at or above it, any number
    (none: exact, or entering with the job not yet run; some or all: the job part way) —
    the path follows ``ready``, so recall is right in each. Between the marks either
    state is right, as long as the rows agree with it."""
    if ready:
        return total - ann_rows if ann_rows < total else (total if total < leave else 0)
    return ann_rows if total < leave else 0


def _entering(total: int, ann_rows: int, ready: bool, threshold: int, leave: int) -> bool:
    """Not ready, and an indexing job should be under way: at the threshold, or part way
    in and not below the leave mark."""
    return not ready and total >= leave and (total >= threshold or ann_rows > 0)


# Records age out of a retention window continuously, and leave memory at the build the
# retention run asks for: a record is judged outside the window only this much later.
RETENTION_GRACE = timedelta(days=1)


def _not_allowed(session: Session, checked: dict[str, list[int]],
                 cutoffs: dict[int, dict[str, datetime]]) -> dict[int, dict[str, int]]:
    """Per user and source, the stored chunks no current record allows: each source's
    records of all its users in one query, their chunk keys against the stored keys."""
    wanted = {(user_id, key) for key, ids in checked.items() for user_id in ids}
    if not wanted:
        return {}
    allowed: dict[int, set[tuple]] = defaultdict(set)
    for key, user_ids in checked.items():
        for user_id, records in get_source(key).extract_many(session, user_ids).items():
            allowed[user_id].update(fresh_chunks(records, cutoffs.get(user_id)))
    extra: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    users = sorted({user_id for user_id, _ in wanted})
    for row in session.execute(
            select(MemoryChunk.user_id, MemoryChunk.source_key, MemoryChunk.source_id,
                   MemoryChunk.chunk_index, MemoryChunk.content_hash)
            .where(MemoryChunk.user_id.in_(users))):
        if (row.user_id, row.source_key) in wanted and \
                tuple(row)[1:] not in allowed[row.user_id]:
            extra[row.user_id][row.source_key] += 1
    return extra


def verify_memory(session: Session, *, ann_threshold: int, ann_leave: int | None = None,
                  user_ids: Iterable[int] | None = None, repair: bool = True,
                  actor: Actor = SYSTEM, batch_size: int = BATCH_SIZE) -> VerifyReport:
    """Check every user (or ``user_ids``), a batch at a time; audit each violating user
    and ask for a full rebuild of their memory, and (``repair``) the indexing job of each
    user entering the HNSW index (a lost job is asked again). ``ann_leave``: the leave
    mark (default: from ``ann_threshold``). Flushes; the caller commits (which pushes)."""
    report = VerifyReport(started_at=datetime.now(UTC))
    marks = (ann_threshold, ann_leave_mark(ann_threshold) if ann_leave is None else ann_leave)
    plans, default = every_plan(session)
    wanted = sorted(set(user_ids)) if user_ids is not None else None
    after = 0
    while True:
        query = select(User.id, User.plan_id).where(User.id > after).order_by(User.id) \
            .limit(batch_size)
        if wanted is not None:
            query = query.where(User.id.in_(wanted))
        users = session.execute(query).all()
        if not users:
            break
        after = users[-1].id
        ids = [u.id for u in users]
        pending = set(session.scalars(select(MemoryBuild.user_id).where(
            MemoryBuild.user_id.in_(ids), MemoryBuild.status.in_(("queued", "running")))))
        stored: dict[int, dict[str, list[int]]] = defaultdict(dict)
        for user_id, key, rows, ann in session.execute(
                select(MemoryChunk.user_id, MemoryChunk.source_key, func.count(),
                       func.count().filter(MemoryChunk.ann))
                .where(MemoryChunk.user_id.in_(ids))
                .group_by(MemoryChunk.user_id, MemoryChunk.source_key)):
            stored[user_id][key] = [rows, ann]
        ready = set(session.scalars(select(MemoryState.user_id).where(
            MemoryState.user_id.in_(ids), MemoryState.ann_ready)))
        last = _last_counts(session, ids)
        judged = [u for u in users if u.id not in pending]
        report.users_pending += len(users) - len(judged)
        resolutions = {u.id: resolve_sources(plans.get(u.plan_id, default)) for u in judged}
        included = {uid: set(r.included_keys) for uid, r in resolutions.items()}
        cutoffs = {uid: r.cutoffs(report.started_at, RETENTION_GRACE)
                   for uid, r in resolutions.items()}
        checked: dict[str, list[int]] = defaultdict(list)
        for u in judged:
            for key in stored.get(u.id, {}):
                if key in included[u.id]:
                    checked[key].append(u.id)
        extra = _not_allowed(session, checked, cutoffs)
        for u in judged:
            mine = stored.get(u.id, {})
            report.users_checked += 1
            report.chunks_checked += sum(rows for rows, _ in mine.values())
            found = _judge(u.id, included[u.id], mine, extra.get(u.id, {}),
                           last.get(u.id), marks, u.id in ready)
            report.violations += found
            total = sum(rows for rows, _ in mine.values())
            ann_rows = sum(ann for _, ann in mine.values())
            if not found and _entering(total, ann_rows, u.id in ready, *marks):
                report.users_indexing += 1
                if repair:
                    request_indexing(session, u.id)
    _record(session, report, repair=repair, actor=actor)
    return report


def _record(session: Session, report: VerifyReport, *, repair: bool, actor: Actor) -> None:
    by_user: dict[int, dict[str, int]] = defaultdict(dict)
    for v in report.violations:
        by_user[v.user_id][f"{v.kind}:{v.source_key}" if v.source_key else v.kind] = v.count
    for user_id, found in sorted(by_user.items()):
        record_event(session, action=VERIFY_ACTION, actor=actor, owner_id=user_id,
                     target_type="user", target_id=user_id, details={"violations": found})
    if repair and by_user:
        report.repairs_requested = len(request_builds(session, sorted(by_user), mode="full",
                                                      trigger="repair"))
    session.add(MemoryVerification(
        started_at=report.started_at, finished_at=datetime.now(UTC),
        users_checked=report.users_checked, users_pending=report.users_pending,
        chunks_checked=report.chunks_checked, violations=len(report.violations),
        users_with_violations=report.users_with_violations,
        repairs_requested=report.repairs_requested))
    session.flush()


def last_verification(session: Session) -> MemoryVerification | None:
    return session.scalars(select(MemoryVerification)
                           .order_by(MemoryVerification.id.desc()).limit(1)).first()
