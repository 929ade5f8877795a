"""Support finds a team by its name, its slug or a member's email, and reads its trace:
members by role (ids and emails), the plan, the sources and their states (its account's
resolution), builds, holds and policies — never content; in a fixed number of queries
however many members or builds. The staff console's users list shows each account's
kind, and a team's account is refused a staff role."""

from __future__ import annotations

import re
import uuid

import pytest
from sqlalchemy import select

from dashboard.access import reach_of
from dashboard.audit.services import Actor
from dashboard.auth.models import User
from dashboard.auth.services import AccountError, set_role, update_account
from dashboard.holds import place_hold
from dashboard.saved_memories import reach as reached
from dashboard.sources import SAVED
from dashboard.support.services import find_teams, find_users, team_trace
from tests.conftest import csrf_from
from tests.factories import build, make_build_record, make_key, make_plan, make_team, make_user

SUPPORT = "help@example.test"
ADMIN = "root@example.test"


@pytest.fixture
def world(db_session):
    canary = f"canary-{uuid.uuid4().hex}"
    make_user(db_session, role="support", email=SUPPORT)
    make_user(db_session, role="admin", email=ADMIN)
    plan = make_plan(db_session, name="Team", cap=3)
    lead = make_user(db_session, plan=plan, email="lead@pilot.example")
    member = make_user(db_session, plan=plan, email="mia@pilot.example")
    reader = make_user(db_session, plan=plan, email="rex@elsewhere.example")
    team = make_team(db_session, lead, slug="pilot", name="Pilot Crew",
                     members={member: "member", reader: "reader"}, max_key_days=90)
    make_team(db_session, lead, slug="other-crew", name="Other")
    key, _ = make_key(db_session, member, name=f"{canary} key")
    reached.save_for(db_session, reach_of(db_session, member.id), team="pilot",
                     content=f"{canary} the team's memory", metadata={"n": canary},
                     actor=Actor("api_key", str(key.id)), api_key_id=key.id)
    result = build(db_session, team.account, "full")
    db_session.add(make_build_record(team.account, mode="full",
                                     source_counts=result.per_source))
    place_hold(db_session, team.id, reason=f"{canary} matter", ends_at=None,
               actor=Actor("system"))
    db_session.commit()
    return canary, team, lead, member, reader


def test_a_team_is_found_by_its_name_its_slug_or_a_members_email(db_session, world):
    _, team, lead, member, _ = world
    for query in ("pilot", "Pilot cr", "crew", "mia@pilot.example", "mia@", str(team.id)):
        found, _ = find_teams(db_session, query)
        assert team.id in {t.id for t in found}, query
    assert [t.slug for t in find_teams(db_session, "mia@pilot.example")[0]] == ["pilot"]
    # Both teams have the lead; a reader's email names only theirs.
    assert {t.slug for t in find_teams(db_session, lead.email)[0]} == {"pilot", "other-crew"}
    assert find_teams(db_session, "zz")[0] == []  # too short
    # A team's account is not listed among users (it is the team, found as such).
    assert team.id not in {u.id for u in find_users(db_session, "pilot")[0]}
    assert find_users(db_session, str(team.id))[0] == []


