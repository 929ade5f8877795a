from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from flask_login import UserMixin
from sqlalchemy import Boolean, CheckConstraint, DateTime, ForeignKey, Index, String, func
from sqlalchemy.orm import Mapped, mapped_column, relationship

from dashboard.extensions import db
from dashboard.models_base import created_at_column
from dashboard.roles import ROLES, STAFF_ROLES

if TYPE_CHECKING:
    from dashboard.plans.models import Plan

# A person signs in; a team is an account that owns a team's memory (dashboard.teams).
KINDS = ("person", "team")


class User(UserMixin, db.Model):
    __tablename__ = "users"
    __table_args__ = (
        CheckConstraint(f"role IN {ROLES!r}", name="role"),
        CheckConstraint(f"kind IN {KINDS!r}", name="kind"),
        # Support's search by the start of an email or of its domain (migration 0010).
        Index("ix_users_email_prefix", "email", postgresql_ops={"email": "text_pattern_ops"}),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    # Stored lower-cased; uniqueness is case-insensitive by construction.
    email: Mapped[str] = mapped_column(String(254), unique=True)
    display_name: Mapped[str] = mapped_column(String(120), default="")
    password_hash: Mapped[str] = mapped_column(String(255))
    role: Mapped[str] = mapped_column(String(16), default="user", server_default="user")
    # NULL means the default (free) plan; see plans.services.get_plan_for_user.
    plan_id: Mapped[int | None] = mapped_column(
        ForeignKey("plans.id", ondelete="SET NULL"), index=True
    )
    active: Mapped[bool] = mapped_column(Boolean, default=True, server_default="true")
    kind: Mapped[str] = mapped_column(String(8), default="person", server_default="person")
    created_at: Mapped[datetime] = created_at_column()
    last_login_at: Mapped[datetime | None] = mapped_column(
        DateTime(timezone=True), default=None
    )

    # Set by a trigger whenever plan_id changes (by any path, a deleted plan's SET NULL
    # included): the schedule's safety net compares it with the last build.
    plan_changed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))

    plan: Mapped[Plan | None] = relationship()

    @property
    def is_authenticated(self) -> bool:
        # Constant, so checking it never refreshes an expired row; an inactive account
        # never becomes current_user (see auth.views.load_user).
        return True

    @property
    def is_active(self) -> bool:  # Flask-Login: a deactivated account cannot sign in
        return self.active

    @property
    def is_staff(self) -> bool:
        return self.role in STAFF_ROLES

    def __repr__(self) -> str:
        return f"<User {self.id} {self.role}>"


# ... and by the start of its domain (an expression, so declared once the table is).
Index("ix_users_email_domain", func.split_part(User.email, "@", 2).label("email_domain"),
      postgresql_ops={"email_domain": "text_pattern_ops"})
