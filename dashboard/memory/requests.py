"""Build requests: a ``memory_builds`` row first (PostgreSQL is the truth, fifty requests
merge into one queued build), the RQ job pushed only after the outermost commit of the
transaction that asked (``queue.queue_for``); a rollback drops only what it asked for.
docs/architecture/builds.md has the reasoning."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import case, event, func, literal, or_, select, text, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.orm import Session, SessionTransaction, scoped_session

from dashboard.audit.services import Actor, record_event
from dashboard.auth.models import User
from dashboard.memory.models import BUILD_MODES, BUILD_TRIGGERS, MemoryBuild
from dashboard.memory.queue import fanout_job_id, queue_for
from dashboard.plans.models import Plan
from dashboard.plans.services import users_of_plan
from dashboard.refusals import Refusal, TooSoon

log = logging.getLogger(__name__)

_PENDING = "orbitpilot.pending_jobs"
_REQUESTED = "orbitpilot.requested_builds"


class BuildRequestError(Refusal):
    """A build request refused for a reason the person asking should read."""


class RateLimited(TooSoon):
    # Says only what is known: the user asked. Their earlier request may still be
    # waiting for a worker, so "your memory was updated" would be false.
    def __init__(self, retry_after: int) -> None:
        super().__init__(
            f"You asked for an update a moment ago; you can ask again in {retry_after} s.",
            retry_after)


@dataclass(frozen=True)
class BuildRequest:
    build_id: int
    merged: bool  # True: joined a build already queued for this user
    user_id: int


# -- requesting ---------------------------------------------------------------------------

def _merge_mode(excluded_mode: Any) -> Any:
    # Full wins over quick: a full rebuild does everything a quick update would.
    return case(
        (or_(MemoryBuild.mode == "full", excluded_mode == "full"), "full"), else_="quick"
    )


def _check(mode: str, trigger: str) -> None:
    if mode not in BUILD_MODES:
        raise BuildRequestError(f"mode must be one of {', '.join(BUILD_MODES)}")
    if trigger not in BUILD_TRIGGERS:
        raise BuildRequestError(f"trigger must be one of {', '.join(BUILD_TRIGGERS)}")


def request_builds(
    session: Session,
    user_ids: Iterable[int],
    *,
    mode: str = "quick",
    trigger: str = "user",
    requested_by_id: int | None = None,
) -> list[BuildRequest]:
    """Record build requests for several users in one statement; each user's job is
    pushed once the caller commits. A user with a build already queued merges into it."""
    _check(mode, trigger)
    ids = sorted(set(user_ids))
    if not ids:
        return []
    stmt = pg_insert(MemoryBuild).values([
        {"user_id": user_id, "mode": mode, "trigger": trigger, "status": "queued",
         "requested_by_id": requested_by_id}
        for user_id in ids
    ])
    stmt = stmt.on_conflict_do_update(
        index_elements=[MemoryBuild.user_id],
        index_where=text("status = 'queued'"),
        set_={"mode": _merge_mode(stmt.excluded.mode)},
    ).returning(MemoryBuild.id, text("(xmax = 0) AS inserted"), MemoryBuild.user_id)
    requests = []
    rows = session.execute(stmt).all()
    transaction = _transaction(_own(session))  # after the statement: it began one if needed
    book = _own(session).info.setdefault(_REQUESTED, [])
    for build_id, inserted, user_id in rows:
        if inserted:
            defer_job(session, ("build", build_id))
        request = BuildRequest(build_id, merged=not inserted, user_id=user_id)
        requests.append(request)
        if mode == "quick":
            book.append((transaction, request))
    return sorted(requests, key=lambda r: r.user_id)


def request_again(session: Session, build_ids: Iterable[int], *, max_attempts: int) -> int:
    """The requests of interrupted builds (their worker killed, Redis lost), queued again:
    the same user, mode, trigger, requester and time, with the attempts already spent,
    so a build that keeps killing its worker stops after ``max_attempts`` (its record
    then says so). A build already queued for the user takes it in (full wins). Pushed
    at the caller's commit; how many were asked again."""
    ids = sorted(set(build_ids))
    if not ids:
        return 0
    columns = ("user_id", "mode", "trigger", "requested_by_id", "attempts", "created_at")
    # Builds that were running: one per user at most (uq_memory_builds_one_running).
    interrupted = (
        select(*(getattr(MemoryBuild, c) for c in columns), literal("queued"))
        .where(MemoryBuild.id.in_(ids), MemoryBuild.attempts < max_attempts)
    )
    stmt = pg_insert(MemoryBuild).from_select([*columns, "status"], interrupted)
    stmt = stmt.on_conflict_do_update(
        index_elements=[MemoryBuild.user_id],
        index_where=text("status = 'queued'"),
        set_={"mode": _merge_mode(stmt.excluded.mode)},
    ).returning(MemoryBuild.id, text("(xmax = 0) AS inserted"))
    asked = session.execute(stmt).all()
    for build_id, inserted in asked:
        if inserted:
            defer_job(session, ("build", build_id))
    session.execute(
        update(MemoryBuild)
        .where(MemoryBuild.id.in_(ids), MemoryBuild.attempts >= max_attempts)
        .values(error=func.concat(MemoryBuild.error,
                                  f"; not asked again after {max_attempts} attempts"))
    )
    return len(asked)


