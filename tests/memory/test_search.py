"""search_memory: top-k by cosine distance within one user's chunks."""

import math
import os

import numpy as np
import pytest
from sqlalchemy import event, insert, select, text, update

from dashboard.memory.ann import index_batch
from dashboard.memory.embedders import HashingEmbedder, minilm_available
from dashboard.memory.models import EMBEDDING_DIMENSIONS, MemoryChunk
from dashboard.memory.pipeline import run_memory_build
from dashboard.memory.search import NothingToSearch, search_memory
from dashboard.saved_memories.models import Memory
from tests.factories import make_user, mark_ann_ready

LEXICAL = [
    "The quarterly tax filing is due on the fifteenth of April.",
    "Ada's sourdough starter needs feeding twice a day with rye flour.",
    "Standup happens at 9:30 every weekday in the blue room.",
    "The Lisbon trip in May: pack light layers and walking shoes.",
    "Renew the car insurance before the end of the month.",
]


def memories_user(db_session, texts):
    user = make_user(db_session)
    db_session.add_all([Memory(owner_id=user.id, content=t) for t in texts])
    db_session.flush()
    return user


def test_lexical_fixture_ranks_the_relevant_chunk_first(db_session):
    embedder = HashingEmbedder()
    user = memories_user(db_session, LEXICAL)
    run_memory_build(user, "quick", session=db_session, embedder=embedder)
    hits = search_memory(db_session, user.id, "when is standup?", 3, embedder=embedder)
    assert hits[0].content.startswith("Standup happens")
    assert [h.distance for h in hits] == sorted(h.distance for h in hits)
    assert search_memory(db_session, user.id, "sourdough rye", 1,
                         embedder=embedder)[0].content.startswith("Ada's sourdough")


