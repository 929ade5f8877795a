"""A plan change applied to all the plan's users at once, where its effect is the same for
each: a source switched off or evicted by a lower cap leaves every user's memory by one
statement per batch of users, not by one build per user. Each batch is one transaction
that takes its users' build locks, deletes, writes their build record and note, and asks
a build for the users it cannot settle so (their memory gains a source, a build holds
their lock, no note yet, or their rows are in the HNSW index). docs/architecture/builds.md
has the reasoning."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass

from sqlalchemy import (
    Integer,
    String,
    bindparam,
    exists,
    func,
    insert,
    select,
    text,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.orm import Session

from dashboard.audit.services import SYSTEM, record_event
from dashboard.auth.models import User
from dashboard.memory.locks import BUILD_LOCK_NAMESPACE
from dashboard.memory.maintenance import mark_fanned_out, plan_change_stamp
from dashboard.memory.models import MemoryBuild, MemoryChunk, MemoryState
from dashboard.memory.requests import request_builds
from dashboard.plans.models import Plan
from dashboard.plans.services import UserPlan, get_plan, resolve_sources, users_of_plan

APPLY_ACTION = "plan.change_applied"
# Users per transaction: each holds one advisory lock per user until it commits, and the
# server's lock table is shared (max_locks_per_transaction x connections).
DEFAULT_BATCH = 500


@dataclass
class PlanApplied:
    """What applying a plan's change did, in counts (the audit event's details)."""

    users: int = 0  # active users of the plan looked at
    applied: int = 0  # users whose chunks left in bulk
    chunks_removed: int = 0
    builds_requested: int = 0  # users left to their own build
    busy: int = 0  # of those: a build or a forget held their lock
    unchanged: int = 0  # nothing to remove and nothing to add
    batches: int = 0

    def details(self) -> dict[str, int]:
        return {"users": self.users, "applied": self.applied,
                "chunks_removed": self.chunks_removed,
                "builds_requested": self.builds_requested, "busy": self.busy,
                "unchanged": self.unchanged, "batches": self.batches}


_IDS = bindparam("ids", type_=ARRAY(Integer))


def _lock_free(session: Session, ids: list[int]) -> set[int]:
    """Of ``ids``, the users whose build lock this transaction now holds (never waits: a
    user whose lock is taken is left to a build that runs after the holder)."""
    rows = session.execute(
        text("SELECT u FROM unnest(:ids) AS u "
             "WHERE pg_try_advisory_xact_lock(:ns, u)").bindparams(_IDS),
        {"ids": ids, "ns": BUILD_LOCK_NAMESPACE})
    return {row[0] for row in rows}


def _notes(session: Session, ids: list[int]) -> dict[int, tuple[set[str], bool]]:
    """user -> (the sources their stored chunks reflect, any row in the HNSW index)."""
    in_index = exists().where(MemoryChunk.user_id == MemoryState.user_id, MemoryChunk.ann)
    return {user_id: (set(keys), bool(ann)) for user_id, keys, ann in session.execute(
        select(MemoryState.user_id, MemoryState.included_keys, in_index)
        .where(MemoryState.user_id.in_(ids)))}


def _counts(rows) -> dict[int, dict[str, int]]:
    out: dict[int, dict[str, int]] = defaultdict(dict)
    for user_id, key, count in rows:
        out[user_id][key] = int(count)
    return out


def _apply_batch(session: Session, plan: UserPlan, ids: list[int],
                 result: PlanApplied) -> None:
    resolution = resolve_sources(plan)
    keep = list(resolution.included_keys)
    free = _lock_free(session, ids)
    notes = _notes(session, sorted(free))
    bulk, build = [], sorted(set(ids) - free)
    result.busy += len(build)
    for user_id in sorted(free):
        note = notes.get(user_id)
        if note is None or note[1] or set(keep) - note[0]:
            build.append(user_id)  # never built, in the index, or gaining a source
        elif note[0] - set(keep):
            bulk.append(user_id)
        else:
            result.unchanged += 1
    if bulk:
        removed = _counts(session.execute(text(
            "WITH gone AS (DELETE FROM memory_chunks WHERE user_id = ANY(:ids) "
            "AND source_key <> ALL(:keep) RETURNING user_id, source_key) "
            "SELECT user_id, source_key, count(*) FROM gone GROUP BY 1, 2").bindparams(
                _IDS, bindparam("keep", type_=ARRAY(String))),
            {"ids": bulk, "keep": keep}))
        kept = _counts(session.execute(
            select(MemoryChunk.user_id, MemoryChunk.source_key, func.count())
            .where(MemoryChunk.user_id.in_(bulk))
            .group_by(MemoryChunk.user_id, MemoryChunk.source_key)))
        _record(session, bulk, removed, kept, resolution.to_dict())
        session.execute(update(MemoryState).where(MemoryState.user_id.in_(bulk))
                        .values(included_keys=keep))
        result.applied += len(bulk)
        result.chunks_removed += sum(sum(c.values()) for c in removed.values())
    if build:
        request_builds(session, build, trigger="plan_change")
        result.builds_requested += len(build)


def _record(session: Session, users: list[int], removed: dict[int, dict[str, int]],
            kept: dict[int, dict[str, int]], resolution: dict) -> None:
    """Each user's build record of the bulk change, succeeded at this commit: what the
    page's "last build" shows and the truth check compares the stored counts with."""
    now = func.clock_timestamp()
    rows = []
    for user_id in users:
        gone, left = removed.get(user_id, {}), kept.get(user_id, {})
        counts = {key: {"added": 0, "removed": gone.get(key, 0), "kept": left.get(key, 0)}
                  for key in sorted(set(gone) | set(left))}
        rows.append({"user_id": user_id, "removed": sum(gone.values()),
                     "kept": sum(left.values()), "source_counts": counts})
    session.execute(
        insert(MemoryBuild).values(
            mode="bulk", trigger="plan_change", status="succeeded", attempts=1, added=0,
            embedded=0, reused=0, resolution=resolution, timings={},
            started_at=now, finished_at=now, inputs_read_at=now),
        rows)


