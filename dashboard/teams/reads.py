"""What the team pages read: each member with the keys and apps they use with the team,
every credential that may act for it, the apps awaiting approval, and the team's audit
events. Reads only (no flush, no event); a fixed number of queries per page."""

from __future__ import annotations

import re
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from dashboard.access import Credential
from dashboard.audit.models import AuditEvent
from dashboard.auth.models import User
from dashboard.connectors.models import OAuthClient, OAuthGrant
from dashboard.saved_memories.models import (
    FORGET_MODES,
    MEMORY_SOURCES,
    MEMORY_STATUSES,
    ApiKey,
    Memory,
)
from dashboard.teams.models import (
    APP_POLICIES,
    FORGET_POLICIES,
    LEAVER_POLICIES,
    ROLES,
    WRITE_POLICIES,
    Team,
    TeamApp,
    TeamMember,
)
from dashboard.teams.services import key_lifetime_allowed

ORBITPILOT = "OrbitPilot"


def key_label(key: ApiKey) -> str:
    return f"API key \u201c{key.name}\u201d ({key.prefix}\u2026)"


def app_label(client: OAuthClient) -> str:
    return f"app {client.client_id} (it calls itself \u201c{client.name}\u201d)"


def _now(now: datetime | None) -> datetime:
    return now or datetime.now(UTC)


# -- credentials -----------------------------------------------------------------------------

@dataclass(frozen=True)
class KeyUse:
    """A member's API key that names the team; ``blocked``: why it may not act for it
    now (None: it may)."""

    key: ApiKey
    owner: User
    blocked: str | None


@dataclass(frozen=True)
class AppUse:
    """A member's connection (grant) that names the team, and the app it is."""

    grant: OAuthGrant
    client: OAuthClient
    owner: User
    blocked: str | None


def _key_blocked(team: Team, key: ApiKey, now: datetime) -> str | None:
    if key.revoked_at is not None:
        return "revoked"
    if key.expires_at is not None and key.expires_at <= now:
        return "expired"
    if not key_lifetime_allowed(team, Credential(key_created_at=key.created_at,
                                                 key_expires_at=key.expires_at)):
        return (f"it lives longer than the team allows ({team.max_key_days} days"
                f"{'' if key.expires_at else '; it never expires'})")
    return None


def _app_blocked(team: Team, grant: OAuthGrant, allowed: set[int]) -> str | None:
    if grant.revoked_at is not None:
        return "disconnected"
    if team.app_policy != "any" and grant.client_pk not in allowed:
        return ("awaiting an admin's approval" if team.app_policy == "approve"
                else "not on the team's list of apps")
    return None


@dataclass(frozen=True)
class Credentials:
    keys: list[KeyUse]
    apps: list[AppUse]

    @property
    def acting_keys(self) -> list[KeyUse]:
        return [k for k in self.keys if k.blocked is None]

    @property
    def acting_apps(self) -> list[AppUse]:
        return [a for a in self.apps if a.blocked is None]


def credentials(session: Session, team: Team, *, now: datetime | None = None) -> Credentials:
    """Every live API key and connection of a current member that names the team, each
    with whether it may act for it now (its lifetime, the app policy): three queries."""
    now = _now(now)
    members = select(TeamMember.user_id).where(TeamMember.team_id == team.id)
    keys = [KeyUse(key, owner, _key_blocked(team, key, now)) for key, owner in session.execute(
        select(ApiKey, User).join(User, User.id == ApiKey.owner_id).where(
            ApiKey.team_ids.contains([team.id]), ApiKey.owner_id.in_(members),
            ApiKey.revoked_at.is_(None)).order_by(User.id, ApiKey.id))]
    allowed = set(session.scalars(select(TeamApp.client_pk).where(TeamApp.team_id == team.id)))
    apps = [AppUse(grant, client, owner, _app_blocked(team, grant, allowed))
            for grant, client, owner in session.execute(
                select(OAuthGrant, OAuthClient, User)
                .join(OAuthClient, OAuthClient.id == OAuthGrant.client_pk)
                .join(User, User.id == OAuthGrant.user_id)
                .where(OAuthGrant.team_ids.contains([team.id]),
                       OAuthGrant.user_id.in_(members), OAuthGrant.revoked_at.is_(None))
                .order_by(User.id, OAuthGrant.id))]
    return Credentials(keys, apps)


