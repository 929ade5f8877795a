"""User-facing memory actions."""

from __future__ import annotations

from flask import Blueprint, flash, redirect, render_template, request, url_for
from flask_login import current_user, login_required

from dashboard.extensions import db
from dashboard.memory.requests import RateLimited, request_user_update

bp = Blueprint("memory", __name__, url_prefix="/memory")


@bp.route("/status")
@login_required
def status():
    """The Memory Status page (§4)."""
    return render_template("memory/status.html")


@bp.route("/update", methods=["POST"])
@login_required
def update_now():
    """"Update my memory now": a quick build, at most once a minute."""
    try:
        request_user_update(db.session, current_user)
    except RateLimited as exc:
        flash(str(exc), "warning")  # RateLimited is our own sentence, with the wait
        return redirect(url_for("main.index")), 303
    db.session.commit()
    flash("Your memory will be updated in a moment.", "success")
    return redirect(request.referrer if request.referrer and
                    request.referrer.startswith(request.host_url) else url_for("main.index"),
                    303)
