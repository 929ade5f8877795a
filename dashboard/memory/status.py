"""The Memory Status page's reads: what a signed-in user's memory holds, why, and what the
next build will change. Content-free by construction (ids, states, counts and times; the
dry run returns counts), in a fixed number of queries; the plan comes in as the
resolution the request already made, shared with the chat notice."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import and_, func, literal, or_, select, union_all
from sqlalchemy.orm import Session

from dashboard.memory.models import MemoryBuild, MemoryChunk
from dashboard.memory.pipeline import preview_memory_build
from dashboard.plans.sentences import state_sentence
from dashboard.plans.services import Resolution, SourceState
from dashboard.sources import CHAT_HISTORY, get_source, source_keys


@dataclass(frozen=True)
class SourceStatus:
    rank: int
    key: str
    label: str
    state: SourceState
    sentence: str  # the status sentence, word for word what every surface says
    chunks: int  # stored now, i.e. as of the last successful build
    # The dry run of the next quick update, in chunks.
    to_add: int
    to_remove: int
    unchanged: int
    keep_days: int | None = None  # the plan's retention window
    # Remembered records that leave memory within ``AGEING_DAYS`` as the window moves on.
    ages_out_soon: int = 0

    @property
    def remembered(self) -> bool:
        return self.state is SourceState.INCLUDED

    @property
    def net(self) -> int:
        return self.to_add - self.to_remove

    @property
    def being_applied(self) -> bool:
        """The plan no longer includes the source, but its chunks are still stored (and
        recalled) until the change reaches this user: the page must not say "not
        remembered" alone meanwhile."""
        return not self.remembered and self.chunks > 0


@dataclass(frozen=True)
class BuildSummary:
    """A build as a page shows it (the Memory Status page, the support trace): its
    record's columns, never content."""

    id: int
    mode: str
    trigger: str
    status: str
    added: int
    removed: int
    kept: int
    embedded: int
    # Memory Status: UTC, whatever the database session's time zone.
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    # The kind of failure as the runner recorded it (never content); Memory Status keeps
    # it for failed builds only.
    error: str | None

    @property
    def duration_seconds(self) -> float | None:
        if self.started_at is None or self.finished_at is None:
            return None
        return (self.finished_at - self.started_at).total_seconds()


@dataclass(frozen=True)
class MemoryStatus:
    plan_name: str
    cap: int
    sources: tuple[SourceStatus, ...]
    # Chunks stored under a key the registry no longer has: the next build removes them.
    other_chunks: int
    last_build: BuildSummary | None  # the latest finished build, succeeded or failed
    # The latest succeeded build, when it is not ``last_build`` (the last one failed, so
    # the memory still holds what this one made).
    last_success: BuildSummary | None
    queued: BuildSummary | None  # a request waiting for a worker
    running: BuildSummary | None
    not_remembered_messages: int
    ageing_days: int = 7

    @property
    def ages_out_soon(self) -> int:
        return sum(s.ages_out_soon for s in self.sources)

    @property
    def total_chunks(self) -> int:
        return sum(s.chunks for s in self.sources) + self.other_chunks

    @property
    def to_add(self) -> int:
        return sum(s.to_add for s in self.sources)

    @property
    def to_remove(self) -> int:
        return sum(s.to_remove for s in self.sources) + self.other_chunks

    @property
    def net(self) -> int:
        return self.to_add - self.to_remove

    @property
    def next_build_changes_nothing(self) -> bool:
        return self.to_add == 0 and self.to_remove == 0


_BUILD_COLUMNS = (MemoryBuild.id, MemoryBuild.mode, MemoryBuild.trigger, MemoryBuild.status,
                  MemoryBuild.added, MemoryBuild.removed, MemoryBuild.kept,
                  MemoryBuild.embedded, MemoryBuild.created_at, MemoryBuild.started_at,
                  MemoryBuild.finished_at, MemoryBuild.error)


def _utc(moment: datetime | None) -> datetime | None:
    return moment.astimezone(UTC) if moment is not None else None


def _summary(row: Any) -> BuildSummary:
    return BuildSummary(
        id=row.id, mode=row.mode, trigger=row.trigger, status=row.status, added=row.added,
        removed=row.removed, kept=row.kept, embedded=row.embedded,
        created_at=_utc(row.created_at), started_at=_utc(row.started_at),
        finished_at=_utc(row.finished_at), error=row.error if row.status == "failed" else None,
    )


