"""Recall quality: does search find what a person means? On the labelled set in
bench/data/recall_set.json (memories of the kinds users save; queries worded differently
from their answer, some with no right answer).

    .venv/bin/python bench/recall.py                      # every embedder available
    .venv/bin/python bench/recall.py --embedders hashing
    .venv/bin/python bench/recall.py --hybrid             # also through search_memory

Per embedder: recall@1/@3/@10 and MRR, texts/s, and for the distance cut a search applies
(``RECALL_MAX_DISTANCE`` or ``--threshold``) the share of no-answer queries answered "no
match" and what it costs; then a sweep of cuts, and the share of queries that share no
content word with their answer; ``--hybrid``: asked of ``search_memory``, hybrid off and on."""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dashboard.memory.embedders import get_embedder, minilm_available  # noqa: E402

SET = Path(__file__).resolve().parent / "data" / "recall_set.json"
STOPWORDS = frozenset((
    "a an and are as at be but by can could did do does for from had has have how i if in is "
    "it its me my of on or our should so that the their them there these this those to was we "
    "were what when where which who why will with would you your about any all also am doing "
    "get got just like more most much need not now one only other out over some than then too "
    "use used using very want way what's whats i'm im").split())
WORD = re.compile(r"[a-z]{3,}")


def content_words(text: str) -> set[str]:
    return {w[:-1] if w.endswith("s") else w for w in WORD.findall(text.lower())
            if w not in STOPWORDS}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--embedders", nargs="*", help="EMBEDDER settings (default: all)")
    parser.add_argument("--threshold", type=float, help="distance threshold to report")
    parser.add_argument("--hybrid", action="store_true",
                        help="also search through the database, hybrid recall off and on")
    return parser.parse_args()


def evaluate(name: str, memories: list[dict], queries: list[dict],
             threshold: float | None) -> dict:
    embedder = get_embedder(name)
    started = time.perf_counter()
    memory_vectors = embedder.embed([m["text"] for m in memories])
    query_vectors = embedder.embed([q["text"] for q in queries])
    seconds = time.perf_counter() - started
    ids = [m["id"] for m in memories]
    distances = 1.0 - query_vectors @ memory_vectors.T  # cosine distance, as pgvector's <=>
    order = np.argsort(distances, axis=1, kind="stable")
    answered = [i for i, q in enumerate(queries) if q["answers"]]
    unanswered = [i for i, q in enumerate(queries) if not q["answers"]]
    ranks = []  # 1-based rank of the first right memory
    for i in answered:
        right = set(queries[i]["answers"])
        ranks.append(next(r for r, j in enumerate(order[i], 1) if ids[j] in right))
    ranks_a = np.array(ranks)
    top = distances[np.arange(len(queries)), order[:, 0]]
    first_right = np.array([distances[i, order[i][r - 1]] for i, r in zip(answered, ranks,
                                                                          strict=True)])
    result = {
        "name": embedder.name, "texts_per_s": (len(memories) + len(queries)) / seconds,
        "recall@1": float(np.mean(ranks_a <= 1)), "recall@3": float(np.mean(ranks_a <= 3)),
        "recall@10": float(np.mean(ranks_a <= 10)), "mrr": float(np.mean(1.0 / ranks_a)),
        "answered_top": top[answered], "unanswered_top": top[unanswered],
        "first_right": first_right, "ranks": ranks_a,
    }
    result["sweep"] = sweep(result)
    result["threshold"] = threshold
    return result


def at_threshold(result: dict, threshold: float) -> tuple[float, float]:
    """(share of no-answer queries with no match, recall@3 kept: the right memory in the
    top 3 and within the threshold)."""
    no_match = float(np.mean(result["unanswered_top"] > threshold))
    kept = float(np.mean((result["ranks"] <= 3) & (result["first_right"] <= threshold)))
    return no_match, kept


def sweep(result: dict) -> list[tuple[float, float, float]]:
    return [(t, *at_threshold(result, t)) for t in np.round(np.arange(0.30, 1.01, 0.05), 2)]


DATABASE = "orbitpilot_bench_recall"


def returned_scores(ranks: list[int]) -> tuple[float, float, float, float]:
    """recall@1/@3/@10 and MRR of what a search returned (rank 0: not returned)."""
    found = np.array(ranks)
    at = [float(np.mean((found > 0) & (found <= k))) for k in (1, 3, 10)]
    mrr = float(np.mean(np.where(found > 0, 1.0 / np.maximum(found, 1), 0.0)))
    return at[0], at[1], at[2], mrr


