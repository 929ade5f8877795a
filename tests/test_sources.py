"""Extraction: what each source yields, and the chat-history pairing rules."""

import pytest
from sqlalchemy.exc import IntegrityError

from dashboard.blinks.models import Blink
from dashboard.orbitpilot.models import Message, ProfileFact
from dashboard.orbitpilot.source import _extract_chat_history
from dashboard.saved_memories.models import Memory
from dashboard.sources import BLINKS, PROFILE, SAVED, extract, get_source
from tests.factories import make_conversation, make_user, user_turns


def test_chat_pairs_have_stable_source_ids(db_session):
    user = make_user(db_session)
    conv, _ = make_conversation(db_session, user, [("q0", "a0"), ("q1", "a1"), ("q2", "a2")])
    records = _extract_chat_history(db_session, user.id)
    assert [(r.source_id, r.text) for r in records] == [
        (f"{conv.id}:0", "User: q0\nOrbitPilot: a0"),
        (f"{conv.id}:1", "User: q1\nOrbitPilot: a1"),
        (f"{conv.id}:2", "User: q2\nOrbitPilot: a2"),
    ]


def test_flagged_pair_is_skipped_and_every_other_pair_keeps_its_source_id(db_session):
    user = make_user(db_session)
    conv, messages = make_conversation(
        db_session, user, [("q0", "a0"), ("secret q1", "secret a1"), ("q2", "a2")],
        flagged={1})
    records = _extract_chat_history(db_session, user.id)
    assert [r.source_id for r in records] == [f"{conv.id}:0", f"{conv.id}:2"]
    assert not any("secret" in r.text for r in records)  # neither the turn nor its reply


def test_an_assistant_message_cannot_be_flagged(db_session):
    user = make_user(db_session)
    _, messages = make_conversation(db_session, user, [("q0", "a0")])
    reply = messages[1]
    assert reply.role == "assistant"
    reply.not_remembered = True
    with pytest.raises(IntegrityError, match="flag_on_user_turns"), db_session.begin_nested():
        db_session.flush()


def test_unanswered_user_message_emits_nothing_but_keeps_its_index(db_session):
    user = make_user(db_session)
    conv, messages = make_conversation(db_session, user, [("q0", "a0"), ("q1", None)])
    assert [r.source_id for r in _extract_chat_history(db_session, user.id)] == [f"{conv.id}:0"]
    # Answered later: it takes index 1, and pair 0 is untouched.
    asked = user_turns(messages)[1]
    db_session.add(Message(conversation_id=conv.id, user_id=user.id, role="assistant",
                           position=3, content="a1", reply_to_id=asked.id))
    db_session.flush()
    assert [r.source_id for r in _extract_chat_history(db_session, user.id)] == [
        f"{conv.id}:0", f"{conv.id}:1"]


def test_unanswered_turn_in_the_middle_does_not_shift_later_pairs(db_session):
    user = make_user(db_session)
    conv, _ = make_conversation(db_session, user, [("q0", "a0"), ("q1", None), ("q2", "a2")])
    assert [r.source_id for r in _extract_chat_history(db_session, user.id)] == [
        f"{conv.id}:0", f"{conv.id}:2"]


def test_pairs_follow_reply_links_not_just_adjacency(db_session):
    user = make_user(db_session)
    conv, messages = make_conversation(db_session, user, [("q0", None), ("q1", None)])
    q0, q1 = user_turns(messages)
    db_session.add_all([
        Message(conversation_id=conv.id, user_id=user.id, role="assistant", position=2,
                content="answer to q1", reply_to_id=q1.id),
        Message(conversation_id=conv.id, user_id=user.id, role="assistant", position=3,
                content="answer to q0", reply_to_id=q0.id),
    ])
    db_session.flush()
    texts = {r.source_id: r.text for r in _extract_chat_history(db_session, user.id)}
    assert texts == {f"{conv.id}:0": "User: q0\nOrbitPilot: answer to q0",
                     f"{conv.id}:1": "User: q1\nOrbitPilot: answer to q1"}


def test_chat_history_is_per_user(db_session):
    alice, bob = make_user(db_session), make_user(db_session)
    make_conversation(db_session, alice, [("alice q", "alice a")])
    make_conversation(db_session, bob, [("bob q", "bob a")])
    assert ["alice" in r.text for r in _extract_chat_history(db_session, alice.id)] == [True]


def test_forgotten_things_are_never_extracted(db_session):
    user = make_user(db_session)
    db_session.add_all([
        ProfileFact(user_id=user.id, key="name", value="Ada"),
        ProfileFact(user_id=user.id, key="city", value="Lyon"),
        Blink(user_id=user.id, title="kept", content="visible blink"),
        Blink(user_id=user.id, title="hidden", content="excluded blink",
              excluded_from_memory=True),
        Memory(owner_id=user.id, content="active memory"),
        Memory(owner_id=user.id, content="soft deleted memory", status="deleted"),
        Memory(owner_id=user.id, content="[REDACTED]", status="redacted"),
    ])
    db_session.flush()
    def texts(key: str) -> list[str]:
        return [r.text for r in get_source(key).extract(db_session, user.id)]

    assert texts(PROFILE) == ["city: Lyon\nname: Ada"]
    assert texts(BLINKS) == ["kept\nvisible blink"]
    assert texts(SAVED) == ["active memory"]


def test_only_the_named_sources_are_extracted(db_session):
    user = make_user(db_session)
    db_session.add(ProfileFact(user_id=user.id, key="name", value="Ada"))
    make_conversation(db_session, user, [("q", "a")])
    records = extract(db_session, user.id, ("orbitpilot.profile",))
    assert {r.source_key for r in records} == {"orbitpilot.profile"}
