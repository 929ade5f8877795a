"""Flask-Admin: thin configuration over services. One ``StaffModelView`` base checks roles,
refuses malformed ids, pages and filters with a 4xx, and turns every save error into a
field error or a plain sentence — never exception text (which can quote SQL and its
parameters). Writes go through the domain services, never ``form.populate_obj``."""

from __future__ import annotations

import logging
import re
import uuid
from typing import Any

from flask import Flask, abort, flash, redirect, render_template, request, url_for
from flask_admin import Admin, AdminIndexView, expose
from flask_admin.actions import action
from flask_admin.contrib.sqla import ModelView
from flask_admin.contrib.sqla.filters import BaseSQLAFilter
from flask_admin.model.base import ViewArgs
from flask_admin.theme import Bootstrap4Theme
from flask_login import current_user
from flask_wtf import FlaskForm
from flask_wtf.form import _Auto
from markupsafe import Markup
from sqlalchemy import BigInteger, Integer, select
from sqlalchemy import inspect as sa_inspect
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import joinedload, selectinload
from wtforms import SelectField
from wtforms.fields import SelectChoice

from dashboard.audit.services import Actor
from dashboard.auth.models import ROLES
from dashboard.extensions import db
from dashboard.ids import INT4_MAX, INT8_MAX, parse_int

log = logging.getLogger(__name__)

SAVE_FAILED = "That change could not be saved, and nothing was changed. Try again."
MAX_PAGE = 1_000_000
_INT_LIMITS = {Integer: INT4_MAX, BigInteger: INT8_MAX}


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


def parse_key(model: type, raw: Any) -> Any:
    """The primary key ``raw`` names, or ``None`` when it cannot be one (not digits, out
    of the column's range, not a UUID)."""
    (column,) = sa_inspect(model).primary_key
    text = raw if isinstance(raw, str) else ""
    for kind, limit in _INT_LIMITS.items():
        if isinstance(column.type, kind):
            return parse_int(text, 0, limit)
    try:
        return uuid.UUID(text)
    except ValueError:
        return None


def _int_arg(name: str, minimum: int, maximum: int) -> None:
    raw = request.args.get(name)
    if raw is not None and parse_int(raw, minimum, maximum) is None:
        abort(400, f"The “{name}” value in the address is not valid.")


_OPERATIONS = {"create_view": "can_create", "edit_view": "can_edit",
               "delete_view": "can_delete", "details_view": "can_view_details",
               "export": "can_export"}


