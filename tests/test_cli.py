"""CLI: accounts and demo data. Bad input is a clear error and writes nothing."""

from sqlalchemy import func, select

from dashboard.auth.models import User
from dashboard.plans.models import Plan, SourceAssignment
from dashboard.plans.services import SourceState, resolve_build_sources
from dashboard.sources import CHAT_HISTORY
from tests.factories import plans_of


def count(db_session, model) -> int:
    return db_session.scalar(select(func.count()).select_from(model))


def test_create_admin(runner, db_session):
    result = runner.invoke(args=["create-admin", "--email", "boss@example.test",
                                 "--password", "a-long-enough-passphrase"])
    assert result.exit_code == 0, result.output
    user = db_session.scalars(select(User).where(User.email == "boss@example.test")).one()
    assert user.role == "admin"


def test_create_user_with_unknown_role_is_a_clear_error(runner, db_session):
    before = count(db_session, User)
    result = runner.invoke(args=["create-user", "--email", "x@example.test", "--password",
                                 "a-long-enough-passphrase", "--role", "superuser"])
    assert result.exit_code != 0
    assert "Unknown role 'superuser'; choose one of: user, support, admin." in result.output
    assert "Traceback" not in result.output
    assert count(db_session, User) == before


def test_create_user_with_unknown_plan_is_a_clear_error(runner, db_session):
    before = count(db_session, User)
    result = runner.invoke(args=["create-user", "--email", "x@example.test", "--password",
                                 "a-long-enough-passphrase", "--plan", "platinum"])
    assert result.exit_code != 0
    assert "Unknown plan 'platinum'" in result.output and "free" in result.output
    assert count(db_session, User) == before


def test_create_user_with_weak_password_or_taken_email(runner, db_session):
    ok = runner.invoke(args=["create-user", "--email", "y@example.test", "--password",
                             "a-long-enough-passphrase"])
    assert ok.exit_code == 0, ok.output
    weak = runner.invoke(args=["create-user", "--email", "z@example.test", "--password", "short"])
    assert weak.exit_code != 0 and "at least 10 characters" in weak.output
    taken = runner.invoke(args=["create-user", "--email", "Y@example.test", "--password",
                                "a-long-enough-passphrase"])
    assert taken.exit_code != 0 and "already exists" in taken.output


def test_set_role_refuses_unknown_role(runner, db_session):
    runner.invoke(args=["create-user", "--email", "r@example.test", "--password",
                        "a-long-enough-passphrase"])
    bad = runner.invoke(args=["set-role", "r@example.test", "root"])
    assert bad.exit_code != 0 and "Unknown role 'root'" in bad.output
    good = runner.invoke(args=["set-role", "r@example.test", "support"])
    assert good.exit_code == 0 and "user -> support" in good.output


def test_seed_demo_makes_the_three_plans_and_is_idempotent(runner, db_session):
    result = runner.invoke(args=["seed-demo", "--password", "demo-password-123"])
    assert result.exit_code == 0, result.output
    assert "demo-password-123" in result.output  # printed for the person running it
    for role in ("admin", "support"):
        assert role in result.output
    plans = {p.slug: p for p in db_session.scalars(select(Plan))}
    assert (plans["free"].included_sources, plans["plus"].included_sources,
            plans["team"].included_sources) == (3, 5, 3)
    assert plans["free"].is_default
    team_rows = db_session.scalars(
        select(SourceAssignment).where(SourceAssignment.plan_id == plans["team"].id)).all()
    assert [(r.source_key, r.enabled) for r in team_rows] == [("blink.blinks", False)]

    def chat_state(email):
        user = db_session.scalars(select(User).where(User.email == email)).one()
        return resolve_build_sources(user, plans_of(db_session)).get(CHAT_HISTORY).state

    assert chat_state("free@demo.orbitpilot.test") is SourceState.EVICTED_BY_CAP
    assert chat_state("plus@demo.orbitpilot.test") is SourceState.INCLUDED
    assert chat_state("team@demo.orbitpilot.test") is SourceState.INCLUDED

    users, plan_count = count(db_session, User), count(db_session, Plan)
    again = runner.invoke(args=["seed-demo", "--password", "demo-password-123"])
    assert again.exit_code == 0 and "[exists]" in again.output
    assert (count(db_session, User), count(db_session, Plan)) == (users, plan_count)


def test_demo_users_can_sign_in(runner, client, db_session, auth):
    runner.invoke(args=["seed-demo", "--password", "demo-password-123"])
    for email in ("free@demo.orbitpilot.test", "plus@demo.orbitpilot.test",
                  "team@demo.orbitpilot.test", "support@demo.orbitpilot.test",
                  "admin@demo.orbitpilot.test"):
        assert auth.login(email, "demo-password-123").status_code == 302, email
        assert email in client.get("/").get_data(as_text=True)
        auth.logout()
