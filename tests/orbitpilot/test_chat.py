"""Chat with OrbitPilot: the pages, sending, ending, guests, the responder, the
memory notice and its query budget, the honesty note, Catch, escaping and the CSP rules."""

from __future__ import annotations

import logging
import math
import re
from datetime import UTC, datetime, timedelta

import pytest
from flask import render_template
from flask_login import login_user
from markupsafe import escape
from sqlalchemy import func, select

from dashboard.blinks.models import Blink
from dashboard.extensions import db
from dashboard.memory import get_embedder
from dashboard.memory.pipeline import run_memory_build
from dashboard.orbitpilot import chat_memory, conversations, recall, replies
from dashboard.orbitpilot.models import Conversation, Message, ProfileFact
from dashboard.orbitpilot.responder import (
    DEFAULT_RESPONDER,
    NOTHING_RELEVANT,
    BuiltinResponder,
    Reply,
    ResponderContext,
    load_responder,
)
from dashboard.plans.sentences import CHAT_REMEMBERED, GUEST_INVITATION, state_sentence
from dashboard.plans.services import (
    SourceState,
    get_plan_for_user,
    get_user_plan,
    resolve_sources,
)
from dashboard.plans.web import request_plans
from dashboard.sources import CHAT_HISTORY, PROFILE
from tests.factories import (
    builds_of,
    make_conversation,
    make_memory,
    make_plan,
    make_user,
    plans_of,
    user_turns,
    with_source,
)
from tests.orbitpilot.conftest import CATCH, CHAT_PAGE, SEND, send, toggle, token
from tests.orbitpilot.dom import parse

DOCK_PAGE = "/no/such/page"  # any page but the chat has the dock; a 404 resolves nothing else
SCRIPT = "<script>alert(1)</script>"


def row_counts(session) -> dict[str, int]:
    return {table.name: session.scalar(select(func.count()).select_from(table))
            for table in db.metadata.sorted_tables}


def notice_text(page) -> str:
    return page.find(data_op_notice=True).find(data_op_notice_text=True).text


def plan_queries(statements) -> list[str]:
    return [s for s in statements if re.search(r"\bFROM plans\b", s)]


# -- the pages -----------------------------------------------------------------------------

def test_chat_page_shows_the_latest_open_conversation_and_the_list(client, signed_in,
                                                                   db_session):
    latest, _ = make_conversation(db_session, signed_in, [("newest question", "an answer")],
                                  title="Newest")
    older, _ = make_conversation(db_session, signed_in, [("older question", "older answer")],
                                 title="Older")
    # Created later, but last active earlier: the list and the page go by activity.
    older.last_activity_at = datetime.now(UTC) - timedelta(hours=1)
    db_session.flush()
    response = client.get(CHAT_PAGE)
    assert response.status_code == 200
    page = parse(response.get_data(as_text=True))
    thread = page.find(data_op_thread=True)
    assert "newest question" in thread.text and "older question" not in thread.text
    titles = [a.find(cls="op-conv-title").text for a in
              page.find(data_op_conversations=True).find_all("a")]
    assert titles == ["Newest", "Older"]
    assert page.find("nav", data_op_conversations=True).find("a", cls="active") is not None


def test_a_conversation_page_is_owner_only(client, signed_in, db_session):
    mine, _ = make_conversation(db_session, signed_in, [("mine", "ok")])
    theirs, _ = make_conversation(db_session, make_user(db_session), [("theirs", "ok")])
    assert client.get(f"/orbitpilot/c/{mine.id}").status_code == 200
    response = client.get(f"/orbitpilot/c/{theirs.id}")
    assert response.status_code == 404
    assert "theirs" not in response.get_data(as_text=True)


@pytest.mark.parametrize("raw", ["abc", "-1", str(2**64), "0"])
def test_a_malformed_conversation_id_is_404(client, signed_in, raw):
    assert client.get(f"/orbitpilot/c/{raw}").status_code == 404


def test_a_guest_is_sent_to_sign_in_for_a_stored_conversation(client):
    response = client.get("/orbitpilot/c/1")
    assert response.status_code == 302
    assert "/auth/signin" in response.headers["Location"]


# -- sending -------------------------------------------------------------------------------

def test_send_json_stores_both_turns_and_answers_with_ids(client, signed_in, db_session):
    response = send(client, "Plan a weekend in Porto\nwith trains")
    assert response.status_code == 201
    body = response.get_json()
    question, reply = (db_session.get(Message, i) for i in body["message_ids"])
    assert (question.role, question.content, question.position) == \
        ("user", "Plan a weekend in Porto\nwith trains", 0)
    assert (reply.role, reply.reply_to_id, reply.position) == ("assistant", question.id, 1)
    assert body["message"] == {"id": question.id, "role": "user", "content": question.content,
                               "not_remembered": False}
    assert body["reply"]["id"] == reply.id and body["reply"]["content"] == reply.content
    assert body["honesty_note"] is None and body["reply"]["honesty_note"] is None
    conversation = db_session.get(Conversation, body["conversation_id"])
    assert conversation.user_id == signed_in.id
    assert conversation.title == "Plan a weekend in Porto" == body["conversation_title"]
    # A new turn alone requests no build (the end or idleness of a conversation does).
    assert builds_of(db_session, signed_in.id) == []


