"""Export jobs: ids only."""

from __future__ import annotations

from dashboard.exports import build_export
from dashboard.extensions import db
from jobs import job_app


def run_export(export_id: int) -> str:
    app = job_app()
    with app.app_context():
        db.engine.dispose(close=False)  # a forked work horse: no inherited connections
        try:
            return build_export(db.session, export_id)
        finally:
            db.session.remove()
