"""Evidence jobs: a report, a drill (ids only)."""

from __future__ import annotations

from dashboard import memory
from dashboard.evidence.drill import run_drill as drill
from dashboard.evidence.report import make_report
from dashboard.evidence.web import inputs_for
from dashboard.extensions import db
from jobs import job_app


def run_report(report_id: int) -> str | None:
    app = job_app()
    with app.app_context():
        db.engine.dispose(close=False)  # a forked work horse: no inherited connections
        try:
            report = make_report(db.session, report_id, inputs_for(app),
                                 commit=db.session.commit)
            return report.status if report is not None else None
        finally:
            db.session.remove()


def run_drill(drill_id: int) -> str | None:
    app = job_app()
    with app.app_context():
        db.engine.dispose(close=False)
        try:
            done = drill(db.session, drill_id, engine=db.engine,
                         settings=memory.settings_from(app.config), commit=db.session.commit)
            return done.status if done is not None else None
        finally:
            db.session.remove()
