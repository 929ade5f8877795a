"""Retention: a plan's windows (keep the last N days of a source's records), the restore
window of soft-deleted memories, and the pruning of operational records.

The preview and the run share their selections (``aged_chunks``, ``purgeable``): what the
preview counts is what the run removes. Aged records leave memory through the user's
next build (the build leaves out what its plan no longer keeps), so the truth check and
the build records stay right; purges are hard deletes with their erasure receipts, and a
legal hold turns them into pending receipts. Services flush; the caller commits (a run
commits per batch)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Select, delete, exists, func, select, union
from sqlalchemy.orm import Session

from dashboard.audit.services import Actor, changes, record_event
from dashboard.auth.models import User
from dashboard.connectors.models import ConnectorAccess
from dashboard.holds import (
    LegalHold,
    held_users,
    hold_condition,
    is_held,
    release_ended_versions,
)
from dashboard.memory import (
    MemoryChunk,
    prune_build_records,
    prune_tombstones,
    request_builds,
)
from dashboard.plans.models import Plan
from dashboard.plans.services import retention_of, users_of_plan
from dashboard.refusals import Conflict, FieldError
from dashboard.saved_memories import forget_memory
from dashboard.saved_memories.models import SCOPES, ForgetMarker, Memory
from dashboard.sources import get_source, registered_sources

RETENTION_ACTOR = Actor("system", "retention")
MAX_DAYS = 36_500  # a hundred years: anything longer is "keep everything"
PURGE_BATCH = 200  # hard deletes per transaction of a run
USER_BATCH = 1_000  # build requests per transaction of a run
PRUNE_BATCH = 5_000  # build records or access rows per statement


class RetentionError(FieldError):
    """A retention value refused, with the form field it is about."""


class RetentionChanged(Conflict):
    """The plan's retention changed between the preview and the confirm."""

    def __init__(self) -> None:
        super().__init__("This plan's retention changed while you were looking at the "
                         "preview. Nothing was applied.", "expected")


def aged_sources() -> list[Any]:
    """The sources a window can apply to (their records carry a time), in rank order."""
    return [s for s in registered_sources() if s.aged]


def _days(raw: object, field_name: str, *, blank_ok: bool) -> int | None:
    text = raw.strip() if isinstance(raw, str) else ""
    if not text and blank_ok:
        return None
    if not text.isdigit() or len(text) > 6 or not 1 <= int(text) <= MAX_DAYS:
        raise RetentionError(f"Give a whole number of days from 1 to {MAX_DAYS}"
                             + (", or leave it empty to keep everything." if blank_ok
                                else "."), field_name)
    return int(text)


def parse_retention(form: Mapping[str, Any]) -> tuple[dict[str, int], int]:
    """A plan's windows (``keep:<source key>``, empty: keep everything) and restore
    window (``restore_window_days``) from a form."""
    windows = {}
    for source in aged_sources():
        days = _days(form.get(f"keep:{source.key}"), f"keep:{source.key}", blank_ok=True)
        if days is not None:
            windows[source.key] = days
    restore = _days(form.get("restore_window_days"), "restore_window_days", blank_ok=False)
    return windows, restore or 1


def retention_fingerprint(plan: Plan) -> str:
    """What a preview was computed from; Confirm carries it back."""
    return json.dumps({"keep": retention_of(plan.retention),
                       "restore": plan.restore_window_days}, sort_keys=True)


# -- the selections the preview counts and the run applies -----------------------------------

def cutoff(days: int, now: datetime) -> datetime:
    return now - timedelta(days=days)


def aged_chunks(plan: Plan, source_key: str, days: int, now: datetime) -> Select:
    """(user id, record id) of every stored chunk of the plan's users whose record is
    older than ``days``: what that window leaves out of memory."""
    return (select(MemoryChunk.user_id, MemoryChunk.source_id)
            .join(User, User.id == MemoryChunk.user_id)
            .where(users_of_plan(plan.id, plan.is_default),
                   MemoryChunk.source_key == source_key,
                   MemoryChunk.record_at < cutoff(days, now)))