class StaffModelView(_RoleGate, ModelView):
    form_base_class = StaffForm
    page_size = 50
    can_view_details = True
    can_export = False

    def get_one(self, id: Any) -> Any:
        key = parse_key(self.model, id)
        found = db.session.get(self.model, key) if key is not None else None
        if found is None:
            abort(404, "There is no such record.")
        return found

    def _get_list_extra_args(self) -> ViewArgs:
        _int_arg("page", 0, MAX_PAGE)
        _int_arg("page_size", 1, max(self.page_size_options or (self.page_size,)))
        _int_arg("sort", 0, len(self._list_columns) - 1)
        _int_arg("desc", 0, 1)
        return super()._get_list_extra_args()

    def _get_list_filter_args(self) -> Any:
        for arg, value in request.args.items():
            if not arg.startswith("flt"):
                continue
            _, _, key = arg[3:].partition("_")
            known = (self._filter_args or {}).get(key)
            if known is None or not known[1].validate(value):
                abort(400, "A filter in the address is not one this list has, or its value "
                           "is not valid.")
        return super()._get_list_filter_args()

    def _handle_view(self, name: str, **kwargs: Any) -> Any:
        denied = super()._handle_view(name, **kwargs)  # the role gate first
        if denied is not None:
            return denied
        # An operation this list does not offer is no page at all (Flask-Admin would
        # redirect to the list as if something had happened).
        flag = _OPERATIONS.get(name)
        if (flag and not getattr(self, flag)) or \
                (name == "ajax_update" and not self.column_editable_list):
            abort(404, "This list has no such page.")
        if name == "action_view":
            chosen = request.form.get("action")
            if chosen not in self._actions_data or not self.is_action_allowed(chosen):
                abort(400, "There is no such action for this list.")
        # A record page with an empty id is a malformed address, not "back to the list".
        if name in ("edit_view", "details_view", "delete_view") and "id" in request.args \
                and not request.args["id"]:
            abort(404, "There is no such record.")
        return None

    def handle_view_exception(self, exc: Exception) -> bool:
        # Flask-Admin would flash str(exc): SQL, parameters, a password hash.
        if isinstance(exc, SQLAlchemyError):
            log.warning("admin save failed on %s: %s", self.endpoint, type(exc).__name__)
            flash(SAVE_FAILED, "error")
            return True
        return super().handle_view_exception(exc)

    def save_through(self, form: Any, apply, errors: tuple[type[Exception], ...]) -> bool:
        """Run a service call and commit; a refusal becomes a field error (or a plain
        sentence), any database failure a plain sentence."""
        try:
            result = apply()
            db.session.commit()
            return result
        except errors as exc:
            db.session.rollback()
            # ``errors`` are the services' own refusals: sentences written for people.
            field = getattr(form, getattr(exc, "field", None) or "", None)
            if field is not None:
                field.errors = [*field.errors, exc.sentence]
            else:
                flash(exc.sentence, "error")
        except SQLAlchemyError as exc:
            db.session.rollback()
            self.handle_view_exception(exc)
        return False

    def ids_from(self, raw_ids: list[str]) -> list[Any]:
        keys = [parse_key(self.model, raw) for raw in raw_ids]
        if not keys or any(key is None for key in keys):
            abort(400, "The selection holds a record id that is not valid.")
        return keys


class ReadOnlyView(StaffModelView):
    """Evidence (builds, audit): nobody edits or deletes it through the UI."""

    can_create = can_edit = can_delete = False
    action_disallowed_list = ["delete"]


class AdminOnlyView(StaffModelView):
    allowed_roles = ("admin",)


def _page_cache() -> dict[str, Any]:
    """Per-request data for the rows of a list page (counts computed in one query for
    the whole page, read by the column formatters). In the WSGI environ, like the plan
    cache: it lives exactly as long as the request."""
    return request.environ.setdefault("orbitpilot.admin_page", {})


def _labels(keys: Any) -> str:
    from dashboard.sources import get_source

    return ", ".join(get_source(key).label for key in keys) or "—"