def test_send_continues_a_conversation_in_order(client, signed_in, db_session):
    first = send(client, "one").get_json()
    second = send(client, "two", first["conversation_id"]).get_json()
    assert second["conversation_id"] == first["conversation_id"]
    assert second["new_conversation"] is False
    positions = db_session.scalars(
        select(Message.position).where(Message.conversation_id == first["conversation_id"])
        .order_by(Message.position)).all()
    assert positions == [0, 1, 2, 3]


def test_send_as_a_plain_form_redirects_to_the_conversation(client, signed_in, db_session):
    response = send(client, "plain form please", as_json=False)
    assert response.status_code == 303
    conversation = db_session.scalars(
        select(Conversation).where(Conversation.user_id == signed_in.id)).one()
    reply = db_session.scalars(select(Message).where(Message.role == "assistant",
                                                     Message.user_id == signed_in.id)).one()
    assert response.headers["Location"] == f"/orbitpilot/c/{conversation.id}#m{reply.id}"


def test_send_accepts_an_accept_json_client_without_format(client, signed_in):
    response = client.post(SEND, data={"message": "hi", "csrf_token": token(client)},
                           headers={"Accept": "application/json"})
    assert response.status_code == 201
    assert response.get_json()["message"]["content"] == "hi"


def test_an_empty_message_is_a_clear_400(client, signed_in, db_session):
    response = send(client, "   ")
    assert response.status_code == 400
    assert response.get_json()["detail"] == "Write a message first."
    assert db_session.scalar(select(func.count()).select_from(Message)) == 0


def test_a_too_long_message_is_refused_and_the_form_keeps_the_draft(client, signed_in,
                                                                    db_session):
    text = "x" * (replies.MAX_MESSAGE_CHARS + 1)
    response = send(client, text)
    assert response.status_code == 400
    assert f"{replies.MAX_MESSAGE_CHARS:,}" in response.get_json()["detail"]
    response = send(client, text, as_json=False)
    assert response.status_code == 400
    page = parse(response.get_data(as_text=True))
    assert f"{replies.MAX_MESSAGE_CHARS:,}" in page.find(data_op_error=True).text
    assert page.find("textarea").text == text  # nothing lost
    assert db_session.scalar(select(func.count()).select_from(Message)) == 0


def test_a_message_at_the_limit_is_accepted(client, signed_in):
    assert send(client, "y" * replies.MAX_MESSAGE_CHARS).status_code == 201


def test_send_to_someone_elses_conversation_is_404(client, signed_in, db_session):
    theirs, _ = make_conversation(db_session, make_user(db_session), [("theirs", "ok")])
    assert send(client, "sneaky", theirs.id).status_code == 404
    assert send(client, "sneaky", "abc").status_code == 404
    assert db_session.scalar(select(func.count()).select_from(Message)
                             .where(Message.user_id == signed_in.id)) == 0


def test_the_title_and_the_text_are_never_logged(client, signed_in, caplog):
    caplog.set_level(logging.DEBUG)
    send(client, "Secret title words xyzzy")
    assert "xyzzy" not in caplog.text


@pytest.mark.parametrize("text, title", [
    ("Short one", "Short one"),
    ("\n\n  Second   line first\nthen more", "Second line first"),
    ("word " * 40, None),
])
def test_derive_title(text, title):
    derived = conversations.derive_title(text)
    if title is not None:
        assert derived == title
    else:
        assert len(derived) <= conversations.TITLE_CHARS and derived.endswith("…")
        assert derived.startswith("word word")


# -- ending a conversation -------------------------------------------------------------------

def test_ending_a_conversation_requests_a_build_and_stops_new_messages(client, signed_in,
                                                                       db_session):
    first = send(client, "hello").get_json()
    conversation_id = first["conversation_id"]
    response = client.post(f"/orbitpilot/c/{conversation_id}/end",
                           data={"csrf_token": token(client)})
    assert response.status_code == 303
    assert response.headers["Location"] == f"/orbitpilot/c/{conversation_id}"
    db_session.expire_all()
    assert db_session.get(Conversation, conversation_id).status == "ended"
    [build] = builds_of(db_session, signed_in.id)
    assert (build.trigger, build.status) == ("conversation_end", "queued")

    refused = send(client, "one more", conversation_id)
    assert refused.status_code == 409
    assert "ended" in refused.get_json()["detail"]
    as_form = send(client, "one more", conversation_id, as_json=False)
    assert as_form.status_code == 409
    page = parse(as_form.get_data(as_text=True))
    assert "ended" in page.find(data_op_error=True).text
    assert page.find("textarea").text == "one more"  # the draft is kept, for a new one
    assert page.find("input", data_op_conversation=True).attrs["value"] == ""
    assert db_session.scalar(select(func.count()).select_from(Message)
                             .where(Message.conversation_id == conversation_id)) == 2

    # On the ended conversation's page, the composer starts a new conversation.
    page = parse(client.get(f"/orbitpilot/c/{conversation_id}").get_data(as_text=True))
    assert page.find(data_op_ended=True) is not None
    assert page.find("input", data_op_conversation=True).attrs["value"] == ""
    assert "hidden" in page.find("form", data_op_end=True).attrs  # nothing to end