def purgeable(plan: Plan, days: int, now: datetime) -> Select:
    """(memory id, owner id) of the plan's users' soft-deleted memories past the restore
    window and not already waiting for a legal hold: what a purge hard-deletes."""
    waiting = exists().where(ForgetMarker.memory_id == Memory.id,
                             ForgetMarker.pending_hold,
                             ForgetMarker.completed_by_id.is_(None))
    return (select(Memory.id, Memory.owner_id)
            .join(User, User.id == Memory.owner_id)
            .where(users_of_plan(plan.id, plan.is_default), Memory.status == "deleted",
                   Memory.deleted_at < cutoff(days, now), ~waiting)
            .order_by(Memory.deleted_at, Memory.id))


@dataclass(frozen=True)
class Drop:
    source_key: str
    label: str
    days_before: int | None
    days_after: int | None
    items: int  # records remembered now that the window leaves out
    users: int

    @property
    def grows(self) -> bool:
        """Keeps more than before: older records come back at the users' next builds."""
        return self.days_before is not None and (self.days_after is None
                                                 or self.days_after > self.days_before)


@dataclass(frozen=True)
class RetentionPreview:
    plan_id: int
    plan_name: str
    drops: tuple[Drop, ...]  # every aged source whose window changes
    restore_before: int
    restore_after: int
    purge_items: int  # soft-deleted memories past the new restore window, purged now
    purge_users: int
    purge_held: int  # of those, waiting for a legal hold instead
    users: int  # users of the plan

    @property
    def changes_anything(self) -> bool:
        return bool(self.drops) or self.restore_before != self.restore_after

    def summary(self) -> dict[str, Any]:
        """For the audit event: counts and keys, never content."""
        return {"users": self.users,
                "drops": {d.source_key: {"items": d.items, "users": d.users}
                          for d in self.drops},
                "purge": {"items": self.purge_items, "users": self.purge_users,
                          "held": self.purge_held}}


def _count_items(session: Session, query: Select) -> tuple[int, int]:
    rows = query.distinct().subquery()
    items, users = session.execute(select(func.count(), func.count(rows.c[0].distinct()))
                                   .select_from(rows)).one()
    return int(items), int(users)


def preview_retention(session: Session, plan: Plan, windows: dict[str, int],
                      restore_days: int, *, now: datetime | None = None) -> RetentionPreview:
    """What setting ``windows`` and ``restore_days`` on ``plan`` would drop now."""
    now = now or datetime.now(UTC)
    before = retention_of(plan.retention)
    drops = []
    for source in aged_sources():
        old, new = before.get(source.key), windows.get(source.key)
        if old == new:
            continue
        items = users = 0
        if new is not None and (old is None or new < old):
            items, users = _count_items(session, aged_chunks(plan, source.key, new, now))
        drops.append(Drop(source.key, source.label, old, new, items, users))
    purge = purgeable(plan, restore_days, now).subquery()
    purge_items, purge_users = session.execute(
        select(func.count(), func.count(purge.c.owner_id.distinct())).select_from(purge)).one()
    held = held_users(session, session.scalars(select(purge.c.owner_id).distinct()), now=now)
    purge_held = session.scalar(select(func.count()).select_from(purge)
                                .where(purge.c.owner_id.in_(held))) if held else 0
    users = session.scalar(select(func.count()).select_from(User)
                           .where(users_of_plan(plan.id, plan.is_default))) or 0
    return RetentionPreview(plan.id, plan.name, tuple(drops), plan.restore_window_days,
                            restore_days, int(purge_items), int(purge_users),
                            int(purge_held or 0), users)


