"""A question alone is not a fact: a chat pair is remembered as what the person said and
what the reply said of its own; a turn that only asks, answered with nothing of the
reply's own, is not remembered, and never outranks the fact it asked about."""

from __future__ import annotations

import os

import pytest

from dashboard.memory import get_embedder, search_memory
from dashboard.memory.embedders import MiniLMEmbedder, minilm_available
from dashboard.orbitpilot.replies import send_message
from dashboard.orbitpilot.responder import BuiltinResponder, ResponderContext, Turn
from dashboard.orbitpilot.source import extract_chat_pairs
from tests.factories import build, make_conversation, make_memory, make_plan, make_user


def builtin_reply(turn: str) -> str:
    """The built-in responder's reply to ``turn`` with nothing recalled, as it writes it."""
    return BuiltinResponder()(ResponderContext(turns=(Turn("user", turn),))).text


def test_a_pair_keeps_the_turn_and_what_the_reply_said_of_its_own(db_session):
    user = make_user(db_session)
    asked, said = "What do I like on planes?", "I like an aisle seat on long flights."
    conversation, _ = make_conversation(db_session, user, [
        (asked, builtin_reply(asked)),  # only asks, and the reply only echoes: nothing
        (said, builtin_reply(said)),  # a statement: the turn, without the echo
        ("What is the capital of Peru?", "Lima."),  # the reply says something
    ])
    assert {r.source_id: r.text for r in extract_chat_pairs(db_session, user.id)} == {
        f"{conversation.id}:1": f"User: {said}",
        f"{conversation.id}:2": "User: What is the capital of Peru?\nOrbitPilot: Lima.",
    }


@pytest.mark.skipif(
    not minilm_available() and os.environ.get("CI", "").lower() not in {"1", "true"},
    reason="the ml extra (all-MiniLM-L6-v2) is not installed")
def test_a_question_answered_from_memory_never_outranks_the_fact_it_asked_about(db_session):
    """With MiniLM: asked what they like on planes, the built-in responder answers from the
    saved fact. Remembered as the pair used to be (the question, and that memory answered
    it), the pair would be nearer the same question than the fact is; it is not
    remembered, and recall of the question finds the fact alone."""
    embedder, cut = get_embedder("minilm"), MiniLMEmbedder.match_distance
    user = make_user(db_session, plan=make_plan(db_session, cap=5))
    fact, question = "Likes an aisle seat on long flights.", "What do I like on planes?"
    make_memory(db_session, user, fact)
    build(db_session, user, "full", embedder)
    exchange = send_message(db_session, responder=BuiltinResponder(), user_id=user.id,
                            text=question, embedder=embedder, max_distance=cut)
    assert fact in exchange.reply.content  # it answered from the fact
    build(db_session, user, "quick", embedder)

    hits = search_memory(db_session, user.id, question, 3, embedder=embedder,
                         max_distance=cut)
    assert [(h.content, h.relevance) for h in hits] == [(fact, "relevant")]
    query, saved, before = embedder.embed(
        [question, fact, f"User: {question}\nOrbitPilot: (answered from your memory)"])
    # The old pair was nearer than the fact, which is near enough to be sure of.
    assert 1 - float(before @ query) < 1 - float(saved @ query) <= MiniLMEmbedder.sure_distance
