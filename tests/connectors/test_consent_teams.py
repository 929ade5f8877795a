"""The consent page's team choice: a box for each of the person's teams, none ticked, a
team that lists its apps marked as needing an admin's approval, and a sentence saying
which team the app will write to; the connection holds the teams ticked (audited by id),
a team the person is not in is refused, a new answer replaces the last choice, and
/settings/connections says what each connection acts for."""

from __future__ import annotations

import re

from sqlalchemy import select

from dashboard.audit.models import AuditEvent
from dashboard.connectors.models import OAuthGrant
from tests.connectors.oauth_flow import (
    ACTION,
    CSRF,
    authorize_url,
    callback,
    pkce,
    register,
    ticked,
)
from tests.factories import make_team, make_user

TEAM_BOX = re.compile(r'<input[^>]*name="teams" value="(\d+)"([^>]*)>')
ACTS_FOR = re.compile(r'<p id="acts-for"[^>]*>([^<]*)</p>')


def consent_page(client, client_id: str) -> str:
    _, challenge = pkce()
    page = client.get(authorize_url(client_id, challenge))
    assert page.status_code == 200
    return page.get_data(as_text=True)


def answer(client, page: str, *, teams=(), untick=()):
    return client.post(ACTION.search(page).group(1).replace("&amp;", "&"), data={
        "csrf_token": CSRF.search(page).group(1), "decision": "allow",
        "granted": ticked(page, untick=untick), "teams": [str(t) for t in teams]})


def team_boxes(page: str) -> dict[int, bool]:
    return {int(value): " checked" in rest for value, rest in TEAM_BOX.findall(page)}


def grant_of(db_session, user) -> OAuthGrant:
    return db_session.scalars(select(OAuthGrant).where(OAuthGrant.user_id == user.id)
                              .execution_options(populate_existing=True)).one()


def test_each_team_is_a_box_none_ticked_and_the_app_acts_for_them_alone(client, signed_in,
                                                                      db_session):
    lead = make_user(db_session)
    pilot = make_team(db_session, lead, name="Pilot", members={signed_in: "member"})
    listed = make_team(db_session, lead, name="Listed", members={signed_in: "admin"},
                       app_policy="approve")
    make_team(db_session, lead, name="Not theirs")
    page = consent_page(client, register(client)["client_id"])
    assert team_boxes(page) == {pilot.id: False, listed.id: False}
    assert "Not theirs" not in page
    assert ACTS_FOR.search(page).group(1) == "It acts for you alone."
    # The team that approves its apps says so, next to its box (read out with it).
    note = re.search(rf'<p[^>]*id="([^"]+)" data-needs-approval="{listed.id}">([^<]*)</p>',
                     page)
    assert note.group(2).startswith("It needs an admin of Listed to approve this app")
    assert f'aria-describedby="{note.group(1)}"' in page
    assert f'data-needs-approval="{pilot.id}"' not in page


def test_a_person_without_teams_sees_no_team_choice(client, signed_in):
    page = consent_page(client, register(client)["client_id"])
    assert 'id="teams"' not in page and team_boxes(page) == {}
    assert ACTS_FOR.search(page).group(1) == "It acts for you alone."


def test_the_connection_holds_the_teams_ticked_and_a_new_answer_replaces_them(
        client, signed_in, db_session):
    pilot = make_team(db_session, make_user(db_session), name="Pilot",
                      members={signed_in: "member"})
    client_id = register(client)["client_id"]
    callback(answer(client, consent_page(client, client_id), teams=[pilot.id]))
    assert grant_of(db_session, signed_in).team_ids == [pilot.id]
    callback(answer(client, consent_page(client, client_id)))  # asked again: none ticked
    assert grant_of(db_session, signed_in).team_ids == []
    events = db_session.scalars(select(AuditEvent).where(
        AuditEvent.action == "oauth.grant", AuditEvent.owner_id == signed_in.id)
        .order_by(AuditEvent.seq)).all()
    assert [(e.details["teams"], e.details["teams_before"]) for e in events] == [
        ([pilot.id], []), ([], [pilot.id])]


def test_a_team_the_person_is_not_in_is_refused_and_nothing_is_granted(client, signed_in,
                                                                      db_session):
    other = make_team(db_session, make_user(db_session), name="Elsewhere")
    page = consent_page(client, register(client)["client_id"])
    for teams in ([other.id], ["x"]):
        refused = answer(client, page, teams=teams)
        assert refused.status_code == 400 and "Location" not in refused.headers
        assert "Choose teams from the list." in refused.get_data(as_text=True)
    assert db_session.scalars(select(OAuthGrant)).all() == []


def test_a_form_sent_back_keeps_its_teams_and_says_which_the_app_will_write_to(
        client, signed_in, db_session):
    lead = make_user(db_session)
    pilot = make_team(db_session, lead, name="Pilot", members={signed_in: "member"})
    docs = make_team(db_session, lead, name="Docs", members={signed_in: "reader"})
    page = consent_page(client, register(client)["client_id"])
    again = answer(client, page, teams=[pilot.id, docs.id],
                   untick=("memory:read", "memory:write"))  # nothing the app may do
    assert again.status_code == 400
    html = again.get_data(as_text=True)
    assert team_boxes(html) == {pilot.id: True, docs.id: True}
    assert ACTS_FOR.search(html).group(1) == (
        "It may save to: Pilot (as member). It may read, not save to: Docs (as reader).")


def test_the_connections_page_says_what_each_connection_acts_for(client, signed_in,
                                                                 db_session):
    lead = make_user(db_session)
    pilot = make_team(db_session, lead, name="Pilot", members={signed_in: "member"})
    listed = make_team(db_session, lead, name="Listed", members={signed_in: "member"},
                       app_policy="allow_list")
    client_id = register(client)["client_id"]
    callback(answer(client, consent_page(client, client_id), teams=[pilot.id, listed.id]))
    grant = grant_of(db_session, signed_in)
    for path in ("/settings/connections/", f"/settings/connections/{grant.id}"):
        html = client.get(path).get_data(as_text=True)
        assert re.search(r"data-acts-for>It may save to: Pilot \(as member\)\.</span>", html)
        assert "data-waiting>Listed: needs an admin of Listed to approve this app" in html
