"""Accounts: sign-up, sign-in checks, roles. Services flush; the caller commits."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session
from werkzeug.security import check_password_hash, generate_password_hash

from dashboard.audit.services import Actor, changes, record_event
from dashboard.auth.models import ROLES, User
from dashboard.refusals import Refusal

if TYPE_CHECKING:  # plans build on accounts, not the other way round
    from dashboard.plans.models import Plan

EMAIL_RE = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")
# The few passwords every list of leaked passwords starts with.
COMMON_PASSWORDS = frozenset({
    "password", "password1", "password123", "passw0rd", "1234567890", "12345678910",
    "qwertyuiop", "iloveyou12", "letmein123", "orbitpilot", "welcome123", "administrator",
})

# A real hash of a random string: checking against it makes an unknown email cost the same
# time as a wrong password, so sign-in does not reveal which emails have accounts.
_DUMMY_HASH = generate_password_hash("not-a-real-password-ever")


class AccountError(Refusal):
    """A clear, user-facing reason an account operation was refused."""


def normalise_email(email: str) -> str:
    return (email or "").strip().lower()


def password_problem(password: str, email: str = "", min_length: int = 10) -> str | None:
    """Why ``password`` is too weak, or ``None``."""
    if len(password) < min_length:
        return f"Use at least {min_length} characters."
    if len(password) > 256:
        return "Use at most 256 characters."
    if password.lower() in COMMON_PASSWORDS:
        return "That password is among the most common ones; choose another."
    if len(set(password)) < 4:
        return "Use a mix of characters, not one or two repeated."
    local = normalise_email(email).split("@", 1)[0]
    if local and len(local) >= 4 and local in password.lower():
        return "Don't build your password from your email address."
    return None


def validate_role(role: str) -> str:
    if role not in ROLES:
        raise AccountError(f"Unknown role {role!r}; choose one of: {', '.join(ROLES)}.", "role")
    return role


def get_user_by_email(session: Session, email: str) -> User | None:
    return session.scalars(select(User).where(User.email == normalise_email(email))).first()


def create_user(
    session: Session,
    *,
    email: str,
    password: str,
    display_name: str = "",
    role: str = "user",
    plan: Plan | None = None,
    min_password_length: int = 10,
    password_hash: str | None = None,
) -> User:
    """Create an account. ``plan=None`` puts it on the default plan (plan_id stays NULL).

    Raises ``AccountError`` with a field name; nothing is written then."""
    email = normalise_email(email)
    if not EMAIL_RE.match(email) or len(email) > 254 or email.endswith(".invalid"):
        # ".invalid" is reserved (RFC 2606): no mail reaches it, and teams' own accounts
        # live there.
        raise AccountError("Enter a valid email address.", "email")
    validate_role(role)
    if password_hash is None:
        problem = password_problem(password, email, min_password_length)
        if problem:
            raise AccountError(problem, "password")
        password_hash = generate_password_hash(password)
    if get_user_by_email(session, email) is not None:
        raise AccountError("An account with that email already exists.", "email")
    user = User(
        email=email,
        display_name=(display_name or "").strip()[:120] or email.split("@", 1)[0],
        password_hash=password_hash,
        role=role,
        plan_id=plan.id if plan else None,
    )
    session.add(user)
    # A savepoint: a concurrent sign-up with the same email fails cleanly, not the
    # surrounding transaction.
    try:
        with session.begin_nested():
            session.flush()
    except IntegrityError:
        raise AccountError("An account with that email already exists.", "email") from None
    return user


def authenticate(session: Session, email: str, password: str) -> User | None:
    user = get_user_by_email(session, email)
    if user is None:
        check_password_hash(_DUMMY_HASH, password)
        return None
    if user.kind != "person":  # a team's account holds memory; nobody signs in as it
        check_password_hash(_DUMMY_HASH, password)
        return None
    if not check_password_hash(user.password_hash, password):
        return None
    return user


def active_user(session: Session, user_id: str) -> User | None:
    """The account a session cookie names, if it may still sign in: one query."""
    try:
        user = session.get(User, int(user_id))
    except (TypeError, ValueError):
        return None
    # A deactivated account loses its open sessions too; a team's is never anyone's.
    return user if user is not None and user.active and user.kind == "person" else None


@dataclass(frozen=True)
class RoleChange:
    user_id: int
    before: str
    after: str


def _keep_an_admin(session: Session, user: User, *, role: str, active: bool) -> None:
    """Refuse a change that would leave no active admin. The admin rows are locked, so
    two admins demoting each other at once cannot both succeed."""
    if not (user.role == "admin" and user.active) or (role == "admin" and active):
        return
    admins = session.scalars(
        select(User.id).where(User.role == "admin", User.active).with_for_update()
    ).all()
    if not set(admins) - {user.id}:
        field = "role" if role != "admin" else "active"
        raise AccountError("This is the last active admin; make someone else an admin "
                           "first.", field)


def set_role(session: Session, user: User, role: str, *, actor: Actor) -> RoleChange:
    change = RoleChange(user.id, user.role, role)
    update_account(session, user, role=role, plan_id=user.plan_id, active=user.active,
                   actor=actor)
    return change


def _account_values(user: User) -> dict[str, object]:
    return {"role": user.role, "plan_id": user.plan_id, "active": user.active}


def _violates(exc: IntegrityError, column: Any) -> bool:
    """Whether PostgreSQL refused the row for ``column``'s foreign key."""
    name = getattr(getattr(exc.orig, "diag", None), "constraint_name", None)
    return name is not None and name in {fk.constraint.name for fk in column.foreign_keys}


def update_account(session: Session, user: User, *, role: str, plan_id: int | None,
                   active: bool, actor: Actor) -> User:
    """A staff edit of an account: its role, its plan (``None``: the default plan) and
    whether it may sign in, audited with before/after. A plan switch requests the
    user's build (``memory.changes``)."""
    validate_role(role)
    if user.kind == "team" and role != "user":
        raise AccountError("This is a team's account: it holds the team's memory and nobody "
                           "signs in as it, so it cannot have a staff role. Give the role "
                           "to a person instead.", "role")
    _keep_an_admin(session, user, role=role, active=active)
    before = _account_values(user)
    user.role, user.plan_id, user.active = role, plan_id, bool(active)
    # The plan's foreign key says whether it exists, also when it was deleted a moment
    # ago; the savepoint keeps the caller's transaction usable.
    try:
        with session.begin_nested():
            session.flush()
    except IntegrityError as exc:
        if not _violates(exc, User.__table__.c.plan_id):
            raise
        raise AccountError("That plan does not exist (any more); choose another.",
                           "plan_ref") from None
    diff = changes(before, _account_values(user))
    if diff["after"]:
        record_event(session, action="user.update", actor=actor, owner_id=user.id,
                     target_type="user", target_id=user.id, details=diff)
    return user
