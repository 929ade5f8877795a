"""The chat recalls across a person's teams: one search over their own memory and every
team they are in, each "Drew on" item saying whose it is (and, for a team's saved memory,
who saved it through which credential), the built-in answer naming the team, a removed
member's next answer drawing on nothing of the team, and an erasure of a team's memory
reaching every member's replies, records and exports."""

from __future__ import annotations

import logging
import uuid

from sqlalchemy import func, select

from dashboard.access import reach_of
from dashboard.audit.services import Actor
from dashboard.auth.models import User
from dashboard.exports import DataExport, build_export, request_export
from dashboard.memory import get_embedder
from dashboard.orbitpilot.conversations import conversation_messages
from dashboard.orbitpilot.models import Message, ReplyRecall
from dashboard.orbitpilot.replies import send_message
from dashboard.orbitpilot.responder import BuiltinResponder
from dashboard.saved_memories import SCOPE_FOR_OPERATION, forget_memory
from dashboard.saved_memories import reach as reached
from dashboard.sources import SAVED
from dashboard.teams import services as teams
from tests.factories import build, make_connection, make_key, make_plan, make_team, make_user
from tests.orbitpilot.conftest import send
from tests.orbitpilot.dom import parse

ALL_SCOPES = list(SCOPE_FOR_OPERATION.values())


def _pilot(db_session, canary: str):
    """A lead and a member of the team Pilot; a memory the lead saved to the team with
    the API key "codex-cli" and one the member saved to their own memory; both built."""
    plan = make_plan(db_session, cap=5)
    lead, member = make_user(db_session, plan=plan), make_user(db_session, plan=plan)
    team = make_team(db_session, lead, slug="pilot", name="Pilot",
                     members={member: "member"})
    key, _ = make_key(db_session, lead, name="codex-cli")
    shared = reached.save_for(
        db_session, reach_of(db_session, lead.id), team="pilot",
        content=f"Heron {canary} is the codename of the billing rewrite.",
        actor=Actor("api_key", str(key.id)), api_key_id=key.id).memory
    own = reached.save_for(db_session, reach_of(db_session, member.id),
                           content=f"My Heron {canary} demo is on Friday.",
                           actor=Actor.of(member)).memory
    for owner in (team.account, member):
        build(db_session, owner, "full")
    return lead, member, team, key, shared, own


def test_a_members_reply_draws_on_the_team_names_it_and_says_who_saved_it(
        client, db_session, auth, caplog):
    canary = uuid.uuid4().hex
    lead, member, team, key, shared, own = _pilot(db_session, canary)
    db_session.commit()
    auth.login(member.email)
    caplog.set_level(logging.DEBUG)
    body = send(client, f"What is Heron {canary}?").get_json()

    items = {item["owner"]: item for item in body["drew_on"]["items"]}
    assert set(items) == {"personal", "pilot"}
    assert (items["pilot"]["item_id"], items["pilot"]["team"]) == (str(shared.id), "Pilot")
    assert items["pilot"]["saved_by"] == (f"Saved by {lead.display_name} via API key "
                                          f"\u201ccodex-cli\u201d ({key.prefix}\u2026)")
    assert items["pilot"]["url"] == f"/teams/pilot/memories#memory-{shared.id}"
    assert (items["personal"]["item_id"], items["personal"]["team"]) == (str(own.id), None)
    assert items["personal"]["saved_by"] is None
    # The built-in answer quotes both, the team's named by its team.
    reply = body["reply"]["content"]
    assert f"the team Pilot's saved memory: \u201cHeron {canary}" in reply
    assert f"your saved memory: \u201cMy Heron {canary}" in reply
    # Recorded in the member's own data: whose chunk each was, never the text.
    rows = db_session.scalars(select(ReplyRecall).where(
        ReplyRecall.message_id == body["reply"]["id"])).all()
    assert {(r.user_id, r.owner_id) for r in rows} == {(member.id, member.id),
                                                       (member.id, team.id)}
    # The conversation page lists both, each saying whose; the team's with its author.
    page = parse(client.get(body["conversation_url"]).get_data(as_text=True))
    listed = {li.attrs["data-owner"]: li for li in
              page.find(id=f"m{body['reply']['id']}").find_all(data_op_drew_on_item=True)}
    assert set(listed) == {"personal", "pilot"}
    assert listed["pilot"].find(data_op_owner=True).normalized_text == "Team Pilot"
    assert "codex-cli" in listed["pilot"].find(data_op_saved_by=True).text
    assert listed["personal"].find(data_op_owner=True).normalized_text == "Personal"
    assert canary not in caplog.text