def build_for_change(session: Session, user_id: int) -> BuildRequest:
    """The quick build a change of ``user_id``'s content asked for in this transaction
    (the change listener's request, made at the flush), or a new one when the listener
    saw no change it watches: one build request per write."""
    for _, request in reversed(_own(session).info.get(_REQUESTED, [])):
        if request.user_id == user_id:
            return request
    return request_build(session, user_id, trigger="content_change")


def request_builds_by_staff(session: Session, user_ids: Iterable[int], *, mode: str,
                            actor: Actor) -> list[BuildRequest]:
    """A staff member's build request for some users: one audit event per user."""
    requests = request_builds(session, user_ids, mode=mode, trigger="admin",
                              requested_by_id=actor.user_id)
    for request in requests:
        record_event(session, action="build.request", actor=actor, owner_id=request.user_id,
                     target_type="build", target_id=request.build_id, mode=mode,
                     details={"merged": request.merged})
    return requests


def request_plan_builds_by_staff(session: Session, plan_ids: Iterable[int], *, mode: str,
                                 actor: Actor) -> list[int]:
    """A staff member's rebuild of whole plans: a fan-out job and an audit event per
    plan (the job requests the users' builds, so the request never loops over them)."""
    found = session.scalars(select(Plan.id).where(Plan.id.in_(set(plan_ids)))
                            .order_by(Plan.id)).all()
    for plan_id in found:
        request_plan_fanout(session, plan_id, mode=mode, trigger="admin",
                            requested_by_id=actor.user_id)
        record_event(session, action="build.request_plan", actor=actor, target_type="plan",
                     target_id=plan_id, mode=mode)
    return list(found)


def request_build(
    session: Session,
    user_id: int,
    *,
    mode: str = "quick",
    trigger: str = "user",
    requested_by_id: int | None = None,
) -> BuildRequest:
    """Record a build request; the job is pushed once the caller commits."""
    (request,) = request_builds(session, [user_id], mode=mode, trigger=trigger,
                                requested_by_id=requested_by_id)
    return request


def request_user_update(
    session: Session, user: User, *, interval: int, mode: str = "quick",
    now: datetime | None = None,
) -> BuildRequest:
    """The user's own "update my memory now", at most once per ``interval`` seconds."""
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


def request_builds_for_plan(
    session: Session, plan: Plan, *, mode: str = "quick", trigger: str = "admin",
    requested_by_id: int | None = None, batch_size: int,
) -> Iterator[int]:
    """Fan out one request per active user of ``plan``, a batch at a time. Yields the
    number requested in each batch; the caller commits after each (so jobs start flowing
    before the whole plan is done, and no transaction holds thousands of rows)."""
    after = 0
    while True:
        ids = session.scalars(
            select(User.id).where(users_of_plan(plan.id, plan.is_default), User.active,
                                  User.id > after)
            .order_by(User.id).limit(batch_size)
        ).all()
        if not ids:
            return
        request_builds(session, ids, mode=mode, trigger=trigger,
                       requested_by_id=requested_by_id)
        after = ids[-1]
        yield len(ids)


