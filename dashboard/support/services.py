"""The support explorer's reads: why a user's source is or is not remembered, a team's
trace (its account's, with its members by role and its policies), and what each plan's
cap evicts. Read-only and content-free by construction (ids, emails, states, counts,
times, a team's name and slug — never a content column), in a fixed number of queries
whatever the user's history, the team's size or the number of plans."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session

from dashboard.auth.models import User
from dashboard.holds import active_hold
from dashboard.ids import INT4_MAX, parse_id
from dashboard.memory import BuildSummary, MemoryBuild, MemoryChunk
from dashboard.plans.impact import plan_rows
from dashboard.plans.sentences import state_sentence
from dashboard.plans.services import (
    SourceState,
    get_plan_for_user,
    resolve_sources,
)
from dashboard.saved_memories.models import Memory
from dashboard.sources import CHAT_HISTORY, get_source, registered_sources
from dashboard.teams.models import ROLES as TEAM_ROLES
from dashboard.teams.models import Team, TeamApp, TeamInvitation, TeamMember

MAX_EMAIL_LENGTH = 254
HISTORY_LIMIT = 20

# The state column for a source the last build's snapshot does not mention (the source
# was added to the registry after that build).
NOT_RECORDED = "not_recorded"


# -- the trace of one user --------------------------------------------------------------

@dataclass(frozen=True)
class SourceRef:
    key: str
    label: str
    rank: int


@dataclass(frozen=True)
class SourceTrace:
    rank: int
    key: str
    label: str
    default_visible: bool
    # "on" / "off": the plan's assignment row decided; "default": no row, the registry's
    # default_visible did.
    assignment: str
    state: str  # a SourceState value, now
    # For evicted_by_cap: the higher-ranked included sources that filled the cap.
    filled_by: tuple[SourceRef, ...]
    sentence: str  # the status sentence, word for word what the user sees
    # The state in the last succeeded build's snapshot; None when there was no such build.
    state_then: str | None
    chunks: int

    @property
    def changed(self) -> bool:
        return self.state_then is not None and self.state_then != self.state


@dataclass(frozen=True)
class LastBuild:
    """The last succeeded build and what its resolution snapshot recorded."""

    build: BuildSummary
    plan_id: int | None
    plan_slug: str | None
    cap: int | None


@dataclass(frozen=True)
class UserTrace:
    user_id: int
    email: str
    role: str
    active: bool
    plan_id: int | None
    plan_name: str
    plan_slug: str
    plan_is_default: bool
    # "own": the user's plan_id names this plan; "default": plan_id is NULL (or names a
    # plan that is gone), so the user is on the default plan.
    plan_origin: str
    cap: int
    sources: tuple[SourceTrace, ...]
    # Chunks stored under keys the registry no longer has (a removed source).
    other_chunks: tuple[tuple[str, int], ...]
    total_chunks: int
    last_build: LastBuild | None
    pending: BuildSummary | None  # the queued request, if any
    running: BuildSummary | None
    history: tuple[BuildSummary, ...]  # the latest HISTORY_LIMIT builds, newest first
    # The user's messages marked "Not remembered" (a count: never which, never their text),
    # and whether chat history is remembered at all on the plan now.
    not_remembered: int = 0
    chat_included: bool = False
    # A legal hold on the user now: (placed at, ends at or None); never its reason here.
    legal_hold: tuple[datetime, datetime | None] | None = None
    # "person", or "team": a team's account (its trace is the team's, ``team_trace``).
    kind: str = "person"
    # A person's teams: (team id, slug, name, role), by name.
    teams: tuple[tuple[int, str, str, str], ...] = ()


# The start of an email or of its domain: at least this many characters, and at most
# this many users listed.
MIN_PART = 3
MAX_MATCHES = 20
MATCH_SCAN_LIMIT = 1000  # matches read before ordering (past it, "more" is said anyway)


@dataclass(frozen=True)
class UserMatch:
    id: int
    email: str
    role: str


def _like_prefix(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


def match_query(query: str, *, limit: int) -> Any:
    """The SELECT of users whose email, or its domain, starts with ``query`` ("@part": the
    domain only), or None when it is too short or too long to be part of an email."""
    text = query.strip().lower()
    domain_only = text.startswith("@")
    text = text.lstrip("@")
    if len(text) < MIN_PART or len(text) > MAX_EMAIL_LENGTH:
        return None
    prefix = _like_prefix(text)
    domain = func.split_part(User.email, "@", 2).like(prefix, escape="\\")
    condition = domain if domain_only else or_(User.email.like(prefix, escape="\\"), domain)
    # The matches first, then their order: asked for both at once, the planner may walk
    # the whole email index in order, filtering, to stop at the limit.
    # A team's account is found as the team (``find_teams``), by its name or slug.
    matches = (select(User.id, User.email, User.role).where(condition, User.kind == "person")
               .limit(MATCH_SCAN_LIMIT).cte("matches").prefix_with("MATERIALIZED"))
    return select(matches).order_by(matches.c.email).limit(limit)


def find_users(session: Session, query: str, *,
               limit: int = MAX_MATCHES) -> tuple[list[UserMatch], bool]:
    """The users ``query`` names, in one query: a user id; else every user whose email, or
    its domain, starts with it (any case; from ``MIN_PART`` characters; "@example" means
    the domain), in email order, through the two prefix indexes — just the one if it is
    a whole email; and whether more matched than are listed."""
    text = query.strip()
    user_id = parse_id(text)  # digits past users.id's integer: no user
    if user_id is not None:
        rows = session.execute(select(User.id, User.email, User.role)
                               .where(User.id == user_id, User.kind == "person")).all()
        return [UserMatch(*row) for row in rows], False
    statement = match_query(text, limit=limit + 1)
    if statement is None:
        return [], False
    matches = [UserMatch(*row) for row in session.execute(statement)]
    # Emails are stored lower-cased (auth.models): a whole one names its user alone.
    whole = [match for match in matches if match.email == text.lower()]
    if whole:
        return whole, False
    return matches[:limit], len(matches) > limit


def _build_row(build: MemoryBuild) -> BuildSummary:
    # As stored: the database session's time zone, and any status's error.
    return BuildSummary(
        id=build.id, mode=build.mode, trigger=build.trigger, status=build.status,
        added=build.added, removed=build.removed, kept=build.kept, embedded=build.embedded,
        created_at=build.created_at, started_at=build.started_at,
        finished_at=build.finished_at, error=build.error,
    )


def _snapshot_states(resolution: Any) -> dict[str, str]:
    """source key -> state, from a build's ``Resolution.to_dict()`` snapshot. Tolerant:
    an old or damaged snapshot yields what it can, never an error on a staff page."""
    if not isinstance(resolution, dict) or not isinstance(resolution.get("sources"), list):
        return {}
    states: dict[str, str] = {}
    for entry in resolution["sources"]:
        if isinstance(entry, dict) and isinstance(entry.get("key"), str) \
                and isinstance(entry.get("state"), str):
            states[entry["key"]] = entry["state"]
    return states


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _refs(keys: tuple[str, ...]) -> tuple[SourceRef, ...]:
    refs = []
    for key in keys:
        source = get_source(key)
        refs.append(SourceRef(key, source.label, registered_sources().index(source) + 1))
    return tuple(refs)


def _builds(session: Session, user_id: int) -> tuple[list[MemoryBuild], MemoryBuild | None,
                                                       list[MemoryBuild]]:
    """History, last succeeded build, and the queued/running ones: three queries, each
    bounded, so the cost does not grow with the number of builds."""
    history = session.scalars(
        select(MemoryBuild).where(MemoryBuild.user_id == user_id)
        .order_by(MemoryBuild.created_at.desc(), MemoryBuild.id.desc())
        .limit(HISTORY_LIMIT)
    ).all()
    # Looked up on its own: the last success can be older than the history shown.
    last_succeeded = session.scalars(
        select(MemoryBuild)
        .where(MemoryBuild.user_id == user_id, MemoryBuild.status == "succeeded")
        .order_by(MemoryBuild.finished_at.desc().nulls_last(), MemoryBuild.id.desc())
        .limit(1)
    ).first()
    # At most one of each (two partial unique indexes). Read directly rather than picked
    # out of the history window, so the answer never depends on how the window is cut.
    current = session.scalars(
        select(MemoryBuild)
        .where(MemoryBuild.user_id == user_id, MemoryBuild.status.in_(("queued", "running")))
    ).all()
    return list(history), last_succeeded, list(current)


def user_trace(session: Session, user_id: int) -> UserTrace | None:
    """The full resolution trace of one user, or None when there is no such user."""
    if not 0 < user_id <= INT4_MAX:
        return None
    # A fresh read (populate_existing): a long-lived session must not show a plan the
    # user has since left.
    user = session.scalars(
        select(User).where(User.id == user_id).execution_options(populate_existing=True)
    ).first()
    if user is None:
        return None

    # Read fresh: a staff page shows the plan the user is on now.
    plan = get_plan_for_user(user, session)
    if plan is None:  # None means a guest; a User row never is one, but never 500
        return None
    resolution = resolve_sources(plan)

    chunk_counts = dict(session.execute(
        select(MemoryChunk.source_key, func.count())
        .where(MemoryChunk.user_id == user.id)
        .group_by(MemoryChunk.source_key)
    ).all())

    history, last_succeeded, current = _builds(session, user.id)
    then = _snapshot_states(last_succeeded.resolution) if last_succeeded else None

    sources = []
    for source_now in resolution.sources:
        registry = get_source(source_now.key)
        row = plan.assignments.get(source_now.key)
        sources.append(SourceTrace(
            rank=source_now.rank, key=source_now.key, label=source_now.label,
            default_visible=registry.default_visible,
            assignment="default" if row is None else ("on" if row else "off"),
            state=source_now.state.value,
            filled_by=_refs(source_now.filled_by),
            sentence=state_sentence(source_now, resolution),
            state_then=None if then is None else then.get(source_now.key, NOT_RECORDED),
            chunks=chunk_counts.get(source_now.key, 0),
        ))

    known = {s.key for s in registered_sources()}
    last_build = None
    if last_succeeded is not None:
        snapshot = last_succeeded.resolution if isinstance(last_succeeded.resolution,
                                                            dict) else {}
        slug = snapshot.get("plan_slug")
        last_build = LastBuild(
            build=_build_row(last_succeeded),
            plan_id=_int_or_none(snapshot.get("plan_id")),
            plan_slug=slug if isinstance(slug, str) else None,
            cap=_int_or_none(snapshot.get("cap")),
        )
    by_status = {b.status: b for b in current}
    count_marked = get_source(CHAT_HISTORY).not_remembered
    return UserTrace(
        user_id=user.id, email=user.email, role=user.role, active=user.active,
        plan_id=plan.id, plan_name=plan.name, plan_slug=plan.slug,
        plan_is_default=plan.is_default,
        plan_origin="own" if user.plan_id is not None and user.plan_id == plan.id
        else "default",
        cap=plan.included_sources,
        sources=tuple(sources),
        other_chunks=tuple(sorted((k, n) for k, n in chunk_counts.items() if k not in known)),
        total_chunks=sum(chunk_counts.values()),
        last_build=last_build,
        pending=_build_row(by_status["queued"]) if "queued" in by_status else None,
        running=_build_row(by_status["running"]) if "running" in by_status else None,
        history=tuple(_build_row(b) for b in history),
        not_remembered=count_marked(session, user.id) if count_marked else 0,
        chat_included=any(s.key == CHAT_HISTORY and s.state == SourceState.INCLUDED.value
                          for s in sources),
        legal_hold=(hold.placed_at, hold.ends_at) if (hold := active_hold(session, user.id))
        else None,
        kind=user.kind,
        teams=tuple((row.id, row.slug, row.name, row.role) for row in session.execute(
            select(Team.id, Team.slug, Team.name, TeamMember.role)
            .join(TeamMember, TeamMember.team_id == Team.id)
            .where(TeamMember.user_id == user.id).order_by(Team.name, Team.id)))
        if user.kind == "person" else (),
    )


# -- a team's trace -------------------------------------------------------------------------

@dataclass(frozen=True)
class TeamMatch:
    id: int
    slug: str
    name: str
    members: int


def find_teams(session: Session, query: str, *, limit: int = MAX_MATCHES
               ) -> tuple[list[TeamMatch], bool]:
    """The teams ``query`` names, in one query: a team (account) id; else every team whose
    slug starts with it, whose name holds it (any case), or that has a member whose email
    (or its domain) starts with it — from ``MIN_PART`` characters; by name; and whether
    more matched than are listed."""
    text = query.strip()
    members = (select(func.count()).select_from(TeamMember)
               .where(TeamMember.team_id == Team.id).scalar_subquery())
    team_id = parse_id(text)
    if team_id is not None:
        rows = session.execute(select(Team.id, Team.slug, Team.name, members)
                               .where(Team.id == team_id)).all()
        return [TeamMatch(*row) for row in rows], False
    people = match_query(text, limit=MATCH_SCAN_LIMIT)
    if people is None:
        return [], False
    lowered = text.lower().lstrip("@")
    by_member = select(TeamMember.team_id).where(
        TeamMember.user_id.in_(select(people.subquery().c.id)))
    named = or_(Team.slug.like(_like_prefix(lowered), escape="\\"),
                func.lower(Team.name).like("%" + _like_prefix(lowered), escape="\\"))
    rows = session.execute(
        select(Team.id, Team.slug, Team.name, members)
        .where(or_(named, Team.id.in_(by_member)))
        .order_by(Team.name, Team.id).limit(limit + 1)).all()
    matches = [TeamMatch(*row) for row in rows]
    return matches[:limit], len(matches) > limit


@dataclass(frozen=True)
class MemberRow:
    user_id: int
    email: str
    role: str
    joined_at: datetime
    last_active_at: datetime | None


@dataclass(frozen=True)
class TeamTrace:
    """A team as support reads it: the team, its members by role, its policies and apps,
    its invitations and memories as counts, and its account's full trace (plan, sources
    and their states, builds, holds). Never a memory's content, never a key's name."""

    id: int
    slug: str
    name: str
    created_at: datetime
    created_by_id: int | None
    members: tuple[tuple[str, tuple[MemberRow, ...]], ...]  # (role, its members), by rank
    policies: tuple[tuple[str, object], ...]
    allowed_apps: int
    pending_invitations: int
    memories: tuple[tuple[str, int], ...]  # (status, count)
    account: UserTrace


def team_trace(session: Session, team_id: int) -> TeamTrace | None:
    """The trace of the team ``team_id`` names (its account's id), or None."""
    if not 0 < team_id <= INT4_MAX:
        return None
    team = session.scalars(select(Team).where(Team.id == team_id)
                           .execution_options(populate_existing=True)).first()
    account = user_trace(session, team_id) if team is not None else None
    if team is None or account is None:
        return None
    rows = session.execute(
        select(TeamMember.user_id, User.email, TeamMember.role, TeamMember.joined_at,
               TeamMember.last_active_at)
        .join(User, User.id == TeamMember.user_id).where(TeamMember.team_id == team.id)
        .order_by(TeamMember.joined_at, TeamMember.user_id)).all()
    by_role = {role: tuple(MemberRow(*row) for row in rows if row.role == role)
               for role in TEAM_ROLES}
    counts = session.execute(select(
        select(func.count()).select_from(TeamApp).where(TeamApp.team_id == team.id)
        .scalar_subquery(),
        select(func.count()).select_from(TeamInvitation).where(
            TeamInvitation.team_id == team.id, TeamInvitation.accepted_at.is_(None),
            TeamInvitation.revoked_at.is_(None),
            TeamInvitation.expires_at > func.now()).scalar_subquery())).one()
    statuses = session.execute(select(Memory.status, func.count())
                               .where(Memory.owner_id == team.id)
                               .group_by(Memory.status).order_by(Memory.status)).all()
    return TeamTrace(
        id=team.id, slug=team.slug, name=team.name, created_at=team.created_at,
        created_by_id=team.created_by_id,
        members=tuple((role, by_role[role]) for role in TEAM_ROLES),
        policies=tuple((name, getattr(team, name)) for name in (
            "write_policy", "forget_policy", "app_policy", "max_key_days", "leaver_policy")),
        allowed_apps=counts[0], pending_invitations=counts[1],
        memories=tuple((status, count) for status, count in statuses), account=account)


# -- the plan report --------------------------------------------------------------------

@dataclass(frozen=True)
class Eviction:
    source: SourceRef
    filled_by: tuple[SourceRef, ...]
    # Every user of a plan resolves alike (resolution depends on the plan alone), so an
    # eviction touches all of the plan's active users.
    users_touched: int


@dataclass(frozen=True)
class PlanReportRow:
    id: int
    name: str
    slug: str
    is_default: bool
    active: bool
    cap: int
    users: int  # active users on the plan (plan_id NULL counts for the default plan)
    included: tuple[SourceRef, ...]
    evicted: tuple[Eviction, ...]


def plan_report(session: Session) -> tuple[PlanReportRow, ...]:
    """Every plan, the default first then by name: cap, users, included sources and the
    assigned sources its cap evicts. Three queries whatever the number of plans."""
    rows = []
    for row in plan_rows(session):
        plan, resolution, count = row.plan, row.resolution, row.users
        rows.append(PlanReportRow(
            id=plan.id, name=plan.name, slug=plan.slug, is_default=plan.is_default,
            active=plan.active, cap=plan.included_sources, users=count,
            included=tuple(SourceRef(s.key, s.label, s.rank) for s in resolution.sources
                           if s.state is SourceState.INCLUDED),
            evicted=tuple(
                Eviction(SourceRef(s.key, s.label, s.rank), _refs(s.filled_by), count)
                for s in resolution.sources if s.state is SourceState.EVICTED_BY_CAP
            ),
        ))
    return tuple(rows)