def set_retention(session: Session, plan: Plan, windows: dict[str, int], restore_days: int,
                  *, actor: Actor, expected: str | None = None,
                  now: datetime | None = None) -> RetentionPreview:
    """Apply a previewed retention change: the plan's values, one audit event (before and
    after, with the preview's counts), and the builds it needs, in the caller's
    transaction — quick updates for the users whose memory holds records the new window
    leaves out, full rebuilds for the plan's users when a window grows (an old pair
    comes back only from a full read). The purges are the periodic run's."""
    now = now or datetime.now(UTC)
    # The plan's row locked, then read as it is now: two confirms cannot interleave.
    session.execute(select(Plan.id).where(Plan.id == plan.id).with_for_update())
    session.refresh(plan)
    if expected is not None and expected != retention_fingerprint(plan):
        raise RetentionChanged()
    for key, days in windows.items():
        get_source(key)  # an unknown source is a programming error, not a form error
        if not 1 <= days <= MAX_DAYS:
            raise RetentionError(f"Give a whole number of days from 1 to {MAX_DAYS}.",
                                 f"keep:{key}")
    if not 1 <= restore_days <= MAX_DAYS:
        raise RetentionError(f"Give a whole number of days from 1 to {MAX_DAYS}.",
                             "restore_window_days")
    preview = preview_retention(session, plan, windows, restore_days, now=now)
    before = {"retention": retention_of(plan.retention),
              "restore_window_days": plan.restore_window_days}
    after = {"retention": dict(sorted(windows.items())), "restore_window_days": restore_days}
    plan.retention, plan.restore_window_days = after["retention"], restore_days
    session.flush()
    if any(d.grows for d in preview.drops):
        request_builds(session, session.scalars(select(User.id).where(
            users_of_plan(plan.id, plan.is_default))), mode="full", trigger="retention")
    else:
        for drop in preview.drops:
            if drop.days_after is not None:
                request_builds(session, session.scalars(
                    select(aged_chunks(plan, drop.source_key, drop.days_after, now)
                           .subquery().c.user_id).distinct()), trigger="retention")
    record_event(session, action="plan.retention", actor=actor, target_type="plan",
                 target_id=plan.id, details={"changes": changes(before, after),
                                             "impact": preview.summary()})
    return preview


# -- the periodic run ----------------------------------------------------------------------

@dataclass
class RetentionRun:
    builds_requested: int = 0
    purged: int = 0
    held: int = 0  # purges turned into pending receipts by a legal hold
    completed: int = 0  # erasures completed after their hold ended
    versions_released: int = 0  # texts kept by holds that reached their end, deleted
    builds_pruned: int = 0
    access_pruned: int = 0
    tombstones_pruned: int = 0
    per_plan: dict[int, dict[str, int]] = field(default_factory=dict)

    @property
    def did_anything(self) -> bool:
        return any((self.builds_requested, self.purged, self.held, self.completed,
                    self.versions_released, self.builds_pruned, self.access_pruned,
                    self.tombstones_pruned))

    def summary(self) -> dict[str, int]:
        return {"builds_requested": self.builds_requested, "purged": self.purged,
                "held": self.held, "completed": self.completed,
                "versions_released": self.versions_released,
                "builds_pruned": self.builds_pruned, "access_pruned": self.access_pruned,
                "tombstones_pruned": self.tombstones_pruned}


def complete_released(session: Session, *, user_id: int | None = None,
                      now: datetime | None = None) -> int:
    """Run the erasures that waited for legal holds which no longer hold (released, or
    past their end): each as its own receipt, named by the pending one. How many ran."""
    now = now or datetime.now(UTC)
    query = select(ForgetMarker).where(ForgetMarker.pending_hold,
                                       ForgetMarker.completed_by_id.is_(None)) \
        .order_by(ForgetMarker.id).limit(PURGE_BATCH)
    if user_id is not None:
        query = query.where(ForgetMarker.owner_id == user_id)
    done = 0
    for marker in session.scalars(query).all():
        if is_held(session, marker.owner_id, now=now):
            continue
        receipt = forget_memory(session, marker.owner_id, marker.memory_id, mode=marker.mode,
                                actor=Actor(marker.actor_type, marker.actor_id),
                                scopes=list(SCOPES), reason=marker.reason)
        marker.completed_by_id = receipt.marker_id
        done += 1
    session.flush()
    return done


def _purge_plan(session: Session, plan: Plan, now: datetime, run: RetentionRun) -> bool:
    """One batch of the plan's purges; whether there may be more."""
    rows = session.execute(purgeable(plan, plan.restore_window_days, now)
                           .limit(PURGE_BATCH)).all()
    for memory_id, owner_id in rows:
        receipt = forget_memory(session, owner_id, memory_id, mode="hard_delete",
                                actor=RETENTION_ACTOR, scopes=list(SCOPES))
        if receipt.pending:
            run.held += 1
        else:
            run.purged += 1
    return len(rows) == PURGE_BATCH


