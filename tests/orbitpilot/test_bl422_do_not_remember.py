"""BL-422: "do not remember" on one message, with real builds and stored chunk keys.

Rule 1: OrbitPilot keeps following the conversation (the responder still sees the turn).
Rule 2: the next build, quick or full, skips the turn and its reply, and removes a chunk an
        earlier build made of them; every other pair keeps its exact source_id.
Rule 3: nothing is hidden or deleted: the turn stays, labelled "Not remembered".
Changing your mind takes effect at the next build, never at once, never retroactively.
Plus the endpoint's shapes and refusals, and the SU-101 Q1 regression guards.
"""

from __future__ import annotations

import json

import pytest
from sqlalchemy import func, select

from dashboard.audit.models import AuditEvent
from dashboard.memory import MemoryBuild, MemoryChunk, get_embedder, search_memory
from dashboard.orbitpilot.chat_memory import get_chat_memory
from dashboard.orbitpilot.conversations import NOT_REMEMBERED_LABEL, REMEMBERED_LABEL
from dashboard.orbitpilot.marks import REMEMBER_TOGGLE_ACTION
from dashboard.orbitpilot.models import Message, ProfileFact
from dashboard.plans.models import SourceAssignment
from dashboard.plans.sentences import CHAT_REMEMBERED, state_sentence
from dashboard.plans.services import SourceState, get_plan_for_user, resolve_sources
from dashboard.sources import BLINKS, CHAT_HISTORY, PROFILE, SAVED
from tests.factories import (
    CountingEmbedder,
    build,
    default_plan,
    make_conversation,
    make_plan,
    make_user,
    plans_of,
    user_turns,
)
from tests.orbitpilot.conftest import TOGGLE, fresh_message, send, toggle, token
from tests.orbitpilot.dom import parse

PAIRS = [("q0 about Lisbon", "a0 trams"), ("q1 my secret plan", "a1 noted your secret"),
         ("q2 about Faro", "a2 beaches")]


@pytest.fixture
def embedder():
    return CountingEmbedder(get_embedder("hashing"))


@pytest.fixture
def chat(db_session, client, auth):
    """A signed-in user whose plan includes chat history, with three answered pairs."""
    user = make_user(db_session, plan=make_plan(db_session, cap=4))
    db_session.add(ProfileFact(user_id=user.id, key="name", value="Ada"))
    conversation, messages = make_conversation(db_session, user, PAIRS)
    auth.login(user.email)
    return user, conversation, user_turns(messages)


def chat_chunks(db_session, user_id) -> dict[tuple, int]:
    """Stored chat-history chunk keys -> chunk row id."""
    rows = db_session.execute(
        select(MemoryChunk.id, MemoryChunk.source_key, MemoryChunk.source_id,
               MemoryChunk.chunk_index, MemoryChunk.content_hash)
        .where(MemoryChunk.user_id == user_id, MemoryChunk.source_key == CHAT_HISTORY)
    ).all()
    return {(r.source_key, r.source_id, r.chunk_index, r.content_hash): r.id for r in rows}


def source_ids(keys) -> set[str]:
    return {key[1] for key in keys}


def all_chunk_text(db_session, user_id) -> str:
    return "\n".join(db_session.scalars(
        select(MemoryChunk.content).where(MemoryChunk.user_id == user_id)))


def flip(client, message_id) -> dict:
    response = toggle(client, message_id)
    assert response.status_code == 200
    return response.get_json()


# -- rule 1: OrbitPilot keeps following the conversation ------------------------------------

def test_rule1_the_responder_still_sees_the_flagged_message(client, chat, recorded):
    user, conversation, turns = chat
    assert flip(client, turns[1].id)["not_remembered"] is True
    response = send(client, "what did I tell you?", conversation.id)
    assert response.status_code == 201
    context = recorded[-1]
    seen = {t.id: t for t in context.turns}
    # Every message of the conversation, the flagged one and its reply included.
    assert len(context.turns) == 2 * len(PAIRS) + 1
    assert seen[turns[1].id].content == PAIRS[1][0]
    assert seen[turns[1].id].not_remembered is True
    assert PAIRS[1][1] in [t.content for t in context.turns]
    assert context.message.content == "what did I tell you?"


# -- rule 2: it never enters long-term memory -----------------------------------------------

