"""Factory helpers: they flush, never commit, so the per-test rollback undoes them."""

from __future__ import annotations

import itertools

from sqlalchemy import select
from werkzeug.security import generate_password_hash

from dashboard.auth.models import User
from dashboard.plans.models import Plan, SourceAssignment

PASSWORD = "correct-horse-battery"
# One cheap hash for every factory user: scrypt per user would dominate the suite's time.
_FAST_HASH = generate_password_hash(PASSWORD, method="pbkdf2:sha256:1000")
_seq = itertools.count(1)


def make_plan(session, *, name: str | None = None, cap: int = 3,
              assignments: dict[str, bool] | None = None) -> Plan:
    n = next(_seq)
    plan = Plan(name=name or f"Plan {n}", slug=f"plan-{n}", included_sources=cap)
    session.add(plan)
    session.flush()
    for key, enabled in (assignments or {}).items():
        session.add(SourceAssignment(plan_id=plan.id, source_key=key, enabled=enabled))
    session.flush()
    return plan


def default_plan(session) -> Plan:
    return session.scalars(select(Plan).where(Plan.is_default)).one()


def make_user(session, *, plan: Plan | None = None, role: str = "user",
              email: str | None = None) -> User:
    n = next(_seq)
    user = User(email=email or f"user{n}@example.test", display_name=f"User {n}",
                password_hash=_FAST_HASH, role=role, plan_id=plan.id if plan else None)
    session.add(user)
    session.flush()
    return user
