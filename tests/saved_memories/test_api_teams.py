"""The memory API through a key's teams: saving to a team is deliberate and needs a writer's
role; a team the key does not reach answers exactly as one that does not exist; lists and
search span the owner's and the teams' memory, each labelled, filtered by team, author and
app; removal, a key without the team and a key outliving the team's limit reach nothing of
it on the very next call; sharing, changing and forgetting follow the role and the team's
policy (hard delete needs the scope too); receipts of team memories; attribution comes
from the key, never from what the client says; a canary reaches no audit event or log."""

from __future__ import annotations

import logging
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import func, select

from dashboard.access import reach_of
from dashboard.audit.models import AuditEvent
from dashboard.audit.services import Actor
from dashboard.auth.models import User
from dashboard.saved_memories import reach as reached
from dashboard.saved_memories.models import Memory
from dashboard.teams.models import TeamMember
from tests.factories import ALL_SCOPES, build, make_connection, make_key, make_team, make_user
from tests.saved_memories.helpers import unique_canary
from tests.saved_memories.test_api import Api, assert_problem

EVERYDAY = ("memory:read", "memory:write", "memory:delete", "memory:redact")


class Pilot:
    """A team "pilot" led by ``lead`` (owner), with an admin, a member and a reader; each
    of them with a key that acts for it; and ``stranger``, in no team."""

    def __init__(self, session, client) -> None:
        self.session, self.client = session, client
        self.lead, self.admin, self.member, self.reader, self.stranger = (
            make_user(session) for _ in range(5))
        self.team = make_team(session, self.lead, slug="pilot", name="Pilot", members={
            self.admin: "admin", self.member: "member", self.reader: "reader"})
        session.commit()

    def api(self, user, *, scopes=EVERYDAY, teams=True, name="test client",
            expires_at=None) -> Api:
        key, raw = make_key(self.session, user, scopes=scopes, name=name,
                            team_ids=[self.team.id] if teams else [], expires_at=expires_at)
        # Committed (a savepoint released): a refused call rolls back, not the test's rows.
        self.session.commit()
        api = Api(self.client, raw)
        api.key = key
        return api

    def saved_by(self, user, content: str, **fields) -> Memory:
        """A memory ``user`` saved to the team on their own pages."""
        memory = reached.save_for(self.session, reach_of(self.session, user.id),
                                  team="pilot", content=content, actor=Actor.of(user),
                                  **fields).memory
        self.session.commit()
        return memory


@pytest.fixture
def pilot(db_session, client, queue) -> Pilot:
    return Pilot(db_session, client)


def save(api: Api, content: str, **fields) -> dict:
    response = api.post("/v1/memories", json={"content": content, **fields})
    assert response.status_code == 201, response.get_data(as_text=True)
    return response.get_json()["memory"]


def listed(api: Api, **query) -> list[dict]:
    response = api.get("/v1/memories", query_string=query)
    assert response.status_code == 200, response.get_data(as_text=True)
    return response.get_json()["items"]


def searched(api: Api, query: str, **filters) -> list[dict]:
    response = api.post("/v1/memories/search", json={"query": query, "k": 20, **filters})
    assert response.status_code == 200, response.get_data(as_text=True)
    return response.get_json()["results"]


def build_all(session, *users) -> None:
    for user in users:
        build(session, user, commit=True)


# -- saving ----------------------------------------------------------------------------------

def test_a_member_saves_to_the_team_named_by_their_key_and_whoever_reads_sees_who(pilot):
    member = pilot.api(pilot.member, name="codex-cli")
    memory = save(member, "The billing rewrite is called Heron.", team="pilot")
    row = pilot.session.get(Memory, uuid.UUID(memory["id"]))
    assert (row.owner_id, row.author_id, row.api_key_id) == (pilot.team.id, pilot.member.id,
                                                            member.key.id)
    assert memory["owner"] == "pilot"
    key = {"id": member.key.id, "name": "codex-cli", "prefix": member.key.prefix}
    assert memory["attribution"] == {
        "owner": "pilot", "owner_name": "Pilot", "author_id": pilot.member.id,
        "author": "you", "key": key, "app": None,
        "via": f"API key \u201ccodex-cli\u201d ({member.key.prefix}\u2026)"}
    # The lead reads it through their own key: saved by the member, with that key.
    answer = pilot.api(pilot.lead).get(f"/v1/memories/{memory['id']}")
    assert answer.status_code == 200
    said = answer.get_json()["attribution"]
    assert (said["author"], said["author_id"], said["key"]) == (
        pilot.member.display_name, pilot.member.id, key)


