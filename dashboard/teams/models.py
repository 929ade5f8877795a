"""A team, its members, invitations and the apps it lets act for it. The team's memory
belongs to its account (``users.kind = 'team'``, the same id), so builds, Memory Status,
retention, holds, the truth check, exports and receipts serve it as they serve a person."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from sqlalchemy import BigInteger, CheckConstraint, DateTime, ForeignKey, Integer, String
from sqlalchemy.orm import Mapped, mapped_column, relationship

from dashboard.extensions import db
from dashboard.models_base import created_at_column

if TYPE_CHECKING:
    from dashboard.auth.models import User

ROLES = ("owner", "admin", "member", "reader")
WRITE_POLICIES = ("members", "admins")
FORGET_POLICIES = ("author_or_admins", "admins")
APP_POLICIES = ("any", "allow_list", "approve")
LEAVER_POLICIES = ("keep", "erase")


class Team(db.Model):
    __tablename__ = "teams"
    __table_args__ = (
        CheckConstraint("slug ~ '^[a-z0-9][a-z0-9-]{1,38}[a-z0-9]$'", name="slug"),
        CheckConstraint(f"write_policy IN {WRITE_POLICIES!r}", name="write_policy"),
        CheckConstraint(f"forget_policy IN {FORGET_POLICIES!r}", name="forget_policy"),
        CheckConstraint(f"app_policy IN {APP_POLICIES!r}", name="app_policy"),
        CheckConstraint("max_key_days IS NULL OR max_key_days BETWEEN 1 AND 3650",
                        name="max_key_days"),
        CheckConstraint(f"leaver_policy IN {LEAVER_POLICIES!r}", name="leaver_policy"),
    )

    # The team's own account: the owner of its memory.
    id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"),
                                    primary_key=True)
    slug: Mapped[str] = mapped_column(String(40), unique=True)
    name: Mapped[str] = mapped_column(String(120))
    created_by_id: Mapped[int | None] = mapped_column(
        ForeignKey("users.id", ondelete="SET NULL"))
    created_at: Mapped[datetime] = created_at_column()
    # Who may save and share to it: members (and above), or admins only.
    write_policy: Mapped[str] = mapped_column(String(16), default="members",
                                              server_default="members")
    # Who may soft delete and redact: the memory's author or an admin, or admins only.
    # (Hard delete: owners and admins, with the memory:hard_delete scope.)
    forget_policy: Mapped[str] = mapped_column(String(24), default="author_or_admins",
                                               server_default="author_or_admins")
    # Which connected apps may act for it: any a member allows, only those on its list,
    # or each new one once an admin approves it (``team_apps`` holds the list).
    app_policy: Mapped[str] = mapped_column(String(16), default="any", server_default="any")
    # The longest a member's API key acting for the team may live (None: no limit).
    max_key_days: Mapped[int | None] = mapped_column(Integer)
    # What becomes of a removed member's memories: kept ("a former member"), or erased.
    leaver_policy: Mapped[str] = mapped_column(String(8), default="keep",
                                               server_default="keep")

    account: Mapped[User] = relationship(foreign_keys=[id])


class TeamMember(db.Model):
    __tablename__ = "team_members"
    __table_args__ = (CheckConstraint(f"role IN {ROLES!r}", name="role"),)

    team_id: Mapped[int] = mapped_column(ForeignKey("teams.id", ondelete="CASCADE"),
                                         primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"),
                                         primary_key=True, index=True)
    role: Mapped[str] = mapped_column(String(8))
    joined_at: Mapped[datetime] = created_at_column()
    last_active_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))

    user: Mapped[User] = relationship(foreign_keys=[user_id])


class TeamInvitation(db.Model):
    """A single-use link bound to an email, stored as the hash of its token."""

    __tablename__ = "team_invitations"
    __table_args__ = (CheckConstraint(f"role IN {ROLES!r}", name="role"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    team_id: Mapped[int] = mapped_column(ForeignKey("teams.id", ondelete="CASCADE"),
                                         index=True)
    email: Mapped[str] = mapped_column(String(254))
    role: Mapped[str] = mapped_column(String(8))
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    created_by_id: Mapped[int | None] = mapped_column(
        ForeignKey("users.id", ondelete="SET NULL"))
    created_at: Mapped[datetime] = created_at_column()
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    accepted_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    accepted_by_id: Mapped[int | None] = mapped_column(
        ForeignKey("users.id", ondelete="SET NULL"))
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))

    team: Mapped[Team] = relationship()


class TeamApp(db.Model):
    """A connected app a team lets act for it (an allow-list entry, or an approval)."""

    __tablename__ = "team_apps"

    team_id: Mapped[int] = mapped_column(ForeignKey("teams.id", ondelete="CASCADE"),
                                         primary_key=True)
    client_pk: Mapped[int] = mapped_column(
        BigInteger, ForeignKey("oauth_clients.id", ondelete="CASCADE"), primary_key=True)
    approved_by_id: Mapped[int | None] = mapped_column(
        ForeignKey("users.id", ondelete="SET NULL"))
    approved_at: Mapped[datetime] = created_at_column()
