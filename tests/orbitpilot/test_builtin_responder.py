"""The built-in responder answers in a sentence from what recall found, in the question's
language (English, French, Chinese), says when it is unsure or found nothing, never echoes
the turn; its words are known as its own, so a chat pair never stores them."""

from __future__ import annotations

import pytest

from dashboard.memory import POSSIBLY_RELATED, RELEVANT, get_embedder
from dashboard.orbitpilot.replies import send_message
from dashboard.orbitpilot.responder import (
    EN,
    FR,
    NOTHING_RELEVANT,
    ZH,
    BuiltinResponder,
    MemoryHit,
    ResponderContext,
    Turn,
    is_builtin_reply,
    language_of,
)
from dashboard.orbitpilot.source import extract_chat_pairs, pair_text
from dashboard.sources import SAVED
from tests.factories import build, make_memory, make_plan, make_user

FACT = "Ticket BL-422 was closed by the night shift."
ASIDE = "The printer on floor 3 jams on Mondays."


def answer(question: str, *hits: MemoryHit, guest: bool = False) -> str:
    return BuiltinResponder()(ResponderContext((Turn("user", question),), hits,
                                               guest=guest)).text


def saved(content: str, relevance: str = RELEVANT, source_id: str = "m1") -> MemoryHit:
    return MemoryHit(SAVED, "Saved memories", source_id, content, 0.3, 1, owner_id=1,
                     relevance=relevance)


@pytest.mark.parametrize(("question", "language"), [
    ("Where do I live?", EN), ("Lisbon?", EN), ("What is le plan?", EN),
    ("Où est-ce que j'habite ?", FR), ("quelle ville pour les vacances", FR),
    ("Et alors ?", FR), ("Préférences ?", FR), ("Where is my résumé?", EN),
    ("我住在哪里？", ZH), ("工单 BL-422 怎么样了", ZH),
    ("What is Heron 50d3f993758448d5954b617df7ed0d07?", EN),  # no word in a code
])
def test_the_language_of_a_question(question, language):
    assert language_of(question) == language


@pytest.mark.parametrize(("question", "expected"), [
    ("What happened to ticket BL-422?",
     f"From your saved memory: \u201c{FACT}\u201d"),
    ("Qu'est devenu le ticket BL-422 ?",
     f"D'après votre mémoire enregistrée : « {FACT} »"),
    ("工单 BL-422 怎么样了？",
     f"根据你保存的记忆：\u201c{FACT}\u201d"),
])
def test_a_question_is_answered_in_its_language_from_the_recalled_item(
        db_session, question, expected):
    """Through the real chat: recall finds the saved fact (by the code it names), and the
    answer quotes it in the question's language, with no echo of the turn."""
    user = make_user(db_session, plan=make_plan(db_session, cap=5))
    make_memory(db_session, user, FACT)
    build(db_session, user, "full")
    exchange = send_message(db_session, responder=BuiltinResponder(), user_id=user.id,
                            text=question, embedder=get_embedder("hashing"))
    assert exchange.reply.content == expected
    assert question not in exchange.reply.content


def test_a_second_relevant_item_is_named_too_and_one_item_only_once():
    first, second = saved(FACT), saved(ASIDE, source_id="m2")
    assert answer("Tell me", first, second, saved("another chunk of m1")) == (
        f"From your saved memory: \u201c{FACT}\u201d\n"
        f"Also, from your saved memory: \u201c{ASIDE}\u201d")
    assert answer("Et alors ?", first, saved(FACT, source_id="m1")) == (
        f"D'après votre mémoire enregistrée : « {FACT} »")


@pytest.mark.parametrize(("question", "unsure", "cited"), [
    ("What about the ticket?", "I'm not sure, but this may be related:",
     f"From your saved memory: \u201c{FACT}\u201d"),
    ("Et le ticket ?", "Je n'en suis pas sûr, mais ceci pourrait s'y rapporter :",
     f"D'après votre mémoire enregistrée : « {FACT} »"),
    ("那个工单呢？", "我不确定，但这可能相关：", f"根据你保存的记忆：\u201c{FACT}\u201d"),
])
def test_only_possibly_related_hits_give_the_unsure_sentence(question, unsure, cited):
    hit = saved(FACT, POSSIBLY_RELATED)
    assert answer(question, hit, saved(ASIDE, POSSIBLY_RELATED, "m2")) == \
        f"{unsure}\n{cited}"


def test_a_relevant_hit_is_answered_surely_before_a_possibly_related_one():
    text = answer("What about the ticket?", saved(ASIDE, POSSIBLY_RELATED, "m2"),
                  saved(FACT))
    assert text == f"From your saved memory: \u201c{FACT}\u201d"


@pytest.mark.parametrize(("question", "sentence"), [
    ("What is my cat called?", NOTHING_RELEVANT),
    ("Comment s'appelle mon chat ?", "Je n'ai rien trouvé dans votre mémoire qui s'y rapporte."),
    ("我的猫叫什么？", "我在你的记忆中没有找到与此相关的内容。"),
])
def test_no_hits_give_the_no_match_sentence(question, sentence):
    assert answer(question) == sentence


@pytest.mark.parametrize(("question", "start"), [
    ("Hello there", "I remember nothing between visits"),
    ("Bonjour, où est mon vol ?", "Je ne me souviens de rien"),
    ("你好，我的航班在哪里？", "你未登录时"),
])
def test_a_guest_is_told_in_their_language_that_nothing_is_remembered(question, start):
    text = answer(question, guest=True)
    assert text.startswith(start) and "You said" not in text


@pytest.mark.parametrize("question", ["Ticket BL-422 is done, I think",
                                      "Le ticket BL-422 est fermé, je crois",
                                      "工单 BL-422 已经关闭了"])
@pytest.mark.parametrize("relevance", [RELEVANT, POSSIBLY_RELATED, None])
def test_a_builtin_reply_is_not_stored_with_its_pair(question, relevance):
    """Whatever the shape and language (and even with no ``drew_on_memory`` to tell), a
    built-in reply is known as one: its pair is the turn alone, neither its framing nor
    the memory it quoted."""
    reply = answer(question, *([saved(FACT, relevance)] if relevance else []))
    assert is_builtin_reply(reply)
    assert pair_text(question, reply, drew_on_memory=False) == f"User: {question}"


def test_other_replies_and_the_earlier_shape():
    assert pair_text("Capital of Peru", "Lima.", False) == \
        "User: Capital of Peru\nOrbitPilot: Lima."
    said = "From what I read, Lima has been the capital since 1535."
    assert not is_builtin_reply(said)
    assert not is_builtin_reply(f"{said}\n{NOTHING_RELEVANT}")
    assert is_builtin_reply("You said: \u201cHi\u201d\nI found nothing in your memory that "
                            "bears on this.\nI drew on this message only.")


def test_a_chat_pair_answered_from_memory_holds_the_turn_alone(db_session):
    """End to end: the stored pair has no framing and no copy of the quoted memory."""
    user = make_user(db_session, plan=make_plan(db_session, cap=5))
    make_memory(db_session, user, FACT)
    build(db_session, user, "full")
    turn = "Remind me about ticket BL-422, please."
    exchange = send_message(db_session, responder=BuiltinResponder(), user_id=user.id,
                            text=turn, embedder=get_embedder("hashing"))
    assert FACT in exchange.reply.content
    (pair,) = extract_chat_pairs(db_session, user.id)
    assert pair.text == f"User: {turn}"