# -- members ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Through:
    """What some of a member's team memories were saved through, and how many."""

    label: str
    count: int


@dataclass
class MemberRow:
    member: TeamMember
    user: User
    keys: list[KeyUse] = field(default_factory=list)
    apps: list[AppUse] = field(default_factory=list)
    through: list[Through] = field(default_factory=list)


def member_rows(session: Session, team: Team, creds: Credentials) -> list[MemberRow]:
    """The members, owners first then by joining, each with the keys and apps they use
    with the team and what their team memories were saved through: three more queries."""
    order = {role: rank for rank, role in enumerate(ROLES)}
    rows = [MemberRow(member, user) for member, user in session.execute(
        select(TeamMember, User).join(User, User.id == TeamMember.user_id)
        .where(TeamMember.team_id == team.id)
        .order_by(TeamMember.joined_at, TeamMember.user_id))]
    rows.sort(key=lambda r: order[r.member.role])
    by_user = {r.user.id: r for r in rows}
    for use in creds.keys:
        by_user[use.owner.id].keys.append(use)
    for app in creds.apps:
        by_user[app.owner.id].apps.append(app)
    counts = session.execute(
        select(Memory.author_id, Memory.api_key_id, Memory.oauth_client_pk, func.count())
        .where(Memory.owner_id == team.id, Memory.author_id.in_(list(by_user)))
        .group_by(Memory.author_id, Memory.api_key_id, Memory.oauth_client_pk)).all() \
        if by_user else []
    key_ids = {k for _, k, _, _ in counts if k is not None}
    client_pks = {c for _, _, c, _ in counts if c is not None}
    keys = {k.id: k for k in session.scalars(select(ApiKey).where(ApiKey.id.in_(key_ids)))} \
        if key_ids else {}
    clients = {c.id: c for c in session.scalars(
        select(OAuthClient).where(OAuthClient.id.in_(client_pks)))} if client_pks else {}
    through: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for author, key_id, client_pk, n in counts:
        if key_id is not None and key_id in keys:
            label = key_label(keys[key_id])
        elif client_pk is not None and client_pk in clients:
            label = app_label(clients[client_pk])
        elif key_id is not None or client_pk is not None:
            label = "a key or app since deleted"
        else:
            label = ORBITPILOT
        through[author][label] += n
    for user_id, labels in through.items():
        by_user[user_id].through = [Through(label, n) for label, n in
                                    sorted(labels.items(), key=lambda item: -item[1])]
    return rows


def owners_count(rows: list[MemberRow]) -> int:
    return sum(1 for r in rows if r.member.role == "owner")


# -- apps the team allows, and those awaiting it ---------------------------------------------

@dataclass(frozen=True)
class AllowedApp:
    client: OAuthClient
    approved_at: datetime
    approved_by: str | None  # the approver's email, if they still have an account


def allowed_apps(session: Session, team_id: int) -> list[AllowedApp]:
    return [AllowedApp(client, row.approved_at, email) for row, client, email in session.execute(
        select(TeamApp, OAuthClient, User.email)
        .join(OAuthClient, OAuthClient.id == TeamApp.client_pk)
        .outerjoin(User, User.id == TeamApp.approved_by_id)
        .where(TeamApp.team_id == team_id).order_by(TeamApp.approved_at, OAuthClient.id))]


@dataclass(frozen=True)
class Candidate:
    """An app a member connected for the team that is not on its list."""

    client: OAuthClient
    members: list[str]  # who connected it (emails)


