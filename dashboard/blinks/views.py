"""Blinks: the user's notes, each readable by the AI or excluded from its memory."""

from __future__ import annotations

from flask import Blueprint, render_template
from flask_login import login_required

bp = Blueprint("blinks", __name__, url_prefix="/blinks")


@bp.route("/")
@login_required
def index():
    return render_template("blink/index.html")
