"""Blinks: the user's notes, each readable by the AI or excluded from its memory.

Ids travel as ``?id=`` (pages) or a form field (the eye), as on the staff pages: a
malformed or foreign id is a 404, never a database error. Every write is a service call
that flushes; ``memory.changes`` requests the owner's build in the same transaction and
this view commits it."""

from __future__ import annotations

from flask import Blueprint, flash, jsonify, redirect, render_template, request, url_for
from flask_login import current_user, login_required
from flask_wtf import FlaskForm
from werkzeug.exceptions import BadRequest, NotFound
from wtforms import StringField, TextAreaField

from dashboard.blinks import services
from dashboard.blinks.models import Blink
from dashboard.blinks.services import MAX_CONTENT, MAX_TITLE
from dashboard.errors import problem
from dashboard.extensions import db
from dashboard.forms import delete_page, owned_or_404, same_site_path, save_form
from dashboard.plans.web import sentence_for
from dashboard.sources import BLINKS

bp = Blueprint("blinks", __name__, url_prefix="/blinks")

NOT_FOUND = "There is no such Blink among yours."
BAD_EXCLUDED = "The field excluded must be 1 (exclude from AI memory) or 0 (let the AI read it)."


@bp.app_template_global("blink_memory_label")
def blink_memory_label(excluded: bool, plan_reads: bool = True) -> str:
    """The eye's words, for the partial wherever it is included."""
    return services.memory_label(bool(excluded), plan_reads)


@bp.app_template_global("blinks_on_plan")
def blinks_on_plan() -> tuple[bool, str]:
    """Whether the person's plan remembers Blinks, and the sentence Memory Status gives
    for it: the request's one resolution (no query once the page read the plan)."""
    source, sentence = sentence_for(current_user, BLINKS)
    return source.remembered, sentence


class BlinkForm(FlaskForm):
    # The service validates (it is what Catch calls too); the form only carries values.
    title = StringField("Title (optional)", render_kw={"maxlength": MAX_TITLE})
    content = TextAreaField("Blink", render_kw={"rows": 4, "maxlength": MAX_CONTENT})


def _page_number() -> int:
    return request.args.get("page", 1, type=int)


def _owned(raw_id: object) -> Blink:
    return owned_or_404(db.session, Blink, raw_id, current_user.id, NOT_FOUND)


def _safe_next(target: str | None) -> str:
    """A same-site path to return to, or the Blinks list."""
    return same_site_path(target) or url_for("blinks.index")


def _render_index(form: BlinkForm, status: int = 200):
    page = services.list_blinks(db.session, user_id=current_user.id, page=_page_number())
    source, sentence = sentence_for(current_user, BLINKS)
    next_url = url_for("blinks.index", page=page.page) if page.page > 1 else None
    return render_template("blink/index.html", form=form, page=page, source=source,
                           sentence=sentence, next_url=next_url), status


@bp.route("/", methods=["GET", "POST"])
@login_required
def index():
    """The list, newest first, with the form for a new Blink (POST creates one)."""
    form = BlinkForm()
    if request.method != "POST":  # GET and HEAD show; only a POST changes
        return _render_index(form)
    saved = save_form(form, lambda: services.create_blink(
        db.session, user_id=current_user.id, title=form.title.data or "",
        content=form.content.data or ""), saved="Blink saved.", endpoint="blinks.index")
    return saved if saved is not None else _render_index(form, 400)


@bp.route("/edit/", methods=["GET", "POST"])
@login_required
def edit():
    blink = _owned(request.args.get("id"))
    form = BlinkForm(obj=blink)
    if request.method == "POST":
        saved = save_form(form, lambda: services.update_blink(
            db.session, blink, title=form.title.data or "", content=form.content.data or ""),
            saved="Blink updated.", endpoint="blinks.index")
        if saved is not None:
            return saved
        return render_template("blink/edit.html", form=form, blink=blink), 400
    return render_template("blink/edit.html", form=form, blink=blink)


@bp.route("/delete/", methods=["GET", "POST"])
@login_required
def delete():
    """GET asks for confirmation (works without JS); POST deletes (``delete_page``)."""
    blink = _owned(request.args.get("id"))
    return delete_page(confirm=lambda: render_template("blink/delete.html", blink=blink),
                       delete=lambda: services.delete_blink(db.session, blink),
                       noun="Blink", endpoint="blinks.index")


def _parse_excluded(raw: str | None) -> bool | None:
    if raw is None or raw == "":
        return None  # no state asked for: flip
    if raw in ("1", "true"):
        return True
    if raw in ("0", "false"):
        return False
    raise BadRequest(BAD_EXCLUDED)


@bp.route("/remember/", methods=["POST"])
@login_required
def toggle_memory():
    """The eye: form field ``blink_id``, optional ``excluded`` (the state asked for; absent:
    flip) and ``format=json``. JSON answers ``{"blink_id", "excluded_from_memory",
    "label"}``; a plain form is redirected back with a flash message."""
    as_json = request.values.get("format") == "json"
    try:
        blink = _owned(request.form.get("blink_id"))
        excluded = _parse_excluded(request.form.get("excluded"))
    except (NotFound, BadRequest) as exc:
        if as_json:
            return problem(exc.code, exc.name, exc.description)
        raise
    services.set_excluded(db.session, blink, excluded)
    plan_reads, sentence = blinks_on_plan()
    # Read before the commit expires the row (a refresh would be one more query).
    result = {"blink_id": blink.id, "excluded_from_memory": blink.excluded_from_memory,
              "read": plan_reads and not blink.excluded_from_memory,
              "label": services.memory_label(blink.excluded_from_memory, plan_reads)}
    db.session.commit()
    if as_json:
        return jsonify(result)
    flash(f"{result['label']}: this takes effect at your next memory update." if plan_reads
          else f"Your choice is kept. {sentence}", "success")
    return redirect(_safe_next(request.form.get("next")))
