"""Staff writes to plans: every field validated into a field error, then applied.

Services flush; the caller (an admin view, a command) commits. A cap change requests
builds for the plan's users through ``memory.changes`` in the same transaction."""

from __future__ import annotations

import re
from dataclasses import dataclass

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from dashboard.plans.models import Plan
from dashboard.sources import SOURCES

SLUG_RE = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")
MAX_PRICE_CENTS = 100_000_000


class PlanError(ValueError):
    """A plan change refused, with the form field it is about."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field


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
    cap = fields.included_sources
    if not isinstance(cap, int) or isinstance(cap, bool) or not 0 <= cap <= len(SOURCES):
        raise PlanError(f"Choose a whole number from 0 to {len(SOURCES)} (the number of "
                        "sources there are).", "included_sources")
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


def create_plan(session: Session, fields: PlanFields) -> Plan:
    clean = _clean(session, fields, None)
    plan = Plan(name=clean.name, slug=clean.slug, description=clean.description,
                included_sources=clean.included_sources,
                monthly_price_cents=clean.monthly_price_cents, active=clean.active)
    session.add(plan)
    _flush(session)
    return plan


def update_plan(session: Session, plan: Plan, fields: PlanFields) -> Plan:
    clean = _clean(session, fields, plan.id)
    if clean.active is False and plan.is_default:
        raise PlanError("The default plan stays active: every account without a plan is "
                        "on it.", "active")
    plan.name, plan.slug, plan.description = clean.name, clean.slug, clean.description
    plan.included_sources = clean.included_sources
    plan.monthly_price_cents, plan.active = clean.monthly_price_cents, clean.active
    _flush(session)
    return plan
