"""What the user's own pages are told about retention and legal holds: a template
function, so the Memory Status page (an engine page) reads it without the engine
importing this domain."""

from __future__ import annotations

from typing import Any

from flask import Flask
from flask_login import current_user

from dashboard.extensions import db
from dashboard.plans.web import request_plans
from dashboard.retention.services import RetentionNotice, retention_notice


def notice_for_current_user() -> RetentionNotice | None:
    plan = request_plans().of(current_user)
    if plan is None:
        return None
    return retention_notice(db.session, current_user.id, plan.restore_window_days)


def init_app(app: Flask) -> None:
    @app.context_processor
    def inject_retention() -> dict[str, Any]:
        return {"retention_notice": notice_for_current_user}
