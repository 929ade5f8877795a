"""The team pages, through the app: each page answers each kind of person with one status
(a member whose role may not: 403 with a sentence; anyone else: the 404 an unknown team
gets); creating a team, invitations end to end, roles and the last owner, leaving and
removal (and the leaver policy's erasure with receipts), sharing and saving to the team,
its controls (audited before and after), who can see it, its Memory Status, its audit
log and CSV (the team's events, no content), and double clicks answering as the first."""

from __future__ import annotations

import csv
import html
import io
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import func, select

from dashboard.access import reach_of
from dashboard.audit.models import AuditEvent
from dashboard.audit.services import Actor
from dashboard.auth.models import User
from dashboard.plans.sentences import state_sentence
from dashboard.plans.services import get_plan_for_user, resolve_sources
from dashboard.saved_memories import forget_memory
from dashboard.saved_memories import reach as reached
from dashboard.saved_memories.models import ForgetMarker, Memory
from dashboard.sources import SAVED
from dashboard.teams import services as teams
from dashboard.teams.models import Team, TeamApp, TeamInvitation, TeamMember
from tests.conftest import AuthActions, csrf_from
from tests.factories import build, make_connection, make_key, make_team, make_user
from tests.races import apart
from tests.test_safe_methods import checksums

CANARY = "CANARY-tpages-7d31"
NONCE = re.compile(r'nonce="[^"]*"')
TOKEN = re.compile(r'(name="csrf_token"[^>]*value=")[^"]*"')
LINK = re.compile(r'id="invitation-link"[^>]*value="([^"]+)"')


@dataclass
class Pilot:
    team: Team
    people: dict[str, User]  # owner, admin, member, reader, stranger, removed


@pytest.fixture
def pilot(db_session, queue) -> Pilot:
    people = {role: make_user(db_session, email=f"pilot-{role}@example.test")
              for role in ("owner", "admin", "member", "reader", "stranger", "removed")}
    team = make_team(db_session, people["owner"], slug="pilot", name="Pilot",
                     members={people["admin"]: "admin", people["member"]: "member",
                              people["reader"]: "reader", people["removed"]: "member"})
    owner = teams.membership(db_session, team.id, people["owner"].id)
    teams.remove_member(db_session, team, owner, people["removed"].id,
                        actor=Actor.of(people["owner"]))
    db_session.commit()  # committed (a savepoint): a request that rolls back keeps these
    return Pilot(team, people)


class Browser:
    """A test client of its own, signed in as ``user`` (a guest for None), each request
    sent outside the test's app context: several people's clients in one test would
    otherwise share its ``g``, and so whoever signed in last."""

    def __init__(self, app, user: User | None = None) -> None:
        self.client = app.test_client()
        if user is not None:
            assert apart(lambda: AuthActions(self.client).login(user.email)).status_code == 302

    def get(self, path: str, **kwargs):
        return apart(lambda: self.client.get(path, **kwargs))

    def head(self, path: str, **kwargs):
        return apart(lambda: self.client.head(path, **kwargs))

    def post(self, path: str, data: dict | None = None, *, token_from: str = "/teams/"):
        token = apart(lambda: csrf_from(self.client, token_from))
        return apart(lambda: self.client.post(path, data={"csrf_token": token,
                                                          **(data or {})}))


def client_of(app, user: User | None) -> Browser:
    return Browser(app, user)


def post(browser: Browser, path: str, data: dict | None = None, *,
         token_from: str = "/teams/"):
    return browser.post(path, data, token_from=token_from)


def normalised(response) -> str:
    """A page without what differs per request (the CSP nonce, the CSRF token)."""
    return TOKEN.sub(r'\1"', NONCE.sub('nonce=""', response.get_data(as_text=True)))


def events(db_session, team_id: int, action: str | None = None) -> list[AuditEvent]:
    query = select(AuditEvent).where(AuditEvent.owner_id == team_id)
    if action:
        query = query.where(AuditEvent.action == action)
    return list(db_session.scalars(query.order_by(AuditEvent.seq)))


# -- who gets what ----------------------------------------------------------------------------

READERS = {"owner": 200, "admin": 200, "member": 200, "reader": 200, "stranger": 404,
           "removed": 404}
MANAGERS = {"owner": 200, "admin": 200, "member": 403, "reader": 403, "stranger": 404,
            "removed": 404}
PAGES = {
    "/teams/pilot/": READERS,
    "/teams/pilot/memories/": READERS,
    "/teams/pilot/memories/receipts/": READERS,
    "/teams/pilot/status": READERS,
    "/teams/pilot/access": READERS,
    "/teams/pilot/leave": READERS,
    "/teams/pilot/settings": MANAGERS,
    "/teams/pilot/audit": MANAGERS,
    "/teams/pilot/audit.csv": MANAGERS,
    "/teams/pilot/members/remove?user_id={member}": MANAGERS,
}
CASES = [(path, who, status) for path, statuses in PAGES.items()
         for who, status in statuses.items()]


@pytest.mark.parametrize(("path", "who", "status"), CASES,
                         ids=[f"{who}-{path.split('?')[0]}" for path, who, status in CASES])
def test_each_team_page_answers_each_person_with_one_status(app, client, pilot, path, who,
                                                            status):
    page = client_of(app, pilot.people[who]).get(
        path.format(member=pilot.people["member"].id))
    assert page.status_code == status
    if status == 403:
        text = html.unescape(page.get_data(as_text=True))
        assert "Only the team's owners and admins can" in text
        assert f"Your role in Pilot is {who}." in text


@pytest.mark.parametrize("path", [p for p in PAGES if "{" not in p])
def test_a_non_member_gets_exactly_the_404_of_a_team_that_does_not_exist(app, client, pilot,
                                                                         path):
    for who in ("stranger", "removed"):
        browser = client_of(app, pilot.people[who])
        mine = browser.get(path)
        unknown = browser.get(path.replace("pilot", "no-such-team"))
        assert (mine.status_code, unknown.status_code) == (404, 404)
        assert normalised(mine) == normalised(unknown)
        assert "You are in no team with that name." in mine.get_data(as_text=True)


def test_a_guest_is_sent_to_sign_in(client, pilot):
    page = client.get("/teams/pilot/")
    assert page.status_code == 302 and "/auth/signin" in page.headers["Location"]


