"""Whose memory a caller may reach, and what each team role may do there: the one
permission table for teams. A neutral module: the teams domain works out a caller's
``Reach`` (``install_resolver``, from ``dashboard.catalog``), and the memories, connectors
and chat domains ask for it with ``reach_of`` without importing teams (which builds on
them)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any

from sqlalchemy import DateTime, Integer, String, column, literal, select, table, tuple_, update


class Action(StrEnum):
    READ = "read"
    WRITE = "write"
    SHARE = "share"
    EDIT = "edit"              # change a memory's text or labels
    FORGET = "forget"          # soft delete and restore
    REDACT = "redact"
    HARD_DELETE = "hard_delete"
    INVITE = "invite"
    REMOVE = "remove"
    CHANGE_ROLE = "change_role"
    CHANGE_POLICY = "change_policy"
    EXPORT = "export"
    AUDIT = "audit"


ADMINS = frozenset({"owner", "admin"})
WRITERS = frozenset({"owner", "admin", "member"})
_MANAGE = {Action.INVITE, Action.REMOVE, Action.CHANGE_ROLE, Action.CHANGE_POLICY,
           Action.EXPORT, Action.AUDIT, Action.HARD_DELETE}
# What a forget mode asks of the team.
ACTION_FOR_MODE = {"soft_delete": Action.FORGET, "restore": Action.FORGET,
                   "redact": Action.REDACT, "hard_delete": Action.HARD_DELETE}


@dataclass(frozen=True)
class TeamSeat:
    """A caller's place in one team: the team (its account id is the owner of its
    memory), the caller's role and the team's policies that decide what the role may do."""

    team_id: int
    slug: str
    name: str
    role: str
    write_policy: str = "members"
    forget_policy: str = "author_or_admins"


def may(seat: TeamSeat, action: Action | str, *, author: bool = False) -> bool:
    """Whether ``seat``'s role may do ``action`` in its team; ``author``: the memory acted
    on was saved by the caller. Readers only read."""
    action = Action(action)
    role = seat.role
    if action is Action.READ:
        return True
    if action in (Action.WRITE, Action.SHARE):
        return role in (ADMINS if seat.write_policy == "admins" else WRITERS)
    if action is Action.EDIT:
        return role in ADMINS or (author and may(seat, Action.WRITE))
    if action in (Action.FORGET, Action.REDACT):
        if role in ADMINS:
            return True
        return seat.forget_policy == "author_or_admins" and role == "member" and author
    if action in _MANAGE:
        return role in ADMINS
    raise ValueError(action)


@dataclass(frozen=True)
class Reach:
    """The memory owners a caller may read: the person's own (``user_id``) and each team
    seat the caller holds *through this credential* (a key or an app that names the team,
    an app the team allows). Everything else is out of reach: the same "not found" as
    something that does not exist."""

    user_id: int
    seats: dict[int, TeamSeat] = field(default_factory=dict)  # team id → seat

    @property
    def owner_ids(self) -> list[int]:
        return [self.user_id, *sorted(self.seats)]

    def seat_of(self, owner_id: int) -> TeamSeat | None:
        return self.seats.get(owner_id)

    def reaches(self, owner_id: int) -> bool:
        return owner_id == self.user_id or owner_id in self.seats

    def by_slug(self, slug: str) -> TeamSeat | None:
        return next((seat for seat in self.seats.values() if seat.slug == slug), None)

    @classmethod
    def personal(cls, user_id: int) -> Reach:
        return cls(user_id)


@dataclass(frozen=True)
class Credential:
    """What a call was made with, as far as teams are concerned: the teams it names
    (``None``: a person on their own pages, every team they are in), the registered app
    it is (for a team's app policy), and for a key, when it was made and when it ends
    (for a team's longest key lifetime)."""

    team_ids: tuple[int, ...] | None = None
    client_pk: int | None = None
    key_created_at: datetime | None = None
    key_expires_at: datetime | None = None


Resolver = Callable[[Any, int, Credential], Reach]
_resolver: Resolver | None = None


def install_resolver(resolver: Resolver) -> None:
    global _resolver
    _resolver = resolver


def reach_of(session: Any, user_id: int, credential: Credential | None = None) -> Reach:
    """What ``user_id`` reaches through ``credential`` (their own pages when None)."""
    if _resolver is None:
        raise RuntimeError("no reach resolver is installed: import dashboard.catalog first")
    return _resolver(session, user_id, credential or Credential())


# Team memberships, read here so that domains below teams can tell a current member
# from "a former member" without importing teams (which builds on them).
_MEMBERS = table("team_members", column("team_id", Integer), column("user_id", Integer),
                 column("last_active_at", DateTime(timezone=True)))
# A member's last activity in a team is stamped at most this often (a write per minute).
ACTIVITY_RESOLUTION = timedelta(minutes=1)


def note_activity(session: Any, team_id: int, user_id: int, *, now: datetime | None = None
                  ) -> None:
    """Stamp ``user_id``'s last activity in the team: on its pages, and when they save or
    change its memory through the API, MCP or the chat."""
    now = now or datetime.now(UTC)
    session.execute(update(_MEMBERS).where(
        _MEMBERS.c.team_id == team_id, _MEMBERS.c.user_id == user_id,
        _MEMBERS.c.last_active_at.is_(None)
        | (_MEMBERS.c.last_active_at < now - ACTIVITY_RESOLUTION))
        .values(last_active_at=now))


def members_among(session: Any, pairs: set[tuple[int, int]]) -> set[tuple[int, int]]:
    """Which of the (team, person) pairs are memberships now: one query."""
    if not pairs:
        return set()
    return {tuple(row) for row in session.execute(  # type: ignore[misc]
        select(_MEMBERS.c.team_id, _MEMBERS.c.user_id).where(
            tuple_(_MEMBERS.c.team_id, _MEMBERS.c.user_id).in_(list(pairs))))}


# What a key or an app chosen for a team must satisfy, read here for the same reason: the
# team's name, its longest key lifetime, its app policy and whether it lists an app.
_TEAMS = table("teams", column("id", Integer), column("slug", String), column("name", String),
               column("max_key_days", Integer), column("app_policy", String))
_TEAM_APPS = table("team_apps", column("team_id", Integer), column("client_pk", Integer))


@dataclass(frozen=True)
class TeamTerms:
    """A team's terms for a credential: a key's longest life (``max_key_days``, None: no
    limit), and whether an app must be on the team's list (``app_listed``: it is)."""

    team_id: int
    slug: str
    name: str
    max_key_days: int | None
    app_policy: str
    app_listed: bool

    @property
    def app_needs_approval(self) -> bool:
        return self.app_policy != "any" and not self.app_listed


def team_terms(session: Any, team_ids: Iterable[int], *, client_pk: int | None = None
               ) -> dict[int, TeamTerms]:
    """The terms of the teams ``team_ids`` (those that exist), in one query; for an app
    (``client_pk``), whether each team lists it."""
    ids = sorted({int(i) for i in team_ids})
    if not ids:
        return {}
    listed = select(_TEAM_APPS.c.team_id).where(
        _TEAM_APPS.c.team_id == _TEAMS.c.id, _TEAM_APPS.c.client_pk == client_pk
    ).exists() if client_pk is not None else literal(False)
    return {row.id: TeamTerms(row.id, row.slug, row.name, row.max_key_days, row.app_policy,
                              bool(row.listed))
            for row in session.execute(
                select(_TEAMS.c.id, _TEAMS.c.slug, _TEAMS.c.name, _TEAMS.c.max_key_days,
                       _TEAMS.c.app_policy, listed.label("listed"))
                .where(_TEAMS.c.id.in_(ids)))}