def test_without_a_team_named_a_save_is_the_callers_own(pilot):
    memory = save(pilot.api(pilot.member), "My own note.")
    assert memory["owner"] == "personal"
    assert pilot.session.get(Memory, uuid.UUID(memory["id"])).owner_id == pilot.member.id


def test_a_reader_may_not_save_to_the_team(pilot):
    reader = pilot.api(pilot.reader)
    body = assert_problem(reader.post("/v1/memories", json={"content": "No.",
                                                             "team": "pilot"}), 403)
    assert (body["title"], body["detail"]) == (
        "Forbidden", "Your role in Pilot (reader) does not let you save to it.")
    assert pilot.session.scalars(select(Memory).where(
        Memory.owner_id == pilot.team.id)).all() == []


def test_a_team_out_of_reach_answers_byte_for_byte_as_one_that_does_not_exist(pilot):
    outsider = pilot.api(pilot.stranger, teams=False)
    without = pilot.api(pilot.member, teams=False)  # a member, but the key lacks the team
    answers = [api.post("/v1/memories", json={"content": "x", "team": team})
               for api in (outsider, without) for team in ("pilot", "no-such-team")]
    for answer in answers:
        assert_problem(answer, 404)
    assert len({answer.get_data() for answer in answers}) == 1
    lists = [api.get("/v1/memories", query_string={"team": team})
             for api in (outsider, without) for team in ("pilot", "no-such-team")]
    assert {answer.status_code for answer in lists} == {404}
    assert {answer.get_data() for answer in lists} == {answers[0].get_data()}


# -- lists, search, filters ------------------------------------------------------------------

@pytest.fixture
def seeded(pilot):
    """The member's own note (their key), a team memory by the member's key, one by the
    lead on OrbitPilot's pages, one through a connected app calling itself ChatGPT."""
    member = pilot.api(pilot.member, name="codex-cli")
    grant, _ = make_connection(pilot.session, pilot.lead, scopes=("memory:write",),
                               name="ChatGPT")
    client = grant.client
    memories = {
        "own": save(member, "Heron demo on Friday, my own note."),
        "team_key": save(member, "Heron ships in May.", team="pilot"),
        "team_page": pilot.saved_by(pilot.lead, "Heron budget is approved."),
        "team_app": pilot.saved_by(pilot.lead, "Heron kickoff notes.",
                                   oauth_client_pk=client.id, client_name="ChatGPT"),
    }
    ids = {name: str(m["id"] if isinstance(m, dict) else m.id) for name, m in memories.items()}
    return member, client, ids


def test_a_list_spans_the_owners_and_the_teams_memory_each_labelled(pilot, seeded):
    member, _, ids = seeded
    items = listed(member)
    assert {item["id"]: item["owner"] for item in items} == {
        ids["own"]: "personal", ids["team_key"]: "pilot", ids["team_page"]: "pilot",
        ids["team_app"]: "pilot"}


@pytest.mark.parametrize(("query", "expected"), [
    ({"team": "pilot"}, {"team_key", "team_page", "team_app"}),
    ({"team": "personal"}, {"own"}),
    ({"author": "lead"}, {"team_page", "team_app"}),
    ({"app": "key"}, {"own", "team_key"}),
    ({"app": "orbitpilot"}, {"team_page"}),
    ({"app": "client"}, {"team_app"}),
    ({"team": "pilot", "app": "key"}, {"team_key"}),
])
def test_lists_and_searches_filter_by_team_author_and_app(pilot, seeded, query, expected):
    member, client, ids = seeded
    values = {"lead": str(pilot.lead.id), "key": f"key:{member.key.id}",
              "client": client.client_id}
    query = {name: values.get(value, value) for name, value in query.items()}
    names = {value: name for name, value in ids.items()}
    assert {names[item["id"]] for item in listed(member, **query)} == expected
    build_all(pilot.session, pilot.member, pilot.session.get(User, pilot.team.id))
    filters = {name: int(value) if name == "author" else value
               for name, value in query.items()}
    assert {names[hit["memory_id"]] for hit in searched(member, "Heron", **filters)} == \
        expected


