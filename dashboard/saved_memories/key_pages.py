"""``/settings/keys``: a signed-in user's own API keys — list, create (the secret shown
once), revoke (with a confirmation page that works without JS).

The secret is rendered straight into the response to the creating POST: it never goes
into the session, a flash message, a redirect URL or a log line, and that response says
``Cache-Control: no-store`` so neither the browser nor a proxy keeps a copy. Reloading
the list shows the key's prefix only. Ids travel as ``?id=``; a malformed id or someone
else's key is a 404."""

from __future__ import annotations

from datetime import UTC, date, datetime, time, timedelta

from flask import Blueprint, flash, make_response, redirect, render_template, request, url_for
from flask_login import current_user, login_required
from flask_wtf import FlaskForm
from werkzeug.exceptions import NotFound
from wtforms import DateField, SelectMultipleField, StringField
from wtforms.fields import SelectChoice
from wtforms.validators import Optional
from wtforms.widgets import CheckboxInput, ListWidget

from dashboard.access import Reach, TeamTerms, reach_of, team_terms
from dashboard.audit.services import Actor
from dashboard.extensions import db
from dashboard.ids import parse_id
from dashboard.refusals import FieldError
from dashboard.saved_memories import keys
from dashboard.saved_memories.models import ApiKey

bp = Blueprint("keys", __name__, url_prefix="/settings/keys")

NOT_FOUND = "There is no such API key among yours."


class KeyForm(FlaskForm):
    # The service validates names and scopes; the form only carries values.
    name = StringField("Name", render_kw={"maxlength": keys.MAX_NAME,
                                          "placeholder": "e.g. ChatGPT connector"})
    scopes = SelectMultipleField(
        "Scopes", choices=[SelectChoice(scope, scope) for scope in keys.USER_SCOPES],
        default=["memory:read"], validate_choice=False,
        widget=ListWidget(prefix_label=False), option_widget=CheckboxInput())
    expires_at = DateField("Expires after (optional)", validators=[Optional()])
    # Choices: the teams the owner is in (``_with_teams``); none ticked unless chosen.
    teams = SelectMultipleField("Teams it may act for", choices=[], coerce=str,
                                validate_choice=False, widget=ListWidget(prefix_label=False),
                                option_widget=CheckboxInput())


def _with_teams(form: KeyForm, reach: Reach) -> dict[int, int | None]:
    """Offer the owner's teams as boxes; answers each team's longest key lifetime."""
    seats = sorted(reach.seats.values(), key=lambda seat: (seat.name, seat.team_id))
    form.teams.choices = [SelectChoice(str(seat.team_id), seat.name) for seat in seats]
    return {team_id: terms.max_key_days
            for team_id, terms in team_terms(db.session, reach.seats).items()}


def _expiry(day: date | None) -> datetime | None:
    """The key works through ``day`` (UTC) and stops at the midnight after it."""
    if day is None:
        return None
    try:
        return datetime.combine(day + timedelta(days=1), time(0), tzinfo=UTC)
    except OverflowError:
        raise FieldError("Choose an earlier date.", "expires_at") from None


def _own_or_404(raw_id: object, *, lock: bool = False) -> ApiKey:
    key = keys.find_own_key(db.session, parse_id(raw_id), owner_id=current_user.id, lock=lock)
    if key is None:
        raise NotFound(NOT_FOUND)
    return key


def key_teams(key: ApiKey, named: dict[int, TeamTerms], reach: Reach
              ) -> list[tuple[str, str | None]]:
    """The teams a key names, by name, each with why it does not act for it now (its
    owner left, or it lives longer than the team allows since), if so."""
    out = []
    for team_id in key.team_ids:
        terms = named.get(team_id)
        if terms is None:
            continue  # a team that no longer exists
        note = None
        if team_id not in reach.seats:
            note = "you are no longer in it"
        elif terms.max_key_days is not None and (
                key.expires_at is None
                or key.expires_at > key.created_at + timedelta(days=terms.max_key_days)):
            note = f"it lives longer than the team's {terms.max_key_days} days"
        out.append((terms.name, note))
    return sorted(out)


def _render_index(form: KeyForm, status: int = 200):
    reach = reach_of(db.session, current_user.id)
    limits = _with_teams(form, reach)
    listed = keys.list_keys(db.session, owner_id=current_user.id)
    named = team_terms(db.session, {t for key in listed for t in key.team_ids})
    return render_template("settings/keys.html", form=form, now=datetime.now(UTC),
                           keys=listed, limits=limits,
                           teams_of={key.id: key_teams(key, named, reach) for key in listed}
                           ), status


@bp.route("/", methods=["GET", "POST"])
@login_required
def index():
    """The user's keys and the create form; POST creates a key and shows its secret."""
    form = KeyForm()
    if request.method != "POST":  # GET and HEAD show; only a POST changes
        return _render_index(form)
    if not form.validate_on_submit():
        return _render_index(form, 400)
    try:
        key, secret = keys.create_key(
            db.session, owner=current_user, name=form.name.data or "",
            scopes=form.scopes.data or [], expires_at=_expiry(form.expires_at.data),
            actor=Actor.of(current_user), team_ids=form.teams.data or [])
    except FieldError as exc:
        getattr(form, exc.field).errors.append(exc.sentence)
        return _render_index(form, 400)
    named = team_terms(db.session, key.team_ids)
    db.session.commit()
    response = make_response(render_template("settings/keys_created.html", key=key,
                                             secret=secret, named=named))
    response.headers["Cache-Control"] = "no-store"
    response.headers["Pragma"] = "no-cache"
    return response


@bp.route("/revoke/", methods=["GET", "POST"])
@login_required
def revoke():
    """GET asks for confirmation; POST revokes (at once: clients using it get 401)."""
    key = _own_or_404(request.args.get("id"), lock=request.method == "POST")
    if request.method != "POST":  # GET and HEAD show; only a POST changes
        return render_template("settings/keys_revoke.html", key=key)
    if keys.revoke_key(db.session, key, actor=Actor.of(current_user)):
        flash(f"Key {key.prefix} revoked. Clients using it stop working at once.", "success")
    else:
        flash(f"Key {key.prefix} was already revoked.", "info")
    db.session.commit()
    return redirect(url_for("keys.index"))