def test_the_end_button_is_on_a_new_conversation_page_ready_for_the_first_send(
        client, signed_in, db_session):
    """A new conversation has no id until its first message: the End form is on the page
    from the start, hidden and naming none, so the script can name the conversation the
    send made and show it at once (no reload); an open conversation's page shows it."""
    page = parse(client.get("/orbitpilot/new").get_data(as_text=True))
    end = page.find("form", data_op_end=True)
    assert end.attrs["action"] == "/orbitpilot/end" and end.attrs["method"] == "post"
    assert "hidden" in end.attrs
    assert end.find("input", data_op_end_conversation=True).attrs["value"] == ""
    assert end.find("button", type="submit").normalized_text == "End conversation"
    # What the script fills in is what the send answers, and the form then ends it.
    conversation_id = send(client, "hello").get_json()["conversation_id"]
    ended = client.post("/orbitpilot/end", data={"conversation_id": str(conversation_id),
                                                 "csrf_token": token(client)})
    assert ended.status_code == 303
    db_session.expire_all()
    assert db_session.get(Conversation, conversation_id).status == "ended"


def test_an_open_conversation_shows_its_end_button(client, signed_in):
    conversation_id = send(client, "hello").get_json()["conversation_id"]
    page = parse(client.get(f"/orbitpilot/c/{conversation_id}").get_data(as_text=True))
    end = page.find("form", data_op_end=True)
    assert "hidden" not in end.attrs
    assert end.find("input", data_op_end_conversation=True).attrs["value"] == \
        str(conversation_id)


def test_a_guest_has_no_end_button(client):
    page = parse(client.get(CHAT_PAGE).get_data(as_text=True))
    assert page.find("form", data_op_end=True) is None


def test_ending_twice_requests_one_build(client, signed_in, db_session):
    conversation_id = send(client, "hello").get_json()["conversation_id"]
    for _ in range(2):
        client.post(f"/orbitpilot/c/{conversation_id}/end", data={"csrf_token": token(client)})
    assert len(builds_of(db_session, signed_in.id)) == 1


def test_ending_someone_elses_conversation_is_404(client, signed_in, db_session):
    theirs, _ = make_conversation(db_session, make_user(db_session), [("theirs", "ok")])
    response = client.post(f"/orbitpilot/c/{theirs.id}/end", data={"csrf_token": token(client)})
    assert response.status_code == 404
    db_session.expire_all()
    assert db_session.get(Conversation, theirs.id).status == "open"


# -- the responder ---------------------------------------------------------------------------

def test_the_builtin_responder_answers_from_what_it_drew_on(client, db_session, auth, recorded):
    user = make_user(db_session, plan=make_plan(db_session, cap=4))
    db_session.add(ProfileFact(user_id=user.id, key="city", value="Lisbon"))
    make_conversation(db_session, user, [("I like trams in Lisbon", "Noted")])
    run_memory_build(user, "quick", session=db_session, embedder=get_embedder("hashing"))
    auth.login(user.email)
    first = send(client, "Where do I live? Lisbon?").get_json()
    second = send(client, "And trams?", first["conversation_id"]).get_json()

    context = recorded[-1]
    assert [t.content for t in context.turns] == [
        "Where do I live? Lisbon?", first["reply"]["content"], "And trams?"]
    # The user has two chunks (the profile and one chat pair); k is 3, but only the pair
    # is near "And trams?": the profile shares nothing with it, and is no match.
    assert [hit.source_key for hit in context.memory] == [CHAT_HISTORY] and not context.guest
    labels = list(dict.fromkeys(hit.label for hit in context.memory))
    assert {hit.source_key for hit in context.memory} <= {PROFILE, CHAT_HISTORY}
    items = second["drew_on"].pop("items")
    assert second["drew_on"] == {"earlier_turns": 2, "sources": labels,
                                 "memory_items": len(context.memory)}
    # The list under the reply: the pair, named by its question, linked to its turn.
    assert [(i["source"], i["item_id"], i["title"]) for i in items] == [
        (CHAT_HISTORY, context.memory[0].source_id, "I like trams in Lisbon")]
    conversation = context.memory[0].source_id.split(":")[0]
    assert items[0]["url"].startswith(f"/orbitpilot/c/{conversation}#m")
    # Deterministic: the same context gives the same words: the pair, by what was said.
    assert second["reply"]["content"] == BuiltinResponder()(context).text == (
        "From an earlier conversation, where you said: \u201cI like trams in Lisbon\u201d")