def test_the_navbar_and_the_team_nav_link_the_pages(app, client, pilot):
    html = client_of(app, pilot.people["member"]).get("/teams/pilot/").get_data(as_text=True)
    assert 'href="/teams/"' in html  # the navbar's "Teams"
    for page in ("/teams/pilot/memories/", "/teams/pilot/status", "/teams/pilot/access"):
        assert f'href="{page}"' in html
    assert 'href="/teams/pilot/settings"' not in html  # a member has no controls
    owner = client_of(app, pilot.people["owner"]).get("/teams/pilot/").get_data(as_text=True)
    assert 'href="/teams/pilot/settings"' in owner and 'href="/teams/pilot/audit"' in owner


# -- my teams, creating one -------------------------------------------------------------------

def test_my_teams_lists_each_with_my_role_and_its_members(app, client, pilot):
    html = client_of(app, pilot.people["reader"]).get("/teams/").get_data(as_text=True)
    assert 'data-team="pilot"' in html
    assert "<strong data-role>reader</strong>" in html
    assert 'data-members="4"' in html  # owner, admin, member, reader


def test_creating_a_team_makes_its_creator_the_owner_and_a_double_click_is_one_team(
        app, client, db_session, pilot):
    browser = client_of(app, pilot.people["stranger"])
    data = {"name": "Heron squad", "slug": "heron"}
    first = post(browser, "/teams/", data)
    second = post(browser, "/teams/", data)
    assert (first.status_code, second.status_code) == (303, 303)
    assert first.headers["Location"] == second.headers["Location"] == "/teams/heron/"
    team = teams.get_team(db_session, "heron")
    assert teams.membership(db_session, team.id, pilot.people["stranger"].id).role == "owner"
    assert db_session.scalar(select(func.count()).select_from(Team)
                             .where(Team.slug == "heron")) == 1
    assert len(events(db_session, team.id, "team.create")) == 1


@pytest.mark.parametrize(("slug", "words"), [
    ("pilot", "That name is taken"),
    ("join", "That name is taken"),
    ("No Spaces", "Use 3 to 40 lower-case letters"),
])
def test_a_slug_refused_is_a_form_error(app, client, pilot, slug, words):
    page = post(client_of(app, pilot.people["stranger"]), "/teams/",
                {"name": "Another", "slug": slug})
    assert page.status_code == 400
    assert words in page.get_data(as_text=True)


# -- invitations ------------------------------------------------------------------------------

def invite(browser: Browser, email: str, role: str = "member"):
    return browser.post("/teams/pilot/invitations", {"email": email, "role": role},
                        token_from="/teams/pilot/")


def link_of(page) -> str:
    match = LINK.search(page.get_data(as_text=True))
    assert match, "no invitation link on the page"
    return "/" + match.group(1).split("/", 3)[3]  # the path of the absolute link


def test_an_invitation_goes_end_to_end_through_the_pages(app, client, db_session, pilot):
    lead = Browser(app, pilot.people["owner"])
    newcomer = make_user(db_session, email="newcomer@example.test")
    db_session.commit()
    made = invite(lead, "Newcomer@Example.test", "member")
    assert made.status_code == 200
    path = link_of(made)
    token = path.rsplit("/", 1)[1]
    assert token.startswith("opti_")
    # Listed as pending (email, role, expiry), its token nowhere but on that one page.
    home = lead.get("/teams/pilot/").get_data(as_text=True)
    assert "newcomer@example.test" in home and token not in home
    assert all(token not in str(e.details) for e in events(db_session, pilot.team.id))
    # A guest sees what it is and is asked to sign in; the wrong account, the same 404
    # as a link that does not exist; the invited address, a button.
    guest = Browser(app).get(path)
    assert guest.status_code == 200 and "Sign in to accept" in guest.get_data(as_text=True)
    assert "Pilot" in guest.get_data(as_text=True)
    wrong = Browser(app, pilot.people["stranger"])
    other = wrong.get(path)
    unknown = wrong.get("/teams/join/opti_" + "x" * 43)
    assert (other.status_code, unknown.status_code) == (404, 404)
    assert html.unescape(other.get_data(as_text=True)).count(
        "This invitation link is not for this account") == 1
    assert normalised(other) == normalised(unknown)
    assert wrong.post(path, token_from="/teams/").status_code == 404
    invited = Browser(app, newcomer)
    asked = invited.get(path)
    assert asked.status_code == 200 and "Accept and join" in asked.get_data(as_text=True)
    first = invited.post(path)
    second = invited.post(path)  # a double click: the same membership
    assert (first.status_code, second.status_code) == (303, 303)
    assert first.headers["Location"] == second.headers["Location"] == "/teams/pilot/"
    assert teams.membership(db_session, pilot.team.id, newcomer.id).role == "member"
    assert len(events(db_session, pilot.team.id, "team.join")) == 1
    # Used up: nobody else gets in with it, and the pending list no longer shows it.
    assert 'id="no-invitations"' in lead.get("/teams/pilot/").get_data(as_text=True)
    used = Browser(app, pilot.people["stranger"]).get(path)
    assert used.status_code == 404


def test_an_expired_or_withdrawn_invitation_says_so(app, client, db_session, pilot):
    later = make_user(db_session, email="later@example.test")
    owner = teams.membership(db_session, pilot.team.id, pilot.people["owner"].id)
    expired = teams.invite(db_session, pilot.team, owner, email=later.email, role="reader",
                           actor=Actor.of(pilot.people["owner"]),
                           now=datetime.now(UTC) - timedelta(days=8))
    db_session.commit()
    invited = Browser(app, later)
    page = invited.get(f"/teams/join/{expired.token}")
    assert page.status_code == 410 and "has expired" in page.get_data(as_text=True)
    assert invited.post(f"/teams/join/{expired.token}").status_code == 410
    lead = Browser(app, pilot.people["owner"])
    path = link_of(invite(lead, later.email, "reader"))
    pending = db_session.scalars(select(TeamInvitation).where(
        TeamInvitation.email == later.email, TeamInvitation.revoked_at.is_(None),
        TeamInvitation.accepted_at.is_(None), TeamInvitation.expires_at > datetime.now(UTC))
    ).one()
    revoke = {"invitation_id": str(pending.id)}
    assert lead.post("/teams/pilot/invitations/revoke", revoke,
                     token_from="/teams/pilot/").status_code == 303
    assert lead.post("/teams/pilot/invitations/revoke", revoke,  # again: the same answer
                     token_from="/teams/pilot/").status_code == 303
    withdrawn = invited.get(path)
    assert withdrawn.status_code == 410 and "withdrawn" in withdrawn.get_data(as_text=True)
    assert teams.membership(db_session, pilot.team.id, later.id) is None


