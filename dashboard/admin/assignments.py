"""The assignment page: plans × sources, the In-RAG switch per cell, the cap per
plan, and an impact preview before either is applied.

Plain forms, no JavaScript needed: a cell's button POSTs the change to ``preview``, which
shows who gains and who loses what; the preview's Confirm POSTs it to ``apply``. Confirm
carries the plan as the preview saw it (``expected``: its cap and every row): if someone
changed any of it in between, the admin sees the impact as it is now instead of applying
a change whose impact they never saw.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from flask import abort, flash, redirect, request, url_for
from flask_admin import BaseView, expose
from flask_login import current_user

from dashboard.audit.services import Actor
from dashboard.extensions import db
from dashboard.plans.editing import (
    PlanChanged,
    PlanError,
    check_assignment,
    check_cap,
    set_assignment,
    set_cap,
)
from dashboard.plans.impact import plan_fingerprint, plan_rows, preview_plan_change
from dashboard.plans.models import Plan
from dashboard.sources import get_source, registered_sources
from dashboard.staff import RoleGate, parse_key

CHANGE_KINDS = ("assignment", "cap")
STALE = ("This plan changed while you were looking at the preview. Nothing was applied; "
         "here is the impact of your change on the plan as it is now.")


@dataclass(frozen=True)
class PlanChange:
    plan: Plan
    kind: str
    source_key: str | None = None
    value: str | None = None  # on, off, default
    cap: int | None = None

    def current(self) -> str:
        """What the preview's impact is computed from (compared again on Confirm)."""
        return plan_fingerprint(self.plan)

    def describe(self) -> str:
        if self.kind == "cap":
            return f"Set the cap of {self.plan.name} to {self.cap}"
        label = get_source(self.source_key or "").label
        if self.value == "default":
            return f"Reset {label} on {self.plan.name} to the default"
        return f"Switch {label} {self.value} for {self.plan.name}"


def _parse_cap(raw: str | None) -> int:
    text = (raw or "").strip()
    if not text.isdigit() or len(text) > 3:
        raise PlanError(f"Choose a whole number from 0 to {len(registered_sources())} (the "
                        "number of sources there are).", "included_sources")
    return check_cap(int(text))


class AssignmentView(RoleGate, BaseView):
    allowed_roles = ("admin",)

    @expose("/")
    def index(self) -> Any:
        return self._matrix()

    def _matrix(self, error: str | None = None, status: int = 200) -> Any:
        return self.render("admin/assignments/matrix.html", rows=plan_rows(db.session),
                           sources=registered_sources(), error=error,
                           max_cap=len(registered_sources())), status

    def _change(self) -> PlanChange:
        """The change the form describes; an unknown plan is 404, a bad value a
        ``PlanError`` (shown on the matrix with a 400)."""
        form = request.form
        key = parse_key(Plan, form.get("plan_id"))
        plan = db.session.get(Plan, key) if key is not None else None
        if plan is None:
            abort(404, "There is no such plan.")
        kind = form.get("kind")
        if kind == "cap":
            return PlanChange(plan, kind, cap=_parse_cap(form.get("cap")))
        if kind == "assignment":
            source_key, value = check_assignment(form.get("source_key"), form.get("value"))
            return PlanChange(plan, kind, source_key=source_key, value=value)
        abort(400, "The form does not say what to change.")

    def _preview(self, change: PlanChange, notice: str | None = None,
                 status: int = 200) -> Any:
        impact = preview_plan_change(
            db.session, change.plan, cap=change.cap,
            assignment=(change.source_key, change.value) if change.kind == "assignment"
            else None)
        return self.render("admin/assignments/preview.html", change=change, impact=impact,
                           notice=notice), status

    @expose("/preview", methods=["POST"])
    def preview(self) -> Any:
        try:
            change = self._change()
        except PlanError as exc:
            return self._matrix(exc.sentence, 400)
        return self._preview(change)

    @expose("/apply", methods=["POST"])
    def apply(self) -> Any:
        try:
            change = self._change()
        except PlanError as exc:
            return self._matrix(exc.sentence, 400)
        expected = request.form.get("expected", "")
        actor = Actor.of(current_user)
        try:
            if change.kind == "cap":
                impact = set_cap(db.session, change.plan, change.cap, actor=actor,
                                 expected=expected)
            else:
                impact = set_assignment(db.session, change.plan, change.source_key,
                                        change.value, actor=actor, expected=expected)
        except PlanChanged:
            db.session.rollback()
            return self._preview(self._change(), STALE, 409)
        db.session.commit()
        flash(f"{change.describe()}: done. " + _impact_sentence(impact), "success")
        return redirect(url_for(".index"), 303)


def _impact_sentence(impact: Any) -> str:
    parts = [f"{impact.users} user(s) gain {s.label}" for s in impact.gained]
    parts += [f"{impact.users} user(s) lose {s.label}" for s in impact.lost]
    if not parts:
        return "No user's memory changes."
    if impact.gained:
        return "; ".join(parts) + ". Their memory builds have been requested."
    return "; ".join(parts) + ". It is being applied to their memory, without rebuilds."
