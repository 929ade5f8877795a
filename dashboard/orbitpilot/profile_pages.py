"""The profile-facts editor: key/value pairs such as "city" or "preferred language", which
together make the user's profile (the ``orbitpilot.profile`` source).

Ids travel as ``?id=``: a malformed or foreign id is a 404. Services flush;
``memory.changes`` requests the owner's build in the same transaction and this view
commits it."""

from __future__ import annotations

from flask import Blueprint, render_template, request
from flask_login import current_user, login_required
from flask_wtf import FlaskForm
from wtforms import StringField

from dashboard.extensions import db
from dashboard.forms import delete_page, owned_or_404, save_form
from dashboard.orbitpilot import profile_services as services
from dashboard.orbitpilot.models import ProfileFact
from dashboard.orbitpilot.profile_services import MAX_KEY, MAX_VALUE
from dashboard.plans.web import sentence_for
from dashboard.sources import PROFILE

bp = Blueprint("profile", __name__, url_prefix="/profile")

NOT_FOUND = "There is no such fact in your profile."


class FactForm(FlaskForm):
    # The service validates; the form only carries values.
    key = StringField("Fact", render_kw={"maxlength": MAX_KEY, "placeholder": "city"})
    value = StringField("Value", render_kw={"maxlength": MAX_VALUE, "placeholder": "Lyon"})


def _owned(raw_id: object) -> ProfileFact:
    return owned_or_404(db.session, ProfileFact, raw_id, current_user.id, NOT_FOUND)


def _render_index(form: FactForm, status: int = 200):
    facts = services.list_facts(db.session, user_id=current_user.id)
    source, sentence = sentence_for(current_user, PROFILE)
    return render_template("profile/index.html", form=form, facts=facts, source=source,
                           sentence=sentence, max_facts=services.MAX_FACTS), status


@bp.route("/", methods=["GET", "POST"])
@login_required
def index():
    """The facts, by key, with the form for a new one (POST adds it)."""
    form = FactForm()
    if request.method != "POST":  # GET and HEAD show; only a POST changes
        return _render_index(form)
    saved = save_form(form, lambda: services.add_fact(
        db.session, user_id=current_user.id, key=form.key.data or "",
        value=form.value.data or ""), saved="Fact added to your profile.",
        endpoint="profile.index")
    return saved if saved is not None else _render_index(form, 400)


@bp.route("/edit/", methods=["GET", "POST"])
@login_required
def edit():
    fact = _owned(request.args.get("id"))
    fact_id = fact.id
    form = FactForm(obj=fact)
    if request.method == "POST":
        saved = save_form(form, lambda: services.update_fact(
            db.session, fact, key=form.key.data or "", value=form.value.data or ""),
            saved="Fact updated.", endpoint="profile.index")
        if saved is not None:
            return saved
        return render_template("profile/edit.html", form=form, fact_id=fact_id), 400
    return render_template("profile/edit.html", form=form, fact_id=fact_id)


@bp.route("/delete/", methods=["GET", "POST"])
@login_required
def delete():
    """GET asks for confirmation (works without JS); POST deletes (``delete_page``)."""
    fact = _owned(request.args.get("id"))
    return delete_page(confirm=lambda: render_template("profile/delete.html", fact=fact),
                       delete=lambda: services.delete_fact(db.session, fact),
                       noun="Profile fact", endpoint="profile.index")