def _latest(user_id: int, statuses: tuple[str, ...], slot: str) -> Any:
    # Newest first along ix_memory_builds_user_id_created_at: the scan stops at the first
    # match, so a long build history costs nothing more.
    return (select(literal(slot).label("slot"), *_BUILD_COLUMNS)
            .where(MemoryBuild.user_id == user_id, MemoryBuild.status.in_(statuses))
            .order_by(MemoryBuild.created_at.desc(), MemoryBuild.id.desc())
            .limit(1))


def _builds(session: Session, user_id: int) -> dict[str, BuildSummary]:
    """slot -> build: "queued", "running" (at most one each, by the two partial unique
    indexes), "finished" (the latest succeeded or failed) and "succeeded". One statement."""
    current = (select(MemoryBuild.status.label("slot"), *_BUILD_COLUMNS)
               .where(MemoryBuild.user_id == user_id,
                      MemoryBuild.status.in_(("queued", "running"))))
    statement = union_all(
        current,
        _latest(user_id, ("succeeded", "failed"), "finished"),
        _latest(user_id, ("succeeded",), "succeeded"),
    )
    return {row.slot: _summary(row) for row in session.execute(statement).all()}


AGEING_DAYS = 7


def _ageing(session: Session, user_id: int, cutoffs: dict[str, datetime]) -> dict[str, int]:
    """Per source with a retention window: the remembered records (not chunks) whose time
    falls out of it within ``AGEING_DAYS``. One grouped read, and none without a window."""
    if not cutoffs:
        return {}
    soon = timedelta(days=AGEING_DAYS)
    rows = session.execute(
        select(MemoryChunk.source_key, func.count(MemoryChunk.source_id.distinct()))
        .where(MemoryChunk.user_id == user_id,
               or_(*(and_(MemoryChunk.source_key == key, MemoryChunk.record_at >= at,
                          MemoryChunk.record_at < at + soon) for key, at in cutoffs.items())))
        .group_by(MemoryChunk.source_key))
    return {key: int(count) for key, count in rows}


def memory_status(session: Session, user: Any, *, resolution: Resolution,
                  embedder_name: str) -> MemoryStatus:
    """Everything the Memory Status page shows for ``user``, whose plan ``resolution``
    resolved (a signed-in user: a guest has no page)."""
    if resolution.plan is None:
        raise ValueError("a guest has no Memory Status page")
    builds = _builds(session, user.id)
    count_marked = get_source(CHAT_HISTORY).not_remembered
    not_remembered = count_marked(session, user.id) if count_marked else 0
    preview = preview_memory_build(user, session=session, embedder_name=embedder_name,
                                   resolution=resolution)
    # What is stored now is what the next build removes or keeps.
    chunk_counts = {key: p.to_remove + p.unchanged for key, p in preview.items()}
    ageing = _ageing(session, user.id, resolution.cutoffs(datetime.now(UTC)))

    sources = []
    for source in resolution.sources:
        dry_run = preview.get(source.key)
        sources.append(SourceStatus(
            rank=source.rank, key=source.key, label=source.label, state=source.state,
            sentence=state_sentence(source, resolution),
            chunks=chunk_counts.get(source.key, 0),
            to_add=dry_run.to_add if dry_run else 0,
            to_remove=dry_run.to_remove if dry_run else 0,
            unchanged=dry_run.unchanged if dry_run else 0,
            keep_days=source.keep_days if source.remembered else None,
            ages_out_soon=ageing.get(source.key, 0),
        ))

    last_build = builds.get("finished")
    last_success = builds.get("succeeded")
    if last_build is not None and last_success is not None and last_success.id == last_build.id:
        last_success = None
    return MemoryStatus(
        plan_name=resolution.plan.name,
        cap=resolution.plan.included_sources,
        sources=tuple(sources),
        other_chunks=sum(n for key, n in chunk_counts.items() if key not in source_keys()),
        last_build=last_build,
        last_success=last_success,
        queued=builds.get("queued"),
        running=builds.get("running"),
        not_remembered_messages=not_remembered,
        ageing_days=AGEING_DAYS,
    )