def app_candidates(session: Session, team_id: int) -> list[Candidate]:
    """Apps whose live connection by a member names the team, not on its list: one query."""
    rows = session.execute(
        select(OAuthClient, User.email)
        .join(OAuthGrant, OAuthGrant.client_pk == OAuthClient.id)
        .join(User, User.id == OAuthGrant.user_id)
        .join(TeamMember, (TeamMember.user_id == OAuthGrant.user_id)
              & (TeamMember.team_id == team_id))
        .where(OAuthGrant.team_ids.contains([team_id]), OAuthGrant.revoked_at.is_(None),
               ~select(TeamApp.client_pk).where(TeamApp.team_id == team_id,
                                                 TeamApp.client_pk == OAuthClient.id).exists())
        .order_by(OAuthClient.id, User.email))
    found: dict[int, Candidate] = {}
    for client, email in rows:
        found.setdefault(client.id, Candidate(client, [])).members.append(email)
    return list(found.values())


# -- the team's audit events -----------------------------------------------------------------

AUDIT_PAGE = 50
AUDIT_EXPORT_MAX = 10_000
ACTOR_KINDS = ("user", "admin", "support", "api_key", "connector", "system")
# Strings an event's details may show: codes of our own, never words someone typed.
_CODES = frozenset({*ROLES, *WRITE_POLICIES, *FORGET_POLICIES, *APP_POLICIES, *LEAVER_POLICIES,
                    *MEMORY_STATUSES, *FORGET_MODES, *MEMORY_SOURCES, "legal_hold", "restore"})
_STAMP = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?([+-]\d\d:\d\d|Z)?")


class AuditFilterError(ValueError):
    """A filter in the address is malformed; the sentence says which."""


@dataclass(frozen=True)
class AuditFilters:
    action: str | None = None
    actor_type: str | None = None
    actor_id: str | None = None
    since: date | None = None  # from the start of this day (UTC)
    until: date | None = None  # to the end of this day (UTC)

    @property
    def actor(self) -> str | None:
        if self.actor_type is None:
            return None
        return f"{self.actor_type}:{self.actor_id}" if self.actor_id else self.actor_type

    @classmethod
    def parse(cls, args: Any, actions: dict[str, str]) -> AuditFilters:
        action = args.get("action") or None
        if action is not None and action not in actions:
            raise AuditFilterError("Choose an action from the list.")
        actor_type = actor_id = None
        actor = args.get("actor") or None
        if actor is not None:
            actor_type, _, actor_id = actor.partition(":")
            if actor_type not in ACTOR_KINDS or len(actor_id) > 64 \
                    or (actor_id and not actor_id.isascii()) \
                    or (actor_id and not actor_id.isalnum()):
                raise AuditFilterError("An actor is a kind (user, api_key, connector, "
                                       "system…) and, after a colon, its id.")
        since, until = _day(args.get("since"), "since"), _day(args.get("until"), "until")
        if since and until and since > until:
            raise AuditFilterError("The dates are the wrong way round: “from” comes "
                                   "before “to”.")
        return cls(action, actor_type, actor_id or None, since, until)

    def as_args(self) -> dict[str, str | None]:
        return {"action": self.action, "actor": self.actor,
                "since": self.since.isoformat() if self.since else None,
                "until": self.until.isoformat() if self.until else None}


def _day(raw: object, name: str) -> date | None:
    if raw in (None, ""):
        return None
    try:
        if not isinstance(raw, str) or len(raw) != 10:
            raise ValueError
        return date.fromisoformat(raw)
    except ValueError:
        raise AuditFilterError(f"Give the “{'from' if name == 'since' else 'to'}” date as "
                               "YYYY-MM-DD.") from None


@dataclass(frozen=True)
class EventRow:
    """An event as the team page shows it: no column that could hold someone's words."""

    seq: int
    occurred_at: datetime
    action: str
    actor_type: str
    actor_id: str | None
    target_type: str | None
    target_id: str | None
    mode: str | None
    facts: list[tuple[str, str]]  # from its details: ids, counts, codes and times only
    hash: str

    @property
    def actor(self) -> str:
        return f"{self.actor_type}:{self.actor_id}" if self.actor_id else self.actor_type