def test_inviting_again_replaces_the_link_so_a_double_click_leaves_one(app, client,
                                                                       db_session, pilot):
    lead = Browser(app, pilot.people["admin"])
    first, second = invite(lead, "twice@example.test"), invite(lead, "twice@example.test")
    assert (first.status_code, second.status_code) == (200, 200)
    live = db_session.scalars(select(TeamInvitation).where(
        TeamInvitation.email == "twice@example.test", TeamInvitation.revoked_at.is_(None))
    ).all()
    assert len(live) == 1 and live[0].token_hash == teams.hash_token(
        link_of(second).rsplit("/", 1)[1])


@pytest.mark.parametrize(("who", "role", "status"), [
    ("member", "member", 403), ("reader", "reader", 403), ("admin", "owner", 403),
    ("owner", "owner", 200), ("admin", "reader", 200)])
def test_who_may_invite_whom(app, client, pilot, who, role, status):
    page = invite(Browser(app, pilot.people[who]), f"{who}-{role}@example.test", role)
    assert page.status_code == status


def test_a_bad_invitation_address_is_a_form_error(app, client, pilot):
    page = invite(Browser(app, pilot.people["owner"]), "not an address")
    assert page.status_code == 400
    assert "Enter a valid email address." in page.get_data(as_text=True)


# -- roles, the last owner, leaving, removal --------------------------------------------------

def role(browser: Browser, user: User, new_role: str):
    return browser.post("/teams/pilot/members/role",
                        {"user_id": str(user.id), "role": new_role}, token_from="/teams/pilot/")


def test_the_last_owner_cannot_be_demoted_or_leave_and_the_page_says_why(app, client,
                                                                         db_session, pilot):
    owner, admin = pilot.people["owner"], pilot.people["admin"]
    lead = Browser(app, owner)
    home = html.unescape(lead.get("/teams/pilot/").get_data(as_text=True))
    assert "The team's last owner: they cannot be given another role" in home
    assert 'id="leave-blocked"' in home
    demoted = role(lead, owner, "admin")
    assert demoted.status_code == 409
    assert "last owner" in html.unescape(demoted.get_data(as_text=True))
    leave = lead.get("/teams/pilot/leave")
    assert leave.status_code == 200 and 'id="refused"' in leave.get_data(as_text=True)
    assert lead.post("/teams/pilot/leave", token_from="/teams/pilot/").status_code == 409
    # An admin makes no owner and touches none.
    assert role(Browser(app, admin), pilot.people["member"], "owner").status_code == 403
    assert role(Browser(app, admin), owner, "member").status_code == 403
    # Once there is another owner, the first may step down.
    assert role(lead, admin, "owner").status_code == 303
    assert role(lead, admin, "owner").status_code == 303  # again: the same answer
    assert role(lead, owner, "member").status_code == 303
    assert teams.membership(db_session, pilot.team.id, owner.id).role == "member"
    changes = [e.details for e in events(db_session, pilot.team.id, "team.role_change")]
    assert changes == [{"team": pilot.team.id, "before": "admin", "after": "owner"},
                       {"team": pilot.team.id, "before": "owner", "after": "member"}]


def test_members_may_not_change_roles_and_an_unknown_member_is_a_404(app, client, pilot):
    assert role(Browser(app, pilot.people["member"]), pilot.people["reader"],
                "admin").status_code == 403
    lead = Browser(app, pilot.people["owner"])
    assert role(lead, pilot.people["stranger"], "admin").status_code == 404
    assert lead.post("/teams/pilot/members/role", {"user_id": "abc", "role": "admin"},
                     token_from="/teams/pilot/").status_code == 404
    assert role(lead, pilot.people["member"], "boss").status_code == 400


def test_leaving_twice_answers_as_the_first_did(app, client, db_session, pilot):
    member = Browser(app, pilot.people["member"])
    first = member.post("/teams/pilot/leave", token_from="/teams/pilot/")
    second = member.post("/teams/pilot/leave", token_from="/teams/")
    assert (first.status_code, second.status_code) == (303, 303)
    assert first.headers["Location"] == second.headers["Location"] == "/teams/"
    assert teams.membership(db_session, pilot.team.id, pilot.people["member"].id) is None
    assert member.get("/teams/pilot/").status_code == 404  # out at once
    assert len(events(db_session, pilot.team.id, "team.leave")) == 1


def test_a_removal_keeps_what_they_saved_as_a_former_members(app, client, db_session,
                                                              pilot):
    member = pilot.people["member"]
    saved = reached.save_for(db_session, reach_of(db_session, member.id), team="pilot",
                             content="The deploy freeze starts on the 20th.",
                             actor=Actor.of(member)).memory
    db_session.commit()
    admin = Browser(app, pilot.people["admin"])
    confirm = admin.get(f"/teams/pilot/members/remove?user_id={member.id}")
    assert confirm.status_code == 200
    assert "a former member" in confirm.get_data(as_text=True)
    data = {"user_id": str(member.id)}
    first = admin.post("/teams/pilot/members/remove", data, token_from="/teams/pilot/")
    second = admin.post("/teams/pilot/members/remove", data, token_from="/teams/pilot/")
    assert (first.status_code, second.status_code) == (303, 303)
    assert first.headers["Location"] == second.headers["Location"]
    assert db_session.get(Memory, saved.id) is not None
    listed = admin.get("/teams/pilot/memories/").get_data(as_text=True)
    assert "Saved by a former member via OrbitPilot" in listed
    assert len(events(db_session, pilot.team.id, "team.remove")) == 2  # removed, member


def test_an_admin_cannot_remove_an_owner(app, client, pilot):
    admin = Browser(app, pilot.people["admin"])
    owner = pilot.people["owner"]
    page = admin.get(f"/teams/pilot/members/remove?user_id={owner.id}")
    assert page.status_code == 200 and "Only an owner can remove an owner." in page.get_data(
        as_text=True)
    refused = admin.post("/teams/pilot/members/remove", {"user_id": str(owner.id)},
                         token_from="/teams/pilot/")
    assert refused.status_code == 403