class PlanView(AdminOnlyView):
    column_list = ("name", "slug", "included_sources", "users", "remembered", "evicted",
                   "is_default", "active", "updated_at")
    column_sortable_list = ("name", "slug", "included_sources", "is_default", "active",
                            "updated_at")
    column_filters = ("name", "included_sources", "is_default", "active")
    column_searchable_list = ("name", "slug")
    form_columns = ("name", "slug", "description", "included_sources", "monthly_price_cents",
                    "active")
    column_labels = {"included_sources": "Sources included (cap)",
                     "monthly_price_cents": "Monthly price (cents)",
                     "users": "Active users", "remembered": "Remembered",
                     "evicted": "Assigned but evicted by the cap"}
    column_descriptions = {
        "included_sources": "Changed on the Assignments page, where you see its impact first."}
    can_delete = False

    def get_query(self) -> Any:
        from dashboard.plans.models import Plan

        return super().get_query().options(selectinload(Plan.assignments))

    def get_list(self, *args: Any, **kwargs: Any) -> Any:
        from dashboard.plans.impact import count_active_users_by_plan

        count, plans = super().get_list(*args, **kwargs)
        _page_cache()["plan_users"] = count_active_users_by_plan(db.session)
        return count, plans

    def _resolution(self, plan: Any) -> Any:
        from dashboard.plans.services import UserPlan, resolve_sources

        resolutions = _page_cache().setdefault("resolutions", {})
        if plan.id not in resolutions:  # two columns show it
            resolutions[plan.id] = resolve_sources(UserPlan.from_plan(plan))
        return resolutions[plan.id]

    def _users(self, context: Any, plan: Any, name: str) -> Any:
        count = _page_cache().get("plan_users", {}).get(plan.id, 0)
        return Markup('<a href="{}">{}</a>').format(
            url_for("user.index_view", flt0_plan_equals=plan.id), count)

    def _remembered(self, context: Any, plan: Any, name: str) -> str:
        return _labels(self._resolution(plan).included_keys)

    def _evicted(self, context: Any, plan: Any, name: str) -> str:
        from dashboard.plans.services import SourceState

        return _labels(s.key for s in self._resolution(plan).sources
                       if s.state is SourceState.EVICTED_BY_CAP)

    def _cap(self, context: Any, plan: Any, name: str) -> Any:
        return Markup('{} <a href="{}#plan-{}">change…</a>').format(
            plan.included_sources, url_for("assignments.index"), plan.id)

    column_formatters = {"users": _users, "remembered": _remembered, "evicted": _evicted,
                         "included_sources": _cap}

    def edit_form(self, obj: Any = None) -> Any:
        # The cap of a plan in use changes on the Assignments page, through its impact
        # preview; a new plan has no users yet, so its form keeps the field.
        form = super().edit_form(obj)
        del form.included_sources
        return form

    def _fields(self, form: Any, model: Any = None):
        from dashboard.plans.editing import PlanFields

        return PlanFields(
            name=form.name.data or "", slug=form.slug.data or "",
            description=form.description.data or "",
            included_sources=model.included_sources if model is not None
            else form.included_sources.data,
            monthly_price_cents=form.monthly_price_cents.data
            if form.monthly_price_cents.data is not None else 0,
            active=bool(form.active.data),
        )

    def create_model(self, form: Any) -> Any:
        from dashboard.plans.editing import PlanError, create_plan

        return self.save_through(form, lambda: create_plan(db.session, self._fields(form),
                                                           actor=Actor.of(current_user)),
                                 (PlanError,))

    def update_model(self, form: Any, model: Any) -> bool:
        from dashboard.plans.editing import PlanError, update_plan

        return bool(self.save_through(
            form, lambda: update_plan(db.session, model, self._fields(form, model),
                                      actor=Actor.of(current_user)), (PlanError,)))

    @action("build_quick", "Quick memory update for every user",
            "Request a quick build for every user of these plans?")
    def action_build_quick(self, ids: list[str]) -> None:
        self._request_for_plans(self.ids_from(ids), "quick")

    @action("build_full", "Full memory rebuild for every user",
            "Request a full rebuild for every user of these plans?")
    def action_build_full(self, ids: list[str]) -> None:
        self._request_for_plans(self.ids_from(ids), "full")

    def _request_for_plans(self, ids: list[int], mode: str) -> None:
        from dashboard.memory.requests import request_plan_builds_by_staff

        plans = request_plan_builds_by_staff(db.session, ids, mode=mode,
                                             actor=Actor.of(current_user))
        db.session.commit()
        flash(f"A {mode} build will be requested for every user of {len(plans)} plan(s); "
              "they appear under Builds as they are requested.", "success")


class OnPlanFilter(BaseSQLAFilter):
    """Users on a plan (by id; the Plans list links here), the default plan's including
    those with no plan row. Flask-Admin reads filter options once at start-up, so a list
    of plan names would go stale: the id is asked for instead."""

    def __init__(self) -> None:
        from dashboard.auth.models import User

        super().__init__(User.plan_id, "Plan")

    def validate(self, value: Any) -> bool:
        return parse_int(value, 0, INT4_MAX) is not None

    def apply(self, query: Any, value: Any, alias: Any = None) -> Any:
        from dashboard.plans.services import effective_plan_id

        return query.filter(effective_plan_id() == int(value))

    def operation(self) -> str:
        return "equals"


