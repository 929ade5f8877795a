"""Pages that belong to no single domain: the home page and the health check."""

from __future__ import annotations

import logging

from flask import Blueprint, current_app, jsonify, redirect, render_template, request, url_for
from flask_login import current_user
from sqlalchemy import text

from dashboard.extensions import db
from dashboard.forms import same_site_path
from dashboard.memory import embedder_loaded, warm_in_background
from dashboard.plans.sentences import state_sentence
from dashboard.plans.web import resolution_of
from dashboard.queues import redis_client

log = logging.getLogger(__name__)
bp = Blueprint("main", __name__)


@bp.route("/")
def index():
    """Home: for a signed-in user, what their plan remembers; for a guest, the invitation."""
    if not current_user.is_authenticated:
        return render_template("index.html", resolution=None, rows=[])
    resolution = resolution_of(current_user)
    rows = [(source, state_sentence(source, resolution)) for source in resolution.sources]
    return render_template("index.html", resolution=resolution, rows=rows)


@bp.route("/signin")
@bp.route("/login")
def signin_elsewhere():
    """The addresses people type for signing in: a 302 to the sign-in page (temporary, so
    no browser keeps it should either address become a page), with ``next`` kept when it
    is a path on this site (never an open redirect)."""
    return redirect(url_for("auth.signin", next=same_site_path(request.args.get("next"))),
                    302)


def _check(probe) -> str:
    """"ok" or "unavailable": the kind of failure goes to the log only (the answer is
    public, and an exception's message can carry a URL)."""
    try:
        probe()
        return "ok"
    except Exception as exc:
        log.warning("health check failed: %s", type(exc).__name__)
        return "unavailable"


def _postgres() -> None:
    try:
        db.session.execute(text("SELECT 1"))
    finally:
        db.session.rollback()


def _redis() -> None:
    if not redis_client().ping():
        raise ConnectionError("no PONG")


@bp.route("/healthz")
def healthz():
    """For load balancers and people: each component answers, or 503 naming the ones
    that do not; "warming" (503 too) while this process loads the embedding model, which
    the run command's web workers do before they serve."""
    components = {"postgres": _check(_postgres), "redis": _check(_redis)}
    setting = current_app.config["EMBEDDER"]
    components["embedder"] = "ok" if embedder_loaded(setting) else "warming"
    if components["embedder"] == "warming":
        warm_in_background(setting)
    down = [name for name in ("postgres", "redis") if components[name] != "ok"]
    status = "unavailable" if down else components["embedder"]
    body = {"status": status, "components": components}
    if down:
        body["unavailable"] = down
    return jsonify(body), 200 if status == "ok" else 503
