"""OrbitPilot Memory Dashboard. ``create_app`` builds the Flask app (``dashboard.app``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # every module of the package runs this file first: it stays light
    from flask import Flask


def create_app(config: Mapping[str, Any] | None = None) -> Flask:
    """The app: defaults, then the environment, then ``config``."""
    # Here, not at the top: small processes (the embedded servers' guard) must not load
    # the whole app.
    from dashboard.app import build_app

    return build_app(config)