def through_search(names: list[str], memories: list[dict], queries: list[dict],
                   threshold: float | None) -> None:
    """The set as one user's saved memories in a bench database of its own, each query
    asked of ``search_memory`` (k 10, at the cut) with hybrid recall (full-text rank fused
    with the vectors) off and on: recall@k and MRR of what it returns, the share of
    no-answer queries it answers with nothing, and how many hits the words found."""
    from sqlalchemy import insert

    from bench._setup import drop_database, fresh_database, migrated_app
    from dashboard.auth.models import User
    from dashboard.embedded import OWNER_ROLE
    from dashboard.extensions import db
    from dashboard.memory.chunking import content_hash
    from dashboard.memory.models import MemoryChunk
    from dashboard.memory.search import search_memory

    urls, admin = fresh_database(DATABASE)
    try:
        app = migrated_app({"SQLALCHEMY_DATABASE_URI": urls.database_url(DATABASE),
                            "MIGRATIONS_DATABASE_URI": urls.database_url(DATABASE, OWNER_ROLE),
                            "EMBEDDER": "hashing"})
        with app.app_context():
            session = db.session
            for name in names:
                embedder = get_embedder(name)
                cut = threshold if threshold is not None else embedder.match_distance
                user_id = session.execute(insert(User).returning(User.id), [{
                    "email": f"recall-{name}@bench.test", "display_name": name,
                    "password_hash": "x", "kind": "person"}]).scalar_one()
                vectors = embedder.embed([m["text"] for m in memories])
                session.execute(insert(MemoryChunk), [
                    {"user_id": user_id, "source_key": "xmemo.saved", "source_id": m["id"],
                     "chunk_index": 0, "content_hash": content_hash(m["text"]),
                     "content": m["text"], "embedding": vector,
                     "embedding_model": embedder.name}
                    for m, vector in zip(memories, vectors, strict=True)])
                session.flush()
                print(f"\n{embedder.name} through search_memory, k 10, cut {cut:.2f}")
                print("  hybrid  recall@1  recall@3  recall@10   MRR  no-answer: no match"
                      "  hits by words")
                for hybrid in (False, True):
                    ranks, silent, lexical = [], 0, 0
                    for query in queries:
                        hits = search_memory(session, user_id, query["text"], 10,
                                             embedder=embedder, max_distance=cut,
                                             hybrid=hybrid)
                        lexical += sum(h.match != "semantic" for h in hits)
                        if not query["answers"]:
                            silent += not hits
                            continue
                        right = set(query["answers"])
                        ranks.append(next((r for r, h in enumerate(hits, 1)
                                           if h.source_id in right), 0))
                    at1, at3, at10, mrr = returned_scores(ranks)
                    unanswered = len(queries) - len(ranks)
                    print(f"  {'on' if hybrid else 'off':>6}  {at1:8.2f}  {at3:8.2f}  "
                          f"{at10:9.2f}  {mrr:4.2f}  {silent / unanswered:19.0%}  "
                          f"{lexical:13d}")
            session.rollback()
            db.engine.dispose()
    finally:
        drop_database(admin, DATABASE)


def main() -> None:
    args = parse_args()
    data = json.loads(SET.read_text())
    memories, queries = data["memories"], data["queries"]
    answered = [q for q in queries if q["answers"]]
    by_id = {m["id"]: m for m in memories}
    apart = [q for q in answered if not any(
        content_words(q["text"]) & content_words(by_id[a]["text"]) for a in q["answers"])]
    print(f"{len(memories)} memories, {len(answered)} answered queries, "
          f"{len(queries) - len(answered)} with no right answer; "
          f"{len(apart) / len(answered):.0%} of answered queries share no content word "
          "with their answer")
    names = args.embedders or ["hashing", *(["minilm"] if minilm_available() else [])]
    for name in names:
        threshold = args.threshold if args.threshold is not None else \
            getattr(get_embedder(name), "match_distance", 1.0)
        result = evaluate(name, memories, queries, threshold)
        no_match, kept = at_threshold(result, threshold)
        print(f"\n{result['name']}: recall@1 {result['recall@1']:.2f}  recall@3 "
              f"{result['recall@3']:.2f}  recall@10 {result['recall@10']:.2f}  MRR "
              f"{result['mrr']:.2f}  ({result['texts_per_s']:.0f} texts/s)")
        print(f"  at distance {threshold:.2f}: {no_match:.0%} of no-answer queries get no "
              f"match; recall@3 within it {kept:.2f} (of {result['recall@3']:.2f})")
        print("  threshold  no-match share  recall@3 kept")
        for t, share, kept_at in result["sweep"]:
            print(f"  {t:9.2f}  {share:14.0%}  {kept_at:13.2f}")
    if args.hybrid:
        through_search(names, memories, queries, args.threshold)


if __name__ == "__main__":
    main()
