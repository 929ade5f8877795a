"""What a cap or assignment change would do, before it is applied.

Every user of a plan resolves the same way (resolution depends on the plan alone), so
the impact is the resolution of the plan as it is against the resolution of the plan as
it would be — ``resolve_sources``, the one rule, run twice — times the plan's active
users (the users whose builds the change requests)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from sqlalchemy import func, select
from sqlalchemy.orm import Session, selectinload

from dashboard.auth.models import User
from dashboard.plans.models import Plan
from dashboard.plans.services import (
    Resolution,
    UserPlan,
    effective_plan_id,
    resolve_sources,
    users_of_plan,
)

ASSIGNMENT_VALUES = ("on", "off", "default")


@dataclass(frozen=True)
class SourceImpact:
    key: str
    label: str
    before: str  # the state now
    after: str  # the state after the change
    change: str  # "gain", "lose" or "" (remembered before and after alike)


@dataclass(frozen=True)
class Impact:
    plan_id: int
    plan_name: str
    users: int
    before: Resolution
    after: Resolution
    sources: tuple[SourceImpact, ...]

    @property
    def gained(self) -> tuple[SourceImpact, ...]:
        return tuple(s for s in self.sources if s.change == "gain")

    @property
    def lost(self) -> tuple[SourceImpact, ...]:
        return tuple(s for s in self.sources if s.change == "lose")

    @property
    def changes_memory(self) -> bool:
        return bool(self.gained or self.lost)

    def summary(self) -> dict[str, object]:
        """For the audit event: counts and source keys, never content."""
        return {"users": self.users,
                "gain": [s.key for s in self.gained],
                "lose": [s.key for s in self.lost]}


def assignment_values(plan: Plan) -> dict[str, str]:
    """The plan's rows as the admin sees them: source_key -> "on" | "off" (a source
    without a row is "default")."""
    return {a.source_key: "on" if a.enabled else "off" for a in plan.assignments}


def plan_fingerprint(plan: Plan) -> str:
    """Everything resolution reads of a plan (its cap and its rows), as one string: a
    preview is confirmed against it, so a change of anything the preview's impact
    depended on — not only the value being changed — makes the confirm stale."""
    rows = ",".join(f"{key}={value}" for key, value in sorted(assignment_values(plan).items()))
    return f"cap={plan.included_sources};{rows}"


def count_active_users(session: Session, plan: Plan) -> int:
    return session.scalar(
        select(func.count()).select_from(User)
        .where(users_of_plan(plan.id, plan.is_default), User.active)
    ) or 0


def with_assignment(plan: UserPlan, source_key: str, value: str) -> UserPlan:
    """``plan`` with one assignment row set on, off, or removed ("default")."""
    assignments = dict(plan.assignments)
    if value == "default":
        assignments.pop(source_key, None)
    else:
        assignments[source_key] = value == "on"
    return replace(plan, assignments=assignments)


def compare(plan: Plan, current: UserPlan, proposed: UserPlan, users: int) -> Impact:
    before, after = resolve_sources(current), resolve_sources(proposed)
    sources = []
    for old, new in zip(before.sources, after.sources, strict=True):
        change = ("gain" if new.remembered and not old.remembered else
                  "lose" if old.remembered and not new.remembered else "")
        sources.append(SourceImpact(old.key, old.label, old.state.value, new.state.value,
                                    change))
    return Impact(plan.id, plan.name, users, before, after, tuple(sources))


def preview_plan_change(session: Session, plan: Plan, *, cap: int | None = None,
                        assignment: tuple[str, str] | None = None) -> Impact:
    """The impact of setting the cap to ``cap``, or the assignment ``(source_key,
    "on"|"off"|"default")``, on ``plan`` (already validated by the caller)."""
    current = UserPlan.from_plan(plan)
    proposed = current
    if cap is not None:
        proposed = replace(proposed, included_sources=cap)
    if assignment is not None:
        proposed = with_assignment(proposed, *assignment)
    return compare(plan, current, proposed, count_active_users(session, plan))


# -- the assignment matrix ---------------------------------------------------------------

@dataclass(frozen=True)
class PlanRow:
    """One plan on the assignment page: its rows, its resolution and its users."""

    plan: Plan
    users: int
    resolution: Resolution
    rows: dict[str, str]  # source_key -> "on" | "off" | "default"


def count_active_users_by_plan(session: Session) -> dict[int, int]:
    """Active users per plan, users without a plan counted on the default plan; one
    grouped query however many plans."""
    plan_id = effective_plan_id().label("plan_id")
    return dict(session.execute(
        select(plan_id, func.count()).where(User.active).group_by(plan_id)).all())


def plan_rows(session: Session) -> list[PlanRow]:
    """Every plan (the default first, then by name) with what the matrix shows: two
    queries for the plans and their rows, one for the user counts."""
    plans = session.scalars(
        select(Plan).options(selectinload(Plan.assignments))
        .order_by(Plan.is_default.desc(), Plan.name, Plan.id)
        # Assignment rows added since the session first loaded a plan must count.
        .execution_options(populate_existing=True)
    ).all()
    counts = count_active_users_by_plan(session)
    rows = []
    for plan in plans:
        rows.append(PlanRow(plan, counts.get(plan.id, 0),
                            resolve_sources(UserPlan.from_plan(plan)), assignment_values(plan)))
    return rows
