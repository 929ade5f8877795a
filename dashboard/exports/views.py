"""The user's export pages: ask (a POST from Memory Status), watch it being made, and
download it (a POST: the download is audited, and only a POST writes)."""

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

from dashboard.exports.services import (
    ExportGone,
    ExportNotFound,
    export_parts,
    find_export,
    is_expired,
    open_download,
    request_export,
)
from dashboard.extensions import db
from dashboard.refusals import TooSoon

bp = Blueprint("exports", __name__, url_prefix="/memory/export")


@bp.route("", methods=["POST"])
@login_required
def ask() -> Any:
    try:
        export, new = request_export(db.session, current_user,
                                     interval=current_app.config["EXPORT_INTERVAL_SECONDS"])
    except TooSoon as exc:
        flash(exc.sentence, "warning")
        return redirect(url_for("memory.status"), 303)
    db.session.commit()
    if not new:
        flash("An export is already being prepared: this is it.", "info")
    return redirect(url_for("exports.show", export_id=export.id), 303)


def _state(export: Any) -> str:
    return "expired" if export.status == "ready" and is_expired(export) else export.status


@bp.route("/<export_id>")
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


@bp.route("/<export_id>/download", methods=["POST"])
@login_required
def download(export_id: str) -> Any:
    try:
        export = open_download(db.session, current_user, export_id)
    except ExportGone as exc:
        abort(410, exc.sentence)
    except ExportNotFound:
        abort(404)
    db.session.commit()
    name = f"orbitpilot-export-{export.id}.zip"
    parts = export_parts(lambda: db.session, export.id)
    return Response(stream_with_context(parts), mimetype="application/zip", headers={
        "Content-Disposition": f'attachment; filename="{name}"',
        "Content-Length": str(export.size_bytes), "Cache-Control": "no-store"})
