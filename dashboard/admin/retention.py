"""Retention and legal holds in the staff console.

Retention: each plan's windows per source and its restore window, one form per plan; the
form POSTs to ``preview`` (what the change drops now, counted by the code that applies
it), whose Confirm POSTs to ``apply`` with the plan's values as the preview saw them.
Legal holds: admins place and release them; support reads them."""

from __future__ import annotations

from datetime import UTC, datetime, time
from typing import Any

from flask import abort, flash, redirect, request, url_for
from flask_admin import BaseView, expose
from flask_login import current_user
from sqlalchemy import select

from dashboard.audit.services import Actor
from dashboard.auth.models import User
from dashboard.extensions import db
from dashboard.holds import HoldError, LegalHold, place_hold, release_hold
from dashboard.plans.models import Plan
from dashboard.plans.services import retention_of
from dashboard.retention import (
    RetentionChanged,
    RetentionError,
    aged_sources,
    complete_released,
    parse_retention,
    preview_retention,
    retention_fingerprint,
    set_retention,
)
from dashboard.roles import STAFF_ROLES
from dashboard.staff import RoleGate, parse_key

STALE = ("This plan's retention changed while you were looking at the preview. Nothing "
         "was applied; here is what your change drops from the plan as it is now.")


def _admin_only() -> None:
    if current_user.role != "admin":
        abort(403)


def _parse_end(raw: object) -> datetime | None:
    text = raw.strip() if isinstance(raw, str) else ""
    if not text:
        return None
    try:
        day = datetime.strptime(text, "%Y-%m-%d").date()
    except ValueError:
        raise HoldError("Give the end as a date (YYYY-MM-DD), or leave it empty.",
                        "ends_at") from None
    return datetime.combine(day, time.min, tzinfo=UTC)


class RetentionView(RoleGate, BaseView):
    allowed_roles = STAFF_ROLES

    def _plan(self) -> Plan:
        key = parse_key(Plan, request.form.get("plan_id"))
        plan = db.session.get(Plan, key) if key is not None else None
        if plan is None:
            abort(404, "There is no such plan.")
        return plan

    def _index(self, error: str | None = None, field: str | None = None,
               status: int = 200) -> Any:
        plans = db.session.scalars(select(Plan).order_by(Plan.id)).all()
        holds = db.session.execute(
            select(LegalHold, User.email).join(User, User.id == LegalHold.user_id)
            .order_by(LegalHold.released_at.is_not(None), LegalHold.id.desc()).limit(200)
        ).all()
        return self.render("admin/retention/index.html", plans=plans, sources=aged_sources(),
                           windows={p.id: retention_of(p.retention) for p in plans},
                           holds=holds, now=datetime.now(UTC), error=error, field=field,
                           form=request.form if status != 200 else {}), status

    @expose("/")
    def index(self) -> Any:
        return self._index()

    def _form(self) -> tuple[Plan, dict[str, int], int]:
        """An admin's POST: the plan, its windows and restore window (``RetentionError``
        for a bad value)."""
        _admin_only()
        return self._plan(), *parse_retention(request.form)

    @expose("/preview", methods=["POST"])
    def preview(self) -> Any:
        try:
            plan, windows, restore = self._form()
        except RetentionError as exc:
            return self._index(exc.sentence, exc.field, 400)
        return self._preview(plan, windows, restore)

    def _preview(self, plan: Plan, windows: dict[str, int], restore: int,
                 notice: str | None = None, status: int = 200) -> Any:
        preview = preview_retention(db.session, plan, windows, restore)
        return self.render("admin/retention/preview.html", plan=plan, preview=preview,
                           windows=windows, restore=restore, sources=aged_sources(),
                           expected=retention_fingerprint(plan), notice=notice), status

    @expose("/apply", methods=["POST"])
    def apply(self) -> Any:
        try:
            plan, windows, restore = self._form()
        except RetentionError as exc:
            return self._index(exc.sentence, exc.field, 400)
        try:
            preview = set_retention(db.session, plan, windows, restore,
                                    actor=Actor.of(current_user),
                                    expected=request.form.get("expected", ""))
        except RetentionChanged:
            db.session.rollback()
            return self._preview(self._plan(), windows, restore, STALE, 409)
        db.session.commit()
        dropped = sum(d.items for d in preview.drops)
        flash(f"Retention of {plan.name} saved. {dropped} remembered item(s) leave memory "
              f"at their users' next builds; {preview.purge_items} deleted memorie(s) past "
              "the restore window are purged by the next retention run"
              + (f" ({preview.purge_held} wait for a legal hold)" if preview.purge_held
                 else "") + ".", "success")
        return redirect(url_for(".index"), 303)

    # -- legal holds --------------------------------------------------------------------

    @expose("/holds", methods=["POST"])
    def place(self) -> Any:
        _admin_only()
        email = (request.form.get("email") or "").strip().lower()
        user = db.session.scalars(select(User).where(User.email == email)).first() \
            if email else None
        try:
            if user is None:
                raise HoldError("No user has that email.", "email")
            place_hold(db.session, user.id, reason=request.form.get("reason"),
                       ends_at=_parse_end(request.form.get("ends_at")),
                       actor=Actor.of(current_user))
        except HoldError as exc:
            db.session.rollback()
            return self._index(exc.sentence, exc.field, 400)
        db.session.commit()
        flash(f"Legal hold placed on {user.email}: nothing of theirs is purged or erased "
              "for good until it ends.", "success")
        return redirect(url_for(".index"), 303)

    @expose("/holds/release", methods=["POST"])
    def release(self) -> Any:
        _admin_only()
        key = parse_key(LegalHold, request.form.get("hold_id"))
        hold = db.session.get(LegalHold, key, with_for_update=True) if key is not None \
            else None
        if hold is None:
            abort(404, "There is no such hold.")
        try:
            release_hold(db.session, hold, actor=Actor.of(current_user))
        except HoldError as exc:
            db.session.rollback()
            return self._index(exc.sentence, exc.field, 409)
        # The erasures that waited for it run now, in this same transaction.
        completed = complete_released(db.session, user_id=hold.user_id)
        db.session.commit()
        flash(f"Legal hold released; {completed} erasure(s) that waited for it completed.",
              "success")
        return redirect(url_for(".index"), 303)