def test_a_team_memory_saved_through_a_connected_app_is_attributed_to_the_app(db_session):
    canary = uuid.uuid4().hex
    plan = make_plan(db_session, cap=5)
    lead, member = make_user(db_session, plan=plan), make_user(db_session, plan=plan)
    team = make_team(db_session, lead, slug="pilot", name="Pilot", members={member: "reader"})
    grant, _ = make_connection(db_session, lead, name="Claude")
    reached.save_for(db_session, reach_of(db_session, lead.id), team="pilot",
                     content=f"Heron {canary} ships in May.", actor=Actor.of(lead),
                     oauth_client_pk=grant.client_pk, client_name="Totally Not Claude")
    build(db_session, team.account, "full")
    exchange = send_message(db_session, responder=BuiltinResponder(), user_id=member.id,
                            text=f"Heron {canary}", embedder=get_embedder("hashing"))
    (item,) = exchange.reply.drew_on
    assert (item.owner, item.team, item.may_forget) == ("pilot", "Pilot", False)  # a reader
    client_id = grant.client.client_id
    assert item.saved_by == (f"Saved by {lead.display_name} via app {client_id} (it calls "
                             "itself \u201cTotally Not Claude\u201d)")


def test_a_removed_member_draws_on_no_team_memory_from_the_next_answer_on(db_session):
    canary = uuid.uuid4().hex
    lead, member, team, _key, shared, _own = _pilot(db_session, canary)
    first = send_message(db_session, responder=BuiltinResponder(), user_id=member.id,
                         text=f"Heron {canary}", embedder=get_embedder("hashing"))
    assert "pilot" in {item.owner for item in first.reply.drew_on}
    owner = teams.membership(db_session, team.id, lead.id)
    teams.remove_member(db_session, team, owner, member.id, actor=Actor.of(lead))

    after = send_message(db_session, responder=BuiltinResponder(), user_id=member.id,
                         text=f"Heron {canary}", conversation_id=str(first.conversation_id),
                         embedder=get_embedder("hashing"))
    assert {item.owner for item in after.reply.drew_on} == {"personal"}
    assert "team Pilot" not in after.reply.content
    assert "billing rewrite" not in after.reply.content
    # The earlier reply's list no longer shows what they cannot reach.
    shown = conversation_messages(db_session, first.conversation_id)
    listed = {item.owner for m in shown for item in m.drew_on}
    assert listed == {"personal"}


def test_the_chat_page_reads_drew_on_in_the_same_queries_for_one_team_item_or_three(
        db_session, count_queries):
    canary = uuid.uuid4().hex
    lead, member, team, key, _shared, _own = _pilot(db_session, canary)
    for n in range(2):
        reached.save_for(db_session, reach_of(db_session, lead.id), team="pilot",
                         content=f"Heron {canary} note {n}.",
                         actor=Actor("api_key", str(key.id)), api_key_id=key.id)
    build(db_session, team.account, "full")

    def cost(k: int) -> tuple[int, int]:
        exchange = send_message(db_session, responder=BuiltinResponder(), user_id=member.id,
                                text=f"Heron {canary} note", memory_k=k,
                                embedder=get_embedder("hashing"))
        team_items = sum(1 for item in exchange.reply.drew_on if item.owner == "pilot")
        with count_queries() as counted:
            conversation_messages(db_session, exchange.conversation_id)
        return team_items, counted.count

    one, three = cost(1), cost(4)
    assert (one[0], three[0]) == (1, 3)
    assert one[1] == three[1]


def test_erasing_a_team_memory_reaches_each_members_replies_records_and_exports(db_session):
    canary = uuid.uuid4().hex
    lead, member, team, _key, shared, _own = _pilot(db_session, canary)
    other = make_user(db_session, plan=make_plan(db_session, cap=5))
    db_session.add(teams.TeamMember(team_id=team.id, user_id=other.id, role="reader"))
    db_session.flush()
    replies = [send_message(db_session, responder=BuiltinResponder(), user_id=person.id,
                            text=f"Heron {canary}", embedder=get_embedder("hashing"))
               for person in (member, other)]
    assert all("billing rewrite" in r.reply.content for r in replies)
    exports = {}
    for person in (member, other, lead):  # the lead is the memory's author
        export, _ = request_export(db_session, person, interval=0)
        assert build_export(db_session, export.id) == "ready"
        exports[person.id] = export.id

    receipt = forget_memory(db_session, team.id, shared.id, mode="hard_delete",
                            actor=Actor.of(lead), scopes=ALL_SCOPES)
    assert receipt.copies["replies"] == {"removed": 2, "left": 0}
    assert receipt.copies["drew_on"] == {"removed": 2, "left": 0}
    assert receipt.copies["exports"] == {"removed": 3, "left": 0}
    for exchange in replies:  # the quote is gone from each member's reply
        assert "billing rewrite" not in db_session.get(Message, exchange.reply.id).content
    assert db_session.scalar(select(func.count()).select_from(ReplyRecall).where(
        ReplyRecall.owner_id == team.id, ReplyRecall.source_key == SAVED)) == 0
    assert {db_session.get(DataExport, e).status for e in exports.values()} == {"withdrawn"}
    assert db_session.get(User, team.id).kind == "team"
