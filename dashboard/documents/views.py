"""Uploaded documents (text and markdown)."""

from __future__ import annotations

from flask import Blueprint, render_template
from flask_login import login_required

bp = Blueprint("documents", __name__, url_prefix="/documents")


@bp.route("/")
@login_required
def index():
    return render_template("documents/index.html")