def _random_chunks(session, user_id, count, rng, offset=0, *, ann=False):
    vectors = rng.standard_normal((count, EMBEDDING_DIMENSIONS)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    session.execute(insert(MemoryChunk), [
        {"user_id": user_id, "source_key": "xmemo.saved", "source_id": str(offset + i),
         "chunk_index": 0, "content_hash": f"{offset + i:064d}", "content": f"c{offset + i}",
         "embedding": vectors[i], "embedding_model": "random", "ann": ann}
        for i in range(count)
    ])


class RandomQuery:
    """An embedder whose query vector is random: the chunks' own model name, so they match."""

    name, dimensions = "random", EMBEDDING_DIMENSIONS

    def __init__(self, rng) -> None:
        self.rng = rng

    def embed(self, texts):
        vector = self.rng.standard_normal((1, EMBEDDING_DIMENSIONS)).astype(np.float32)
        return vector / np.linalg.norm(vector)


def user_among_a_crowd(db_session, rng, *, chunks: int, ann: bool = False):
    """A user with ``chunks`` random chunks (contents c10000…) beside one with 3,000; both
    in the HNSW index if ``ann`` (so the index holds far more rows than the user's)."""
    crowd = make_user(db_session)
    _random_chunks(db_session, crowd.id, 3000, rng, ann=ann)
    user = make_user(db_session)
    _random_chunks(db_session, user.id, chunks, rng, offset=10_000, ann=ann)
    db_session.flush()
    return user


class Recorder:
    """The statements that reach the database while it listens, with their parameters."""

    def __init__(self) -> None:
        self.ran: list[tuple[str, object]] = []

    def __call__(self, conn, cursor, statement, parameters, context, executemany):
        self.ran.append((statement, parameters))

    def __enter__(self):
        from dashboard.extensions import db

        event.listen(db.engine, "before_cursor_execute", self)
        return self

    def __exit__(self, *exc):
        from dashboard.extensions import db

        event.remove(db.engine, "before_cursor_execute", self)

    def nearest(self):
        """The statements that ordered by distance."""
        return [(s, p) for s, p in self.ran if "<=>" in s]

    def hnsw(self):
        """The statements that searched the partial index (``AND ann``, its predicate)."""
        return [(s, p) for s, p in self.nearest() if "memory_chunks.ann" in s]


def explain(db_session, statements) -> dict:
    """EXPLAIN (FORMAT JSON) of the last statement, replayed after the ones before it (its
    settings) inside a savepoint that is rolled back."""
    cursor = db_session.connection().connection.driver_connection.cursor()
    *before, (statement, parameters) = statements
    with db_session.begin_nested() as replay:
        for setting, setting_parameters in before:
            cursor.execute(setting, setting_parameters)
        plan = cursor.execute("EXPLAIN (FORMAT JSON) " + statement, parameters).fetchone()[0]
        replay.rollback()
    return plan[0]["Plan"]


def plan_nodes(plan: dict):
    yield plan
    for child in plan.get("Plans", ()):
        yield from plan_nodes(child)


@pytest.mark.parametrize("chunks", [10, 25])
def test_a_user_below_the_threshold_gets_the_exact_path_and_k_rows_in_exact_order(
        db_session, chunks):
    """10 rows of 25, or all 10 of 10, in the exact order (recomputed here), among a
    crowd's rows; no HNSW index in the plan, no HNSW settings sent."""
    rng = np.random.default_rng(7)
    small = user_among_a_crowd(db_session, rng, chunks=chunks)
    embedder = RandomQuery(np.random.default_rng(3))
    query = RandomQuery(np.random.default_rng(3)).embed(["q"])[0]
    with Recorder() as recorder:
        hits = search_memory(db_session, small.id, "anything", 10, embedder=embedder)
    assert len(hits) == 10
    assert not [s for s, _ in recorder.ran if "set_config" in s]
    rows = db_session.execute(select(MemoryChunk.content, MemoryChunk.embedding)
                              .where(MemoryChunk.user_id == small.id)).all()
    distances = {content: 1 - float(np.dot(vector, query)) for content, vector in rows}
    expected = sorted(distances, key=distances.get)[:10]
    assert [h.content for h in hits] == expected
    ((statement, parameters),) = recorder.nearest()
    plan = explain(db_session, [(statement, parameters)])
    assert not [n for n in plan_nodes(plan) if n.get("Index Name") ==
                "ix_memory_chunks_embedding_ann"]


def test_a_user_with_fewer_than_k_chunks_gets_them_all(db_session, count_queries):
    rng = np.random.default_rng(5)
    small = user_among_a_crowd(db_session, rng, chunks=4)
    with count_queries() as q:
        hits = search_memory(db_session, small.id, "anything", 10, embedder=RandomQuery(rng))
    assert sorted(h.content for h in hits) == [f"c{10_000 + i}" for i in range(4)]
    # One statement: the path (the note's flag, one row's model) and the exact scan.
    assert q.count == 1


def test_a_user_above_the_threshold_takes_the_partial_hnsw_index_and_gets_k_rows(db_session):
    """A real build and its indexing job flag the user's rows (threshold 30); EXPLAIN of
    the very statement
    search_memory ran, replayed after its settings, is an Index Scan of the partial HNSW
    index with no Sort, and the result is exactly k of the user's rows, nearest first."""
    rng = np.random.default_rng(11)
    embedder = HashingEmbedder()
    crowd = make_user(db_session)
    _random_chunks(db_session, crowd.id, 3000, rng, ann=True)
    big = memories_user(db_session, [f"note {i}: {LEXICAL[i % 5]} (variant {i})"
                                     for i in range(60)])
    result = run_memory_build(big, "quick", session=db_session, embedder=embedder,
                              ann_threshold=30)
    assert (result.ann, result.indexing, result.added) == (False, True, 60)
    while not index_batch(db_session, big.id, leave=24, batch=500).done:
        pass

    with Recorder() as recorder:
        hits = search_memory(db_session, big.id, "when is standup?", 10, embedder=embedder)
    assert len(hits) == 10
    assert {h.chunk_id for h in hits} <= set(db_session.scalars(
        select(MemoryChunk.id).where(MemoryChunk.user_id == big.id)))
    assert [h.distance for h in hits] == sorted(h.distance for h in hits)
    assert "Standup" in hits[0].content
    settings = [(s, p) for s, p in recorder.ran if "set_config" in s]
    nearest = recorder.hnsw()
    # The path statement (which scans no small owner here), then the HNSW path alone: no
    # top-up.
    assert len(settings) == 1 and len(nearest) == 1 and len(recorder.nearest()) == 2
    # Its settings stayed inside search_memory: the caller's transaction is as it was.
    assert db_session.execute(text("SHOW enable_sort")).scalar() == "on"
    plan = explain(db_session, settings + nearest)
    nodes = list(plan_nodes(plan))
    scans = [n for n in nodes if n["Node Type"] == "Index Scan"]
    assert [n["Index Name"] for n in scans] == ["ix_memory_chunks_embedding_ann"], plan
    assert not [n for n in nodes if n["Node Type"] == "Sort"], plan


def test_an_approximate_path_that_comes_back_short_is_topped_up_exactly(db_session,
                                                                        monkeypatch):
    """The approximate path made to answer nothing: the exact scan fills in k rows, the
    exact top k of the user's own (40 rows in the index; the crowd's, outside it, never
    come back)."""
    from dashboard.memory import search

    rng = np.random.default_rng(13)
    crowd = make_user(db_session)
    _random_chunks(db_session, crowd.id, 200, rng)
    big = make_user(db_session)
    _random_chunks(db_session, big.id, 40, rng, offset=10_000, ann=True)
    mark_ann_ready(db_session, big.id)
    monkeypatch.setattr(search, "_hnsw", lambda *args: None)
    query = RandomQuery(np.random.default_rng(17))
    hits = search_memory(db_session, big.id, "anything", 10, embedder=query)
    vector = RandomQuery(np.random.default_rng(17)).embed(["q"])[0]
    rows = db_session.execute(select(MemoryChunk.content, MemoryChunk.embedding)
                              .where(MemoryChunk.user_id == big.id)).all()
    distances = {content: 1 - float(np.dot(embedding, vector)) for content, embedding in rows}
    assert [h.content for h in hits] == sorted(distances, key=distances.get)[:10]


def test_k_is_clamped_and_other_users_are_never_returned(db_session):
    embedder = HashingEmbedder()
    mine = memories_user(db_session, LEXICAL[:2])
    theirs = memories_user(db_session, ["standup standup standup"])
    for user in (mine, theirs):
        run_memory_build(user, "quick", session=db_session, embedder=embedder)
    hits = search_memory(db_session, mine.id, "standup", 1000, embedder=embedder)
    assert len(hits) == 2
    assert all(h.content in LEXICAL for h in hits)


@pytest.mark.parametrize("query", ["!!!", "the and of", "¿?", "— … —"])
def test_a_query_with_nothing_to_search_on_is_refused_naming_the_query(db_session, query):
    # The hashing embedder gives such a query the zero vector: every cosine distance to
    # it would be NaN, and the "nearest" chunks an arbitrary few.
    embedder = HashingEmbedder()
    user = memories_user(db_session, LEXICAL)
    run_memory_build(user, "quick", session=db_session, embedder=embedder)
    with pytest.raises(NothingToSearch) as caught:
        search_memory(db_session, user.id, query, 3, embedder=embedder)
    assert (caught.value.kind, caught.value.field) == ("invalid", "query")
    assert "nothing to search on" in caught.value.sentence


@pytest.mark.parametrize("ann", [False, True], ids=["exact", "hnsw"])
def test_a_chunk_with_nothing_to_search_on_is_never_a_hit(db_session, ann):
    rng = np.random.default_rng(11)
    user = make_user(db_session)
    _random_chunks(db_session, user.id, 4, rng, ann=ann)
    db_session.execute(insert(MemoryChunk), [{
        "user_id": user.id, "source_key": "xmemo.saved", "source_id": "zero",
        "chunk_index": 0, "content_hash": "z" * 64, "content": "!!!",
        "embedding": np.zeros(EMBEDDING_DIMENSIONS, dtype=np.float32),
        "embedding_model": "random", "ann": ann}])
    if ann:
        mark_ann_ready(db_session, user.id)
    hits = search_memory(db_session, user.id, "anything", 10, embedder=RandomQuery(rng))
    assert sorted(h.content for h in hits) == ["c0", "c1", "c2", "c3"]
    assert all(math.isfinite(h.distance) for h in hits)


requires_ml = pytest.mark.skipif(
    not minilm_available() and os.environ.get("CI", "").lower() not in {"1", "true"},
    reason="the ml extra (all-MiniLM-L6-v2) is not installed",
)


@requires_ml
def test_semantic_fixture_with_minilm(db_session):
    from dashboard.memory.embedders import get_embedder

    embedder = get_embedder("minilm")  # in CI a missing ml extra fails here, never skips
    user = memories_user(db_session, [
        "I adopted a puppy named Rex last spring.",
        "The quarterly tax filing is due in April.",
        "My favourite city for a weekend away is Lisbon.",
        "I am allergic to peanuts.",
    ])
    result = run_memory_build(user, "quick", session=db_session, embedder=embedder)
    assert result.embedded == 4
    hits = search_memory(db_session, user.id, "my dog", 2, embedder=embedder)
    assert hits[0].content.startswith("I adopted a puppy")
    hits = search_memory(db_session, user.id, "food I must avoid", 1, embedder=embedder)
    assert hits[0].content == "I am allergic to peanuts."


def test_a_chunk_farther_than_the_cut_is_no_match(db_session):
    """A chunk sharing nothing with the query is not presented as a memory of it."""
    embedder = HashingEmbedder()
    user = memories_user(db_session, LEXICAL)
    run_memory_build(user, "quick", session=db_session, embedder=embedder)
    query = "passport renewal"  # no word of any memory
    assert len(search_memory(db_session, user.id, query, 3, embedder=embedder)) == 3
    assert search_memory(db_session, user.id, query, 3, embedder=embedder,
                         max_distance=embedder.match_distance) == []
    near = search_memory(db_session, user.id, "when is standup?", 3, embedder=embedder,
                         max_distance=embedder.match_distance)
    assert near and all(h.distance <= embedder.match_distance for h in near)
    assert near[0].content.startswith("Standup happens")


def test_the_cut_is_the_embedders_unless_configured(app):
    from dashboard.memory import match_distance, settings_from

    assert match_distance(HashingEmbedder()) == HashingEmbedder.match_distance == 0.99
    assert match_distance(HashingEmbedder(), 0.5) == 0.5
    assert settings_from({**app.config, "RECALL_MAX_DISTANCE": 0.7}).recall_max_distance == 0.7


@requires_ml
def test_minilm_finds_what_a_person_means_and_says_no_match_to_the_rest(db_session):
    """The README's example: the saved memory is the first hit for the words it uses and
    for a paraphrase, and a question about something never saved matches nothing."""
    from dashboard.memory.embedders import MiniLMEmbedder, get_embedder

    embedder = get_embedder("minilm")
    user = memories_user(db_session, [
        "Prefers aisle seats on long flights.",
        "The quarterly tax filing is due in April.",
        "I adopted a puppy named Rex last spring.",
    ])
    run_memory_build(user, "quick", session=db_session, embedder=embedder)
    cut = MiniLMEmbedder.match_distance
    for query in ("seat preference", "what do I like on planes"):
        hits = search_memory(db_session, user.id, query, 3, embedder=embedder, max_distance=cut)
        assert hits[0].content == "Prefers aisle seats on long flights.", query
    assert search_memory(db_session, user.id, "what is my blood type", 3, embedder=embedder,
                         max_distance=cut) == []


# -- hybrid: the query's names, codes and identifiers, fused with the vectors ---------------

@pytest.mark.parametrize(("query", "terms"), [
    ("what was the outcome with BL-422", ["BL-422"]),
    ("why do we see ECONNRESET on the proxy?", ["ECONNRESET"]),
    ("where is Heron at? Ask Ada", ["Heron", "Ada"]),  # "Ask" opens a sentence
    ("Heron", ["Heron"]),
    ("BL-422怎么样了", ["BL-422"]),  # a code inside Chinese text
    ("What do I like on planes?", []),  # everyday words are the vectors' to judge
])
def test_the_words_looked_up_are_the_querys_names_codes_and_identifiers(query, terms):
    from dashboard.memory.lexical import lexical_terms

    assert lexical_terms(query) == terms


def test_a_code_inside_chinese_text_is_found_by_its_words_in_one_statement(
        db_session, count_queries):
    """A person's memory in Chinese and their team's in English, each holding a code the
    hashing vectors cannot see (no word shared: distance 1, beyond the cut): found by
    its words, in one statement over both owners, labelled as matched by words."""
    embedder = HashingEmbedder()
    person = memories_user(db_session, ["工单BL-422已经关闭。", "我喜欢靠过道的座位。"])
    team = memories_user(db_session, ["The proxy logs ECONNRESET every night.",
                                      "Standup happens at 9:30 every weekday."])
    for owner in (person, team):
        run_memory_build(owner, "quick", session=db_session, embedder=embedder)
    query, cut = "BL-422和ECONNRESET怎么样了", embedder.match_distance
    assert search_memory(db_session, [person.id, team.id], query, 5, embedder=embedder,
                         max_distance=cut, hybrid=False) == []
    with count_queries() as q:
        hits = search_memory(db_session, [person.id, team.id], query, 5, embedder=embedder,
                             max_distance=cut)
    assert q.count == 1
    assert sorted((h.content, h.owner_id, h.match) for h in hits) == [
        ("The proxy logs ECONNRESET every night.", team.id, "lexical"),
        ("工单BL-422已经关闭。", person.id, "lexical")]


def test_on_the_hnsw_path_the_words_are_read_through_their_gin_index(db_session):
    """A ready user (every row in the partial HNSW index) asked about a code: EXPLAIN of
    the very statement search_memory ran, after its settings, reads the vectors off the
    HNSW index and the words off the GIN index, and the chunk holding the code (its
    vector the farthest from the query's) comes first."""
    rng = np.random.default_rng(19)
    crowd = make_user(db_session)
    _random_chunks(db_session, crowd.id, 60, rng)
    # Most of the table is the big user's, as with a user past ANN_MIN_CHUNKS: their id
    # narrows little, the code a great deal, so the planner reads the words' GIN index.
    big = make_user(db_session)
    _random_chunks(db_session, big.id, 400, rng, offset=10_000, ann=True)
    away = -RandomQuery(np.random.default_rng(23)).embed(["q"])[0]  # the farthest there is
    db_session.execute(update(MemoryChunk).where(
        MemoryChunk.user_id == big.id, MemoryChunk.source_id == "10007").values(
        content="Locker BL-422 at the gym", embedding=away))
    mark_ann_ready(db_session, big.id)
    db_session.execute(text("ANALYZE memory_chunks"))  # the code is rare, as in a large user
    with Recorder() as recorder:
        hits = search_memory(db_session, big.id, "what was the outcome with BL-422", 10,
                             embedder=RandomQuery(np.random.default_rng(23)))
    assert len(hits) == 10 and hits[0].content == "Locker BL-422 at the gym"
    assert hits[0].match == "lexical" and hits[0].distance == pytest.approx(2.0)
    assert {h.match for h in hits[1:]} == {"semantic"}
    settings = [(s, p) for s, p in recorder.ran if "set_config" in s]
    (fused,) = recorder.hnsw()
    assert len(settings) == 1 and "@@" in fused[0]
    nodes = list(plan_nodes(explain(db_session, settings + [fused])))
    # The vector list straight off the index, unsorted; the words' off theirs.
    (top,) = [n for n in nodes if n.get("Subplan Name") == "CTE top"]
    vectors = list(plan_nodes(top))
    assert [n["Index Name"] for n in vectors if n["Node Type"] == "Index Scan"] == [
        "ix_memory_chunks_embedding_ann"], top
    assert not [n for n in vectors if n["Node Type"] == "Sort"], top
    assert ("Bitmap Index Scan", "ix_memory_chunks_lexemes") in {
        (n["Node Type"], n.get("Index Name")) for n in nodes}, nodes


@requires_ml
def test_an_identifier_the_vectors_miss_is_found_by_its_words(db_session, count_queries):
    """MiniLM puts the locker's memory far from a question about BL-422 (its other words
    mean nothing alike): beyond a cut of 0.8, the vectors alone answer without it. Hybrid
    recall finds it first, in one statement, as matched by its words. The code proves the
    subject, not the thing asked: nothing in it is an outcome, so it is possibly related;
    asked what BL-422 holds, it is relevant. The memory about an outcome, near enough to
    show, is only possibly related."""
    from dashboard.memory.embedders import get_embedder

    embedder = get_embedder("minilm")
    locker = "Locker BL-422 at the gym holds my spare running shoes."
    user = memories_user(db_session, [locker, "The outcome of the board vote was a tie.",
                                      "Prefers aisle seats on long flights.",
                                      "The quarterly tax filing is due in April."])
    run_memory_build(user, "quick", session=db_session, embedder=embedder)
    query, cut = "what was the outcome with BL-422", 0.8
    everything = search_memory(db_session, user.id, query, 10, embedder=embedder,
                               hybrid=False)
    assert {h.content: h.distance for h in everything}[locker] > cut
    assert locker not in [h.content for h in search_memory(
        db_session, user.id, query, 3, embedder=embedder, max_distance=cut, hybrid=False)]
    with count_queries() as q:
        hits = search_memory(db_session, user.id, query, 3, embedder=embedder,
                             max_distance=cut)
    assert q.count == 1
    assert (hits[0].content, hits[0].match, hits[0].relevance) == \
        (locker, "lexical", "possibly_related")
    # The outcome's memory is near enough to show, not to be sure of.
    assert {(h.match, h.relevance) for h in hits[1:]} <= {("semantic", "possibly_related")}
    held = search_memory(db_session, user.id, "what's in BL-422?", 3, embedder=embedder,
                         max_distance=cut)[0]
    assert (held.content, held.relevance) == (locker, "relevant")


def test_a_team_on_the_hnsw_path_is_fused_in_with_the_persons_hits(db_session):
    """The person's exact statement and their team's HNSW one (every row ``ann``, the note
    ready) each fuse their lists; the union is fused again: the person's chunk, near and
    holding the code, before the team's, which only its words found (hashing vectors:
    distance 1). The vectors alone find the person's only."""
    embedder = HashingEmbedder()
    person = memories_user(db_session, ["Ticket BL-422 closed after the vendor patch.",
                                        LEXICAL[2]])
    team = memories_user(db_session, ["工单BL-422已经关闭。", LEXICAL[0]])
    for owner in (person, team):
        run_memory_build(owner, "quick", session=db_session, embedder=embedder)
    db_session.execute(update(MemoryChunk).where(MemoryChunk.user_id == team.id)
                       .values(ann=True))
    mark_ann_ready(db_session, team.id)
    query, cut = "BL-422 closed", embedder.match_distance
    with Recorder() as recorder:
        hits = search_memory(db_session, [person.id, team.id], query, 5, embedder=embedder,
                             max_distance=cut)
    assert len(recorder.hnsw()) == 1  # the team's own statement
    assert [(h.content, h.owner_id, h.match) for h in hits] == [
        ("Ticket BL-422 closed after the vendor patch.", person.id, "both"),
        ("工单BL-422已经关闭。", team.id, "lexical")]
    assert [h.content for h in search_memory(
        db_session, [person.id, team.id], query, 5, embedder=embedder, max_distance=cut,
        hybrid=False)] == ["Ticket BL-422 closed after the vendor patch."]


def test_chunks_the_words_rank_equally_share_their_rank_whatever_their_ids(db_session):
    """Every chunk holds the query's one identifier once: the words rank them equally, so
    the vectors decide. Ranked 1, 2, 3, 4 by id instead, the oldest (a weak match) would
    win the fusion over the nearest (1/63 + 1/61 against 1/61 + 1/64)."""
    embedder = HashingEmbedder()
    code = "f3a9c2d17b4e4c0e9d5a6b7c8d9e0f1a"
    weak, far, second, nearest = (f"My Heron {code} demo is on Friday.",
                                  f"Heron {code} is the codename of the billing rewrite.",
                                  f"Heron {code} note one.", f"Heron {code} note zero.")
    user = make_user(db_session)
    for content in (weak, far, second, nearest):  # saved and built in turn: ids in order
        db_session.add(Memory(owner_id=user.id, content=content))
        db_session.flush()
        run_memory_build(user, "quick", session=db_session, embedder=embedder)
    ids = dict(db_session.execute(select(MemoryChunk.content, MemoryChunk.id)
                                  .where(MemoryChunk.user_id == user.id)).all())
    assert ids[weak] < ids[far] < ids[second] < ids[nearest]  # the case the ids decided
    hits = search_memory(db_session, user.id, f"Heron {code} note zero", 4,
                         embedder=embedder)
    assert {h.match for h in hits} == {"both"}
    assert [h.content for h in hits[:2]] == [nearest, second]