def test_support_reads_a_teams_trace_without_content(client, auth, db_session, world):
    canary, team, lead, member, reader = world
    auth.login(SUPPORT)
    found = client.get("/support/", query_string={"q": "Pilot Crew"})
    assert found.status_code == 302 and found.headers["Location"].endswith(
        f"/support/teams/{team.id}")
    listed = client.get("/support/", query_string={"q": "lead@pilot.example"})
    body = listed.get_data(as_text=True)
    assert listed.status_code == 200 and "data-teams" in body
    assert f"/support/teams/{team.id}" in body and f"/support/users/{lead.id}" in body
    page = client.get(f"/support/teams/{team.id}")
    assert page.status_code == 200
    html = page.get_data(as_text=True)
    assert canary not in html
    members = {role: row for role, row in re.findall(
        r'<tr data-role="(\w+)">(.*?)</tr>', html, re.S)}
    assert lead.email in members["owner"] and f"#{lead.id}" in members["owner"]
    assert member.email in members["member"] and reader.email in members["reader"]
    assert "none" in members["admin"]
    assert re.search(r'data-policy="max_key_days">90<', html)
    assert re.search(r'data-policy="leaver_policy">keep<', html)
    assert 'data-held="yes"' in html  # the hold, never its reason
    assert re.search(rf'<tr data-source="{SAVED}"[^>]*>.*?Remembered.*?>\s*1\s*</td>', html,
                     re.S)
    assert "1 active" in html
    # The account's user page is the team's trace.
    account = client.get(f"/support/users/{team.id}")
    assert account.status_code == 302 and account.headers["Location"].endswith(
        f"/support/teams/{team.id}")
    # A member's own trace names their teams.
    mine = client.get(f"/support/users/{member.id}").get_data(as_text=True)
    assert f"/support/teams/{team.id}" in mine and canary not in mine
    assert client.get("/support/teams/999999").status_code == 404
    assert client.get(f"/support/teams/{lead.id}").status_code == 404  # a person


def test_a_teams_trace_costs_the_same_queries_for_three_members_or_thirty(
        db_session, world, count_queries):
    _, team, lead, *_ = world
    team_trace(db_session, team.id)  # what a session reads once (the plans) is read
    with count_queries() as few:
        small = team_trace(db_session, team.id)
    for _ in range(27):
        db_session.add(teams_member(db_session, team))
    for _ in range(5):
        db_session.add(make_build_record(team.account, mode="quick"))
    db_session.flush()
    with count_queries() as many:
        large = team_trace(db_session, team.id)
    assert sum(len(m) for _, m in small.members) == 3
    assert sum(len(m) for _, m in large.members) == 30
    assert few.count == many.count


def teams_member(session, team):
    from dashboard.teams.models import TeamMember

    return TeamMember(team_id=team.id, user_id=make_user(session).id, role="member")


def test_the_users_list_shows_each_accounts_kind_and_marks_teams(client, auth, db_session,
                                                                  world):
    _, team, lead, *_ = world
    auth.login(ADMIN)
    page = client.get("/admin/user/", query_string={"search": "pilot"}).get_data(as_text=True)
    assert 'data-kind="team"' in page and 'data-kind="person"' in page
    assert f"/support/teams/{team.id}" in page
    only = client.get("/admin/user/", query_string={"flt0_kind_equals": "team"})
    assert only.status_code == 200
    listed = only.get_data(as_text=True)
    assert team.account.email in listed and lead.email not in listed
    assert client.get("/admin/user/", query_string={"flt0_kind_equals": "robot"}
                      ).status_code == 400


def test_a_teams_account_cannot_be_given_a_staff_role(client, auth, db_session, world):
    _, team, *_ = world
    account = db_session.get(User, team.id)
    for role in ("support", "admin"):
        with pytest.raises(AccountError, match="team's account") as refused:
            set_role(db_session, account, role, actor=Actor("system"))
        assert refused.value.field == "role"
    with pytest.raises(AccountError, match="staff role"):
        update_account(db_session, account, role="admin", plan_id=account.plan_id,
                       active=True, actor=Actor("system"))
    db_session.rollback()
    # Through the console: a form error, and nothing changes.
    auth.login(ADMIN)
    edit = f"/admin/user/edit/?id={team.id}"
    token = csrf_from(client, edit)
    answer = client.post(edit, data={"csrf_token": token, "role": "admin",
                                     "plan_ref": str(account.plan_id or ""), "active": "y"})
    assert answer.status_code == 200 and "cannot have a staff role" in answer.get_data(
        as_text=True)
    assert db_session.scalar(select(User.role).where(User.id == team.id)) == "user"