def test_under_the_erase_policy_a_removal_erases_what_they_saved_with_receipts(
        app, client, db_session, pilot):
    member = pilot.people["member"]
    pilot.team.leaver_policy = "erase"
    reach = reach_of(db_session, member.id)
    saved = [reached.save_for(db_session, reach, team="pilot", content=f"{CANARY} note {n}",
                              actor=Actor.of(member)).memory.id for n in range(2)]
    kept = reached.save_for(db_session, reach_of(db_session, pilot.people["admin"].id),
                            team="pilot", content="The admin's note stays.",
                            actor=Actor.of(pilot.people["admin"])).memory.id
    db_session.commit()
    lead = Browser(app, pilot.people["owner"])
    confirm = html.unescape(lead.get(f"/teams/pilot/members/remove?user_id={member.id}")
                            .get_data(as_text=True))
    assert "The team's leaver policy erases what a leaver saved" in confirm
    assert "the 2 memories they saved to the team are erased for good" in confirm
    done = lead.post("/teams/pilot/members/remove", {"user_id": str(member.id)},
                     token_from="/teams/pilot/")
    assert done.status_code == 303
    assert all(db_session.get(Memory, memory_id) is None for memory_id in saved)
    assert db_session.get(Memory, kept) is not None
    markers = db_session.scalars(select(ForgetMarker).where(
        ForgetMarker.memory_id.in_(saved))).all()
    assert sorted(m.mode for m in markers) == ["hard_delete", "hard_delete"]
    assert all(m.owner_id == pilot.team.id for m in markers)
    flashed = html.unescape(lead.get("/teams/pilot/").get_data(as_text=True))
    assert "the 2 memories they saved to it were erased for good, each with a receipt" \
        in flashed
    for marker in markers:
        receipt = lead.get(f"/teams/pilot/memories/receipts/{marker.id}")
        assert receipt.status_code == 200 and CANARY not in receipt.get_data(as_text=True)
    removal = events(db_session, pilot.team.id, "team.remove")[-1]
    assert removal.details["erased"] == 2 and removal.details["policy"] == "erase"
    # Every event of the erasure names ids only.
    assert all(CANARY not in str(e.details) for e in events(db_session, pilot.team.id))


# -- sharing and saving to the team -----------------------------------------------------------

def test_a_personal_memory_is_shared_to_a_team_deliberately_once(app, client, db_session,
                                                                 pilot):
    member = pilot.people["member"]
    own = reached.save_for(db_session, reach_of(db_session, member.id),
                           content="Standup is at 9:30.", actor=Actor.of(member)).memory
    db_session.commit()
    browser = Browser(app, member)
    listed = browser.get("/memories/").get_data(as_text=True)
    assert f'href="/memories/{own.id}/share"' in listed
    asked = browser.get(f"/memories/{own.id}/share")
    assert asked.status_code == 200 and '<option value="pilot">Pilot</option>' in \
        asked.get_data(as_text=True)
    path = f"/memories/{own.id}/share"
    first = browser.post(path, {"team": "pilot"}, token_from=path)
    second = browser.post(path, {"team": "pilot"}, token_from=path)
    assert (first.status_code, second.status_code) == (303, 303)
    assert first.headers["Location"] == second.headers["Location"]
    assert first.headers["Location"].startswith("/teams/pilot/memories/#memory-")
    copies = db_session.scalars(select(Memory).where(Memory.shared_from_id == own.id)).all()
    assert [(c.owner_id, c.author_id, c.content) for c in copies] == [
        (pilot.team.id, member.id, "Standup is at 9:30.")]
    assert db_session.get(Memory, own.id).owner_id == member.id  # the original stays
    assert len(events(db_session, pilot.team.id, "memory.share")) == 1
    # A team the person is not in, or may not write to, is not one to choose.
    assert browser.post(path, {"team": "no-such-team"}, token_from=path).status_code == 400


def test_a_reader_is_offered_no_team_to_share_to(app, client, db_session, pilot):
    reader = pilot.people["reader"]
    own = reached.save_for(db_session, reach_of(db_session, reader.id), content="Mine.",
                           actor=Actor.of(reader)).memory
    db_session.commit()
    browser = Browser(app, reader)
    assert "/share" not in browser.get("/memories/").get_data(as_text=True)
    path = f"/memories/{own.id}/share"
    assert 'id="no-team"' in browser.get(path).get_data(as_text=True)
    assert browser.post(path, {"team": "pilot"}, token_from=path).status_code == 400
    assert db_session.scalar(select(func.count()).select_from(Memory).where(
        Memory.shared_from_id == own.id)) == 0


def save(browser: Browser, content: str):
    return browser.post("/teams/pilot/memories/", {"content": content},
                        token_from="/teams/pilot/memories/")


def test_a_member_saves_to_the_team_and_the_lead_sees_who_saved_it(app, client, db_session,
                                                                   pilot):
    member, lead = Browser(app, pilot.people["member"]), Browser(app, pilot.people["owner"])
    page = member.get("/teams/pilot/memories/").get_data(as_text=True)
    assert "Save to Pilot" in page
    first, second = save(member, "Heron ships on Tuesdays."), save(member,
                                                                    "Heron ships on Tuesdays.")
    assert (first.status_code, second.status_code) == (303, 303)
    assert first.headers["Location"] == second.headers["Location"]
    rows = db_session.scalars(select(Memory).where(Memory.owner_id == pilot.team.id)).all()
    assert [(m.author_id, m.source, m.content) for m in rows] == [
        (pilot.people["member"].id, "orbitpilot", "Heron ships on Tuesdays.")]
    seen = html.unescape(lead.get("/teams/pilot/memories/").get_data(as_text=True))
    assert f"Saved by {pilot.people['member'].display_name} via OrbitPilot" in seen
    assert 'href="/teams/pilot/access">Who can see this?</a>' in seen
    assert "Heron ships on Tuesdays." in seen
    assert save(member, "").status_code == 400


