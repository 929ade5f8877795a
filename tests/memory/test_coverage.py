"""A hit within the sure distance is relevant only when it covers the question: a memory
about the question's subject but not the thing asked stays possibly related."""

from __future__ import annotations

import numpy as np

from dashboard.memory.coverage import content_token, coverage
from dashboard.memory.embedders import MiniLMEmbedder, embed_query, get_embedder
from dashboard.memory.minilm import MiniLM
from dashboard.memory.pipeline import run_memory_build
from dashboard.memory.search import POSSIBLY_RELATED, RELEVANT, search_memory
from tests.memory.test_multilingual import requires_ml
from tests.memory.test_search import memories_user

BILLING = "Decided in October to move the billing service to Postgres 16."
WIFI = "The home wifi network is called Larkspur-5G."
AISLE = "Prefers aisle seats on long-haul flights."
NOT_SAVED = "who owns the billing service?"  # its subject is saved, its owner is not
ASKED = "which database version are we moving billing to?"
PENICILLIN_ZH = "对青霉素过敏，小时候起过荨麻疹。"
PENICILLIN_FR = "Je ne supporte pas la pénicilline, elle me donne des boutons."


def test_stop_words_and_punctuation_name_nothing():
    assert [t for t in ["what", "'", "s", "my", "sister", "?", "##ling", "called"]
            if content_token(t)] == ["sister", "##ling", "called"]


def coverage_of(question: str, texts: list[str]) -> list[float]:
    model = get_embedder("minilm")._model
    (asked,) = model.token_vectors([question], content_token)
    return coverage(asked, model.token_vectors(texts, content_token))


@requires_ml
def test_every_word_of_a_paraphrase_finds_a_counterpart_a_missing_subject_does_not():
    missing, asked = coverage_of(NOT_SAVED, [BILLING]) + coverage_of(ASKED, [BILLING])
    assert missing < MiniLMEmbedder.COVERAGE_FLOOR <= asked
    # Nothing to miss in a question of stop words alone.
    assert coverage_of("what is it?", [BILLING]) == [1.0]


@requires_ml
def test_a_near_memory_that_does_not_cover_the_question_is_only_possibly_related(db_session):
    embedder = get_embedder("multilingual")
    user = memories_user(db_session, [BILLING, WIFI, AISLE])
    run_memory_build(user, "quick", session=db_session, embedder=embedder)
    near = search_memory(db_session, user.id, NOT_SAVED, 3, embedder=embedder)[0]
    # Within the sure distance: the words decide, not the distance.
    assert near.content == BILLING
    assert near.distance <= embed_query(embedder, NOT_SAVED).sure_distance
    assert near.relevance == POSSIBLY_RELATED
    found = search_memory(db_session, user.id, ASKED, 3, embedder=embedder)[0]
    assert (found.content, found.relevance) == (BILLING, RELEVANT)


@requires_ml
def test_a_memory_not_in_english_is_left_to_the_distance():
    """MiniLM reads English only: its words say nothing about a Chinese memory."""
    minilm = get_embedder("minilm")
    question = "what medicine am I allergic to?"
    for text in (PENICILLIN_ZH, PENICILLIN_FR):
        assert coverage_of(question, [text])[0] < minilm.COVERAGE_FLOOR
    assert minilm.covers(question, [PENICILLIN_ZH, PENICILLIN_FR, BILLING]) == \
        [True, True, False]


@requires_ml
def test_one_pass_over_the_sure_hits_and_none_when_nothing_is_sure(db_session,
                                                                     monkeypatch):
    """MiniLM's passes in a search, by their batches: the question once (its vector and
    its words together), then the one hit within the sure distance alone; a question
    nothing is near costs the question's pass only."""
    embedder = get_embedder("multilingual")
    user = memories_user(db_session, [BILLING, WIFI, AISLE])
    run_memory_build(user, "quick", session=db_session, embedder=embedder)
    passes = []
    real = MiniLM.states

    def counted(self, ids, mask):
        passes.append(len(ids))
        return real(self, ids, mask)

    monkeypatch.setattr(MiniLM, "states", counted)
    search_memory(db_session, user.id, "what's our wifi called?", 3, embedder=embedder)
    assert passes == [1, 1]
    passes.clear()
    hits = search_memory(db_session, user.id, "what is my blood type?", 3, embedder=embedder)
    assert hits and passes == [1]


@requires_ml
def test_an_english_questions_vector_is_the_row_its_text_is_stored_as():
    """The question's pass also reads its words: the vector must stay ``embed``'s own,
    or a saved copy of the question would no longer be at distance 0."""
    for name in ("multilingual", "minilm"):
        embedder = get_embedder(name)
        assert np.array_equal(embed_query(embedder, ASKED).vector, embedder.embed([ASKED])[0])
