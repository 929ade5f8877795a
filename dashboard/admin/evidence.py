"""The deployment's evidence report in the staff console, for admins: ask for one (a job
with progress), run the deletion/export drill, download (a POST: audited)."""

from __future__ import annotations

from typing import Any

from flask import abort, current_app, flash, jsonify, redirect, request, url_for
from flask_admin import BaseView, expose
from flask_login import current_user

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
from dashboard.evidence.views import download_response
from dashboard.evidence.web import signing_key
from dashboard.extensions import db
from dashboard.staff import RoleGate


class EvidenceView(RoleGate, BaseView):
    allowed_roles = ("admin",)

    def is_visible(self) -> bool:
        # Reached from the staff home: the menu keeps to one line on a laptop.
        return False

    @expose("/")
    def index(self) -> Any:
        reports = reports_of(db.session, None, limit=10)
        latest = reports[0] if reports else None
        if request.args.get("format") == "json":
            return jsonify({"id": latest.id if latest else None,
                            "status": latest.status if latest else None,
                            "progress": latest.progress if latest else 0})
        return self.render("admin/evidence/index.html", reports=reports, latest=latest,
                           drill=last_drill(db.session, None), downloads=DOWNLOADS,
                           key_path=KEY_PATH, key_id=signing_key(current_app).key_id())

    @expose("/report", methods=["POST"])
    def ask(self) -> Any:
        _, new = request_report(db.session, current_user)
        db.session.commit()
        if not new:
            flash("A report is already being made: this is it.", "info")
        return redirect(url_for(".index"), 303)

    @expose("/drill", methods=["POST"])
    def drill(self) -> Any:
        _, new = request_drill(db.session, current_user)
        db.session.commit()
        flash("The drill is running on the sandbox account." if new
              else "A drill is already running: this is it.", "info")
        return redirect(url_for(".index"), 303)

    @expose("/<report_id>/<fmt>", methods=["POST"])
    def download(self, report_id: str, fmt: str) -> Any:
        try:
            data, media, name = open_download(db.session, current_user, report_id, fmt,
                                              team_id=None, key=signing_key(current_app))
        except ReportNotFound:
            abort(404)
        db.session.commit()
        return download_response(data, media, name)