def test_memory_k_zero_hands_the_responder_no_memory(app, client, signed_in, recorded,
                                                     monkeypatch, db_session):
    db_session.add(ProfileFact(user_id=signed_in.id, key="city", value="Lisbon"))
    run_memory_build(signed_in, "quick", session=db_session, embedder=get_embedder("hashing"))
    monkeypatch.setitem(app.config, "ORBITPILOT_MEMORY_K", 0)
    send(client, "Lisbon?")
    assert recorded[-1].memory == ()


@pytest.mark.parametrize("message", ["!!!", "the and of", "?"])
def test_a_message_with_nothing_to_search_on_draws_on_no_memory(client, signed_in, recorded,
                                                                db_session, message):
    db_session.add(ProfileFact(user_id=signed_in.id, key="city", value="Lisbon"))
    run_memory_build(signed_in, "quick", session=db_session, embedder=get_embedder("hashing"))
    assert recall.memory_hits(db_session, signed_in.id, message,
                                embedder=get_embedder("hashing")) == ()
    response = send(client, message)
    assert response.status_code == 201
    assert recorded[-1].memory == ()
    assert response.get_json()["drew_on"]["memory_items"] == 0
    assert response.get_json()["reply"]["content"] == NOTHING_RELEVANT


def test_a_chunk_with_nothing_to_search_on_is_never_drawn_on(client, signed_in, recorded,
                                                             db_session):
    db_session.add(ProfileFact(user_id=signed_in.id, key="city", value="Lisbon"))
    make_memory(db_session, signed_in, "...")
    run_memory_build(signed_in, "quick", session=db_session, embedder=get_embedder("hashing"))
    send(client, "Lisbon?")
    assert [hit.content for hit in recorded[-1].memory] == ["city: Lisbon"]
    assert all(math.isfinite(hit.distance) for hit in recorded[-1].memory)


def echo(context: ResponderContext) -> Reply:
    return Reply(f"echo {len(context.turns)}")


class Polite:
    def __call__(self, context: ResponderContext) -> Reply:
        return Reply("Certainly.")


def test_the_responder_is_pluggable_by_dotted_path(app, client, signed_in, monkeypatch):
    assert load_responder("tests.orbitpilot.test_chat.echo") is echo
    assert isinstance(load_responder("tests.orbitpilot.test_chat:Polite"), Polite)
    monkeypatch.setitem(app.config, "ORBITPILOT_RESPONDER", "tests.orbitpilot.test_chat:echo")
    assert send(client, "hi").get_json()["reply"]["content"] == "echo 1"
    monkeypatch.setitem(app.config, "ORBITPILOT_RESPONDER", "tests.orbitpilot.test_chat.Polite")
    assert send(client, "hi").get_json()["reply"]["content"] == "Certainly."


def test_the_default_responder_is_the_builtin_one(app):
    path = app.config.get("ORBITPILOT_RESPONDER", DEFAULT_RESPONDER)
    assert isinstance(load_responder(path), BuiltinResponder)


# -- guests ----------------------------------------------------------------------------------

def test_a_guest_chats_from_the_session_and_leaves_no_row_anywhere(client, db_session,
                                                                   recorded):
    before = row_counts(db_session)
    first = send(client, "hello as a guest")
    assert first.status_code == 201
    body = first.get_json()
    assert body["message_ids"] == [None, None] and body["conversation_id"] is None
    assert body["honesty_note"] == GUEST_INVITATION
    second = send(client, "and again").get_json()
    plain = send(client, "as a form", as_json=False)
    assert plain.status_code == 303 and plain.headers["Location"] == CHAT_PAGE
    assert row_counts(db_session) == before

    # The responder saw the session's turns only, and no memory.
    context = recorded[-2]
    assert context.guest and context.memory == ()
    assert [t.content for t in context.turns] == [
        "hello as a guest", body["reply"]["content"], "and again"]
    assert all(t.id is None for t in context.turns)
    assert second["drew_on"]["earlier_turns"] == 2

    page = parse(client.get(CHAT_PAGE).get_data(as_text=True))
    thread = page.find(data_op_thread=True)
    assert "hello as a guest" in thread.text and "as a form" in thread.text
    assert page.find("form", data_op_action="remember") is None  # no eye toggle
    assert page.find("form", data_op_action="catch") is None
    assert notice_text(page) == GUEST_INVITATION
    assert page.find(data_op_notice=True).find("a").attrs["href"] == "/auth/signup"


def test_a_guests_session_keeps_only_the_last_turns_cut_short(client, db_session):
    long = "z" * 2000
    for n in range(8):
        assert send(client, f"{n} {long}").status_code == 201
    with client.session_transaction() as session:
        kept = session["orbitpilot.guest_chat"]
    assert len(kept) == replies.GUEST_MAX_TURNS
    assert all(len(text) <= replies.GUEST_TURN_CHARS for _, text in kept)
    assert kept[-2][0] == "user" and kept[-2][1].startswith("7 ")


def test_a_guest_can_start_over(client):
    send(client, "forget me")
    response = client.post("/orbitpilot/guest/clear", data={"csrf_token": token(client)})
    assert response.status_code == 303
    page = parse(client.get(CHAT_PAGE).get_data(as_text=True))
    assert "forget me" not in page.find(data_op_thread=True).text