def test_rule2_the_next_quick_build_removes_the_pair_and_keeps_the_others(
        client, db_session, chat, embedder):
    user, conversation, turns = chat
    build(db_session, user, "quick", embedder)
    before = chat_chunks(db_session, user.id)
    assert source_ids(before) == {f"{conversation.id}:{i}" for i in range(3)}

    flip(client, turns[1].id)
    result = build(db_session, user, "quick", embedder)

    after = chat_chunks(db_session, user.id)
    removed = {k: v for k, v in before.items() if k[1] == f"{conversation.id}:1"}
    assert removed and after == {k: v for k, v in before.items() if k not in removed}
    # The other pairs: the exact keys, the very same rows, nothing embedded again.
    assert (result.removed, result.added, result.embedded) == (len(removed), 0, 0)
    assert embedder.texts == []
    text = all_chunk_text(db_session, user.id)
    assert PAIRS[1][0] not in text and PAIRS[1][1] not in text
    hits = search_memory(db_session, user.id, PAIRS[1][0], 10, embedder=embedder)
    assert f"{conversation.id}:1" not in {h.source_id for h in hits}


def test_rule2_the_next_full_build_removes_the_pair_and_reembeds_nothing(
        client, db_session, chat, embedder):
    user, conversation, turns = chat
    build(db_session, user, "quick", embedder)
    before = chat_chunks(db_session, user.id)

    flip(client, turns[1].id)
    result = build(db_session, user, "full", embedder)

    after = chat_chunks(db_session, user.id)
    assert set(after) == {k for k in before if k[1] != f"{conversation.id}:1"}
    assert source_ids(after) == {f"{conversation.id}:0", f"{conversation.id}:2"}
    assert result.embedded == 0 and embedder.texts == []  # stored embeddings reused
    text = all_chunk_text(db_session, user.id)
    assert PAIRS[1][0] not in text and PAIRS[1][1] not in text


@pytest.mark.parametrize("mode", ["quick", "full"])
def test_rule2_a_pair_flagged_before_any_build_is_never_extracted(
        client, db_session, chat, embedder, mode):
    user, conversation, turns = chat
    flip(client, turns[1].id)
    build(db_session, user, mode, embedder)
    assert source_ids(chat_chunks(db_session, user.id)) == \
        {f"{conversation.id}:0", f"{conversation.id}:2"}
    assert not any(PAIRS[1][0] in t or PAIRS[1][1] in t for t in embedder.texts)
    # And the other mode after it agrees.
    build(db_session, user, "full" if mode == "quick" else "quick", embedder)
    assert source_ids(chat_chunks(db_session, user.id)) == \
        {f"{conversation.id}:0", f"{conversation.id}:2"}


def test_rule2_the_toggle_requests_the_next_build(client, db_session, chat):
    user, _, turns = chat
    flip(client, turns[1].id)
    builds = db_session.scalars(select(MemoryBuild).where(MemoryBuild.user_id == user.id)).all()
    assert [(b.status, b.trigger, b.mode) for b in builds] == \
        [("queued", "content_change", "quick")]


# -- rule 3: nothing is hidden or deleted ---------------------------------------------------

def test_rule3_the_message_stays_labelled_and_there_is_no_purge(client, db_session, chat):
    user, conversation, turns = chat
    flip(client, turns[1].id)
    response = client.get(f"/orbitpilot/c/{conversation.id}")
    assert response.status_code == 200
    page = parse(response.get_data(as_text=True))
    shown = page.find(data_message_id=str(turns[1].id))
    assert shown.find(cls="op-bubble").text == PAIRS[1][0]
    flag = shown.find(data_op_flag=True)
    assert flag.text == NOT_REMEMBERED_LABEL and "d-none" not in flag.classes
    eye = shown.find("form", data_op_action="remember").find("i")
    assert "bi-eye-slash" in eye.classes and "bi-eye" not in eye.classes
    # Its reply is still shown too, and nothing offers to delete or purge anything.
    assert PAIRS[1][1] in [b.text for b in page.find_all(cls="op-bubble")]
    html = response.get_data(as_text=True).lower()
    assert "purge" not in html and "bi-trash" not in html
    for form in page.find_all("form"):
        assert "delete" not in form.attrs.get("action", "").lower()
        assert "delete" not in form.normalized_text.lower()
    # The unflagged turns keep the open eye and a hidden label.
    other = page.find(data_message_id=str(turns[0].id))
    assert "bi-eye" in other.find("form", data_op_action="remember").find("i").classes
    assert "d-none" in other.find(data_op_flag=True).classes
    assert db_session.scalar(select(func.count()).select_from(Message)
                             .where(Message.conversation_id == conversation.id)) == 6


