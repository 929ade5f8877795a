"""Evidence pages: a team's (``/teams/<slug>/evidence``, its owners only: ask for a
report, run a drill, download — a POST, audited), the public key at a well-known URL and
the report's JSON Schema (GETs, public, changing nothing)."""

from __future__ import annotations

from pathlib import Path
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
    url_for,
)
from flask_login import current_user, login_required

from dashboard.errors import refusal_status
from dashboard.evidence.checks import last_drill
from dashboard.evidence.drill import request_drill
from dashboard.evidence.formats import KEY_PATH
from dashboard.evidence.report import (
    DOWNLOADS,
    ReportNotFound,
    open_download,
    reports_of,
    request_report,
)
from dashboard.evidence.web import signing_key
from dashboard.extensions import db
from dashboard.refusals import Refusal
from dashboard.teams.models import Team, TeamMember
from dashboard.teams.services import team_for

bp = Blueprint("evidence", __name__)
SCHEMA_PATH = Path(__file__).resolve().parent / "report_schema.json"
OWNERS_ONLY = "Only the team's owners can see and make its evidence report."


def _owned_team(slug: str) -> tuple[Team, TeamMember]:
    """The team, if the signed-in person owns it: 404 alike for no team and not a
    member; 403 for any other role."""
    try:
        team, member = team_for(db.session, current_user.id, slug)
    except Refusal as exc:
        abort(refusal_status(exc), exc.sentence)
    if member.role != "owner":
        abort(403, OWNERS_ONLY)
    return team, member


def download_response(data: bytes, media: str, name: str) -> Response:
    response = Response(data, mimetype=media.split(";")[0])
    if "charset" in media:
        response.charset = "utf-8"
    response.headers["Content-Disposition"] = f'attachment; filename="{name}"'
    response.headers["Cache-Control"] = "no-store"
    return response


@bp.route(KEY_PATH)
def public_key() -> Response:
    response = Response(signing_key(current_app).public_pem(), mimetype="application/x-pem-file")
    response.headers["Cache-Control"] = "public, max-age=3600"
    return response


@bp.route("/evidence/report-schema.json")
def report_schema() -> Response:
    return Response(SCHEMA_PATH.read_bytes(), mimetype="application/schema+json")


@bp.route("/teams/<slug>/evidence", methods=["GET"])
@login_required
def team(slug: str) -> Any:
    team, member = _owned_team(slug)
    reports = reports_of(db.session, team.id, limit=5)
    latest = reports[0] if reports else None
    drill = last_drill(db.session, team.id)
    if request.args.get("format") == "json":
        return jsonify({"id": latest.id if latest else None,
                        "status": latest.status if latest else None,
                        "progress": latest.progress if latest else 0})
    return render_template("evidence/team.html", team=team, seat=member, reports=reports,
                           latest=latest, drill=drill, downloads=DOWNLOADS, key_path=KEY_PATH)


@bp.route("/teams/<slug>/evidence", methods=["POST"])
@login_required
def team_ask(slug: str) -> Any:
    team, _ = _owned_team(slug)
    _, new = request_report(db.session, current_user, team=team)
    db.session.commit()
    if not new:
        flash("A report of this team is already being made: this is it.", "info")
    return redirect(url_for("evidence.team", slug=slug), 303)


@bp.route("/teams/<slug>/evidence/drill", methods=["POST"])
@login_required
def team_drill(slug: str) -> Any:
    team, _ = _owned_team(slug)
    _, new = request_drill(db.session, current_user, team=team)
    db.session.commit()
    flash("The drill is running on the sandbox account: its receipts appear here and in "
          "the next report." if new else "A drill is already running: this is it.", "info")
    return redirect(url_for("evidence.team", slug=slug), 303)


@bp.route("/teams/<slug>/evidence/<report_id>/<fmt>", methods=["POST"])
@login_required
def team_download(slug: str, report_id: str, fmt: str) -> Any:
    team, _ = _owned_team(slug)
    try:
        data, media, name = open_download(db.session, current_user, report_id, fmt,
                                          team_id=team.id, key=signing_key(current_app))
    except ReportNotFound:
        abort(404)
    db.session.commit()
    return download_response(data, media, name)