def test_a_tampered_guest_session_is_ignored_not_an_error(client, recorded):
    with client.session_transaction() as session:
        session["orbitpilot.guest_chat"] = [["system", "x"], "nope", ["user", 5],
                                            ["user", "kept"]]
    assert send(client, "hi").status_code == 201
    assert [t.content for t in recorded[-1].turns] == ["kept", "hi"]


def test_guests_get_no_dock(client):
    page = parse(client.get(DOCK_PAGE).get_data(as_text=True))
    assert page.find(data_op_dock=True) is None


# -- the memory notice and the honesty note ---------------------------------------------

def chat_state_case(db_session, monkeypatch, state: SourceState):
    """A user whose chat history resolves to ``state``."""
    if state is SourceState.INCLUDED:
        return make_user(db_session, plan=make_plan(db_session, cap=4))
    if state is SourceState.EVICTED_BY_CAP:
        return make_user(db_session)  # the untouched default plan (SU-101 Q1)
    if state is SourceState.NOT_ASSIGNED_BY_ADMIN:
        return make_user(db_session, plan=make_plan(db_session, cap=4,
                                                    assignments={CHAT_HISTORY: False}))
    # No built-in plan hides chat history by default: a registry where it is not visible.
    with_source(monkeypatch, CHAT_HISTORY, default_visible=False)
    return make_user(db_session, plan=make_plan(db_session, cap=4))


@pytest.mark.parametrize("state", [SourceState.INCLUDED, SourceState.EVICTED_BY_CAP,
                                   SourceState.NOT_ASSIGNED_BY_ADMIN,
                                   SourceState.NOT_ASSIGNED_BY_DEFAULT])
def test_one_truth_the_notice_the_honesty_note_and_memory_status_in_every_state(
        client, auth, db_session, monkeypatch, state):
    user = chat_state_case(db_session, monkeypatch, state)
    resolution = resolve_sources(get_plan_for_user(user, db_session))
    source = resolution.get(CHAT_HISTORY)
    assert source.state is state
    expected = CHAT_REMEMBERED if state is SourceState.INCLUDED \
        else state_sentence(source, resolution)
    assert chat_memory.get_chat_memory(user, plans_of(db_session)).text == expected

    auth.login(user.email)
    body = send(client, "Is this remembered?").get_json()
    note = body["reply"]["honesty_note"]
    assert body["honesty_note"] == note
    chat_page = parse(client.get(f"/orbitpilot/c/{body['conversation_id']}")
                      .get_data(as_text=True))
    dock_page = parse(client.get(DOCK_PAGE).get_data(as_text=True))
    assert notice_text(chat_page) == expected
    assert notice_text(dock_page.find(data_op_dock=True)) == expected
    # The third surface: the Memory Status page's reason for chat history is the same
    # sentence, word for word (and the notice in its dock too).
    status_page = parse(client.get("/memory/status").get_data(as_text=True))
    chat_row = status_page.find("tr", data_source=CHAT_HISTORY)
    assert chat_row.find(cls="sentence").text == state_sentence(source, resolution)
    if state is not SourceState.INCLUDED:
        assert chat_row.find(cls="sentence").text == expected
    assert notice_text(status_page.find(data_op_dock=True)) == expected
    rendered_notes = [n.text for n in chat_page.find_all(data_op_honesty_text=True)]
    dock_notes = [n.text for n in dock_page.find_all(data_op_honesty_text=True)]
    if state is SourceState.INCLUDED:
        assert note is None and rendered_notes == [] and dock_notes == []
        link = chat_page.find(data_op_notice=True).find("a", data_op_notice_text=True)
        assert link.attrs["href"] == "/memory/status"
    else:
        assert note == expected
        assert rendered_notes == [expected] and dock_notes == [expected]
    # Computed at request time, never stored with the reply.
    stored = db_session.get(Message, body["reply"]["id"]).content
    assert expected not in stored


def test_on_the_free_plan_the_note_under_every_reply_names_chat_history(
        client, auth, db_session):
    """The untouched default plan evicts chat history by its cap: the sentence names the
    sources that come first, not chat history, so the note says what it is about first,
    in the reply sent, on the conversation's page and in the dock alike."""
    user = make_user(db_session)  # no plan: the default "Free"
    resolution = resolve_sources(get_plan_for_user(user, db_session))
    sentence = state_sentence(resolution.get(CHAT_HISTORY), resolution)
    assert "chat history" not in sentence.lower()  # why the note must name it
    auth.login(user.email)
    body = send(client, "Is this remembered?").get_json()
    second = send(client, "And this?", body["conversation_id"]).get_json()
    pages = [parse(body["html"]), parse(second["html"]),
             parse(client.get(f"/orbitpilot/c/{body['conversation_id']}").get_data(
                 as_text=True)),
             parse(client.get(DOCK_PAGE).get_data(as_text=True)).find(data_op_dock=True)]
    notes = [n.normalized_text for page in pages for n in page.find_all(data_op_honesty=True)]
    assert notes == [f"Chat history. {sentence}"] * 6  # one per reply: 1 + 1 + 2 + 2


