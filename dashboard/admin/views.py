"""Flask-Admin: thin configuration over services. Writes go through the domain services,
never ``form.populate_obj``; staff pages show ids, states, counts, never content."""

from __future__ import annotations

from typing import Any

from flask import flash, render_template, request, url_for
from flask_admin.actions import action
from flask_admin.contrib.sqla.filters import BaseSQLAFilter
from flask_login import current_user
from markupsafe import Markup
from sqlalchemy import select
from sqlalchemy.orm import joinedload, selectinload
from wtforms import SelectField
from wtforms.fields import SelectChoice

from dashboard.audit.services import Actor
from dashboard.auth.models import ROLES, User
from dashboard.auth.services import AccountError, update_account
from dashboard.connectors.models import OAuthGrant
from dashboard.connectors.services import grant_hard_delete as grant_connection_hard_delete
from dashboard.connectors.services import revoke_grant
from dashboard.extensions import db
from dashboard.ids import INT4_MAX, parse_int
from dashboard.memory import (
    BUILD_STATUSES,
    BUILD_TRIGGERS,
    RECORD_MODES,
    MemoryBuild,
    request_builds_by_staff,
    request_plan_builds_by_staff,
)
from dashboard.plans.editing import PlanError, PlanFields, create_plan, update_plan
from dashboard.plans.impact import count_active_users_by_plan
from dashboard.plans.models import Plan
from dashboard.plans.services import SourceState, UserPlan, effective_plan_id, resolve_sources
from dashboard.saved_memories.keys import grant_hard_delete, revoke_key
from dashboard.saved_memories.models import FORGET_MODES, ApiKey, ForgetMarker
from dashboard.sources import get_source
from dashboard.staff import AdminOnlyView, CodeEquals, ReadOnlyView, abbreviated


def _page_cache() -> dict[str, Any]:
    """Per-request data for the rows of a list page (counts computed in one query for
    the whole page, read by the column formatters). In the WSGI environ, like the plan
    cache: it lives exactly as long as the request."""
    return request.environ.setdefault("orbitpilot.admin_page", {})


def _labels(keys: Any) -> str:
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
        return super().get_query().options(selectinload(Plan.assignments))

    def get_list(self, *args: Any, **kwargs: Any) -> Any:
        count, plans = super().get_list(*args, **kwargs)
        _page_cache()["plan_users"] = count_active_users_by_plan(db.session)
        return count, plans

    def _resolution(self, plan: Any) -> Any:
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
        return self.save_through(form, lambda: create_plan(db.session, self._fields(form),
                                                           actor=Actor.of(current_user)),
                                 (PlanError,))

    def update_model(self, form: Any, model: Any) -> bool:
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
        super().__init__(User.plan_id, "Plan")

    def validate(self, value: Any) -> bool:
        return parse_int(value, 0, INT4_MAX) is not None

    def apply(self, query: Any, value: Any, alias: Any = None) -> Any:
        return query.filter(effective_plan_id() == int(value))

    def operation(self) -> str:
        return "equals"


_DEFAULT_NAME = "orbitpilot.default_plan_name"