def test_a_reader_cannot_save_to_the_team(app, client, db_session, pilot):
    reader = Browser(app, pilot.people["reader"])
    assert 'id="read-only"' in reader.get("/teams/pilot/memories/").get_data(as_text=True)
    refused = save(reader, "Not mine to save.")
    assert refused.status_code == 403
    assert "does not let you save to it" in html.unescape(refused.get_data(as_text=True))
    assert db_session.scalar(select(func.count()).select_from(Memory).where(
        Memory.owner_id == pilot.team.id)) == 0


def test_the_list_filters_by_author_and_by_app(app, client, db_session, pilot):
    member, admin = pilot.people["member"], pilot.people["admin"]
    key, _ = make_key(db_session, member, name="codex-cli")
    reached.save_for(db_session, reach_of(db_session, member.id), team="pilot",
                     content="Through the key.", actor=Actor("api_key", str(key.id)),
                     api_key_id=key.id)
    reached.save_for(db_session, reach_of(db_session, admin.id), team="pilot",
                     content="Through the pages.", actor=Actor.of(admin))
    db_session.commit()
    lead = Browser(app, pilot.people["owner"])
    by_member = lead.get(f"/teams/pilot/memories/?author={member.id}").get_data(as_text=True)
    assert "Through the key." in by_member and "Through the pages." not in by_member
    by_key = html.unescape(lead.get(f"/teams/pilot/memories/?app=key:{key.id}")
                           .get_data(as_text=True))
    assert "Through the key." in by_key and "Through the pages." not in by_key
    assert f"via API key “codex-cli” ({key.prefix}…)" in by_key
    pages = lead.get("/teams/pilot/memories/?app=orbitpilot").get_data(as_text=True)
    assert "Through the pages." in pages and "Through the key." not in pages
    assert lead.get("/teams/pilot/memories/?author=abc").status_code == 400
    assert lead.get("/teams/pilot/memories/?status=gone").status_code == 400
    assert lead.get("/teams/pilot/memories/?cursor=nope").status_code == 400


def test_what_each_role_may_do_to_a_team_memory(app, client, db_session, pilot):
    member = pilot.people["member"]
    mine = reached.save_for(db_session, reach_of(db_session, member.id), team="pilot",
                            content="The member's own note.", actor=Actor.of(member)).memory
    theirs = reached.save_for(db_session, reach_of(db_session, pilot.people["admin"].id),
                              team="pilot", content="The admin's note.",
                              actor=Actor.of(pilot.people["admin"])).memory
    db_session.commit()
    browser = Browser(app, member)
    assert browser.get(f"/teams/pilot/memories/{mine.id}/edit").status_code == 200
    assert browser.get(f"/teams/pilot/memories/{theirs.id}/edit").status_code == 403
    assert browser.get(f"/teams/pilot/memories/{theirs.id}/forget").status_code == 403
    assert browser.get(
        f"/teams/pilot/memories/{mine.id}/forget?mode=hard_delete").status_code == 403
    reader = Browser(app, pilot.people["reader"])
    assert reader.get(f"/teams/pilot/memories/{mine.id}/forget").status_code == 403
    # A personal memory, or a made-up id, is no team memory: a 404 either way.
    own = reached.save_for(db_session, reach_of(db_session, member.id), content="Mine.",
                           actor=Actor.of(member)).memory
    db_session.commit()
    assert browser.get(f"/teams/pilot/memories/{own.id}/edit").status_code == 404
    assert browser.get("/teams/pilot/memories/not-an-id/edit").status_code == 404
    # The member changes their own; a second click with the same words is the same.
    path = f"/teams/pilot/memories/{mine.id}/edit"
    changed = browser.post(path, {"content": "The member's own note, changed."},
                           token_from=path)
    again = browser.post(path, {"content": "The member's own note, changed."},
                         token_from=path)
    assert (changed.status_code, again.status_code) == (303, 303)
    assert db_session.get(Memory, mine.id).version == 2


def test_forgetting_and_erasing_a_team_memory_leave_receipts(app, client, db_session,
                                                            pilot):
    member = pilot.people["member"]
    memory = reached.save_for(db_session, reach_of(db_session, member.id), team="pilot",
                              content=f"Forget me {CANARY}", actor=Actor.of(member)).memory
    db_session.commit()
    browser = Browser(app, member)
    path = f"/teams/pilot/memories/{memory.id}/forget"
    first = browser.post(path, {"mode": "soft_delete"}, token_from=f"{path}?mode=soft_delete")
    second = browser.post(path, {"mode": "soft_delete"}, token_from="/teams/pilot/memories/")
    assert (first.status_code, second.status_code) == (303, 303)
    assert first.headers["Location"] == second.headers["Location"]
    assert "/teams/pilot/memories/receipts/" in first.headers["Location"]
    assert db_session.get(Memory, memory.id).status == "deleted"
    # Erasing for good is an owner's or an admin's, with a confirm and its receipt page.
    assert browser.post(path, {"mode": "hard_delete"},
                        token_from="/teams/pilot/memories/").status_code == 403
    admin = Browser(app, pilot.people["admin"])
    confirm = admin.get(f"{path}?mode=hard_delete")
    assert confirm.status_code == 200 and "This cannot be undone." in confirm.get_data(
        as_text=True)
    erased = admin.post(path, {"mode": "hard_delete"}, token_from=f"{path}?mode=hard_delete")
    twice = admin.post(path, {"mode": "hard_delete"}, token_from="/teams/pilot/memories/")
    assert (erased.status_code, twice.status_code) == (303, 303)
    assert erased.headers["Location"] == twice.headers["Location"]
    assert db_session.get(Memory, memory.id) is None
    receipt = admin.get(erased.headers["Location"])
    assert receipt.status_code == 200 and CANARY not in receipt.get_data(as_text=True)
    assert 'data-mode="hard_delete"' in receipt.get_data(as_text=True)
    # Gone: its page answers 410 now, for anyone.
    assert browser.get(f"{path}?mode=soft_delete").status_code == 410


def test_a_forgotten_team_memory_is_restored_by_its_author(app, client, db_session, pilot):
    member = pilot.people["member"]
    memory = reached.save_for(db_session, reach_of(db_session, member.id), team="pilot",
                              content="Back soon.", actor=Actor.of(member)).memory
    forget_memory(db_session, pilot.team.id, memory.id, mode="soft_delete",
                  actor=Actor.of(member))
    db_session.commit()
    browser = Browser(app, member)
    path = f"/teams/pilot/memories/{memory.id}/restore"
    assert browser.get(path).status_code == 200
    first = browser.post(path, token_from=path)
    second = browser.post(path, token_from="/teams/pilot/memories/")
    assert (first.status_code, second.status_code) == (303, 303)
    assert db_session.get(Memory, memory.id).status == "active"