def test_one_search_returns_personal_and_team_hits_each_labelled_and_attributed(
        pilot, seeded):
    member, client, ids = seeded
    build_all(pilot.session, pilot.member, pilot.session.get(User, pilot.team.id))
    hits = {hit["memory_id"]: hit for hit in searched(member, "Heron")}
    assert set(hits) == set(ids.values())
    assert hits[ids["own"]]["owner"] == "personal"
    assert {hits[ids[name]]["owner"] for name in ("team_key", "team_page", "team_app")} == \
        {"pilot"}
    app = hits[ids["team_app"]]["attribution"]
    assert app["app"] == {"client_id": client.client_id, "claimed_name": "ChatGPT"}
    assert app["via"] == f"app {client.client_id} (it calls itself \u201cChatGPT\u201d)"
    assert hits[ids["team_page"]]["attribution"]["via"] == "OrbitPilot"


def test_a_removed_member_sees_nothing_of_the_team_on_their_very_next_call(pilot, seeded):
    member, _, ids = seeded
    build_all(pilot.session, pilot.member, pilot.session.get(User, pilot.team.id))
    assert len(searched(member, "Heron")) == 4
    pilot.session.delete(pilot.session.get(TeamMember, (pilot.team.id, pilot.member.id)))
    pilot.session.commit()
    assert [hit["memory_id"] for hit in searched(member, "Heron")] == [ids["own"]]
    assert [item["id"] for item in listed(member)] == [ids["own"]]
    assert_problem(member.get(f"/v1/memories/{ids['team_page']}"), 404)
    assert_problem(member.get("/v1/memories", query_string={"team": "pilot"}), 404)


def test_a_key_without_the_team_sees_none_of_it(pilot, seeded):
    _, _, ids = seeded
    build_all(pilot.session, pilot.member, pilot.session.get(User, pilot.team.id))
    personal = pilot.api(pilot.member, teams=False)
    assert [hit["memory_id"] for hit in searched(personal, "Heron")] == [ids["own"]]
    assert [item["id"] for item in listed(personal)] == [ids["own"]]
    unknown = assert_problem(personal.get(f"/v1/memories/{uuid.uuid4()}"), 404)
    assert assert_problem(personal.get(f"/v1/memories/{ids['team_key']}"), 404) == unknown


def test_a_key_that_outlives_the_teams_limit_does_not_reach_it(pilot, seeded):
    _, _, ids = seeded
    now = datetime.now(UTC)
    short = pilot.api(pilot.member, expires_at=now + timedelta(days=20))
    long_ = pilot.api(pilot.member, expires_at=now + timedelta(days=40))
    endless = pilot.api(pilot.member)
    pilot.team.max_key_days = 30  # set after the keys were made: checked at every call
    pilot.session.commit()
    assert len(listed(short)) == 4
    assert [item["id"] for item in listed(long_)] == [ids["own"]]
    assert [item["id"] for item in listed(endless)] == [ids["own"]]
    assert_problem(long_.post("/v1/memories", json={"content": "x", "team": "pilot"}), 404)


# -- sharing -----------------------------------------------------------------------------------

def test_sharing_copies_a_personal_memory_to_the_team_with_its_provenance(pilot):
    member = pilot.api(pilot.member)
    own = save(member, "Standup is at 9:30.")
    answer = member.post(f"/v1/memories/{own['id']}/share", json={"team": "pilot"})
    assert answer.status_code == 201, answer.get_data(as_text=True)
    shared = answer.get_json()["memory"]
    assert answer.headers["Location"] == f"/v1/memories/{shared['id']}"
    assert (shared["owner"], shared["content"], shared["attribution"]["author_id"]) == (
        "pilot", "Standup is at 9:30.", pilot.member.id)
    row = pilot.session.get(Memory, uuid.UUID(shared["id"]))
    assert (row.owner_id, row.shared_from_id) == (pilot.team.id, uuid.UUID(own["id"]))
    event = pilot.session.scalars(select(AuditEvent).where(  # the log keeps every run's
        AuditEvent.action == "memory.share", AuditEvent.target_id == shared["id"])).one()
    assert event.details == {"from": own["id"], "team": pilot.team.id}
    # A retry (the answer lost on the way) gets the same copy: 200, no second copy, no
    # second share in the log.
    again = member.post(f"/v1/memories/{own['id']}/share", json={"team": "pilot"})
    assert again.status_code == 200, again.get_data(as_text=True)
    assert again.get_json()["memory"]["id"] == shared["id"]
    assert again.headers["Location"] == f"/v1/memories/{shared['id']}"
    assert pilot.session.scalar(select(func.count()).select_from(Memory).where(
        Memory.shared_from_id == uuid.UUID(own["id"]))) == 1
    assert pilot.session.scalar(select(func.count()).select_from(AuditEvent).where(
        AuditEvent.action == "memory.share",
        AuditEvent.details["from"].astext == own["id"])) == 1
    # A reader may not; a team out of reach is the unknown-team 404; a forgotten
    # memory is a conflict; "personal" names no team.
    reader = pilot.api(pilot.reader)
    theirs = save(reader, "Reader's note.")
    assert_problem(reader.post(f"/v1/memories/{theirs['id']}/share",
                               json={"team": "pilot"}), 403)
    assert_problem(member.post(f"/v1/memories/{own['id']}/share",
                               json={"team": "elsewhere"}), 404)
    assert member.delete(f"/v1/memories/{own['id']}").status_code == 200
    assert_problem(member.post(f"/v1/memories/{own['id']}/share",
                               json={"team": "pilot"}), 409)
    assert_problem(member.post(f"/v1/memories/{own['id']}/share",
                               json={"team": "personal"}), 422)