def test_the_note_follows_the_plan_at_request_time(client, auth, db_session):
    plan = make_plan(db_session, cap=3)
    user = make_user(db_session, plan=plan)
    auth.login(user.email)
    body = send(client, "first").get_json()
    assert body["honesty_note"] is not None
    plan.included_sources = 4
    db_session.commit()
    page = parse(client.get(f"/orbitpilot/c/{body['conversation_id']}").get_data(as_text=True))
    assert page.find_all(data_op_honesty_text=True) == []
    assert notice_text(page) == CHAT_REMEMBERED


def test_the_notice_for_a_guest_is_the_invitation(db_session):
    assert chat_memory.get_chat_memory(None, plans_of(db_session)).text == GUEST_INVITATION


def test_the_notice_reads_the_plan_once_per_request(app, db_session, count_queries):
    user = make_user(db_session)
    with app.test_request_context("/"):
        login_user(user)
        with count_queries() as first:
            notice = chat_memory.get_chat_memory(user, request_plans()).text
        with count_queries() as second:
            assert chat_memory.get_chat_memory(user, request_plans()).text == notice
    assert first.count == 1 and second.count == 0


def _dock_queries(app, user, count_queries, *, plan_loaded: bool):
    with app.test_request_context("/"):
        login_user(user)
        if plan_loaded:
            get_user_plan(user, request_plans())
        with count_queries() as q:
            html = render_template("orbitpilot/_dock.html")
    assert "data-op-dock" in html
    return q


def test_the_dock_costs_the_notice_plus_one_query_whatever_the_history(app, db_session,
                                                                      count_queries):
    user = make_user(db_session)
    make_conversation(db_session, user, [("q", "a")])
    small = _dock_queries(app, user, count_queries, plan_loaded=False)
    assert len(plan_queries(small.statements)) == 1 and small.count == 2, small.statements
    loaded = _dock_queries(app, user, count_queries, plan_loaded=True)
    assert plan_queries(loaded.statements) == [] and loaded.count == 1, loaded.statements

    for n in range(30):
        make_conversation(db_session, user, [(f"q{n}.{i}", f"a{n}.{i}") for i in range(5)])
    big = _dock_queries(app, user, count_queries, plan_loaded=False)
    assert big.count == small.count
    assert _dock_queries(app, user, count_queries, plan_loaded=True).count == loaded.count


def test_a_real_page_load_spends_at_most_one_query_on_the_notice(client, auth, db_session,
                                                                 count_queries):
    user = make_user(db_session)
    for n in range(10):
        make_conversation(db_session, user, [(f"q{n}.{i}", f"a{n}.{i}") for i in range(4)])
    auth.login(user.email)
    with count_queries() as q:
        response = client.get(DOCK_PAGE)
    page = parse(response.get_data(as_text=True))
    assert page.find(data_op_dock=True) is not None
    assert len(plan_queries(q.statements)) == 1, q.statements
    non_user = [s for s in q.statements if not re.search(r"\bFROM users\b", s)]
    assert len(non_user) == 2, non_user  # the notice's plan and the dock's messages

    # The home page resolves the plan itself: the notice then costs nothing more.
    with count_queries() as q:
        response = client.get("/")
    assert parse(response.get_data(as_text=True)).find(data_op_dock=True) is not None
    assert len(plan_queries(q.statements)) == 1, q.statements


# -- the dock --------------------------------------------------------------------------------

def test_the_dock_shows_the_latest_open_conversations_last_messages(client, signed_in,
                                                                    db_session):
    pairs = [(f"question {n}", f"answer {n}") for n in range(5)]
    conversation, _ = make_conversation(db_session, signed_in, pairs, title="Trip")
    page = parse(client.get(DOCK_PAGE).get_data(as_text=True))
    dock = page.find("details", data_op_dock=True)
    bubbles = [b.text for b in dock.find_all(cls="op-bubble")]
    assert bubbles == ["question 3", "answer 3", "question 4", "answer 4"]
    assert len(bubbles) == conversations.DOCK_MESSAGES
    hidden = dock.find("input", data_op_conversation=True)
    assert hidden.attrs["value"] == str(conversation.id)
    form = dock.find("form", data_op_composer=True)
    assert form.attrs["action"] == SEND and form.attrs["method"] == "post"
    assert form.find("input", name="csrf_token") is not None
    # The eye and Catch are there too, as plain forms.
    assert len(dock.find_all("form", data_op_action="remember")) == 2
    assert len(dock.find_all("form", data_op_action="catch")) == 2


def test_the_dock_ignores_ended_conversations(client, signed_in, db_session):
    conversation, _ = make_conversation(db_session, signed_in, [("old", "done")])
    conversations.end_conversation(db_session, conversation)
    dock = parse(client.get(DOCK_PAGE).get_data(as_text=True)).find(data_op_dock=True)
    assert dock.find_all(cls="op-bubble") == []
    assert dock.find("input", data_op_conversation=True).attrs["value"] == ""