class UserView(AdminOnlyView):
    """People and teams' accounts (``kind``): a team's account owns the team's memory and
    nobody signs in as it, so it gets no staff role; its trace is the team's."""

    column_list = ("id", "email", "kind", "role", "plan", "active", "builds", "created_at")
    column_sortable_list = ("id", "email", "kind", "role", "active", "created_at")
    column_searchable_list = ("email",)
    column_filters = ("role", CodeEquals(User.kind, "Kind", max_length=8,
                                         choices={"person": "Person", "team": "Team account"}),
                      "active", OnPlanFilter())
    named_filter_urls = True
    # The plan is chosen by id from the plans that exist, "" for the default plan: an id
    # that names no plan is "Not a valid choice", never quietly the default.
    form_columns = ("role", "plan_ref", "active")
    form_overrides = {"role": SelectField}
    form_args = {"role": {"choices": [SelectChoice(role, role.capitalize()) for role in ROLES]}}
    form_extra_fields = {"plan_ref": SelectField("Plan", choices=[])}
    can_create = can_delete = False
    # Staff pages never show content; a user row is ids, email, role, plan.
    column_details_list = ("id", "email", "kind", "role", "plan", "active", "builds",
                           "created_at", "last_login_at")
    column_labels = {"kind": "Kind"}

    def get_query(self) -> Any:
        return super().get_query().options(joinedload(User.plan))

    def _plan(self, context: Any, user: Any, name: str) -> str:
        """The plan by the name the Plans list uses; one without names the default."""
        if user.plan is not None:
            return user.plan.name
        if _DEFAULT_NAME not in request.environ:  # once a page, and only if needed
            request.environ[_DEFAULT_NAME] = db.session.scalar(
                select(Plan.name).where(Plan.is_default))
        default = request.environ[_DEFAULT_NAME]
        return f"{default} (the default)" if default else "the default plan"

    def _builds(self, context: Any, user: Any, name: str) -> Any:
        trace = url_for("support.team", team_id=user.id) if user.kind == "team" \
            else url_for("support.trace", user_id=user.id)
        return Markup('<a href="{}">builds</a> · <a href="{}">why remembered?</a>').format(
            url_for("builds.index_view", flt0_user_id_equals=user.id), trace)

    def _kind(self, context: Any, user: Any, name: str) -> Any:
        if user.kind == "team":
            return Markup('<span class="badge badge-info" data-kind="team">team account'
                          '</span>')
        return Markup('<span data-kind="person">person</span>')

    column_formatters = {"plan": _plan, "builds": _builds, "kind": _kind}
    column_formatters_detail = column_formatters

    def edit_form(self, obj: Any = None) -> Any:
        form = super().edit_form(obj)
        plans = db.session.scalars(select(Plan).order_by(Plan.name)).all()
        default = next((plan.name for plan in plans if plan.is_default), None)
        form.plan_ref.choices = [SelectChoice("", f"The default plan ({default})" if default
                                              else "The default plan"),
                                 *(SelectChoice(str(plan.id), plan.name) for plan in plans)]
        if not form.is_submitted() and obj is not None:
            form.plan_ref.data = str(obj.plan_id) if obj.plan_id else ""
        return form

    def update_model(self, form: Any, model: Any) -> bool:
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
        existing = db.session.scalars(select(User.id).where(User.id.in_(ids))).all()
        requests = request_builds_by_staff(db.session, existing, mode=mode,
                                           actor=Actor.of(current_user))
        db.session.commit()
        merged = sum(r.merged for r in requests)
        flash(f"{mode.capitalize()} build requested for {len(requests)} user(s)"
              + (f" ({merged} merged into builds already queued)" if merged else "") + ".",
              "success")


class ApiKeyView(AdminOnlyView):
    """Keys are listed and revoked here, by id and prefix; the secret itself was shown
    once, to its owner, and only its hash is stored (and never shown). The name is the
    owner's own words: only their key page shows it, and it is not searchable here."""

    can_create = can_edit = can_delete = False
    action_disallowed_list = ["delete"]
    column_list = ("id", "owner.email", "prefix", "scopes", "created_at", "expires_at",
                   "last_used_at", "revoked_at")
    column_details_list = column_list
    column_labels = {"owner.email": "Owner"}
    column_sortable_list = ("id", "created_at", "last_used_at", "revoked_at")
    column_filters = ("owner.email", "prefix", "revoked_at", "expires_at")
    column_searchable_list = ("prefix",)
    column_default_sort = ("id", True)
    named_filter_urls = True

    def get_query(self) -> Any:
        return super().get_query().options(joinedload(ApiKey.owner))

    @action("revoke", "Revoke", "Revoke these keys? Clients using them stop working at once.")
    def action_revoke(self, ids: list[str]) -> None:
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
        keys = db.session.scalars(select(ApiKey).where(ApiKey.id.in_(self.ids_from(ids)))
                                  .with_for_update()).all()
        granted = sum(grant_hard_delete(db.session, key, actor=Actor.of(current_user))
                      for key in keys)
        db.session.commit()
        flash(f"Granted memory:hard_delete to {granted} key(s)"
              + (f"; {len(keys) - granted} already had it or are revoked."
                 if granted < len(keys) else "."), "success")


