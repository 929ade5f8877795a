"""Plans, limits and source resolution: the one truth of what a build includes.

``resolve_sources`` is the pure rule; ``resolve_build_sources`` feeds it the user's plan
through a ``UserPlans``, which reads each user's plan once for as long as it lives: a
request keeps one (``plans.web``), so every surface of a page shares one query."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from sqlalchemy import ColumnElement, Integer, func, literal, or_, select
from sqlalchemy import inspect as sa_inspect
from sqlalchemy.orm import Session, joinedload, selectinload

from dashboard.auth.models import User
from dashboard.plans.models import DEFAULT_INCLUDED_SOURCES, DEFAULT_RESTORE_WINDOW_DAYS, Plan
from dashboard.refusals import NotFound
from dashboard.sources import registered_sources

FALLBACK_PLAN_NAME = "Free"


class SourceState(StrEnum):
    INCLUDED = "included"
    EVICTED_BY_CAP = "evicted_by_cap"
    NOT_ASSIGNED_BY_ADMIN = "not_assigned_by_admin"
    NOT_ASSIGNED_BY_DEFAULT = "not_assigned_by_default"
    GUEST = "guest"


@dataclass(frozen=True)
class UserPlan:
    """What resolution needs of a plan, detached from the session (safe across commits)."""

    id: int | None
    name: str
    slug: str
    included_sources: int
    is_default: bool
    # source_key -> enabled, for the plan's assignment rows only.
    assignments: dict[str, bool] = field(default_factory=dict)
    # source_key -> days of records kept (no key: all); a deleted memory's restore window.
    retention: dict[str, int] = field(default_factory=dict)
    restore_window_days: int = DEFAULT_RESTORE_WINDOW_DAYS

    @classmethod
    def from_plan(cls, plan: Plan) -> UserPlan:
        return cls(
            id=plan.id,
            name=plan.name,
            slug=plan.slug,
            included_sources=plan.included_sources,
            is_default=plan.is_default,
            assignments={a.source_key: a.enabled for a in plan.assignments},
            retention=retention_of(plan.retention),
            restore_window_days=plan.restore_window_days or DEFAULT_RESTORE_WINDOW_DAYS,
        )


def retention_of(raw: Any) -> dict[str, int]:
    """A plan's stored windows, keeping only whole positive days of aged sources."""
    if not isinstance(raw, dict):
        return {}
    aged = {s.key for s in registered_sources() if s.aged}
    return {key: days for key, days in raw.items()
            if key in aged and type(days) is int and days > 0}


# Used only when the database has no default plan at all (never after migrations).
FALLBACK_PLAN = UserPlan(None, FALLBACK_PLAN_NAME, "free", DEFAULT_INCLUDED_SOURCES, True)


@dataclass(frozen=True)
class SourceResolution:
    key: str
    label: str
    rank: int
    state: SourceState
    # "plan_row" when the plan's assignment row decided, "default" when the registry did.
    decided_by: str | None
    assigned: bool
    cap: int | None = None
    # For an eviction: the higher-ranked included sources that filled the cap.
    filled_by: tuple[str, ...] = ()
    # The plan's retention window for it, in days (``None``: every record is kept).
    keep_days: int | None = None

    @property
    def remembered(self) -> bool:
        return self.state is SourceState.INCLUDED

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "rank": self.rank,
            "state": self.state.value,
            "decided_by": self.decided_by,
            "assigned": self.assigned,
            "cap": self.cap,
            "filled_by": list(self.filled_by),
            "keep_days": self.keep_days,
        }


@dataclass(frozen=True)
class Resolution:
    plan: UserPlan | None  # None for a guest
    sources: tuple[SourceResolution, ...]

    @property
    def guest(self) -> bool:
        return self.plan is None

    @property
    def included_keys(self) -> tuple[str, ...]:
        return tuple(s.key for s in self.sources if s.remembered)

    def cutoffs(self, now: datetime, grace: timedelta = timedelta(0),
                ) -> dict[str, datetime]:
        """Per included source with a retention window: records made before this time
        are not remembered (``grace`` later, for a check that allows for the job's lag)."""
        return {s.key: now - timedelta(days=s.keep_days) - grace
                for s in self.sources if s.remembered and s.keep_days}

    def get(self, key: str) -> SourceResolution:
        for source in self.sources:
            if source.key == key:
                return source
        raise KeyError(key)

    def to_dict(self) -> dict[str, Any]:
        """The snapshot a build record keeps: ids, states and the cap, never content."""
        return {
            "plan_id": self.plan.id if self.plan else None,
            "plan_slug": self.plan.slug if self.plan else None,
            "cap": self.plan.included_sources if self.plan else None,
            "sources": [s.to_dict() for s in self.sources],
        }


def resolve_sources(plan: UserPlan | None) -> Resolution:
    """The rule, for a plan (``None`` = a guest), with no I/O."""
    resolved: list[SourceResolution] = []
    if plan is None:
        for rank, source in enumerate(registered_sources(), start=1):
            resolved.append(
                SourceResolution(source.key, source.label, rank, SourceState.GUEST, None, False)
            )
        return Resolution(None, tuple(resolved))

    cap = plan.included_sources
    included: list[str] = []
    for rank, source in enumerate(registered_sources(), start=1):
        if source.key in plan.assignments:
            assigned, decided_by = plan.assignments[source.key], "plan_row"
        else:
            assigned, decided_by = source.default_visible, "default"
        if not assigned:
            state = (
                SourceState.NOT_ASSIGNED_BY_ADMIN
                if decided_by == "plan_row"
                else SourceState.NOT_ASSIGNED_BY_DEFAULT
            )
            resolved.append(SourceResolution(source.key, source.label, rank, state, decided_by,
                                             False))
        elif len(included) < cap:
            included.append(source.key)
            resolved.append(SourceResolution(source.key, source.label, rank,
                                             SourceState.INCLUDED, decided_by, True, cap,
                                             keep_days=plan.retention.get(source.key)))
        else:
            resolved.append(SourceResolution(source.key, source.label, rank,
                                             SourceState.EVICTED_BY_CAP, decided_by, True, cap,
                                             tuple(included)))
    return Resolution(plan, tuple(resolved))