class UserView(AdminOnlyView):
    column_list = ("id", "email", "role", "plan", "active", "builds", "created_at")
    column_sortable_list = ("id", "email", "role", "active", "created_at")
    column_searchable_list = ("email",)
    column_filters = ("role", "active", OnPlanFilter())
    named_filter_urls = True
    # The plan is chosen by id from the plans that exist, "" for the default plan: an id
    # that names no plan is "Not a valid choice", never quietly the default.
    form_columns = ("role", "plan_ref", "active")
    form_overrides = {"role": SelectField}
    form_args = {"role": {"choices": [SelectChoice(role, role.capitalize()) for role in ROLES]}}
    form_extra_fields = {"plan_ref": SelectField("Plan", choices=[])}
    can_create = can_delete = False
    # Staff pages never show content; a user row is ids, email, role, plan.
    column_details_list = ("id", "email", "role", "plan", "active", "builds", "created_at",
                           "last_login_at")

    def get_query(self) -> Any:
        from dashboard.auth.models import User

        return super().get_query().options(joinedload(User.plan))

    def _plan(self, context: Any, user: Any, name: str) -> str:
        return user.plan.name if user.plan is not None else "the default plan"

    def _builds(self, context: Any, user: Any, name: str) -> Any:
        return Markup('<a href="{}">builds</a> · <a href="{}">why remembered?</a>').format(
            url_for("builds.index_view", flt0_user_id_equals=user.id),
            url_for("support.trace", user_id=user.id))

    column_formatters = {"plan": _plan, "builds": _builds}
    column_formatters_detail = column_formatters

    def edit_form(self, obj: Any = None) -> Any:
        from dashboard.plans.models import Plan

        form = super().edit_form(obj)
        plans = db.session.scalars(select(Plan).order_by(Plan.name)).all()
        form.plan_ref.choices = [SelectChoice("", "The default plan"),
                                 *(SelectChoice(str(plan.id), plan.name) for plan in plans)]
        if not form.is_submitted() and obj is not None:
            form.plan_ref.data = str(obj.plan_id) if obj.plan_id else ""
        return form

    def update_model(self, form: Any, model: Any) -> bool:
        from dashboard.auth.services import AccountError, update_account

        plan_id = int(form.plan_ref.data) if form.plan_ref.data else None
        return bool(self.save_through(form, lambda: update_account(
            db.session, model, role=form.role.data, plan_id=plan_id,
            active=bool(form.active.data), actor=Actor.of(current_user)), (AccountError,)))

    @action("build_quick", "Quick memory update", "Request a quick build for these users?")
    def action_build_quick(self, ids: list[str]) -> None:
        self._request_for_users(self.ids_from(ids), "quick")

    @action("build_full", "Full memory rebuild", "Request a full rebuild for these users?")
    def action_build_full(self, ids: list[str]) -> None:
        self._request_for_users(self.ids_from(ids), "full")

    def _request_for_users(self, ids: list[int], mode: str) -> None:
        from dashboard.auth.models import User
        from dashboard.memory.requests import request_builds_by_staff

        existing = db.session.scalars(select(User.id).where(User.id.in_(ids))).all()
        requests = request_builds_by_staff(db.session, existing, mode=mode,
                                           actor=Actor.of(current_user))
        db.session.commit()
        merged = sum(r.merged for r in requests)
        flash(f"{mode.capitalize()} build requested for {len(requests)} user(s)"
              + (f" ({merged} merged into builds already queued)" if merged else "") + ".",
              "success")