def apply_plan_change_batches(session: Session, plan_id: int, *,
                              batch_size: int = DEFAULT_BATCH) -> Iterator[PlanApplied]:
    """Apply the plan's current sources to its active users, a batch at a time (in id
    order); yields the running totals after each batch, which the caller commits. The
    plan is read afresh for every batch, so a change made meanwhile applies from the
    next batch on (and the fan-out is asked again for it: ``memory_changed_at``)."""
    result = PlanApplied()
    after = 0
    while True:
        plan = get_plan(session, plan_id)  # fresh, with its assignments, each batch
        if plan is None:
            return
        ids = list(session.scalars(
            select(User.id).where(users_of_plan(plan.id, plan.is_default), User.active,
                                  User.id > after)
            .order_by(User.id).limit(batch_size)))
        if not ids:
            return
        _apply_batch(session, plan, ids, result)
        result.users += len(ids)
        result.batches += 1
        after = ids[-1]
        yield result


def apply_plan_change(session: Session, plan_id: int, *,
                      batch_size: int = DEFAULT_BATCH) -> PlanApplied:
    """The plan-change fan-out: apply its effect in bulk where it only removes, ask
    builds where it adds, a committed transaction per batch; then note the change as
    fanned out and audit it once, with counts."""
    if session.get(Plan, plan_id) is None:
        return PlanApplied()
    changed_at = plan_change_stamp(session, plan_id)
    result = PlanApplied()
    for result in apply_plan_change_batches(session, plan_id, batch_size=batch_size):  # noqa: B007
        session.commit()
    mark_fanned_out(session, plan_id, changed_at)
    record_event(session, action=APPLY_ACTION, actor=SYSTEM, target_type="plan",
                 target_id=plan_id, details=result.details())
    session.commit()
    return result