def test_the_eye_sits_in_the_same_clustered_row_as_the_reply_actions(client, chat):
    _, conversation, _ = chat
    page = parse(client.get(f"/orbitpilot/c/{conversation.id}").get_data(as_text=True))
    users = page.find_all(cls="op-msg-user")
    replies = page.find_all(cls="op-msg-assistant")
    assert len(users) == len(replies) == 3
    for message in users:
        row = message.find(cls="op-actions")
        button = row.find("form", data_op_action="remember").find("button")
        assert "op-icon" in button.classes and button.attrs["aria-label"]
    for message in replies:
        row = message.find(cls="op-actions")
        button = row.find("form", data_op_action="catch").find("button")
        assert "op-icon" in button.classes and button.attrs["aria-label"]
        assert row.find("form", data_op_action="remember") is None  # replies: no eye


# -- changing your mind ---------------------------------------------------------------------

def test_excluded_then_reenabled_before_the_next_build_is_as_if_never_touched(
        client, db_session, chat, embedder):
    user, _, turns = chat
    build(db_session, user, "quick", embedder)
    before = chat_chunks(db_session, user.id)
    assert flip(client, turns[1].id)["not_remembered"] is True
    assert flip(client, turns[1].id)["not_remembered"] is False
    result = build(db_session, user, "quick", embedder)
    assert chat_chunks(db_session, user.id) == before  # same keys, same rows
    assert (result.added, result.removed, result.embedded) == (0, 0, 0)
    assert embedder.texts == []
    result = build(db_session, user, "full", embedder)
    assert set(chat_chunks(db_session, user.id)) == set(before)
    assert result.embedded == 0


def test_the_toggle_never_acts_before_the_next_build(client, db_session, chat, embedder):
    user, _, turns = chat
    build(db_session, user, "quick", embedder)
    before = chat_chunks(db_session, user.id)
    flip(client, turns[1].id)
    assert chat_chunks(db_session, user.id) == before  # only the next build changes memory


def test_reenabled_after_a_build_removed_it_comes_back_from_the_following_build(
        client, db_session, chat, embedder):
    user, conversation, turns = chat
    build(db_session, user, "quick", embedder)
    original = chat_chunks(db_session, user.id)
    pair = {k for k in original if k[1] == f"{conversation.id}:1"}

    flip(client, turns[1].id)
    build(db_session, user, "quick", embedder)
    assert not pair & set(chat_chunks(db_session, user.id))

    flip(client, turns[1].id)
    assert not pair & set(chat_chunks(db_session, user.id))  # not before the build
    result = build(db_session, user, "quick", embedder)
    after = chat_chunks(db_session, user.id)
    assert set(after) == set(original)  # back with its exact key
    assert (result.added, result.removed) == (len(pair), 0)
    assert result.embedded == len(pair)  # only that pair is embedded again
    # The others were never touched: the same rows throughout.
    assert {k: v for k, v in after.items() if k not in pair} == \
        {k: v for k, v in original.items() if k not in pair}


# -- the endpoint ---------------------------------------------------------------------------

def test_the_json_shape(client, db_session, chat):
    _, _, turns = chat
    assert flip(client, turns[0].id) == {"message_id": turns[0].id, "not_remembered": True,
                                         "label": NOT_REMEMBERED_LABEL}
    assert flip(client, turns[0].id) == {"message_id": turns[0].id, "not_remembered": False,
                                         "label": REMEMBERED_LABEL}


def test_the_plain_form_redirects_back_with_a_flash(client, db_session, chat):
    _, conversation, turns = chat
    response = toggle(client, turns[2].id, as_json=False)
    assert response.status_code == 303
    assert response.headers["Location"] == f"/orbitpilot/c/{conversation.id}#m{turns[2].id}"
    assert fresh_message(db_session, turns[2].id).not_remembered is True
    page = client.get(response.headers["Location"]).get_data(as_text=True)
    alerts = parse(page).find_all(cls="alert-success")
    assert len(alerts) == 1 and alerts[0].normalized_text