class ConnectionView(AdminOnlyView):
    """Connected apps per user: the app's own name, what it may do, how often it called
    and how many items it was handed (counts only: never what it read). Revoking cuts
    the app off at its next call."""

    can_create = can_edit = can_delete = False
    action_disallowed_list = ["delete"]
    column_list = ("id", "user.email", "client.name", "client.kind", "scopes", "created_at",
                   "last_used_at", "calls", "revoked_at", "revoked_by")
    column_details_list = column_list
    column_labels = {"user.email": "User", "client.name": "App", "client.kind": "Identified by"}
    column_formatters = {"client.kind": lambda v, c, m, n: "metadata document"
                         if m.client.kind == "document" else "self-registration (unverified)"}
    column_sortable_list = ("id", "created_at", "last_used_at", "calls", "revoked_at")
    column_filters = ("user.email", "revoked_at")
    column_default_sort = ("id", True)
    named_filter_urls = True

    def get_query(self) -> Any:
        return super().get_query().options(joinedload(OAuthGrant.user),
                                           joinedload(OAuthGrant.client))

    @action("revoke", "Disconnect", "Disconnect these apps? Their next call fails.")
    def action_revoke(self, ids: list[str]) -> None:
        grants = db.session.scalars(select(OAuthGrant).where(
            OAuthGrant.id.in_(self.ids_from(ids))).with_for_update()).all()
        revoked = sum(revoke_grant(db.session, grant, actor=Actor.of(current_user), by="admin")
                      for grant in grants)
        db.session.commit()
        flash(f"Disconnected {revoked} app(s)" + (f"; {len(grants) - revoked} already were."
                                                  if revoked < len(grants) else "."), "success")

    @action("grant_hard_delete", "Allow memory:hard_delete",
            "Let these apps erase memories for good (memory:hard_delete)?")
    def action_grant_hard_delete(self, ids: list[str]) -> None:
        grants = db.session.scalars(select(OAuthGrant).where(
            OAuthGrant.id.in_(self.ids_from(ids))).with_for_update()).all()
        granted = sum(grant_connection_hard_delete(db.session, grant,
                                                   actor=Actor.of(current_user))
                      for grant in grants)
        db.session.commit()
        flash(f"Allowed memory:hard_delete for {granted} app(s)"
              + (f"; {len(grants) - granted} already had it or are disconnected."
                 if granted < len(grants) else "."), "success")


def _duration(view: Any, context: Any, build: Any, name: str) -> str:
    if build.started_at is None or build.finished_at is None:
        return ""
    return f"{(build.finished_at - build.started_at).total_seconds():.1f} s"


def _build_user(view: Any, context: Any, build: Any, name: str) -> Any:
    return Markup('<a href="{}">{}</a>').format(
        url_for("support.trace", user_id=build.user_id), abbreviated(build.user.email))


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
    column_filters = (
        CodeEquals(MemoryBuild.status, "Status", max_length=12, choices=BUILD_STATUSES),
        CodeEquals(MemoryBuild.mode, "Mode", max_length=8, choices=RECORD_MODES),
        CodeEquals(MemoryBuild.trigger, "Trigger", max_length=24, choices=BUILD_TRIGGERS),
        "user_id", "user.email", "created_at")
    named_filter_urls = True
    column_default_sort = ("id", True)
    simple_list_pager = True
    column_formatters = {"duration": _duration, "user.email": _build_user}
    column_formatters_detail = {**column_formatters, "resolution": _resolution_table}

    def get_query(self) -> Any:
        return super().get_query().options(joinedload(MemoryBuild.user))


class ForgetMarkerView(ReadOnlyView):
    """Every forget, redact, hard delete and restore: ids, states, counts and the
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
    column_filters = (
        CodeEquals(ForgetMarker.mode, "Mode", max_length=16, choices=FORGET_MODES),
        "owner_id", "owner.email",
        CodeEquals(ForgetMarker.actor_type, "Actor type", max_length=16,
                   choices=("api_key", "user", "admin", "support", "system")),
        "vacuumed_at", "created_at")
    named_filter_urls = True
    column_default_sort = ("id", True)
    simple_list_pager = True

    def get_query(self) -> Any:
        return super().get_query().options(joinedload(ForgetMarker.owner))