def _aged_users(session: Session, plan: Plan, now: datetime, after: int) -> list[int]:
    """The next batch of the plan's users (ids above ``after``, in order) whose memory
    holds a record its windows leave out."""
    windows = retention_of(plan.retention)
    if not windows:
        return []
    selections = [select(aged_chunks(plan, key, days, now)
                         .where(MemoryChunk.user_id > after).subquery().c.user_id)
                  for key, days in windows.items()]
    users = union(*selections).subquery() if len(selections) > 1 \
        else selections[0].distinct().subquery()
    return list(session.scalars(select(users.c.user_id).order_by(users.c.user_id)
                                .limit(USER_BATCH)))


def _prune(session: Session, now: datetime, config: Mapping[str, Any],
           run: RetentionRun) -> None:
    build_days, access_days = config.get("BUILD_RECORD_DAYS"), config.get("ACCESS_LOG_DAYS")
    if build_days:
        while True:
            pruned = prune_build_records(session, before=cutoff(build_days, now),
                                         limit=PRUNE_BATCH)
            run.builds_pruned += pruned
            session.commit()
            if pruned < PRUNE_BATCH:
                break
    run.tombstones_pruned = prune_tombstones(session, now=now)
    session.commit()
    if access_days:
        while True:
            batch = (select(ConnectorAccess.id)
                     .where(ConnectorAccess.created_at < cutoff(access_days, now))
                     .limit(PRUNE_BATCH))
            pruned = session.execute(delete(ConnectorAccess)
                                     .where(ConnectorAccess.id.in_(batch))).rowcount or 0
            run.access_pruned += pruned
            session.commit()
            if pruned < PRUNE_BATCH:
                break


def apply_retention(session: Session, *, config: Mapping[str, Any] | None = None,
                    now: datetime | None = None) -> RetentionRun:
    """One run over every plan: request the builds that age records out, purge the
    soft-deleted memories past their restore window (a held user's become pending
    receipts), complete erasures whose hold ended and let go of the texts it kept, prune
    build records and access logs.
    Commits per batch (the periodic task's session); one audit event with the counts."""
    now = now or datetime.now(UTC)
    run = RetentionRun()
    run.completed = complete_released(session, now=now)
    run.versions_released = release_ended_versions(session, now=now)
    session.commit()
    for plan in session.scalars(select(Plan).order_by(Plan.id)).all():
        after = 0
        while ids := _aged_users(session, plan, now, after):
            run.builds_requested += sum(not r.merged for r in request_builds(
                session, ids, trigger="retention"))
            session.commit()
            after = ids[-1]
        while _purge_plan(session, plan, now, run):
            session.commit()
        session.commit()
    _prune(session, now, config or {}, run)
    if run.did_anything:
        record_event(session, action="retention.apply", actor=RETENTION_ACTOR,
                     target_type="retention", details=run.summary())
    session.flush()
    return run


# -- what a user is told ------------------------------------------------------------------

@dataclass(frozen=True)
class RetentionNotice:
    held_since: datetime | None  # under a legal hold since
    held_until: datetime | None
    purge_soon: int  # soft-deleted memories purged in the next ``days``
    restore_window_days: int
    days: int


def retention_notice(session: Session, user_id: int, restore_window_days: int, *,
                     days: int = 7, now: datetime | None = None) -> RetentionNotice:
    """The legal hold and the purges due soon, for the Memory Status page: one statement."""
    now = now or datetime.now(UTC)
    hold = hold_condition(user_id, now)
    placed, ends, soon = session.execute(select(
        select(LegalHold.placed_at).where(hold).limit(1).scalar_subquery(),
        select(LegalHold.ends_at).where(hold).limit(1).scalar_subquery(),
        select(func.count()).select_from(Memory).where(
            Memory.owner_id == user_id, Memory.status == "deleted",
            Memory.deleted_at < cutoff(restore_window_days, now) + timedelta(days=days))
        .scalar_subquery())).one()
    return RetentionNotice(placed, ends, 0 if placed else int(soon or 0),
                           restore_window_days, days)