def test_the_chat_page_has_no_dock(client, signed_in):
    page = parse(client.get(CHAT_PAGE).get_data(as_text=True))
    assert page.find(data_op_dock=True) is None
    assert page.find("form", data_op_composer=True) is not None


# -- escaping and the page rules -------------------------------------------------------------

def test_message_html_is_shown_escaped_in_the_chat_and_the_dock(client, signed_in):
    body = send(client, SCRIPT).get_json()
    assert SCRIPT not in body["html"]
    for path in (f"/orbitpilot/c/{body['conversation_id']}", DOCK_PAGE, CHAT_PAGE):
        html = client.get(path).get_data(as_text=True)
        assert SCRIPT not in html, path
        assert str(escape(SCRIPT)) in html, path
        bubbles = [b.text for b in parse(html).find_all(cls="op-bubble")]
        assert SCRIPT in bubbles, path  # shown as text, exactly as written


@pytest.mark.parametrize("path", [CHAT_PAGE, DOCK_PAGE])
def test_chat_pages_follow_the_csp_rules(client, signed_in, db_session, path):
    make_conversation(db_session, signed_in, [("q", "a")])
    page = parse(client.get(path).get_data(as_text=True))
    scripts = page.find_all("script")
    assert scripts and all("nonce" in s.attrs and s.attrs.get("src") for s in scripts)
    for node in page.iter():
        assert not [a for a in node.attrs if a.startswith("on")], node.tag
        assert "style" not in node.attrs, node.tag
        assert not node.attrs.get("href", "").lower().startswith("javascript:")
    for form in page.find_all("form", method="post"):
        assert form.find("input", name="csrf_token") is not None
    for button in page.find_all("button", cls="op-icon"):
        assert button.attrs.get("aria-label")


# -- Catch -----------------------------------------------------------------------------------

def test_catch_saves_a_reply_as_a_blink(client, signed_in, db_session):
    body = send(client, "Tell me about Porto").get_json()
    response = client.post(CATCH, data={"message_id": body["reply"]["id"], "format": "json",
                                        "csrf_token": token(client)})
    assert response.status_code == 201
    caught = response.get_json()
    blink = db_session.get(Blink, caught["blink_id"])
    assert (blink.user_id, blink.content) == (signed_in.id, body["reply"]["content"])
    assert blink.title == caught["title"] == "Caught from “Tell me about Porto”"
    assert caught["blink_url"] == f"/blinks/edit/?id={blink.id}"
    assert caught["message_id"] == body["reply"]["id"]
    # A new Blink changes the next build: memory.changes requested it.
    assert [b.trigger for b in builds_of(db_session, signed_in.id)] == ["content_change"]


def test_catch_as_a_plain_form_redirects_with_a_flash(client, signed_in, db_session):
    body = send(client, "Tell me about Faro").get_json()
    response = client.post(CATCH, data={"message_id": body["reply"]["id"],
                                        "csrf_token": token(client)})
    assert response.status_code == 303
    assert response.headers["Location"] == \
        f"/orbitpilot/c/{body['conversation_id']}#m{body['reply']['id']}"
    with client.session_transaction() as session:
        assert [c for c, _ in session["_flashes"]] == ["success"]
    assert db_session.scalar(select(func.count()).select_from(Blink)
                             .where(Blink.user_id == signed_in.id)) == 1


def test_catch_is_owner_only_and_for_replies_only(client, signed_in, db_session):
    _, theirs = make_conversation(db_session, make_user(db_session), [("q", "their reply")])
    response = client.post(CATCH, data={"message_id": theirs[1].id, "format": "json",
                                        "csrf_token": token(client)})
    assert response.status_code == 404
    _, mine = make_conversation(db_session, signed_in, [("my question", "my reply")])
    response = client.post(CATCH, data={"message_id": user_turns(mine)[0].id,
                                        "format": "json", "csrf_token": token(client)})
    assert response.status_code == 400
    assert db_session.scalar(select(func.count()).select_from(Blink)) == 0


def test_a_guest_cannot_catch(client, db_session):
    _, messages = make_conversation(db_session, make_user(db_session), [("q", "a")])
    response = client.post(CATCH, data={"message_id": messages[1].id, "format": "json",
                                        "csrf_token": token(client)})
    assert response.status_code == 401
    assert db_session.scalar(select(func.count()).select_from(Blink)) == 0


def test_a_toggle_for_a_message_in_the_dock_redirects_to_its_conversation(client, signed_in,
                                                                          db_session):
    conversation, messages = make_conversation(db_session, signed_in, [("q", "a")])
    response = toggle(client, messages[0].id, as_json=False)
    assert response.status_code == 303
    assert response.headers["Location"] == f"/orbitpilot/c/{conversation.id}#m{messages[0].id}"


def silent(context: ResponderContext) -> Reply:
    return Reply("   ")


