"""The demo's team: Pilot, led by the Team plan's user, with a member and a reader, and
team memories saved by different members through an API key, a registered app and the
pages, so attribution shows at once; its account on the Team plan; seeded once."""

from __future__ import annotations

from sqlalchemy import func, select

from dashboard.access import reach_of
from dashboard.auth.models import User
from dashboard.connectors.models import OAuthClient, OAuthGrant
from dashboard.plans.models import Plan
from dashboard.saved_memories import reach as reached
from dashboard.saved_memories.models import ApiKey, Memory
from dashboard.teams.models import Team, TeamMember


def count(session, model, *where) -> int:
    return session.scalar(select(func.count()).select_from(model).where(*where))


def test_the_demo_seeds_the_pilot_team_with_attributed_memories_once(runner, db_session,
                                                                       client, auth):
    result = runner.invoke(args=["seed-demo", "--password", "demo-password-123"])
    assert result.exit_code == 0, result.output
    assert "Demo team: Pilot (/teams/pilot), led by team@demo.orbitpilot.test" in \
        result.output
    team = db_session.scalars(select(Team).where(Team.slug == "pilot")).one()
    account = db_session.get(User, team.id)
    lead = db_session.scalars(select(User).where(
        User.email == "team@demo.orbitpilot.test")).one()
    assert (team.name, account.kind) == ("Pilot", "team")
    assert account.plan_id == db_session.scalar(select(Plan.id).where(Plan.slug == "team"))
    roles = dict(db_session.execute(
        select(User.email, TeamMember.role).join(TeamMember, TeamMember.user_id == User.id)
        .where(TeamMember.team_id == team.id)).all())
    assert roles == {"team@demo.orbitpilot.test": "owner",
                     "plus@demo.orbitpilot.test": "member",
                     "free@demo.orbitpilot.test": "reader"}

    memories = db_session.scalars(select(Memory).where(Memory.owner_id == team.id)
                                  .order_by(Memory.created_at)).all()
    said = reached.attribute(db_session, reach_of(db_session, lead.id), memories)
    key = db_session.scalars(select(ApiKey).where(ApiKey.name == "codex-cli")).one()
    app = db_session.scalars(select(OAuthClient).where(OAuthClient.name == "Claude")).one()
    assert [said[m.id].sentence for m in memories] == [
        f"Saved by Pat Plus via API key \u201ccodex-cli\u201d ({key.prefix}\u2026)",
        f"Saved by you via app {app.client_id} (it calls itself \u201cClaude\u201d)",
        "Saved by you via OrbitPilot"]
    assert key.team_ids == [team.id]
    assert db_session.scalars(select(OAuthGrant.team_ids).where(
        OAuthGrant.client_pk == app.id)).one() == [team.id]

    counts = [count(db_session, model) for model in (Team, TeamMember, Memory, ApiKey,
                                                       OAuthClient, User)]
    again = runner.invoke(args=["seed-demo", "--password", "demo-password-123"])
    assert again.exit_code == 0, again.output
    assert [count(db_session, model) for model in (Team, TeamMember, Memory, ApiKey,
                                                     OAuthClient, User)] == counts
    # The lead signs in as themselves and sees the team; nobody signs in as its account.
    assert auth.login("team@demo.orbitpilot.test", "demo-password-123").status_code == 302
    auth.logout()
    assert auth.login(account.email, "!").status_code == 400  # the form again, refused