class ApiKeyView(AdminOnlyView):
    """Keys are listed and revoked here; the secret itself was shown once, to its owner,
    and only its hash is stored (and never shown)."""

    can_create = can_edit = can_delete = False
    action_disallowed_list = ["delete"]
    column_list = ("id", "owner.email", "name", "prefix", "scopes", "created_at",
                   "expires_at", "last_used_at", "revoked_at")
    column_details_list = column_list
    column_labels = {"owner.email": "Owner"}
    column_sortable_list = ("id", "created_at", "last_used_at", "revoked_at")
    column_filters = ("owner.email", "prefix", "revoked_at", "expires_at")
    column_searchable_list = ("prefix", "name")
    column_default_sort = ("id", True)
    named_filter_urls = True

    def get_query(self) -> Any:
        from dashboard.xmemo.models import ApiKey

        return super().get_query().options(joinedload(ApiKey.owner))

    @action("revoke", "Revoke", "Revoke these keys? Clients using them stop working at once.")
    def action_revoke(self, ids: list[str]) -> None:
        from dashboard.xmemo.keys import revoke_key
        from dashboard.xmemo.models import ApiKey

        keys = db.session.scalars(select(ApiKey).where(ApiKey.id.in_(self.ids_from(ids)))
                                  .with_for_update()).all()
        revoked = sum(revoke_key(db.session, key, actor=Actor.of(current_user))
                      for key in keys)
        db.session.commit()
        flash(f"Revoked {revoked} key(s)" + (f"; {len(keys) - revoked} already were."
                                             if revoked < len(keys) else "."), "success")

    @action("grant_hard_delete", "Grant memory:hard_delete",
            "Grant these keys irreversible erasure (memory:hard_delete)?")
    def action_grant_hard_delete(self, ids: list[str]) -> None:
        from dashboard.xmemo.keys import grant_hard_delete
        from dashboard.xmemo.models import ApiKey

        keys = db.session.scalars(select(ApiKey).where(ApiKey.id.in_(self.ids_from(ids)))
                                  .with_for_update()).all()
        granted = sum(grant_hard_delete(db.session, key, actor=Actor.of(current_user))
                      for key in keys)
        db.session.commit()
        flash(f"Granted memory:hard_delete to {granted} key(s)"
              + (f"; {len(keys) - granted} already had it or are revoked."
                 if granted < len(keys) else "."), "success")


def _duration(view: Any, context: Any, build: Any, name: str) -> str:
    if build.started_at is None or build.finished_at is None:
        return ""
    return f"{(build.finished_at - build.started_at).total_seconds():.1f} s"


def _build_user(view: Any, context: Any, build: Any, name: str) -> Any:
    return Markup('<a href="{}">{}</a>').format(
        url_for("support.trace", user_id=build.user_id), build.user.email)


def _resolution_table(view: Any, context: Any, build: Any, name: str) -> Any:
    return Markup(render_template("admin/builds/_resolution.html", build=build))


class BuildView(ReadOnlyView):
    column_list = ("id", "user.email", "status", "mode", "trigger", "added", "removed", "kept",
                   "embedded", "duration", "error", "created_at", "finished_at")
    column_details_list = ("id", "user_id", "user.email", "status", "mode", "trigger",
                           "requested_by_id", "attempts", "added", "removed", "kept",
                           "embedded", "reused", "duration", "resolution", "error",
                           "embedding_model", "created_at", "started_at", "inputs_read_at",
                           "finished_at")
    column_labels = {"user.email": "User", "resolution": "Sources (as this build resolved "
                                                         "them; chunks per source)"}
    column_sortable_list = ("id", "created_at", "finished_at")
    column_filters = ("status", "mode", "trigger", "user_id", "user.email", "created_at")
    named_filter_urls = True
    column_default_sort = ("id", True)
    simple_list_pager = True
    column_formatters = {"duration": _duration, "user.email": _build_user}
    column_formatters_detail = {**column_formatters, "resolution": _resolution_table}

    def get_query(self) -> Any:
        from dashboard.memory.models import MemoryBuild

        return super().get_query().options(joinedload(MemoryBuild.user))


