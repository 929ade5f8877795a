"""The export pages: a person's (ask, a POST from Memory Status; watch it being made;
download it, a POST: the download is audited, and only a POST writes), a team's for its
owners and admins (``/teams/<slug>/export``: the state and a button; the team pages link
here), and a person's request to erase what they saved to teams (a confirm page, a POST)."""

from __future__ import annotations

from typing import Any

from flask import (
    Blueprint,
    Response,
    abort,
    current_app,
    flash,
    jsonify,
    redirect,
    render_template,
    request,
    stream_with_context,
    url_for,
)
from flask_login import current_user, login_required

from dashboard.errors import refusal_status
from dashboard.exports.services import (
    ExportGone,
    ExportNotFound,
    ExportTooSoon,
    erase_team_contributions,
    erasure_receipts_of,
    export_parts,
    find_export,
    is_expired,
    latest_export,
    open_download,
    open_team_download,
    request_export,
    request_team_export,
    team_contributions,
    team_export_for,
)
from dashboard.extensions import db
from dashboard.refusals import Refusal, TooSoon

bp = Blueprint("exports", __name__)


@bp.route("/memory/export", methods=["POST"])
@login_required
def ask() -> Any:
    try:
        export, new = request_export(db.session, current_user,
                                     interval=current_app.config["EXPORT_INTERVAL_SECONDS"])
    except ExportTooSoon as exc:
        # To the export asked for last: ready, it is one click away (else its page says
        # what became of it).
        latest = find_export(db.session, current_user.id, str(exc.latest_id))
        ready = _state(latest) == "ready"
        flash(("Your last export is ready: download it below. " if ready else "")
              + exc.sentence, "info" if ready else "warning")
        return redirect(url_for("exports.show", export_id=latest.id), 303)
    db.session.commit()
    if not new:
        flash("An export is already being prepared: this is it.", "info")
    return redirect(url_for("exports.show", export_id=export.id), 303)


def _state(export: Any) -> str:
    return "expired" if export.status == "ready" and is_expired(export) else export.status


@bp.route("/memory/export/<export_id>")
@login_required
def show(export_id: str) -> Any:
    try:
        export = find_export(db.session, current_user.id, export_id)
    except ExportNotFound:
        abort(404)
    state = _state(export)
    if request.args.get("format") == "json":
        return jsonify({"id": export.id, "status": state, "progress": export.progress})
    return render_template("memory/export.html", export=export, state=state)


def _zip(export: Any, name: str) -> Response:
    parts = export_parts(lambda: db.session, export.id)
    return Response(stream_with_context(parts), mimetype="application/zip", headers={
        "Content-Disposition": f'attachment; filename="{name}"',
        "Content-Length": str(export.size_bytes), "Cache-Control": "no-store"})


@bp.route("/memory/export/<export_id>/download", methods=["POST"])
@login_required
def download(export_id: str) -> Any:
    try:
        export = open_download(db.session, current_user, export_id)
    except ExportGone as exc:
        abort(410, exc.sentence)
    except ExportNotFound:
        abort(404)
    db.session.commit()
    return _zip(export, f"orbitpilot-export-{export.id}.zip")


# -- a team's export ----------------------------------------------------------------------------

def _team_or_refuse(slug: str) -> Any:
    """The team and its account, or the refusal's page: 404 alike for a team that does
    not exist and one the person is not in, 403 for a member or reader."""
    try:
        return team_export_for(db.session, current_user, slug)
    except Refusal as exc:
        abort(refusal_status(exc), exc.sentence)


@bp.route("/teams/<slug>/export", methods=["GET"])
@login_required
def team(slug: str) -> Any:
    team, account = _team_or_refuse(slug)
    export = latest_export(db.session, account.id)
    state = _state(export) if export is not None else None
    if request.args.get("format") == "json":
        return jsonify({"id": export.id if export else None, "status": state,
                        "progress": export.progress if export else 0})
    return render_template("exports/team.html", team=team, export=export, state=state)


@bp.route("/teams/<slug>/export", methods=["POST"])
@login_required
def team_ask(slug: str) -> Any:
    try:
        _, export, new = request_team_export(
            db.session, current_user, slug,
            interval=current_app.config["EXPORT_INTERVAL_SECONDS"])
    except TooSoon as exc:
        flash(exc.sentence, "warning")
        return redirect(url_for("exports.team", slug=slug), 303)
    except Refusal as exc:
        abort(refusal_status(exc), exc.sentence)
    db.session.commit()
    if not new:
        flash("An export of this team is already being prepared: this is it.", "info")
    return redirect(url_for("exports.team", slug=slug), 303)


@bp.route("/teams/<slug>/export/<export_id>/download", methods=["POST"])
@login_required
def team_download(slug: str, export_id: str) -> Any:
    team, _ = _team_or_refuse(slug)
    try:
        export = open_team_download(db.session, current_user, slug, export_id)
    except ExportGone as exc:
        abort(410, exc.sentence)
    except ExportNotFound:
        abort(404)
    db.session.commit()
    return _zip(export, f"orbitpilot-team-{team.slug}-export-{export.id}.zip")


# -- "erase what I saved to teams" --------------------------------------------------------------

@bp.route("/memory/teams/erase", methods=["GET"])
@login_required
def erase_contributions() -> Any:
    return render_template(
        "exports/erase_contributions.html",
        contributions=team_contributions(db.session, current_user.id),
        receipts=erasure_receipts_of(db.session, current_user.id))


@bp.route("/memory/teams/erase", methods=["POST"])
@login_required
def erase_contributions_confirm() -> Any:
    receipts = erase_team_contributions(db.session, current_user)
    db.session.commit()
    pending = sum(1 for r in receipts if r.pending)
    done = len(receipts) - pending
    if receipts:
        flash(f"Erased {done} memor{'y' if done == 1 else 'ies'} you saved to teams"
              + (f"; {pending} wait for a legal hold to end (recall stopped at once)"
                 if pending else "") + ". The receipts are below.", "success")
    else:
        flash("There was nothing left to erase: the receipts of what was erased are below.",
              "info")
    return redirect(url_for("exports.erase_contributions") + "#receipts", 303)
