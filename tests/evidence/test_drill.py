"""The deletion/export drill, for real: committed rows (a VACUUM sees only those), a real
build and recall, a hard delete, probes, a VACUUM, an export. And a drill that cannot
erase (a legal hold on the sandbox) fails, and the report's drill check with it."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import delete, select

from dashboard.audit.models import AuditEvent
from dashboard.auth.models import User
from dashboard.evidence import checks
from dashboard.evidence.drill import SANDBOX_EMAIL, STEPS, run_drill, sandbox_account
from dashboard.evidence.models import EvidenceDrill
from dashboard.extensions import db
from dashboard.holds.models import LegalHold
from dashboard.memory import settings_from


@pytest.fixture
def real(app, queue):
    """The app's own session: every commit is real. The sandbox account (with what
    cascades from it) and the drills are deleted afterwards."""
    with app.app_context():
        try:
            yield db.session
        finally:
            db.session.rollback()
            db.session.execute(delete(EvidenceDrill))
            db.session.execute(delete(User).where(User.email == SANDBOX_EMAIL))
            db.session.commit()
            db.session.remove()


def drill(app, session) -> EvidenceDrill:
    row = EvidenceDrill(status="queued", steps=[])
    session.add(row)
    session.commit()
    return run_drill(session, row.id, engine=db.engine, settings=settings_from(app.config),
                     commit=session.commit)


def test_the_drill_saves_recalls_erases_and_the_export_shows_it_gone(app, real, probes):
    first_event = real.scalar(select(AuditEvent.seq).order_by(AuditEvent.seq.desc())
                              .limit(1)) or 0
    done = drill(app, real)
    assert [s["step"] for s in done.steps] == list(STEPS)
    assert all(s["ok"] for s in done.steps), done.steps
    assert (done.status, done.ok) == ("ready", True)
    steps = {s["step"]: s for s in done.steps}
    assert steps["probe"]["rows_left"] == {"memories": 0, "versions": 0, "chunks": 0}
    assert steps["export"]["words_found"] is False
    # Receipts and audit events: ids, counts, times — not the synthetic words.
    events = real.scalars(select(AuditEvent).where(AuditEvent.seq > first_event)).all()
    assert {"memory.create", "memory.hard_delete", "evidence.drill"} <= {
        e.action for e in events}
    blob = json.dumps(done.steps) + json.dumps([e.details for e in events])
    assert "Evidence drill" not in blob and "synthetic" not in blob
    check = checks.check_drill(checks.Context(real, app.config, probes))
    assert check.passed, check.summary


def test_a_drill_that_cannot_erase_fails_and_so_does_its_check(app, real, probes):
    sandbox = sandbox_account(real)
    real.add(LegalHold(user_id=sandbox.id, reason="drill test"))
    real.commit()
    done = drill(app, real)
    assert (done.status, done.ok) == ("failed", False)
    assert [(s["step"], s["ok"]) for s in done.steps] == [
        ("save", True), ("recall", True), ("hard_delete", False)]
    assert done.steps[-1]["pending_hold"] is True
    check = checks.check_drill(checks.Context(real, app.config, probes))
    assert (check.passed, check.summary) == (False, "The last drill failed at: hard_delete.")


def test_the_drill_command_runs_it_and_says_each_step(app, real):
    result = app.test_cli_runner().invoke(args=["evidence", "drill"])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == [f"  {step}: ok" for step in STEPS] + [
        result.output.splitlines()[-1]]
    assert result.output.splitlines()[-1].endswith(": passed.")