# -- the team's controls ----------------------------------------------------------------------

CONTROLS = {"write_policy": "admins", "forget_policy": "admins", "app_policy": "approve",
            "max_key_days": "30", "leaver_policy": "erase"}


def test_a_settings_change_is_audited_with_before_and_after(app, client, db_session, pilot):
    admin = Browser(app, pilot.people["admin"])
    page = admin.get("/teams/pilot/settings")
    assert page.status_code == 200
    first = admin.post("/teams/pilot/settings", CONTROLS, token_from="/teams/pilot/settings")
    second = admin.post("/teams/pilot/settings", CONTROLS, token_from="/teams/pilot/settings")
    assert (first.status_code, second.status_code) == (303, 303)
    team = db_session.get(Team, pilot.team.id)
    db_session.refresh(team)
    assert (team.write_policy, team.forget_policy, team.app_policy, team.max_key_days,
            team.leaver_policy) == ("admins", "admins", "approve", 30, "erase")
    changes = events(db_session, pilot.team.id, "team.policy_change")
    assert len(changes) == 1  # the second click changed nothing, and recorded nothing
    assert changes[0].details == {
        "before": {"write_policy": "members", "forget_policy": "author_or_admins",
                   "app_policy": "any", "max_key_days": None, "leaver_policy": "keep"},
        "after": {"write_policy": "admins", "forget_policy": "admins", "app_policy": "approve",
                  "max_key_days": 30, "leaver_policy": "erase"}}
    assert changes[0].actor_type == "user" and changes[0].actor_id == str(
        pilot.people["admin"].id)
    # The members' pages follow: a member may no longer save to the team.
    assert save(Browser(app, pilot.people["member"]), "Now refused.").status_code == 403


@pytest.mark.parametrize(("field", "value"), [("max_key_days", "0"),
                                              ("max_key_days", "ten"),
                                              ("write_policy", "everyone"),
                                              ("leaver_policy", "")])
def test_a_bad_control_is_a_form_error_and_changes_nothing(app, client, db_session, pilot,
                                                           field, value):
    page = Browser(app, pilot.people["owner"]).post(
        "/teams/pilot/settings", {**CONTROLS, field: value}, token_from="/teams/pilot/settings")
    assert page.status_code == 400 and 'invalid-feedback' in page.get_data(as_text=True)
    assert events(db_session, pilot.team.id, "team.policy_change") == []


def test_the_settings_show_the_plan_retention_and_a_legal_hold(app, client, db_session,
                                                               pilot):
    from dashboard.holds import place_hold

    staff = make_user(db_session, role="admin")
    place_hold(db_session, pilot.team.id, reason=f"Matter {CANARY}", ends_at=None,
               actor=Actor.of(staff))
    db_session.commit()
    page = html.unescape(Browser(app, pilot.people["owner"]).get("/teams/pilot/settings")
                         .get_data(as_text=True))
    assert 'id="legal-hold"' in page and "The team is under a legal hold" in page
    assert CANARY not in page  # the hold's reason is staff's, never shown here
    assert 'id="plan-line"' in page and "A forgotten memory can be restored for" in page


def test_apps_members_connected_wait_for_approval_and_are_approved(app, client, db_session,
                                                                   pilot):
    member = pilot.people["member"]
    grant, _ = make_connection(db_session, member, name=f"Agent {CANARY}")
    grant.team_ids = [pilot.team.id]
    pilot.team.app_policy = "approve"
    db_session.commit()
    client_id = grant.client.client_id
    admin = Browser(app, pilot.people["admin"])
    page = admin.get("/teams/pilot/settings").get_data(as_text=True)
    assert 'id="candidate-apps"' in page and client_id in page
    access = admin.get("/teams/pilot/access").get_data(as_text=True)
    assert "awaiting an admin" in access
    approve = {"client_pk": str(grant.client_pk), "op": "approve"}
    first = admin.post("/teams/pilot/settings/apps", approve, token_from="/teams/pilot/settings")
    second = admin.post("/teams/pilot/settings/apps", approve,
                        token_from="/teams/pilot/settings")
    assert (first.status_code, second.status_code) == (303, 303)
    assert db_session.get(TeamApp, (pilot.team.id, grant.client_pk)) is not None
    assert len(events(db_session, pilot.team.id, "team.app_allow")) == 1
    assert reach_of(db_session, member.id).seat_of(pilot.team.id) is not None
    page = admin.get("/teams/pilot/settings").get_data(as_text=True)
    assert 'id="allowed-apps"' in page and 'id="no-candidate-apps"' in page
    removed = admin.post("/teams/pilot/settings/apps", {**approve, "op": "remove"},
                         token_from="/teams/pilot/settings")
    assert removed.status_code == 303
    assert db_session.get(TeamApp, (pilot.team.id, grant.client_pk)) is None
    assert admin.post("/teams/pilot/settings/apps", {"client_pk": "999999999", "op": "approve"},
                      token_from="/teams/pilot/settings").status_code == 404
    assert Browser(app, member).post("/teams/pilot/settings/apps", approve,
                                     token_from="/teams/pilot/").status_code == 403


# -- who can see it, its status ---------------------------------------------------------------

def test_who_can_see_lists_members_abilities_and_every_credential_acting(app, client,
                                                                          db_session, pilot):
    member = pilot.people["member"]
    now = datetime.now(UTC)
    acting, _ = make_key(db_session, member, name="laptop", expires_at=now + timedelta(days=10))
    forever, _ = make_key(db_session, member, name="forever")
    other, _ = make_key(db_session, member, name="not-for-the-team")
    acting.team_ids, forever.team_ids = [pilot.team.id], [pilot.team.id]
    grant, _ = make_connection(db_session, pilot.people["reader"], name="Claude")
    grant.team_ids = [pilot.team.id]
    pilot.team.max_key_days = 30
    db_session.commit()
    page = html.unescape(Browser(app, pilot.people["reader"]).get("/teams/pilot/access")
                         .get_data(as_text=True))
    assert f'data-key="{acting.id}"' in page and acting.prefix in page
    assert grant.client.client_id in page
    assert "lives longer than the team allows (30 days; it never expires)" in page
    assert "not-for-the-team" not in page
    member_row = page[page.index(f'data-member="{member.id}"'):]
    assert "change their own" in member_row.split("</li>")[0]
    reader_row = page[page.index(f'data-member="{pilot.people["reader"].id}"'):]
    assert "May read and search." in reader_row.split("</li>")[0]
    # The home shows the same keys and apps beside their members.
    home = html.unescape(Browser(app, pilot.people["owner"]).get("/teams/pilot/")
                         .get_data(as_text=True))
    assert "API key “laptop”" in home and grant.client.client_id in home