def test_the_toggle_writes_the_flag_and_one_audit_event_only(client, db_session, chat,
                                                             count_queries):
    user, _, turns = chat
    target = fresh_message(db_session, turns[1].id)
    before = {c: getattr(target, c) for c in ("content", "role", "position", "reply_to_id",
                                              "conversation_id", "user_id")}
    events_before = db_session.scalar(select(func.count()).select_from(AuditEvent))
    csrf = token(client)
    with count_queries() as q:
        response = toggle(client, turns[1].id, csrf=csrf)
    assert response.status_code == 200
    writes = [s for s in q.statements
              if s.lstrip().upper().startswith(("INSERT", "UPDATE", "DELETE"))]
    updates = [s for s in writes if s.lstrip().upper().startswith("UPDATE")]
    assert len(updates) == 1 and updates[0].split()[1] == "messages"
    assignments = updates[0].split(" SET ", 1)[1].split(" WHERE ", 1)[0]
    assert {part.split("=")[0].strip() for part in assignments.split(",")} == \
        {"not_remembered", "updated_at"}
    inserted = sorted(s.split()[2] for s in writes if s.lstrip().upper().startswith("INSERT"))
    # The audit event, and the build request memory.changes makes for the next build.
    assert inserted == ["audit_events", "memory_builds"]
    assert not [s for s in writes if s.lstrip().upper().startswith("DELETE")]

    after = fresh_message(db_session, turns[1].id)
    assert after.not_remembered is True
    assert {c: getattr(after, c) for c in before} == before
    assert db_session.scalar(select(func.count()).select_from(AuditEvent)) == events_before + 1
    event = db_session.scalars(select(AuditEvent).order_by(AuditEvent.seq.desc())).first()
    assert (event.action, event.owner_id, event.target_type, event.target_id) == \
        (REMEMBER_TOGGLE_ACTION, user.id, "message", str(turns[1].id))
    assert (event.actor_type, event.actor_id) == ("user", str(user.id))
    assert event.details == {"before": {"not_remembered": False},
                             "after": {"not_remembered": True}}
    serialised = json.dumps([event.details, event.target_id, event.mode])
    assert PAIRS[1][0] not in serialised and "secret" not in serialised


def test_another_users_message_is_404(client, db_session, chat):
    _, theirs = make_conversation(db_session, make_user(db_session), [("not yours", "ok")])
    for as_json in (True, False):
        response = toggle(client, theirs[0].id, as_json=as_json)
        assert response.status_code == 404
    assert fresh_message(db_session, theirs[0].id).not_remembered is False


@pytest.mark.parametrize("raw", ["", "abc", "-1", "0", str(2**31), str(2**64), "999999"])
def test_no_such_message_is_404(client, chat, raw):
    assert toggle(client, raw).status_code == 404


def test_an_assistant_message_is_400(client, db_session, chat):
    _, conversation, _ = chat
    reply = db_session.scalars(select(Message).where(
        Message.conversation_id == conversation.id, Message.role == "assistant")).first()
    for as_json in (True, False):
        response = toggle(client, reply.id, as_json=as_json)
        assert response.status_code == 400
    assert "replies" in toggle(client, reply.id).get_json()["detail"]
    assert fresh_message(db_session, reply.id).not_remembered is False


def test_the_csrf_token_is_required(client, db_session, chat):
    _, _, turns = chat
    response = client.post(TOGGLE, data={"message_id": turns[0].id, "format": "json"})
    assert response.status_code == 400
    assert "security token" in response.get_data(as_text=True)
    response = client.post(TOGGLE, data={"message_id": turns[0].id},
                           headers={"Accept": "application/json"})
    assert response.status_code == 400
    assert response.get_json()["title"] == "CSRF token missing or invalid"
    assert fresh_message(db_session, turns[0].id).not_remembered is False


def test_guests_are_refused_401_as_json(client, db_session):
    _, messages = make_conversation(db_session, make_user(db_session), [("q", "a")])
    response = toggle(client, messages[0].id)
    assert response.status_code == 401
    assert response.mimetype == "application/problem+json"
    assert fresh_message(db_session, messages[0].id).not_remembered is False


def test_guests_are_sent_to_sign_in_by_the_plain_form(client, db_session):
    _, messages = make_conversation(db_session, make_user(db_session), [("q", "a")])
    response = toggle(client, messages[0].id, as_json=False)
    assert response.status_code == 302
    assert response.headers["Location"].startswith("/auth/signin")
    assert fresh_message(db_session, messages[0].id).not_remembered is False


