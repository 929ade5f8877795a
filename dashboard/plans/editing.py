"""Staff writes to plans: every field validated into a field error, applied, and recorded
as one audit event (before/after of what changed) in the same transaction.

Services flush; the caller (an admin view, a command) commits. A cap or assignment
change requests builds for the plan's users through ``memory.changes`` in the same
transaction."""

from __future__ import annotations

import re
from dataclasses import dataclass

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from dashboard.audit.services import Actor, changes, record_event
from dashboard.plans.impact import (
    ASSIGNMENT_VALUES,
    Impact,
    assignment_values,
    plan_fingerprint,
    preview_plan_change,
)
from dashboard.plans.models import Plan, SourceAssignment
from dashboard.refusals import Refusal
from dashboard.sources import registered_sources, source_keys

SLUG_RE = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")
MAX_PRICE_CENTS = 100_000_000


class PlanError(Refusal):
    """A plan change refused, with the form field it is about."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message, field)


class PlanChanged(PlanError):
    """The plan no longer holds the value the change was confirmed against."""

    def __init__(self) -> None:
        super().__init__("This plan changed while you were looking at the preview. Nothing "
                         "was applied.", "expected")


@dataclass(frozen=True)
class PlanFields:
    name: str
    slug: str
    description: str = ""
    included_sources: int = 3
    monthly_price_cents: int = 0
    active: bool = True


def _clean(session: Session, fields: PlanFields, plan_id: int | None) -> PlanFields:
    name = (fields.name or "").strip()
    slug = (fields.slug or "").strip()
    if not name:
        raise PlanError("Give the plan a name.", "name")
    if len(name) > 80:
        raise PlanError("Use at most 80 characters.", "name")
    if not SLUG_RE.match(slug) or len(slug) > 80:
        raise PlanError("Use lowercase letters, digits and single dashes (like “team-plus”).",
                        "slug")
    cap = check_cap(fields.included_sources)
    price = fields.monthly_price_cents
    if not isinstance(price, int) or isinstance(price, bool) or price < 0:
        raise PlanError("The price cannot be negative.", "monthly_price_cents")
    if price > MAX_PRICE_CENTS:
        raise PlanError("That price is higher than any plan could cost.", "monthly_price_cents")
    others = select(Plan.id).where(Plan.id != plan_id) if plan_id else select(Plan.id)
    if session.scalar(others.where(func.lower(Plan.name) == name.lower()).limit(1)):
        raise PlanError("Another plan already has that name.", "name")
    if session.scalar(others.where(func.lower(Plan.slug) == slug.lower()).limit(1)):
        raise PlanError("Another plan already has that slug.", "slug")
    return PlanFields(name, slug, (fields.description or "").strip(), cap, price,
                      bool(fields.active))


def check_cap(cap: object) -> int:
    most = len(registered_sources())
    if not isinstance(cap, int) or isinstance(cap, bool) or not 0 <= cap <= most:
        raise PlanError(f"Choose a whole number from 0 to {most} (the number of "
                        "sources there are).", "included_sources")
    return cap


_AUDITED_FIELDS = ("name", "slug", "description", "included_sources", "monthly_price_cents",
                   "active")


def _values(plan: Plan) -> dict[str, object]:
    return {name: getattr(plan, name) for name in _AUDITED_FIELDS}


_UNIQUE_FIELDS = {"uq_plans_name": "name", "uq_plans_name_lower": "name",
                  "uq_plans_slug": "slug"}


def _flush(session: Session) -> None:
    # A concurrent save with the same name or slug fails here, as a field error; any
    # other refusal goes up to the caller, which says so without the database's words.
    try:
        with session.begin_nested():
            session.flush()
    except IntegrityError as exc:
        field = _UNIQUE_FIELDS.get(getattr(getattr(exc.orig, "diag", None),
                                           "constraint_name", None))
        if field is None:
            raise
        raise PlanError(f"Another plan already has that {field}.", field) from None


def create_plan(session: Session, fields: PlanFields, *, actor: Actor) -> Plan:
    clean = _clean(session, fields, None)
    plan = Plan(name=clean.name, slug=clean.slug, description=clean.description,
                included_sources=clean.included_sources,
                monthly_price_cents=clean.monthly_price_cents, active=clean.active)
    session.add(plan)
    _flush(session)
    record_event(session, action="plan.create", actor=actor, target_type="plan",
                 target_id=plan.id, details=changes({}, _values(plan)))
    return plan


def update_plan(session: Session, plan: Plan, fields: PlanFields, *, actor: Actor) -> Plan:
    clean = _clean(session, fields, plan.id)
    if clean.active is False and plan.is_default:
        raise PlanError("The default plan stays active: every account without a plan is "
                        "on it.", "active")
    before = _values(plan)
    plan.name, plan.slug, plan.description = clean.name, clean.slug, clean.description
    plan.included_sources = clean.included_sources
    plan.monthly_price_cents, plan.active = clean.monthly_price_cents, clean.active
    _flush(session)
    diff = changes(before, _values(plan))
    if diff["after"]:
        record_event(session, action="plan.update", actor=actor, target_type="plan",
                     target_id=plan.id, details=diff)
    return plan


def _locked(session: Session, plan: Plan) -> Plan:
    # Two admins changing one plan at once: the second waits, then reads the plan and its
    # rows as the first left them (the check against ``expected`` and the impact it
    # audits are about the plan as it really is).
    plan = session.get(Plan, plan.id, with_for_update=True, populate_existing=True)
    session.expire(plan, ["assignments"])
    return plan


def _check_expected(plan: Plan, expected: str | None) -> None:
    if expected is not None and plan_fingerprint(plan) != expected:
        raise PlanChanged()


def set_cap(session: Session, plan: Plan, cap: object, *, actor: Actor,
            expected: str | None = None) -> Impact:
    """Set how many assigned sources the plan's builds include. Returns the impact; the
    plan's users get builds requested (``memory.changes``) when the cap moved.
    ``expected``: the ``plan_fingerprint`` the admin's preview was computed from; a plan
    that changed since raises ``PlanChanged``."""
    cap = check_cap(cap)
    plan = _locked(session, plan)
    _check_expected(plan, expected)
    impact = preview_plan_change(session, plan, cap=cap)
    if plan.included_sources == cap:
        return impact
    before = plan.included_sources
    plan.included_sources = cap
    _flush(session)
    record_event(session, action="plan.cap", actor=actor, target_type="plan",
                 target_id=plan.id,
                 details={"before": {"included_sources": before},
                          "after": {"included_sources": cap}, "impact": impact.summary()})
    return impact


def check_assignment(source_key: object, value: object) -> tuple[str, str]:
    if source_key not in source_keys():
        raise PlanError("There is no such source.", "source_key")
    if value not in ASSIGNMENT_VALUES:
        raise PlanError("Choose on, off or default.", "value")
    return source_key, value  # type: ignore[return-value]


def assignment_value(plan: Plan, source_key: str) -> str:
    """The plan's row for the source: "on", "off", or "default" when there is none."""
    return assignment_values(plan).get(source_key, "default")


def set_assignment(session: Session, plan: Plan, source_key: object, value: object, *,
                   actor: Actor, expected: str | None = None) -> Impact:
    """Switch a source on or off for a plan, or back to the registry's default (the row
    is removed). Returns the impact; builds are requested for the plan's users.
    ``expected``: as for ``set_cap``."""
    source_key, value = check_assignment(source_key, value)
    plan = _locked(session, plan)
    _check_expected(plan, expected)
    before = assignment_value(plan, source_key)
    impact = preview_plan_change(session, plan, assignment=(source_key, value))
    if before == value:
        return impact
    row = next((r for r in plan.assignments if r.source_key == source_key), None)
    if value == "default":
        plan.assignments.remove(row)
        session.delete(row)
    elif row is None:
        plan.assignments.append(SourceAssignment(source_key=source_key, enabled=value == "on",
                                                 updated_by_id=actor.user_id))
    else:
        row.enabled, row.updated_by_id = value == "on", actor.user_id
    _flush(session)
    record_event(session, action="assignment.set", actor=actor, target_type="plan",
                 target_id=plan.id,
                 details={"source_key": source_key, "before": {"row": before},
                          "after": {"row": value}, "impact": impact.summary()})
    return impact