def test_the_team_memory_status_shows_each_source_with_its_sentence(app, client, db_session,
                                                                    pilot):
    member = pilot.people["member"]
    reached.save_for(db_session, reach_of(db_session, member.id), team="pilot",
                     content="Built once for the team.", actor=Actor.of(member))
    build(db_session, db_session.get(User, pilot.team.id))
    db_session.commit()
    page = Browser(app, pilot.people["reader"]).get("/teams/pilot/status")
    text = html.unescape(page.get_data(as_text=True))
    assert page.status_code == 200
    account = db_session.get(User, pilot.team.id)
    resolution = resolve_sources(get_plan_for_user(account, db_session))
    for source in resolution.sources:  # every source, with the one sentence for its state
        row = text[text.index(f'<tr data-source="{source.key}"'):]
        assert state_sentence(source, resolution) in row.split("</tr>")[0]
    saved_row = text[text.index(f'<tr data-source="{SAVED}"'):].split("</tr>")[0]
    assert 'data-chunks="1"' in saved_row
    assert 'id="total-chunks">1<' in text
    assert "The team is on the" in text and 'id="last-build"' in text
    assert "Update my memory now" not in text and 'id="not-remembered"' not in text


# -- the team's audit log ---------------------------------------------------------------------

@pytest.fixture
def busy(db_session, pilot) -> Pilot:
    """A team with things done to it and its memories, the canary in every word typed."""
    member = pilot.people["member"]
    key, _ = make_key(db_session, member, name=f"key {CANARY}")
    grant, _ = make_connection(db_session, member, name=f"App {CANARY}")
    key.team_ids, grant.team_ids = [pilot.team.id], [pilot.team.id]
    reach = reach_of(db_session, member.id)
    noted = reached.save_for(db_session, reach, team="pilot", content=f"Note {CANARY}",
                             actor=Actor("api_key", str(key.id)), api_key_id=key.id,
                             client_name=f"Client {CANARY}").memory
    forget_memory(db_session, pilot.team.id, noted.id, mode="soft_delete",
                  actor=Actor.of(member), reason=f"Reason {CANARY}")
    owner = teams.membership(db_session, pilot.team.id, pilot.people["owner"].id)
    teams.invite(db_session, pilot.team, owner, email="audit@example.test", role="reader",
                 actor=Actor.of(pilot.people["owner"]))
    db_session.commit()
    return pilot


def test_the_audit_page_and_csv_hold_the_teams_events_and_no_content(app, client,
                                                                     db_session, busy):
    admin = Browser(app, busy.people["admin"])
    page = admin.get("/teams/pilot/audit")
    text = page.get_data(as_text=True)
    assert page.status_code == 200 and CANARY not in text
    shown = set(re.findall(r'data-action="([a-z_.]+)"', text))
    assert {"team.create", "team.remove", "team.invite", "memory.create",
            "memory.soft_delete"} <= shown
    assert shown == {e.action for e in events(db_session, busy.team.id)}
    # Another team's events are not this one's.
    other = make_team(db_session, busy.people["stranger"], slug="other-team")
    db_session.commit()
    assert f'data-seq="{events(db_session, other.id)[0].seq}"' not in admin.get(
        "/teams/pilot/audit").get_data(as_text=True)
    download = admin.get("/teams/pilot/audit.csv")
    assert download.status_code == 200 and download.mimetype == "text/csv"
    assert "attachment" in download.headers["Content-Disposition"]
    body = download.get_data(as_text=True)
    assert CANARY not in body
    rows = list(csv.DictReader(io.StringIO(body)))
    assert [int(r["seq"]) for r in rows] == [e.seq for e in reversed(events(
        db_session, busy.team.id))]
    forgot = next(r for r in rows if r["action"] == "memory.soft_delete")
    assert "marker_id=" in forgot["details"] and forgot["mode"] == "soft_delete"


def test_the_audit_page_filters_by_action_actor_and_date(app, client, db_session, busy):
    admin = Browser(app, busy.people["admin"])
    member_id = busy.people["member"].id
    by_action = admin.get("/teams/pilot/audit?action=team.invite").get_data(as_text=True)
    assert set(re.findall(r'data-action="([a-z_.]+)"', by_action)) == {"team.invite"}
    by_actor = admin.get(f"/teams/pilot/audit?actor=user:{member_id}").get_data(as_text=True)
    assert set(re.findall(r'data-action="([a-z_.]+)"', by_actor)) == {"memory.soft_delete"}
    by_kind = admin.get("/teams/pilot/audit?actor=api_key").get_data(as_text=True)
    assert set(re.findall(r'data-action="([a-z_.]+)"', by_kind)) == {"memory.create"}
    today = datetime.now(UTC).date()
    tomorrow = (today + timedelta(days=1)).isoformat()
    assert 'id="no-events"' in admin.get(f"/teams/pilot/audit?since={tomorrow}").get_data(
        as_text=True)
    assert 'id="no-events"' not in admin.get(
        f"/teams/pilot/audit?since={today.isoformat()}&until={today.isoformat()}").get_data(
        as_text=True)
    # The ends of the calendar are dates too (not a 500).
    assert 'id="no-events"' not in admin.get(
        "/teams/pilot/audit?since=0001-01-01&until=9999-12-31").get_data(as_text=True)
    csv_rows = list(csv.DictReader(io.StringIO(admin.get(
        "/teams/pilot/audit.csv?action=team.invite").get_data(as_text=True))))
    assert {r["action"] for r in csv_rows} == {"team.invite"}
    for bad in ("action=nope", "actor=robot", "actor=user:1%20OR", "since=yesterday",
                f"since={tomorrow}&until={today.isoformat()}", "before=abc",
                "before=1&after=2"):
        assert admin.get(f"/teams/pilot/audit?{bad}").status_code == 400, bad


