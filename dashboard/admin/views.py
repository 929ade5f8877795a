"""Flask-Admin: thin configuration over services. One ``StaffModelView`` base checks roles."""

from __future__ import annotations

from flask import Flask, abort, redirect, request, url_for
from flask_admin import Admin, AdminIndexView, expose
from flask_admin.contrib.sqla import ModelView
from flask_admin.theme import Bootstrap4Theme
from flask_login import current_user

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


class StaffModelView(_RoleGate, ModelView):
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


class UserView(AdminOnlyView):
    column_list = ("id", "email", "role", "plan", "active", "created_at")
    column_searchable_list = ("email",)
    column_filters = ("role", "active")
    form_columns = ("role", "plan", "active")
    can_create = can_delete = False
    # Staff pages never show content; a user row is ids, email, role, plan.
    column_details_list = ("id", "email", "display_name", "role", "plan", "active",
                           "created_at", "last_login_at")


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