def test_only_ones_own_memory_is_shared(pilot):
    team_memory = pilot.saved_by(pilot.lead, "The team's own.")
    member = pilot.api(pilot.member)
    assert_problem(member.post(f"/v1/memories/{team_memory.id}/share",
                               json={"team": "pilot"}), 404)


# -- changing and forgetting, by role and policy ----------------------------------------------

def test_a_member_changes_and_forgets_their_own_team_memory_but_not_others(pilot):
    member = pilot.api(pilot.member)
    mine = save(member, "Mine to change.", team="pilot")
    lead_s = pilot.saved_by(pilot.lead, "The lead's.")
    answer = member.patch(f"/v1/memories/{mine['id']}", json={"content": "Changed."})
    assert answer.status_code == 200 and answer.get_json()["owner"] == "pilot"
    refused = assert_problem(member.patch(f"/v1/memories/{lead_s.id}",
                                          json={"content": "No."}), 403)
    assert refused["detail"] == "Your role in Pilot (member) does not let you change " \
                                "this memory."
    assert_problem(member.delete(f"/v1/memories/{lead_s.id}"), 403)
    assert_problem(member.post(f"/v1/memories/{lead_s.id}/forget",
                               json={"mode": "redact"}), 403)
    deleted = member.delete(f"/v1/memories/{mine['id']}")
    assert deleted.status_code == 200
    assert member.post(f"/v1/memories/{mine['id']}/restore").status_code == 200
    redacted = member.post(f"/v1/memories/{mine['id']}/forget", json={"mode": "redact"})
    assert redacted.status_code == 200
    assert redacted.get_json()["memory"]["owner"] == "pilot"
    reader = pilot.api(pilot.reader)
    assert_problem(reader.delete(f"/v1/memories/{lead_s.id}"), 403)
    assert pilot.session.get(Memory, lead_s.id).status == "active"


def test_an_admin_forgets_anyones_and_a_strict_policy_leaves_members_none(pilot):
    member = pilot.api(pilot.member)
    mine = save(member, "Member's.", team="pilot")
    other = save(member, "Member's other.", team="pilot")
    admin = pilot.api(pilot.admin)
    assert admin.delete(f"/v1/memories/{mine['id']}").status_code == 200
    pilot.team.forget_policy = "admins"
    pilot.session.commit()
    assert_problem(member.delete(f"/v1/memories/{other['id']}"), 403)
    assert_problem(member.post(f"/v1/memories/{other['id']}/forget",
                               json={"mode": "redact"}), 403)
    pilot.team.write_policy = "admins"  # and saving to the team is for admins alone
    pilot.session.commit()
    assert_problem(member.patch(f"/v1/memories/{other['id']}", json={"content": "x"}), 403)
    assert_problem(member.post("/v1/memories", json={"content": "x", "team": "pilot"}), 403)
    assert admin.post("/v1/memories", json={"content": "x", "team": "pilot"}
                      ).status_code == 201


def test_hard_delete_of_a_team_memory_needs_an_admin_and_the_scope(pilot):
    member = pilot.api(pilot.member, scopes=ALL_SCOPES)
    mine = save(member, "To erase.", team="pilot")
    refused = assert_problem(member.delete(f"/v1/memories/{mine['id']}",
                                           query_string={"mode": "hard_delete"}), 403)
    assert "(member)" in refused["detail"]
    scoped = assert_problem(pilot.api(pilot.admin).delete(
        f"/v1/memories/{mine['id']}", query_string={"mode": "hard_delete"}), 403)
    assert "memory:hard_delete" in scoped["detail"] and scoped["title"] == "Missing scope"
    admin = pilot.api(pilot.admin, scopes=ALL_SCOPES)
    answer = admin.post(f"/v1/memories/{mine['id']}/forget", json={"mode": "hard_delete"})
    assert answer.status_code == 200, answer.get_data(as_text=True)
    assert pilot.session.get(Memory, uuid.UUID(mine["id"])) is None
    assert_problem(member.get(f"/v1/memories/{mine['id']}"), 410)


