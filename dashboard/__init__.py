"""OrbitPilot Memory Dashboard. ``create_app`` builds the Flask app (``dashboard.app``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flask import Flask


def create_app(config: Mapping[str, Any] | None = None) -> Flask:
    """The app: defaults, then the environment, then ``config``."""
    # Here, not at the top: every module of the package runs this file first, and small
    # processes (the embedded servers' guard) must not load the whole app.
    from dashboard.app import build_app

    return build_app(config)
