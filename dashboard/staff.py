"""The staff console's bases: the role gate, and ``StaffModelView``, which refuses
malformed ids, pages and filters with a 4xx, turns every save error into a field error or
a plain sentence (never exception text), and hides operations a list lacks (404). Also the
rewrite of Flask-Admin's inline handlers, which the app's CSP refuses."""

from __future__ import annotations

import logging
import re
import uuid
from datetime import UTC, datetime
from typing import Any

from flask import abort, flash, redirect, request, url_for
from flask_admin.contrib.sqla import ModelView
from flask_admin.contrib.sqla.filters import FilterEqual
from flask_admin.model import typefmt
from flask_admin.model.base import ViewArgs
from flask_login import current_user
from flask_wtf import FlaskForm
from flask_wtf.form import _Auto
from jinja2 import pass_context
from markupsafe import Markup
from sqlalchemy import BigInteger, Integer
from sqlalchemy import inspect as sa_inspect
from sqlalchemy.exc import SQLAlchemyError

from dashboard.extensions import db
from dashboard.ids import INT4_MAX, INT8_MAX, parse_int
from dashboard.roles import STAFF_ROLES

log = logging.getLogger(__name__)

SAVE_FAILED = "That change could not be saved, and nothing was changed. Try again."
MAX_PAGE = 1_000_000
_INT_LIMITS = {Integer: INT4_MAX, BigInteger: INT8_MAX}


class RoleGate:
    """403 for a signed-in user without the role, a sign-in redirect otherwise."""

    allowed_roles: tuple[str, ...] = STAFF_ROLES

    def is_accessible(self) -> bool:
        return current_user.is_authenticated and current_user.role in self.allowed_roles

    def inaccessible_callback(self, name, **kwargs):
        if current_user.is_authenticated:
            abort(403)
        return redirect(url_for("auth.signin", next=request.full_path))


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


class CodeEquals(FilterEqual):
    """Exact match on a short code column; empty, over-long or (with fixed options) an
    unknown value is not a valid filter (400)."""

    def __init__(self, column: Any, name: str, *, max_length: int,
                 choices: tuple[str, ...] | dict[str, str] | None = None,
                 strict: bool = True) -> None:
        """``choices``: the values offered (a dict: value → the words shown); not
        ``strict``: an address may name another value too (an action of an older
        release stays findable in the log)."""
        labels = choices if isinstance(choices, dict) else {c: c for c in choices or ()}
        options = [(value, f"{label} ({value})" if label != value else value)
                   for value, label in labels.items()] or None
        super().__init__(column, name, options=options)
        self.max_length = max_length
        self.choices = tuple(labels) if strict and labels else None

    def validate(self, value: Any) -> bool:
        return isinstance(value, str) and 0 < len(value) <= self.max_length and \
            (self.choices is None or value in self.choices)


def utc_text(moment: datetime | None, *, precise: bool = False) -> str:
    """Every staff time in one format with its zone; ``precise``: the exact stored value."""
    if moment is None:
        return ""
    moment = moment.astimezone(UTC)
    if precise:
        return moment.isoformat(timespec="microseconds")
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC")


def moment_cell(view: Any, value: datetime, name: str) -> Markup:
    """A time to the second, the exact value on hover (and for machines, ``datetime``)."""
    exact = utc_text(value, precise=True)
    return Markup('<time datetime="{}" title="{}">{}</time>').format(
        exact, exact, utc_text(value))


# A value with an unbroken run longer than this (an email, a UUID, a hash, a dotted code)
# is cut short in a list, so that the list fits the screen with every word whole.
LONG_RUN = 20
_RUN = re.compile(rf"[^\s]{{{LONG_RUN + 1},}}")


def abbreviated(text: str) -> Markup:
    """``text`` cut short by the stylesheet (``.op-trunc``: an ellipsis), the whole of it
    one hover away (``title``) and in the page itself: selected and copied whole, read
    whole by a screen reader, found by the browser's search."""
    return Markup('<span class="op-trunc" title="{}">{}</span>').format(text, text)


def list_cell(value: Any) -> Any:
    """A list's plain text value, abbreviated when a run of it would widen its column
    past the screen; anything else (numbers, the formatters' markup) as it is."""
    if isinstance(value, uuid.UUID):
        value = str(value)
    if isinstance(value, str) and not isinstance(value, Markup) and _RUN.search(value):
        return abbreviated(value)
    return value


class StaffModelView(RoleGate, ModelView):
    form_base_class = StaffForm
    column_type_formatters = {**typefmt.BASE_FORMATTERS, datetime: moment_cell}
    column_type_formatters_detail = {**typefmt.DETAIL_FORMATTERS, datetime: moment_cell}
    # An export keeps the exact value (a file for tools).
    column_type_formatters_export = {**typefmt.EXPORT_FORMATTERS,
                                     datetime: lambda view, value, name: utc_text(
                                         value, precise=True)}
    page_size = 50
    can_view_details = True
    can_export = False

    @pass_context
    def get_list_value(self, context: Any, model: Any, name: str) -> Any:
        return list_cell(super().get_list_value(context, model, name))

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
