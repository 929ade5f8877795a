"""Flask-Admin: thin configuration over services. One ``StaffModelView`` base checks roles."""

from __future__ import annotations

from typing import Any

from flask import Flask, abort, flash, redirect, request, url_for
from flask_admin import Admin, AdminIndexView, expose
from flask_admin.actions import action
from flask_admin.contrib.sqla import ModelView
from flask_admin.theme import Bootstrap4Theme
from flask_login import current_user
from flask_wtf import FlaskForm
from flask_wtf.form import _Auto
from sqlalchemy import select

from dashboard.extensions import db


class _RoleGate:
    """403 for a signed-in user without the role, a sign-in redirect otherwise."""

    allowed_roles: tuple[str, ...] = ("support", "admin")

    def is_accessible(self) -> bool:
        return current_user.is_authenticated and current_user.role in self.allowed_roles

    def inaccessible_callback(self, name, **kwargs):
        if current_user.is_authenticated:
            abort(403)
        return redirect(url_for("auth.signin", next=request.full_path))


class StaffIndexView(_RoleGate, AdminIndexView):
    @expose("/")
    def index(self):
        return self.render("admin/staff_index.html")


class StaffForm(FlaskForm):
    """Flask-Admin forms carry the same CSRF token as every other form of the app."""

    def __init__(self, formdata: Any = _Auto, obj: Any = None, **kwargs: Any) -> None:
        # Flask-Admin's Unique validator skips the row being edited through ``_obj``.
        self._obj = obj
        super().__init__(formdata=formdata, obj=obj, **kwargs)


class StaffModelView(_RoleGate, ModelView):
    form_base_class = StaffForm
    page_size = 50
    can_view_details = True
    can_export = False


class ReadOnlyView(StaffModelView):
    """Evidence (builds, audit): nobody edits or deletes it through the UI."""

    can_create = can_edit = can_delete = False
    action_disallowed_list = ["delete"]


class AdminOnlyView(StaffModelView):
    allowed_roles = ("admin",)


class PlanView(AdminOnlyView):
    column_list = ("name", "slug", "included_sources", "is_default", "active", "updated_at")
    form_columns = ("name", "slug", "description", "included_sources", "monthly_price_cents",
                    "active")
    column_labels = {"included_sources": "Sources included (cap)"}
    can_delete = False

    @action("build_quick", "Quick memory update for every user",
            "Request a quick build for every user of these plans?")
    def action_build_quick(self, ids: list[str]) -> None:
        _request_for_plans(ids, "quick")

    @action("build_full", "Full memory rebuild for every user",
            "Request a full rebuild for every user of these plans?")
    def action_build_full(self, ids: list[str]) -> None:
        _request_for_plans(ids, "full")


def _request_for_users(ids: list[str], mode: str) -> None:
    from dashboard.memory.requests import request_build

    merged = 0
    for user_id in ids:
        merged += request_build(db.session, int(user_id), mode=mode, trigger="admin",
                                requested_by_id=current_user.id).merged
    db.session.commit()
    flash(f"{mode.capitalize()} build requested for {len(ids)} user(s)"
          + (f" ({merged} merged into builds already queued)" if merged else "") + ".",
          "success")


def _request_for_plans(ids: list[str], mode: str) -> None:
    from dashboard.memory.requests import request_builds_for_plan
    from dashboard.plans.models import Plan

    total = 0
    for plan in db.session.scalars(select(Plan).where(Plan.id.in_([int(i) for i in ids]))):
        for count in request_builds_for_plan(db.session, plan, mode=mode,
                                             requested_by_id=current_user.id):
            db.session.commit()  # a batch at a time: jobs flow while the fan-out goes on
            total += count
    flash(f"{mode.capitalize()} build requested for {total} user(s).", "success")


class UserView(AdminOnlyView):
    column_list = ("id", "email", "role", "plan", "active", "created_at")
    column_searchable_list = ("email",)
    column_filters = ("role", "active")
    form_columns = ("role", "plan", "active")
    can_create = can_delete = False
    # Staff pages never show content; a user row is ids, email, role, plan.
    column_details_list = ("id", "email", "display_name", "role", "plan", "active",
                           "created_at", "last_login_at")

    @action("build_quick", "Quick memory update", "Request a quick build for these users?")
    def action_build_quick(self, ids: list[str]) -> None:
        _request_for_users(ids, "quick")

    @action("build_full", "Full memory rebuild", "Request a full rebuild for these users?")
    def action_build_full(self, ids: list[str]) -> None:
        _request_for_users(ids, "full")


class BuildView(ReadOnlyView):
    column_list = ("id", "user_id", "mode", "trigger", "status", "added", "removed", "kept",
                   "embedded", "created_at", "finished_at")
    column_filters = ("status", "mode", "trigger", "user_id")
    column_default_sort = ("id", True)
    simple_list_pager = True


def init_admin(app: Flask) -> Admin:
    from dashboard.auth.models import User
    from dashboard.memory.models import MemoryBuild
    from dashboard.plans.models import Plan

    admin = Admin(
        app,
        name="OrbitPilot staff",
        url="/admin",
        index_view=StaffIndexView(url="/admin"),
        theme=Bootstrap4Theme(swatch="default"),
    )
    admin.add_view(PlanView(Plan, db, name="Plans"))
    admin.add_view(UserView(User, db, name="Users"))
    admin.add_view(BuildView(MemoryBuild, db, name="Builds", endpoint="builds"))
    return admin
