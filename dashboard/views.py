"""Pages that belong to no single domain: the home page and the health check."""

from __future__ import annotations

from flask import Blueprint, jsonify, render_template
from flask_login import current_user
from sqlalchemy import text

from dashboard.extensions import db
from dashboard.plans.sentences import state_sentence
from dashboard.plans.services import resolve_build_sources

bp = Blueprint("main", __name__)


@bp.route("/")
def index():
    """Home: for a signed-in user, what their plan remembers; for a guest, the invitation."""
    if not current_user.is_authenticated:
        return render_template("index.html", resolution=None, rows=[])
    resolution = resolve_build_sources(current_user)
    rows = [(source, state_sentence(source, resolution)) for source in resolution.sources]
    return render_template("index.html", resolution=resolution, rows=rows)


@bp.route("/healthz")
def healthz():
    """Liveness for load balancers: the database answers."""
    db.session.execute(text("SELECT 1"))
    return jsonify(status="ok")
