"""Every change that alters what a user's next build holds requests that build, in the
same transaction: content, flags and deletions (the registry's watches), a user's
plan, and a plan's cap or assignments (fanned out to the plan's users by a job).

This is one ORM listener rather than a call in every service, so no write path can
forget it. Bulk ``UPDATE``/``DELETE`` statements bypass ORM events: code that changes a
watched column in bulk must call ``request_builds`` itself.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from sqlalchemy import event
from sqlalchemy import inspect as sa_inspect
from sqlalchemy.orm import Session, UOWTransaction

from dashboard.auth.models import User
from dashboard.memory.requests import request_builds, request_plan_fanout
from dashboard.plans.models import Plan, SourceAssignment
from dashboard.sources import Source, Watch, registered_sources

_watched: tuple[tuple[Source, ...], dict[type, list[Watch]]] = ((), {})


def _watches() -> dict[type, list[Watch]]:
    """The installed sources' watches by model (read on the first flush, not at import:
    the sources are installed after the engine is imported)."""
    global _watched
    installed = registered_sources()
    if _watched[0] is not installed:
        by_model: dict[type, list[Watch]] = defaultdict(list)
        for source in installed:
            for watch in source.watches:
                by_model[watch.model].append(watch)
        _watched = (installed, dict(by_model))
    return _watched[1]


def _changed(obj: object, fields: Iterable[str]) -> bool:
    attrs = sa_inspect(obj).attrs
    return any(attrs[name].history.has_changes() for name in fields)


def _owners(obj: object, watch: Watch) -> set[int]:
    """The owner now and, if the row moved between owners, the owner before."""
    history = sa_inspect(obj).attrs[watch.owner].history
    owners = {*history.added, *history.deleted, getattr(obj, watch.owner)}
    return {owner for owner in owners if owner is not None}


def changed_owners(session: Session) -> tuple[set[int], set[int], set[int]]:
    """What this flush changed: (users whose content changed, users whose plan changed,
    plans whose cap or assignments changed)."""
    content: set[int] = set()
    plan_moves: set[int] = set()
    plans: set[int] = set()
    watches = _watches()
    for objects, counts in ((session.new, "on_insert"), (session.deleted, "on_delete")):
        for obj in objects:
            for watch in watches.get(type(obj), ()):
                if getattr(watch, counts):
                    content |= _owners(obj, watch)
            if isinstance(obj, SourceAssignment):
                plans.add(obj.plan_id)
    for obj in session.dirty:
        for watch in watches.get(type(obj), ()):
            if _changed(obj, {*watch.fields, watch.owner}):
                content |= _owners(obj, watch)
        if isinstance(obj, User) and _changed(obj, ("plan_id",)):
            plan_moves.add(obj.id)
        elif isinstance(obj, Plan) and _changed(obj, ("included_sources",)):
            plans.add(obj.id)
        elif isinstance(obj, SourceAssignment) and _changed(obj, ("enabled", "source_key",
                                                                  "plan_id")):
            plans |= {p for p in sa_inspect(obj).attrs["plan_id"].history.sum() if p}
    return content, plan_moves, plans


@event.listens_for(Session, "after_flush")
def _request_builds_for_changes(session: Session, flush_context: UOWTransaction) -> None:
    content, plan_moves, plans = changed_owners(session)
    gone = {obj.id for obj in session.deleted if isinstance(obj, User)}
    if content - gone:
        request_builds(session, content - gone, trigger="content_change")
    if plan_moves - gone:
        request_builds(session, plan_moves - gone, trigger="plan_change")
    for plan_id in sorted(plans):
        request_plan_fanout(session, plan_id)