def test_the_order_is_target_then_role_then_state(pilot):
    reader = pilot.api(pilot.reader)
    assert_problem(reader.delete(f"/v1/memories/{uuid.uuid4()}"), 404)
    gone = pilot.saved_by(pilot.lead, "Deleted already.")
    assert pilot.api(pilot.lead).delete(f"/v1/memories/{gone.id}").status_code == 200
    # The member may not delete the lead's memory: 403, before its state (409).
    assert_problem(pilot.api(pilot.member).delete(f"/v1/memories/{gone.id}"), 403)
    assert_problem(pilot.api(pilot.lead).delete(f"/v1/memories/{gone.id}"), 409)


# -- receipts ----------------------------------------------------------------------------------

def test_members_read_the_receipts_of_team_memories_others_get_404(pilot):
    memory = pilot.saved_by(pilot.lead, "To forget.")
    answer = pilot.api(pilot.admin).delete(f"/v1/memories/{memory.id}")
    marker = answer.get_json()["receipt"]["marker_id"]
    member = pilot.api(pilot.member)
    receipts = member.get(f"/v1/memories/{memory.id}/receipts")
    assert receipts.status_code == 200
    assert [r["marker_id"] for r in receipts.get_json()["items"]] == [marker]
    assert member.get(f"/v1/erasure-receipts/{marker}").get_json()["marker_id"] == marker
    for outside in (pilot.api(pilot.stranger, teams=False),
                    pilot.api(pilot.member, teams=False)):
        assert_problem(outside.get(f"/v1/erasure-receipts/{marker}"), 404)
        assert_problem(outside.get(f"/v1/memories/{memory.id}/receipts"), 404)


# -- attribution nobody can spoof, and no content where it does not belong --------------------

def test_a_key_named_codex_cli_claiming_chatgpt_is_shown_as_the_key_it_is(pilot):
    codex = pilot.api(pilot.member, name="codex-cli")
    memory = save(codex, "Heron uses Postgres.", team="pilot", source="chatgpt")
    assert memory["source"] == "chatgpt"  # the client's claim, kept as such
    build_all(pilot.session, pilot.session.get(User, pilot.team.id))
    lead = pilot.api(pilot.lead)
    for said in (lead.get(f"/v1/memories/{memory['id']}").get_json()["attribution"],
                 searched(lead, "Heron Postgres")[0]["attribution"]):
        assert said["via"] == f"API key \u201ccodex-cli\u201d ({codex.key.prefix}\u2026)"
        assert said["key"]["name"] == "codex-cli" and said["app"] is None
        assert "ChatGPT" not in str(said) and "chatgpt" not in str(said)
    # A client cannot name itself on this API at all.
    assert_problem(codex.post("/v1/memories", json={"content": "x", "team": "pilot",
                                                     "client_name": "ChatGPT"}), 422)


def test_a_canary_in_team_memories_reaches_no_audit_event_or_log(pilot, caplog):
    canary = unique_canary()
    caplog.set_level(logging.DEBUG)
    member = pilot.api(pilot.member)
    memory = save(member, f"{canary} is the codename.", team="pilot",
                  metadata={"label": canary})
    member.patch(f"/v1/memories/{memory['id']}", json={"content": f"{canary} renamed."})
    build_all(pilot.session, pilot.session.get(User, pilot.team.id))
    assert searched(member, canary, team="pilot")
    own = save(member, f"{canary} mine.")
    assert member.post(f"/v1/memories/{own['id']}/share",
                       json={"team": "pilot"}).status_code == 201
    assert member.post(f"/v1/memories/{memory['id']}/forget",
                       json={"mode": "redact", "reason": f"{canary} reason"}
                       ).status_code == 200
    events = pilot.session.scalars(select(AuditEvent).where(
        AuditEvent.owner_id.in_([pilot.team.id, pilot.member.id]))).all()
    assert {"memory.create", "memory.update", "memory.share", "memory.redact"} <= \
        {event.action for event in events}
    for event in events:
        values = [getattr(event, c.key) for c in AuditEvent.__table__.columns]
        assert canary not in repr(values), event.action
    assert caplog.records and canary not in caplog.text
