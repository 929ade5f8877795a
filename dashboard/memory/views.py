"""User-facing memory pages: Memory Status and "Update my memory now"."""

from __future__ import annotations

from flask import Blueprint, current_app, flash, redirect, render_template, url_for
from flask_login import current_user, login_required

from dashboard.extensions import db
from dashboard.memory.embedders import embedder_model_name
from dashboard.memory.requests import RateLimited, request_user_update
from dashboard.memory.settings import settings_from
from dashboard.memory.status import memory_status
from dashboard.plans.sentences import GUEST_INVITATION
from dashboard.plans.web import resolution_of

bp = Blueprint("memory", __name__, url_prefix="/memory")


@bp.route("/status")
def status():
    """The Memory Status page; a guest sees the invitation instead."""
    if not current_user.is_authenticated:
        return render_template("memory/guest.html", invitation=GUEST_INVITATION)
    # The request's cached plan: the chat notice on this page resolves the same one.
    resolution = resolution_of(current_user)
    settings = settings_from(current_app.config)
    page = memory_status(db.session, current_user, resolution=resolution,
                         embedder_name=embedder_model_name(settings.embedder))
    return render_template("memory/status.html", page=page,
                           interval=settings.user_build_interval)


@bp.route("/update", methods=["POST"])
@login_required
def update_now():
    """"Update my memory now": a quick build, at most once per interval."""
    try:
        asked = request_user_update(
            db.session, current_user,
            interval=settings_from(current_app.config).user_build_interval)
    except RateLimited as exc:
        flash(exc.sentence, "warning")
        return redirect(url_for("memory.status"), 303)
    db.session.commit()
    if asked.merged:
        flash("An update was already waiting for a worker; your request joined it.", "info")
    else:
        flash("Update requested: it waits for a worker, and this page shows when it runs.",
              "success")
    return redirect(url_for("memory.status"), 303)