@dataclass(frozen=True)
class Fanout:
    """A job that requests a build for every active user of a plan, a batch at a time.
    ``trigger="plan_change"``: the plan's cap or assignments changed (the sweeper pushes
    it again if it is lost); ``"admin"``: an admin asked to rebuild the whole plan."""

    plan_id: int
    mode: str = "quick"
    trigger: str = "plan_change"
    requested_by_id: int | None = None
    # An admin's rebuild is a job of its own; a change's fan-out has the one id the
    # sweeper looks for.
    token: str = field(default_factory=lambda: uuid.uuid4().hex[:12], compare=False)

    @property
    def job_id(self) -> str:
        if self.trigger == "plan_change":
            return fanout_job_id(self.plan_id)
        return f"{fanout_job_id(self.plan_id)}-{self.trigger}-{self.token}"


def request_plan_fanout(session: Session, plan_id: int, *, mode: str = "quick",
                        trigger: str = "plan_change",
                        requested_by_id: int | None = None) -> None:
    """Ask a worker to request builds for every user of a plan; pushed after commit, so
    an admin's request never loops over thousands of users."""
    _check(mode, trigger)
    defer_job(session, ("fanout", Fanout(plan_id, mode, trigger, requested_by_id)))


# -- pushing to RQ after commit -------------------------------------------------------------
# Each pending job remembers the (possibly nested) transaction that asked for it. A
# rollback drops what that transaction and the savepoints inside it asked for, nothing
# else; the outermost commit pushes what is left.

def _own(session: Session | scoped_session) -> Session:
    return session() if isinstance(session, scoped_session) else session


def _transaction(session: Session) -> SessionTransaction:
    """The innermost transaction, begun if none is yet: what a job or request made now
    belongs to (a rollback of it drops them)."""
    return session.get_nested_transaction() or session.get_transaction() or session.begin()


def defer_job(session: Session | scoped_session, job: tuple[str, Any]) -> None:
    """Push ``job`` to the bound queue once the session's outermost transaction commits
    (dropped if it rolls back)."""
    session = _own(session)
    session.info.setdefault(_PENDING, []).append((_transaction(session), job))


def _inside(transaction: SessionTransaction | None, ancestor: SessionTransaction) -> bool:
    while transaction is not None:
        if transaction is ancestor:
            return True
        transaction = transaction.parent
    return False


def _forget(session: Session, transaction: SessionTransaction) -> None:
    """Drop what ``transaction`` and the savepoints inside it asked for."""
    for key in (_PENDING, _REQUESTED):
        entries = session.info.get(key)
        if entries:
            entries[:] = [(t, item) for t, item in entries if not _inside(t, transaction)]


@event.listens_for(Session, "after_soft_rollback")
def _drop_rolled_back(session: Session, previous_transaction: SessionTransaction) -> None:
    _forget(session, previous_transaction)


@event.listens_for(Session, "after_commit")
def _push_after_commit(session: Session) -> None:
    # Fires for a released savepoint too: nothing is committed until the outermost
    # transaction is, and its own after_commit pushes everything then.
    if session.in_nested_transaction():
        return
    session.info.pop(_REQUESTED, None)  # a later transaction asks (and merges) anew
    pending = session.info.pop(_PENDING, None)
    if not pending:
        return
    queue = queue_for(session)
    if queue is None:  # no queue bound (a bare engine): the sweeper pushes builds later
        log.warning("%d job(s) not pushed: no build queue is bound to this database "
                    "engine (queued builds wait for the sweeper)", len(pending))
        return
    queue.push([job for _, job in pending])


@event.listens_for(Session, "after_transaction_end")
def _drop_when_the_transaction_ends(session: Session, transaction: SessionTransaction) -> None:
    # A session closed without commit or rollback: what it asked for goes with it.
    if transaction.parent is None:
        _forget(session, transaction)