class ForgetMarkerView(ReadOnlyView):
    """Every forget, redact, hard delete and restore (§8): ids, states, counts and the
    audit event — never content. The reason is left out too: it is free text the owner
    or their client typed, and staff pages show no text a user wrote."""

    column_list = ("id", "created_at", "mode", "memory_id", "owner.email", "actor_type",
                   "actor_id", "from_status", "to_status", "version", "removed_versions",
                   "removed_chunks", "audit_event_id", "vacuum_due", "vacuumed_at")
    column_details_list = ("id", "created_at", "mode", "memory_id", "owner_id", "owner.email",
                           "actor_type", "actor_id", "from_status", "to_status", "version",
                           "removed_versions", "removed_chunks", "audit_event_id",
                           "vacuum_due", "vacuumed_at")
    column_labels = {"owner.email": "Owner", "removed_versions": "Versions removed",
                     "removed_chunks": "Chunks removed", "audit_event_id": "Audit event"}
    column_sortable_list = ("id", "created_at")
    column_filters = ("mode", "owner_id", "owner.email", "actor_type", "vacuumed_at",
                      "created_at")
    named_filter_urls = True
    column_default_sort = ("id", True)
    simple_list_pager = True

    def get_query(self) -> Any:
        from dashboard.xmemo.models import ForgetMarker

        return super().get_query().options(joinedload(ForgetMarker.owner))


# Flask-Admin writes two kinds of inline handler, which the app's CSP refuses (and
# Chromium reports even when nothing runs them): an action menu item runs
# ``modelActions.execute('<name>')``, a filter menu item returns false. Rewritten here into
# markup that static/admin-csp.js handles; tests/browser checks no inline handler is left.
_ACTION_HANDLER = re.compile(r'onclick="return modelActions\.execute\(\'([A-Za-z0-9_]+)\'\);"')
_NOOP_HANDLER = ' onclick="return false;"'


def without_inline_handlers(response: Any) -> Any:
    if not request.path.startswith("/admin") or response.mimetype != "text/html" \
            or response.direct_passthrough:
        return response
    html = response.get_data(as_text=True)
    if "onclick=" in html:
        html = _ACTION_HANDLER.sub(r'data-model-action="\1"', html).replace(_NOOP_HANDLER, "")
        response.set_data(html)
    return response


def init_admin(app: Flask) -> Admin:
    from dashboard.admin.assignments import AssignmentView
    from dashboard.audit.models import AuditEvent
    from dashboard.audit.views import AuditEventView
    from dashboard.auth.models import User
    from dashboard.memory.models import MemoryBuild
    from dashboard.plans.models import Plan
    from dashboard.security import csp_nonce
    from dashboard.support.views import SupportView
    from dashboard.xmemo.models import ApiKey, ForgetMarker

    admin = Admin(
        app,
        name="OrbitPilot staff",
        url="/admin",
        index_view=StaffIndexView(url="/admin"),
        theme=Bootstrap4Theme(swatch="default"),
        csp_nonce_generator=csp_nonce,
    )
    admin.add_view(PlanView(Plan, db, name="Plans"))
    admin.add_view(UserView(User, db, name="Users"))
    admin.add_view(AssignmentView(name="Assignments", endpoint="assignments",
                                  url="/admin/assignments"))
    admin.add_view(ApiKeyView(ApiKey, db, name="API keys", endpoint="api_keys"))
    admin.add_view(BuildView(MemoryBuild, db, name="Builds", endpoint="builds"))
    admin.add_view(AuditEventView(AuditEvent, db, name="Audit log", endpoint="audit"))
    admin.add_view(ForgetMarkerView(ForgetMarker, db, name="Erasure markers",
                                    endpoint="markers"))
    admin.add_view(SupportView(name="Support", endpoint="support", url="/support"))
    app.after_request(without_inline_handlers)
    return admin
