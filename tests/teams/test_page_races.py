"""Double clicks on the team pages as real races: two requests at once, on committed data,
each in its own thread and transaction (tests/races.py). The first stops before its audit
event, holding its new rows; the second runs into them and waits; both finish — and the
second answers as the first did, with one row made, never a 500."""

from __future__ import annotations

from sqlalchemy import delete, func, select, text

from dashboard.audit.services import Actor
from dashboard.auth.models import User
from dashboard.extensions import db
from dashboard.saved_memories.models import Memory
from dashboard.saved_memories.team_pages import SAVE_LOCK_NAMESPACE
from dashboard.teams import services as teams
from dashboard.teams.models import Team, TeamMember
from tests.factories import make_team
from tests.races import (
    JOIN,
    Request,
    apart,
    audit_chain_held,
    signed_in,
    token,
    waiting_on_a_transaction,
    waiting_on_the_chain,
)
from tests.saved_memories.helpers import wait_until


def waiting_to_save(user_id: int) -> int:
    """Backends waiting for a person's team-save lock (``team_pages.SAVE_LOCK_NAMESPACE``)."""
    with db.engine.connect() as probe:
        count = probe.scalar(text(
            "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
            "WHERE NOT l.granted AND a.datname = current_database() AND "
            "l.locktype = 'advisory' AND l.classid = :ns AND l.objid = :id "
            "AND l.objsubid = 2"), {"ns": SAVE_LOCK_NAMESPACE, "id": user_id})
        probe.rollback()
    return count or 0


def drop_teams_of(session, creator_id: int) -> None:
    """The teams a test's person made, with their accounts (users rows of their own)."""
    session.rollback()
    accounts = session.scalars(select(Team.id).where(Team.created_by_id == creator_id)).all()
    if accounts:
        session.execute(delete(User).where(User.id.in_(accounts)))
        session.commit()


def race(first, second, path: str, data: dict, token_from: str, wait_second) -> tuple:
    tokens = [token(client, token_from) for client in (first, second)]
    a = Request(lambda: apart(lambda: first.post(path, data={"csrf_token": tokens[0],
                                                              **data})))
    b = Request(lambda: apart(lambda: second.post(path, data={"csrf_token": tokens[1],
                                                               **data})))
    with audit_chain_held(db.engine):
        a.start()
        assert wait_until(lambda: waiting_on_the_chain(db.engine) == 1, a)
        b.start()
        assert wait_until(wait_second, b)
    a.join(JOIN)
    b.join(JOIN)
    assert (a.error, b.error) == (None, None)
    return a.response, b.response


def test_save_to_the_team_clicked_twice_at_once_saves_once(app, committed, queue):
    lead = committed.user()
    team = make_team(committed.session, lead, slug="race-save")
    committed.session.commit()
    try:
        first, second = signed_in(app, lead.email), signed_in(app, lead.email)
        one, two = race(first, second, "/teams/race-save/memories/",
                        {"content": "Heron ships on Tuesdays."}, "/teams/race-save/memories/",
                        lambda: waiting_to_save(lead.id) == 1)
        assert (one.status_code, two.status_code) == (303, 303)
        assert one.headers["Location"] == two.headers["Location"]
        committed.session.expire_all()
        assert committed.session.scalar(select(func.count()).select_from(Memory).where(
            Memory.owner_id == team.id)) == 1
    finally:
        drop_teams_of(committed.session, lead.id)


def test_an_invitation_accepted_twice_at_once_is_one_membership(app, committed, queue):
    lead, invitee = committed.user(), committed.user()
    team = make_team(committed.session, lead, slug="race-join")
    owner = teams.membership(committed.session, team.id, lead.id)
    invited = teams.invite(committed.session, team, owner, email=invitee.email,
                           role="member", actor=Actor.of(lead))
    committed.session.commit()
    try:
        first, second = signed_in(app, invitee.email), signed_in(app, invitee.email)
        path = f"/teams/join/{invited.token}"
        one, two = race(first, second, path, {}, path,
                        lambda: waiting_on_a_transaction(db.engine) == 1)
        assert (one.status_code, two.status_code) == (303, 303)
        assert one.headers["Location"] == two.headers["Location"] == "/teams/race-join/"
        committed.session.expire_all()
        assert committed.session.scalar(select(func.count()).select_from(TeamMember).where(
            TeamMember.team_id == team.id, TeamMember.user_id == invitee.id)) == 1
    finally:
        drop_teams_of(committed.session, lead.id)


def test_a_team_created_twice_at_once_is_one_team(app, committed, queue):
    lead = committed.user()
    committed.session.commit()
    try:
        first, second = signed_in(app, lead.email), signed_in(app, lead.email)
        one, two = race(first, second, "/teams/", {"name": "Race", "slug": "race-make"},
                        "/teams/", lambda: waiting_on_a_transaction(db.engine) == 1)
        assert (one.status_code, two.status_code) == (303, 303)
        assert one.headers["Location"] == two.headers["Location"] == "/teams/race-make/"
        committed.session.expire_all()
        assert committed.session.scalar(select(func.count()).select_from(Team).where(
            Team.slug == "race-make")) == 1
    finally:
        drop_teams_of(committed.session, lead.id)
