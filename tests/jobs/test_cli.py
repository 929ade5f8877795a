"""``flask worker`` and ``flask builds``: jobs/ registers them through the flask.commands
entry point (the app never imports jobs), and each does what it says, audited."""

from __future__ import annotations

import pytest
from flask.cli import FlaskGroup, ScriptInfo
from sqlalchemy import select

from dashboard.audit.models import AuditEvent
from dashboard.memory import MemoryBuild
from tests.factories import builds_of, default_plan, make_plan, make_user, settle


@pytest.fixture
def flask_cli(app, runner):
    """The ``flask`` command as a shell runs it: the app's commands and the plugins'."""
    group = FlaskGroup(create_app=lambda: app, add_default_commands=False,
                       load_dotenv=False, set_debug_flag=False)

    def invoke(*args: str):
        return runner.invoke(group, list(args), obj=ScriptInfo(create_app=lambda: app))

    return invoke


def test_the_worker_and_build_commands_come_from_the_entry_point(app, flask_cli):
    assert "worker" not in app.cli.commands and "builds" not in app.cli.commands
    listed = flask_cli("--help")
    assert listed.exit_code == 0, listed.output
    assert "worker" in listed.output and "builds" in listed.output
    assert "sweep" in flask_cli("builds", "--help").output


def test_builds_request_for_one_user_queues_and_audits(flask_cli, db_session, queue):
    user = make_user(db_session, email="cli-build@example.test")
    result = flask_cli("builds", "request", "--user", user.email, "--mode", "full")
    assert result.exit_code == 0, result.output
    (build,) = builds_of(db_session, user.id)
    assert (build.status, build.mode, build.trigger) == ("queued", "full", "admin")
    assert result.output.strip() == f"{user.email}: queued as build {build.id}"
    event = db_session.scalars(select(AuditEvent).where(AuditEvent.action == "build.request")
                               .order_by(AuditEvent.seq.desc())).first()
    assert (event.actor_type, event.actor_id, event.owner_id) == ("system", "cli", user.id)


def test_builds_request_for_a_plan_requests_every_active_user(flask_cli, db_session, queue):
    plan = make_plan(db_session, name="Cli plan")
    users = [make_user(db_session, plan=plan) for _ in range(3)]
    result = flask_cli("builds", "request", "--plan", plan.slug)
    assert result.exit_code == 0, result.output
    assert result.output.strip() == f"{plan.slug}: requested quick builds for 3 user(s)"
    assert all(len(builds_of(db_session, u.id)) == 1 for u in users)
    event = db_session.scalars(select(AuditEvent).where(
        AuditEvent.action == "build.request_plan").order_by(AuditEvent.seq.desc())).first()
    assert (event.target_id, event.details) == (str(plan.id), {"users": 3})


@pytest.mark.parametrize("args", [(), ("--user", "a@example.test", "--plan", "free")])
def test_builds_request_needs_exactly_one_target(flask_cli, db_session, args):
    result = flask_cli("builds", "request", *args)
    assert result.exit_code != 0
    assert "Give exactly one of --user or --plan." in result.output
    assert "Traceback" not in result.output


def test_builds_request_for_an_unknown_user_or_plan_is_a_clear_error(flask_cli, db_session):
    before = db_session.scalars(select(MemoryBuild.id)).all()
    nobody = flask_cli("builds", "request", "--user", "nobody@example.test")
    assert nobody.exit_code != 0 and "No account with email" in nobody.output
    no_plan = flask_cli("builds", "request", "--plan", "platinum")
    assert no_plan.exit_code != 0 and "Unknown plan 'platinum'" in no_plan.output
    assert db_session.scalars(select(MemoryBuild.id)).all() == before


def test_builds_sweep_and_schedule_report_what_they_did(flask_cli, db_session, queue):
    user = make_user(db_session, plan=default_plan(db_session))
    settle(db_session)
    swept = flask_cli("builds", "sweep")
    assert swept.exit_code == 0 and swept.output.startswith("failed 0, re-enqueued ")
    scheduled = flask_cli("builds", "schedule", "--all")
    assert scheduled.exit_code == 0, scheduled.output
    assert "scheduled and" in scheduled.output
    assert [b.trigger for b in builds_of(db_session, user.id) if b.status == "queued"] \
        == ["schedule"]