def test_a_responder_that_gives_nothing_leaves_no_half_turn(app, client, signed_in,
                                                           db_session, monkeypatch):
    conversation_id = send(client, "first").get_json()["conversation_id"]
    monkeypatch.setitem(app.config, "ORBITPILOT_RESPONDER", "tests.orbitpilot.test_chat:silent")
    response = send(client, "second", conversation_id)
    assert response.status_code == 502
    assert response.get_json()["detail"] == "OrbitPilot could not answer that. Try again."
    assert db_session.scalar(select(func.count()).select_from(Message)
                             .where(Message.conversation_id == conversation_id)) == 2
    new = send(client, "a new one")
    assert new.status_code == 502
    assert db_session.scalar(select(func.count()).select_from(Conversation)
                             .where(Conversation.user_id == signed_in.id)) == 1


def test_a_guests_too_long_message_is_a_clear_400(client):
    response = send(client, "g" * (replies.MAX_MESSAGE_CHARS + 1))
    assert response.status_code == 400
    assert f"{replies.MAX_MESSAGE_CHARS:,}" in response.get_json()["detail"]
    with client.session_transaction() as session:
        assert "orbitpilot.guest_chat" not in session


def test_ending_by_a_form_field_is_the_same(client, signed_in, db_session):
    conversation_id = send(client, "hello").get_json()["conversation_id"]
    response = client.post("/orbitpilot/end", data={"conversation_id": conversation_id,
                                                    "csrf_token": token(client)})
    assert response.status_code == 303
    db_session.expire_all()
    assert db_session.get(Conversation, conversation_id).status == "ended"
    response = client.post("/orbitpilot/end", data={"csrf_token": token(client)})
    assert response.status_code == 404


def test_a_guests_session_stays_small_with_text_that_does_not_compress(client):
    """Random characters outside ASCII: the cookie stays within what a browser keeps, the
    latest turns kept and the oldest dropped."""
    import random

    rng = random.Random(7)
    for n in range(6):
        text = "".join(chr(rng.randrange(0x20000, 0x2A6DF)) for _ in range(280)) + f" {n}"
        response = client.post(SEND, data={"message": text, "format": "json",
                                            "csrf_token": token(client)})
        assert response.status_code == 201
        cookie = next(h for h in response.headers.getlist("Set-Cookie")
                      if h.startswith("session="))
        assert len(cookie) < 4000
    turns = parse(client.get(CHAT_PAGE).get_data(as_text=True)).find_all(
        cls="op-msg-user")
    assert turns and turns[-1].text.strip().endswith(" 5")


def test_a_responder_that_fails_is_a_502_and_stores_nothing(client, db_session, signed_in,
                                                           app, monkeypatch):
    monkeypatch.setitem(app.config, "ORBITPILOT_RESPONDER",
                        "tests.orbitpilot.recording:failing_responder")
    before = db_session.scalar(select(func.count()).select_from(Message))
    response = send(client, "Hello?")
    assert response.status_code == 502
    assert "could not answer" in response.get_json()["detail"]
    assert db_session.scalar(select(func.count()).select_from(Message)) == before


# -- the eye, where chat history is not remembered anyway; the reply it covers ----------------

def eye_label(page, message_id: int) -> str:
    return page.find(data_message_id=str(message_id)).find(
        "form", data_op_action="remember").find("button").attrs["aria-label"]


def covered_mark(page, reply_id: int):
    return page.find(data_message_id=str(reply_id)).find(data_op_covered=True)


def test_on_free_the_eye_says_chat_history_is_not_remembered_anyway(client, auth, db_session):
    free_user = make_user(db_session)  # the default plan: the cap leaves chat history out
    conversation, messages = make_conversation(db_session, free_user, [("q1", "a1")])
    auth.login(free_user.email)
    page = parse(client.get(f"/orbitpilot/c/{conversation.id}").get_data(as_text=True))
    assert eye_label(page, messages[0].id) == (
        "Remembered. Do not remember this message (chat history is not remembered on your "
        "plan anyway)")

    free_user.plan_id = make_plan(db_session, cap=4).id  # a plan that remembers chats
    db_session.flush()
    page = parse(client.get(f"/orbitpilot/c/{conversation.id}").get_data(as_text=True))
    assert eye_label(page, messages[0].id) == "Remembered. Do not remember this message"


def test_the_reply_to_a_marked_message_is_marked_too(client, auth, db_session):
    user = make_user(db_session, plan=make_plan(db_session, cap=4))
    conversation, messages = make_conversation(db_session, user, [("q1", "a1"), ("q2", "a2")],
                                               flagged={1})
    q1, a1, q2, a2 = messages
    auth.login(user.email)
    for path in (f"/orbitpilot/c/{conversation.id}", DOCK_PAGE):
        page = parse(client.get(path).get_data(as_text=True))
        assert "d-none" in covered_mark(page, a1.id).classes, path
        mark = covered_mark(page, a2.id)
        assert "d-none" not in mark.classes, path
        assert mark.text == "Not remembered: it answers a message you marked"
        assert page.find(data_message_id=str(a2.id)).attrs["data-answers"] == str(q2.id)