def detail_facts(details: Any, prefix: str = "") -> list[tuple[str, str]]:
    """The ids, counts, codes and times in an event's details, flattened (``before.role``);
    any other string is left out, so no words anyone typed can show, whatever an event
    held."""
    facts: list[tuple[str, str]] = []
    if not isinstance(details, dict):
        return facts
    for key, value in details.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            facts += detail_facts(value, f"{name}.")
        elif value is None or isinstance(value, bool):
            facts.append((name, "—" if value is None else str(value).lower()))
        elif isinstance(value, int | float):
            facts.append((name, str(value)))
        elif isinstance(value, str) and _safe_code(value):
            facts.append((name, value))
    return facts


def _safe_code(value: str) -> bool:
    if value in _CODES or _STAMP.fullmatch(value) or value.isdigit():
        return True
    try:
        uuid.UUID(value)
    except ValueError:
        return False
    return len(value) == 36


@dataclass(frozen=True)
class EventsPage:
    rows: list[EventRow]
    newer: int | None  # ``after`` for the page of newer events
    older: int | None  # ``before`` for the page of older events


_COLUMNS = (AuditEvent.seq, AuditEvent.occurred_at, AuditEvent.action, AuditEvent.actor_type,
            AuditEvent.actor_id, AuditEvent.target_type, AuditEvent.target_id,
            AuditEvent.mode, AuditEvent.details, AuditEvent.hash)


def _filtered(team_id: int, filters: AuditFilters) -> Any:
    query = select(*_COLUMNS).where(AuditEvent.owner_id == team_id)
    if filters.action:
        query = query.where(AuditEvent.action == filters.action)
    if filters.actor_type:
        query = query.where(AuditEvent.actor_type == filters.actor_type)
    if filters.actor_id:
        query = query.where(AuditEvent.actor_id == filters.actor_id)
    if filters.since:
        query = query.where(AuditEvent.occurred_at >= datetime.combine(filters.since, time(),
                                                                       UTC))
    if filters.until and filters.until < date.max:  # to the end of time: no bound
        query = query.where(AuditEvent.occurred_at < datetime.combine(
            filters.until + timedelta(days=1), time(), UTC))
    return query


def _row(row: Any) -> EventRow:
    return EventRow(row.seq, row.occurred_at.astimezone(UTC), row.action, row.actor_type,
                    row.actor_id, row.target_type, row.target_id, row.mode,
                    detail_facts(row.details), row.hash)


def team_events(session: Session, team_id: int, filters: AuditFilters, *,
                before: int | None = None, after: int | None = None,
                limit: int = AUDIT_PAGE) -> EventsPage:
    """A page of the team's events (its own and its memories'), newest first, past a
    position (keyset on ``seq``: one index range read, however long the log)."""
    query = _filtered(team_id, filters)
    if after is not None:
        rows = list(session.execute(query.where(AuditEvent.seq > after)
                                    .order_by(AuditEvent.seq.asc()).limit(limit + 1)))
        more_newer = len(rows) > limit
        rows = rows[:limit][::-1]
        return EventsPage([_row(r) for r in rows],
                          rows[0].seq if more_newer and rows else None,
                          rows[-1].seq if rows else None)
    if before is not None:
        query = query.where(AuditEvent.seq < before)
    rows = list(session.execute(query.order_by(AuditEvent.seq.desc()).limit(limit + 1)))
    more_older = len(rows) > limit
    rows = rows[:limit]
    return EventsPage([_row(r) for r in rows],
                      rows[0].seq if before is not None and rows else None,
                      rows[-1].seq if more_older and rows else None)


def team_events_export(session: Session, team_id: int, filters: AuditFilters,
                       limit: int = AUDIT_EXPORT_MAX) -> list[EventRow]:
    """The newest ``limit`` events the filters keep, newest first (a CSV download)."""
    return [_row(r) for r in session.execute(
        _filtered(team_id, filters).order_by(AuditEvent.seq.desc()).limit(limit))]