# -- the users of a plan ----------------------------------------------------------------
# The one place that knows a user with no plan (plan_id NULL) is on the default plan.

def plan_or_default(plan_id: Any) -> ColumnElement[int]:
    """SQL: ``plan_id`` (a column or a value), or the default plan's id when it is NULL."""
    default_plan = select(Plan.id).where(Plan.is_default).scalar_subquery()
    return func.coalesce(plan_id, default_plan)


def effective_plan_id() -> ColumnElement[int]:
    """SQL expression on ``users``: the id of the plan the user is on."""
    return plan_or_default(User.plan_id)


def users_of_plan(plan_id: int, is_default: bool) -> ColumnElement[bool]:
    """SQL condition on ``users``: the user is on this plan. The same rule as
    ``effective_plan_id``, spelled so the index on ``users.plan_id`` serves it."""
    if is_default:
        return or_(User.plan_id.is_(None), User.plan_id == plan_id)
    return User.plan_id == plan_id


# -- reading plans ---------------------------------------------------------------------

def _load_plan(session: Session, condition: Any) -> Plan | None:
    """A plan with its assignment rows in one round trip (the notice's whole budget).

    populate_existing: a long-lived session must see assignment rows added since it first
    loaded this plan (resolution is the one truth; stale is wrong)."""
    return session.scalars(
        select(Plan).where(condition).options(joinedload(Plan.assignments))
        .execution_options(populate_existing=True)
    ).unique().first()


class UnknownPlan(NotFound):
    """No plan has that slug or name."""


def find_plan(session: Session, slug_or_name: str) -> Plan:
    """The plan a command names, by slug or (any case) by name."""
    plan = session.scalars(
        select(Plan).where((Plan.slug == slug_or_name) | (func.lower(Plan.name) ==
                                                          slug_or_name.lower()))
    ).first()
    if plan is None:
        known = session.scalars(select(Plan.slug).order_by(Plan.id)).all()
        raise UnknownPlan(
            f"Unknown plan {slug_or_name!r}; known plans: {', '.join(known) or 'none'}.", "plan"
        )
    return plan


def get_plan(session: Session, plan_id: int) -> UserPlan | None:
    """A plan by id with its assignment rows, read fresh (one query): for a job that
    resolves a plan's users batch by batch while staff may change it."""
    plan = _load_plan(session, Plan.id == plan_id)
    return UserPlan.from_plan(plan) if plan else None


def get_default_plan(session: Session) -> UserPlan:
    plan = _load_plan(session, Plan.is_default)
    return UserPlan.from_plan(plan) if plan else FALLBACK_PLAN


def _is_guest(user: Any) -> bool:
    return user is None or not getattr(user, "is_authenticated", False)


def get_plan_for_user(user: Any, session: Session) -> UserPlan | None:
    """The user's plan with its assignment rows, in one query; ``None`` for a guest.

    A user with no plan is on the default plan; so is one whose plan row vanished under
    us (deleted mid-request)."""
    if _is_guest(user):
        return None
    plan = _load_plan(session, Plan.id == plan_or_default(literal(user.plan_id, Integer)))
    if plan is None and user.plan_id is not None:
        return get_default_plan(session)
    return UserPlan.from_plan(plan) if plan else FALLBACK_PLAN


def every_plan(session: Session) -> tuple[dict[int, UserPlan], UserPlan]:
    """Every plan by id, with its assignment rows read fresh (two queries), and the
    default plan: for a job resolving many users at once."""
    plans = {plan.id: UserPlan.from_plan(plan) for plan in session.scalars(
        select(Plan).options(selectinload(Plan.assignments))
        .execution_options(populate_existing=True))}
    default = next((plan for plan in plans.values() if plan.is_default), FALLBACK_PLAN)
    return plans, default


def _user_key(user: Any) -> Any:
    # The identity map key, read without touching attributes: after a commit they are
    # expired, and ``user.id`` would cost a refresh query on every later call.
    state = sa_inspect(user, raiseerr=False)
    if state is not None and state.identity:
        return state.identity[0]
    return user.id


class UserPlans:
    """Users' plans, each read once (``get_plan_for_user``) for as long as this lives.

    The edge keeps one per request and passes it down, so every surface of a page shares
    one query; a job or command makes its own, which is then a plain query per user."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self._plans: dict[Any, UserPlan | None] = {}

    def of(self, user: Any) -> UserPlan | None:
        if _is_guest(user):
            return None
        key = _user_key(user)
        if key not in self._plans:
            self._plans[key] = get_plan_for_user(user, self.session)
        return self._plans[key]


def get_user_plan(user: Any, plans: UserPlans) -> UserPlan | None:
    """The user's plan, read once per ``plans`` (per request, at the edge)."""
    return plans.of(user)


def resolve_build_sources(user: Any, plans: UserPlans, plan: UserPlan | None = None,
                          ) -> Resolution:
    """Per source, in rank order: remembered or not, and why. ``plan`` overrides the
    user's current plan (used for previews of an admin change)."""
    return resolve_sources(plan if plan is not None else plans.of(user))
