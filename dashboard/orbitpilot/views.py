"""Chat with OrbitPilot (§5)."""

from __future__ import annotations

from flask import Blueprint, render_template

bp = Blueprint("orbitpilot", __name__, url_prefix="/orbitpilot")


@bp.route("/")
def chat():
    return render_template("orbitpilot/chat.html")