def test_the_audit_page_pages_by_position(app, client, db_session, busy, monkeypatch):
    from dashboard.teams import reads

    monkeypatch.setattr(reads, "AUDIT_PAGE", 2)
    admin = Browser(app, busy.people["admin"])
    seqs = [e.seq for e in reversed(events(db_session, busy.team.id))]
    seen, path = [], "/teams/pilot/audit"
    while path:
        text = admin.get(path).get_data(as_text=True)
        seen += [int(s) for s in re.findall(r'<tr data-seq="(\d+)"', text)]
        older = re.search(r'rel="next" href="([^"]+)"', text)
        path = html.unescape(older.group(1)) if older else None
    assert seen == seqs and len(seqs) > 2
    back = admin.get(f"/teams/pilot/audit?after={seqs[-1]}").get_data(as_text=True)
    assert [int(s) for s in re.findall(r'<tr data-seq="(\d+)"', back)] == seqs[-3:-1]


# -- reads change nothing; POSTs are activity -------------------------------------------------

def test_no_get_or_head_of_a_team_page_changes_a_row(app, client, db_session, busy):
    member = busy.people["member"]
    memory = db_session.scalars(select(Memory).where(Memory.owner_id == busy.team.id)).first()
    marker = db_session.scalars(select(ForgetMarker).where(
        ForgetMarker.owner_id == busy.team.id)).first()
    token = teams.invite(db_session, busy.team,
                         teams.membership(db_session, busy.team.id, busy.people["owner"].id),
                         email=busy.people["stranger"].email, role="member",
                         actor=Actor.of(busy.people["owner"])).token
    db_session.commit()
    paths = [*[p.format(member=member.id) for p in PAGES], "/teams/",
             f"/teams/pilot/memories/{memory.id}/edit",
             f"/teams/pilot/memories/{memory.id}/forget?mode=redact",
             f"/teams/pilot/memories/{memory.id}/restore",
             f"/teams/pilot/memories/receipts/{marker.id}",
             f"/memories/{memory.id}/share", f"/teams/join/{token}"]
    browsers = [Browser(app, busy.people[who]) for who in ("owner", "member", "stranger")]
    before = checksums(db_session)  # once signed in (a sign-in stamps the account)
    for browser in browsers:
        for path in paths:
            got, head = browser.get(path), browser.head(path)
            assert got.status_code < 500 and head.status_code == got.status_code, path
    assert checksums(db_session) == before


def test_a_post_on_a_team_page_is_the_members_last_activity(app, client, db_session, pilot):
    member = pilot.people["member"]
    browser = Browser(app, member)
    browser.get("/teams/pilot/")
    browser.get("/teams/pilot/memories/")
    assert teams.membership(db_session, pilot.team.id, member.id).last_active_at is None
    assert save(browser, "Active now.").status_code == 303
    db_session.expire_all()
    stamped = teams.membership(db_session, pilot.team.id, member.id).last_active_at
    assert stamped is not None and datetime.now(UTC) - stamped < timedelta(minutes=5)
    home = Browser(app, pilot.people["owner"]).get("/teams/pilot/").get_data(as_text=True)
    row = home[home.index(f'id="member-{member.id}"'):].split("</li>")[0]
    assert "<dd class=\"col-sm-9\" data-last-activity>today</dd>" in row


# -- what a page costs ------------------------------------------------------------------------

def grow(db_session, pilot: Pilot, n: int) -> None:
    """``n`` more members, each with a key naming the team and a memory saved through it."""
    for _ in range(n):
        person = make_user(db_session)
        db_session.add(TeamMember(team_id=pilot.team.id, user_id=person.id, role="member"))
        db_session.flush()
        key, _ = make_key(db_session, person)
        key.team_ids = [pilot.team.id]
        reached.save_for(db_session, reach_of(db_session, person.id), team="pilot",
                         content="A note.", actor=Actor("api_key", str(key.id)),
                         api_key_id=key.id)
    db_session.commit()


@pytest.mark.parametrize("path", ["/teams/pilot/", "/teams/pilot/access",
                                  "/teams/pilot/memories/", "/teams/pilot/audit"])
def test_a_team_page_costs_the_same_queries_for_3_and_30_members(app, client, db_session,
                                                                 pilot, count_queries, path):
    browser = Browser(app, pilot.people["owner"])

    def cost() -> int:
        db_session.expire_all()
        with count_queries() as counted:
            assert browser.get(path).status_code == 200
        return counted.count

    grow(db_session, pilot, 3)
    few = cost()
    grow(db_session, pilot, 27)
    assert cost() == few


def test_leaving_under_the_erase_policy_erases_what_the_leaver_saved(app, client,
                                                                      db_session, pilot):
    member = pilot.people["member"]
    pilot.team.leaver_policy = "erase"
    saved = reached.save_for(db_session, reach_of(db_session, member.id), team="pilot",
                             content="Mine to take with me.", actor=Actor.of(member)).memory
    db_session.commit()
    browser = Browser(app, member)
    asked = html.unescape(browser.get("/teams/pilot/leave").get_data(as_text=True))
    assert "the 1 memory you saved to the team is erased for good" in asked
    assert browser.post("/teams/pilot/leave", token_from="/teams/pilot/").status_code == 303
    assert db_session.get(Memory, saved.id) is None
    marker = db_session.scalars(select(ForgetMarker).where(
        ForgetMarker.memory_id == saved.id)).one()
    assert (marker.mode, marker.owner_id) == ("hard_delete", pilot.team.id)
    assert events(db_session, pilot.team.id, "team.leave")[-1].details["erased"] == 1


def test_a_guest_accepting_is_sent_to_sign_in_first(app, client, db_session, pilot):
    owner = teams.membership(db_session, pilot.team.id, pilot.people["owner"].id)
    invited = teams.invite(db_session, pilot.team, owner, email="guest@example.test",
                           role="member", actor=Actor.of(pilot.people["owner"]))
    db_session.commit()
    guest = Browser(app)
    path = f"/teams/join/{invited.token}"
    answer = guest.post(path, token_from="/auth/signin")
    assert answer.status_code == 302 and "/auth/signin" in answer.headers["Location"]
    assert db_session.get(TeamInvitation, invited.invitation.id).accepted_at is None