def test_guests_see_no_eye_toggle(client):
    send(client, "hello")
    page = parse(client.get("/orbitpilot/").get_data(as_text=True))
    assert page.find(cls="op-msg-user") is not None
    assert page.find("form", data_op_action="remember") is None
    assert page.find(data_op_flag=True) is None


# -- SU-101 Q1: regression guards -------------------------------------------------------

def chat_resolution(db_session, plan):
    user = make_user(db_session, plan=plan)
    resolution = resolve_sources(get_plan_for_user(user, db_session))
    return user, resolution, resolution.get(CHAT_HISTORY)


class SU101Q1SourceCoverageTests:
    """chat_history is assigned on a plan nobody edited: by the registry's default."""

    def test_chat_history_is_assigned_by_default_with_no_row(self, db_session):
        plan = make_plan(db_session, cap=3)
        _, _, chat = chat_resolution(db_session, plan)
        assert chat.assigned is True and chat.decided_by == "default"
        assert db_session.scalars(select(SourceAssignment).where(
            SourceAssignment.plan_id == plan.id)).all() == []

    def test_the_untouched_default_plan_too(self, db_session):
        plan = default_plan(db_session)
        _, _, chat = chat_resolution(db_session, plan)
        assert chat.assigned is True
        assert db_session.scalars(select(SourceAssignment).where(
            SourceAssignment.plan_id == plan.id,
            SourceAssignment.source_key == CHAT_HISTORY)).all() == []


class SU101Q1SourceCapFindingTests:
    """On an untouched cap-3 plan the cap evicts chat_history: profile, Blinks and saved
    memories fill it. Cap 4, or switching one of them off, includes it."""

    def test_the_cap_evicts_chat_history_on_an_untouched_plan(self, db_session):
        user, resolution, chat = chat_resolution(db_session, make_plan(db_session, cap=3))
        assert chat.state is SourceState.EVICTED_BY_CAP
        assert chat.cap == 3 and chat.filled_by == (PROFILE, BLINKS, SAVED)
        # The notice says exactly what the status page says, never "remembered".
        notice = get_chat_memory(user, plans_of(db_session)).text
        assert notice == state_sentence(chat, resolution)
        assert get_chat_memory(user, plans_of(db_session)).text != CHAT_REMEMBERED

    def test_cap_four_includes_it(self, db_session):
        user, _, chat = chat_resolution(db_session, make_plan(db_session, cap=4))
        assert chat.state is SourceState.INCLUDED
        assert get_chat_memory(user, plans_of(db_session)).text == CHAT_REMEMBERED

    @pytest.mark.parametrize("switched_off", [PROFILE, BLINKS, SAVED])
    def test_switching_one_of_the_three_off_includes_it(self, db_session, switched_off):
        plan = make_plan(db_session, cap=3, assignments={switched_off: False})
        user, _, chat = chat_resolution(db_session, plan)
        assert chat.state is SourceState.INCLUDED
        assert get_chat_memory(user, plans_of(db_session)).text == CHAT_REMEMBERED

    def test_a_build_on_the_untouched_plan_stores_no_chat(self, db_session, embedder):
        user = make_user(db_session, plan=make_plan(db_session, cap=3))
        db_session.add(ProfileFact(user_id=user.id, key="name", value="Ada"))
        make_conversation(db_session, user, PAIRS)
        build(db_session, user, "quick", embedder)
        assert chat_chunks(db_session, user.id) == {}


def test_a_double_submit_of_the_form_lands_where_the_person_meant(client, db_session,
                                                                   signed_in):
    """The form sends the state it shows; pressing twice (no script, a slow page) does not
    flip the message back. Without the field the endpoint flips, as before."""
    _, messages = make_conversation(db_session, signed_in, [("mine", "reply")])
    asked = messages[0]
    for _ in range(2):
        response = client.post(TOGGLE, data={"message_id": asked.id, "not_remembered": "1",
                                              "csrf_token": token(client)})
        assert response.status_code == 303
    assert fresh_message(db_session, asked.id).not_remembered is True
    events = db_session.scalars(select(AuditEvent).where(
        AuditEvent.target_type == "message", AuditEvent.target_id == str(asked.id))).all()
    assert len(events) == 1  # the second press changed nothing, so recorded nothing
    response = client.post(TOGGLE, data={"message_id": asked.id, "not_remembered": "maybe",
                                          "csrf_token": token(client)})
    assert response.status_code == 400
