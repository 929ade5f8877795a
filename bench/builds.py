"""Memory build and retrieval benchmark: every figure beside its target, from one run.

    .venv/bin/python bench/builds.py                 # the full sizes
    .venv/bin/python bench/builds.py --quick         # small sizes, a smoke run

On a database of its own (``orbitpilot_bench``, or BENCH_DATABASE_URL), migrated and
dropped afterwards unless --keep: (1) builds of one user with N chat pairs — full, no-op,
one message, the dry run; (2) MiniLM against the hashing embedder in a forked work horse;
(3) retrieval over 1,000,000 chunks and for a 200,000-chunk user on the HNSW path (vectors
with the structure of sentence embeddings; recall against numpy's exact answer); (4) a
quick update crossing ANN_MIN_CHUNKS each way. Nothing here passes or fails."""

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

WORDS = ("lisbon porto budget flight hotel museum dinner recipe garden meeting project "
         "deadline invoice puppy training running marathon coffee book chapter").split()
INDEX = "ix_memory_chunks_embedding_ann"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=10_000)
    parser.add_argument("--chunks", type=int, default=1_000_000)
    parser.add_argument("--users", type=int, default=1_000)
    parser.add_argument("--big-user-chunks", type=int, default=200_000)
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--previews", type=int, default=30)
    parser.add_argument("--minilm-texts", type=int, default=500)
    parser.add_argument("--minilm-pairs", type=int, default=300)
    parser.add_argument("--cross-pairs", type=int, default=3_000,
                        help="chunks of the user whose updates cross the threshold")
    parser.add_argument("--skip-retrieval", action="store_true")
    parser.add_argument("--skip-minilm", action="store_true")
    parser.add_argument("--skip-crossing", action="store_true")
    parser.add_argument("--quick", action="store_true", help="small sizes for a smoke run")
    parser.add_argument("--keep", action="store_true", help="keep the bench database")
    args = parser.parse_args()
    if args.quick:
        (args.pairs, args.chunks, args.users, args.big_user_chunks, args.queries,
         args.previews, args.minilm_texts, args.minilm_pairs, args.cross_pairs) = (
            1_000, 50_000, 100, 20_000, 50, 10, 100, 50, 500)
    return args


def bench_app(name: str):
    """An app on a database of its own. On the embedded server the superuser makes it
    (owned by the owner role, with pgvector) and the bench connects as the owner: it
    measures the engine, not privileges (the tests run every build as the app role).
    BENCH_DATABASE_URL: an existing database."""
    from dashboard.embedded import OWNER_ROLE

    url = os.environ.get("BENCH_DATABASE_URL")
    admin = None
    if not url:
        urls, admin = fresh_database(name)
        url = urls.database_url(name, OWNER_ROLE)
    return migrated_app({"SQLALCHEMY_DATABASE_URI": url, "MIGRATIONS_DATABASE_URI": url}), admin


def verdict(ok: bool) -> str:
    return "ok" if ok else "MISSED"


def p95(values: list[float]) -> float:
    return statistics.quantiles(values, n=20, method="inclusive")[18] if len(values) > 1 \
        else values[0]


def load_note() -> str:
    one, five, _ = os.getloadavg()
    return f"(load average {one:.1f}/{five:.1f} on {os.cpu_count()} CPUs)"


def chat_texts(rng: np.random.Generator, count: int) -> list[tuple[str, str]]:
    return [(" ".join(rng.choice(WORDS, 12)) + f" #{i}?",
             "Answer: " + " ".join(rng.choice(WORDS, 25))) for i in range(count)]


def make_chat_user(session: Session, pairs: int, *, email: str, conversations: int = 100):
    """A user on a plan that includes chat history, with ``pairs`` answered pairs spread
    over up to ``conversations`` conversations. Returns (user, question ids)."""
    from dashboard.auth.models import User
    from dashboard.orbitpilot.models import Conversation, Message
    from dashboard.plans.models import Plan

    plan = Plan(name=f"bench-{email}", slug=f"bench-{email}", included_sources=4)
    session.add(plan)
    session.flush()
    user = User(email=email, display_name="bench", password_hash="x", plan_id=plan.id)
    session.add(user)
    session.flush()
    count = max(1, min(conversations, pairs // 100 or 1))
    conv_ids = session.execute(insert(Conversation).returning(Conversation.id), [
        {"user_id": user.id, "title": f"bench {n}"} for n in range(count)
    ]).scalars().all()
    turns = [(conv_ids[i % count], i // count) for i in range(pairs)]
    texts = chat_texts(np.random.default_rng(1), pairs)
    ids = session.execute(insert(Message).returning(Message.id), [
        {"conversation_id": conv, "user_id": user.id, "role": "user",
         "position": 2 * index, "content": texts[n][0]}
        for n, (conv, index) in enumerate(turns)
    ]).scalars().all()
    session.execute(insert(Message), [
        {"conversation_id": conv, "user_id": user.id, "role": "assistant",
         "position": 2 * index + 1, "content": texts[n][1], "reply_to_id": ids[n]}
        for n, (conv, index) in enumerate(turns)
    ])
    session.commit()
    return user, ids


def timed_build(session: Session, user, mode: str, embedder, **kwargs):
    from dashboard.memory.pipeline import run_memory_build

    started = time.perf_counter()
    result = run_memory_build(user, mode, session=session, embedder=embedder, **kwargs)
    session.commit()
    return time.perf_counter() - started, result


# -- 1. builds ---------------------------------------------------------------------------------

def bench_builds(app, pairs: int, previews: int) -> None:
    from dashboard.memory.embedders import get_embedder
    from dashboard.memory.pipeline import preview_memory_build
    from dashboard.orbitpilot.models import Message

    print(f"\n== builds: one user with {pairs:,} chat pairs (hashing embedder) "
          f"{load_note()} ==")
    embedder = get_embedder("hashing")
    with app.app_context():
        session = db.session
        user, question_ids = make_chat_user(session, pairs, email="builds@bench.test")
        full_s, full = timed_build(session, user, "full", embedder)
        write_rate = full.added / (full.timings["write_ms"] / 1000)
        whole_rate = full.added / full_s
        print(f"full build:            {ms(full_s)}  chunks={full.added:,}  "
              f"embedded={full.embedded:,}  phases {full.timings}")
        print(f"  write phase:         {write_rate:,.0f} chunks/s (target >= 40,000) "
              f"{verdict(write_rate >= 40_000)}")
        print(f"  whole build:         {whole_rate:,.0f} chunks/s (target >= 8,000) "
              f"{verdict(whole_rate >= 8_000)}")
        noop_s, noop = timed_build(session, user, "quick", embedder)
        print(f"no-op quick update:    {ms(noop_s)}  embedded={noop.embedded}  "
              f"added={noop.added} removed={noop.removed} kept={noop.kept:,}  "
              f"ratio to full = 1/{full_s / noop_s:,.1f} (target: 1/20 or less) "
              f"{verdict(noop_s * 20 <= full_s)}")
        session.execute(update(Message).where(Message.id == question_ids[pairs // 2])
                        .values(content="an edited question about the Lisbon budget"))
        session.commit()
        one_s, one = timed_build(session, user, "quick", embedder)
        print(f"one-message update:    {ms(one_s)}  embedded={one.embedded} "
              f"(target: that pair's chunks, 1) {verdict(one.embedded == 1)}  "
              f"added={one.added} removed={one.removed}")

        def preview_times() -> list[float]:
            preview_memory_build(user, session=session, embedder_name=embedder.name)
            session.rollback()
            times = []
            for _ in range(previews):
                started = time.perf_counter()
                preview_memory_build(user, session=session, embedder_name=embedder.name)
                times.append((time.perf_counter() - started) * 1000)
                session.rollback()
            return times

        after_build = preview_times()
        session.execute(update(Message).where(Message.id == question_ids[7])
                        .values(not_remembered=True))
        session.commit()
        after_change = preview_times()
        worst = max(p95(after_build), p95(after_change))
        print(f"Memory Status preview: median {statistics.median(after_build):,.1f} ms, "
              f"p95 {p95(after_build):,.1f} ms right after the build; median "
              f"{statistics.median(after_change):,.1f} ms, p95 {p95(after_change):,.1f} ms "
              f"after one flagged pair (target <= 50 ms) {verdict(worst <= 50)}")
        db.session.remove()


# -- 2. MiniLM ---------------------------------------------------------------------------------

def forked_texts_per_second(embedder, texts: list[str]) -> float:
    """Embed ``texts`` in a forked child, as a worker's work horse does with the model its
    parent loaded; the child reports its rate through a pipe."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: one line, then out without Python's clean-up
        try:
            started = time.perf_counter()
            embedder.embed(texts)
            os.write(write, f"{len(texts) / (time.perf_counter() - started)}".encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        reported = pipe.read()
    os.waitpid(pid, 0)
    return float(reported)


def bench_minilm(app, texts_count: int, pairs: int) -> None:
    from dashboard.memory.embedders import (
        HashingEmbedder,
        get_embedder,
        minilm_available,
        preload_embedder,
    )

    started = time.perf_counter()
    if not minilm_available():  # imports torch and sentence-transformers
        print("\n== MiniLM: skipped (install the ml extra) ==")
        return
    print(f"\n== MiniLM vs hashing: {texts_count:,} chat texts {load_note()} ==")
    embedder = preload_embedder("minilm")  # as the worker does: load, run nothing
    print(f"import and load (once per worker process, before it forks): "
          f"{ms(time.perf_counter() - started)}")
    texts = [f"User: {q}\nOrbitPilot: {a}"
             for q, a in chat_texts(np.random.default_rng(2), texts_count)]
    forked = forked_texts_per_second(embedder, texts)
    started = time.perf_counter()
    HashingEmbedder().embed(texts)
    hashing = len(texts) / (time.perf_counter() - started)
    embedder.embed(texts[:64])  # warm, in this process
    started = time.perf_counter()
    embedder.embed(texts)
    here = len(texts) / (time.perf_counter() - started)
    print(f"MiniLM:                {forked:,.0f} texts/s in a forked work horse, {here:,.0f} "
          f"texts/s in-process ({embedder.threads} threads, batches of "
          f"{embedder.batch_size})")
    print(f"hashing:               {hashing:,.0f} texts/s on the same texts")

    print(f"-- MiniLM: full build of {pairs:,} pairs, then an unchanged full rebuild --")
    embedder = get_embedder("minilm")
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


# -- 3. retrieval ------------------------------------------------------------------------------

def unit_rows(matrix: np.ndarray) -> np.ndarray:
    return (matrix / np.linalg.norm(matrix, axis=1, keepdims=True)).astype(np.float32)


class Structured:
    """Vectors with the low intrinsic dimension of sentence embeddings: a Gaussian in a
    random 32-dimensional subspace, plus isotropic noise (15% of the signal) in all 384."""

    def __init__(self, seed: int, dimensions: int = 32, noise: float = 0.15) -> None:
        rng = np.random.default_rng(seed)
        self.basis, _ = np.linalg.qr(rng.standard_normal((384, dimensions)))
        self.noise = noise * np.sqrt(dimensions / 384)

    def draw(self, rng: np.random.Generator, count: int) -> np.ndarray:
        signal = rng.standard_normal((count, self.basis.shape[1])) @ self.basis.T
        return unit_rows(signal + self.noise * rng.standard_normal((count, 384)))


def copy_vectors(conn, rows) -> None:
    """Binary COPY of (user_id, index, vector, ann) rows into memory_chunks."""
    with conn.cursor() as cur, cur.copy(
            "COPY memory_chunks (user_id, source_key, source_id, chunk_index, content_hash, "
            "content, embedding, embedding_model, ann) FROM STDIN WITH (FORMAT BINARY)") as cp:
        cp.set_types(["int4", "varchar", "varchar", "int4", "varchar", "text", "vector",
                      "varchar", "bool"])
        for user_id, i, vector, ann in rows:
            cp.write_row((user_id, "xmemo.saved", str(i), 0, f"{i:064d}", "x", vector,
                          "random", ann))


def make_users(app, count: int, prefix: str) -> list[int]:
    from dashboard.auth.models import User

    with app.app_context():
        ids = db.session.execute(insert(User).returning(User.id), [
            {"email": f"{prefix}{i}@bench.test", "display_name": "r", "password_hash": "x"}
            for i in range(count)
        ]).scalars().all()
        db.session.commit()
        db.session.remove()
    return list(ids)


def raw_connection(app):
    from pgvector.psycopg import register_vector

    with app.app_context():
        raw = db.engine.raw_connection()
    register_vector(raw.driver_connection)
    return raw


def load_random_chunks(app, total: int, users: int) -> tuple[list[int], int]:
    """``total`` random unit vectors spread evenly over ``users`` new users, by binary
    COPY (none flagged: each user is far below ANN_MIN_CHUNKS)."""
    ids = make_users(app, users, "r")
    per_user = total // users
    rng = np.random.default_rng(42)
    started = time.perf_counter()
    raw = raw_connection(app)
    try:
        conn = raw.driver_connection
        for user_id in ids:
            vectors = unit_rows(rng.standard_normal((per_user, 384)))
            copy_vectors(conn, ((user_id, i, vectors[i], False) for i in range(per_user)))
        conn.commit()
    finally:
        raw.close()
    print(f"loaded {per_user * users:,} chunks for {users:,} users by COPY in "
          f"{time.perf_counter() - started:,.1f} s")
    return ids, per_user


def load_big_user(app, chunks: int) -> tuple[int, np.ndarray, list[int], Structured]:
    """One user with ``chunks`` structured vectors, all ``ann``: the partial index is
    dropped, the rows copied, and the index built again over them (as migration 0006
    does for users already that large)."""
    (user_id,) = make_users(app, 1, "big")
    shape = Structured(seed=3)
    vectors = shape.draw(np.random.default_rng(4), chunks)
    raw = raw_connection(app)
    try:
        conn = raw.driver_connection
        started = time.perf_counter()
        conn.execute(f"DROP INDEX {INDEX}")
        copy_vectors(conn, ((user_id, i, vectors[i], True) for i in range(chunks)))
        conn.commit()
        copied = time.perf_counter() - started
        conn.autocommit = True
        conn.execute("SET maintenance_work_mem = '1GB'")
        started = time.perf_counter()
        conn.execute(f"CREATE INDEX {INDEX} ON memory_chunks USING hnsw "
                     "(embedding vector_cosine_ops) WITH (m = 16, ef_construction = 64) "
                     "WHERE ann")
        built = time.perf_counter() - started
        conn.execute("VACUUM ANALYZE memory_chunks")
        ids = [row[0] for row in conn.execute(
            "SELECT id FROM memory_chunks WHERE user_id = %s ORDER BY source_id::int",
            (user_id,))]
        size = conn.execute(f"SELECT pg_size_pretty(pg_relation_size('{INDEX}'))").fetchone()
        conn.execute("RESET maintenance_work_mem")
        conn.autocommit = False  # back to the pool as it came
    finally:
        raw.close()
    print(f"big user: {chunks:,} ann chunks copied in {copied:,.1f} s; partial HNSW index "
          f"built after the load in {built:,.1f} s ({chunks / built:,.0f} rows/s, {size[0]})")
    return user_id, vectors, ids, shape


class Fixed:
    """An embedder that returns the vector set before each query."""

    name, dimensions = "random", 384

    def __init__(self) -> None:
        self.vector = None

    def embed(self, texts):
        return self.vector[None, :]


def measure(session, user_id: int, queries: list[np.ndarray], truth_of) -> tuple:
    from dashboard.memory.search import search_memory

    embedder = Fixed()
    latencies, rows, recalls = [], [], []
    for vector in queries:
        truth = truth_of(vector)
        session.rollback()
        embedder.vector = vector
        started = time.perf_counter()
        hits = search_memory(session, user_id, "q", 10, embedder=embedder)
        latencies.append(time.perf_counter() - started)
        session.rollback()
        rows.append(len(hits))
        recalls.append(len({h.chunk_id for h in hits} & truth) / 10)
    return latencies, rows, recalls


def report(label: str, latencies, rows, recalls, *, p95_target_ms: float,
           recall_target: float) -> None:
    p95_ms = p95(latencies) * 1000
    recall = statistics.mean(recalls)
    print(f"{label}p50 {ms(statistics.median(latencies))}  p95 {p95_ms:,.1f} ms (target "
          f"<= {p95_target_ms:g} ms) {verdict(p95_ms <= p95_target_ms)}  rows min "
          f"{min(rows)} of 10 {verdict(min(rows) == 10)}  recall@10 {recall:.3f} (min "
          f"{min(recalls):.1f}; target {'=' if recall_target == 1 else '>='} "
          f"{recall_target:g}) {verdict(recall >= recall_target)}")


def bench_retrieval(app, total: int, users: int, big_chunks: int, queries: int) -> None:
    from dashboard.memory.models import MemoryChunk
    from dashboard.memory.search import HNSW_EF_SEARCH

    print(f"\n== retrieval: k=10 over {total:,} chunks across {users:,} users, then a user "
          f"with {big_chunks:,} among them {load_note()} ==")
    user_ids, per_user = load_random_chunks(app, total, users)
    big_id, big_vectors, big_ids, shape = load_big_user(app, big_chunks)
    rng = np.random.default_rng(7)
    with app.app_context():
        session = db.session
        picks = [int(rng.choice(user_ids)) for _ in range(queries)]
        vectors = unit_rows(rng.standard_normal((queries, 384)))
        stored: dict[int, tuple[list[int], np.ndarray]] = {}

        def small_truth(user_id):
            def truth(vector):
                if user_id not in stored:
                    rows = session.execute(select(MemoryChunk.id, MemoryChunk.embedding)
                                           .where(MemoryChunk.user_id == user_id)).all()
                    stored[user_id] = ([r[0] for r in rows],
                                       np.array([r[1] for r in rows], dtype=np.float32))
                ids, matrix = stored[user_id]
                return {ids[i] for i in np.argsort(-(matrix @ vector))[:10]}
            return truth

        latencies, rows, recalls = [], [], []
        for user_id, vector in zip(picks, vectors, strict=True):
            one = measure(session, user_id, [vector], small_truth(user_id))
            for into, values in zip((latencies, rows, recalls), one, strict=True):
                into.extend(values)
        report(f"users of {per_user:,} chunks (exact path): ", latencies, rows, recalls,
               p95_target_ms=10, recall_target=1.0)

        big_queries = shape.draw(np.random.default_rng(8), queries)
        big_ids_array = np.array(big_ids)

        def big_truth(vector):
            return set(big_ids_array[np.argsort(-(big_vectors @ vector))[:10]].tolist())

        report(f"user of {big_chunks:,} chunks (HNSW, ef_search {HNSW_EF_SEARCH}): ",
               *measure(session, big_id, list(big_queries), big_truth),
               p95_target_ms=50, recall_target=0.95)
        print(f"  its plan: {hnsw_plan_line(session, big_id, big_queries[0])}")
        print("  ef_search against recall@10 (the same statement and settings, 50 queries):")
        for ef in (40, 100, 200, 400):
            latencies, recalls = ef_sweep(session, big_id, big_queries[:50], big_truth, ef)
            print(f"    ef_search {ef:>3}: recall@10 {statistics.mean(recalls):.3f} (min "
                  f"{min(recalls):.1f})  p50 {ms(statistics.median(latencies))}  p95 "
                  f"{ms(p95(latencies))}")
        unstructured = unit_rows(np.random.default_rng(9).standard_normal((50, 384)))
        latencies, recalls = ef_sweep(session, big_id, unstructured, big_truth,
                                      HNSW_EF_SEARCH)
        print(f"  random queries off the data's subspace: recall@10 "
              f"{statistics.mean(recalls):.3f}  p95 {ms(p95(latencies))}")
        db.session.remove()

    threshold = app.config["ANN_MIN_CHUNKS"] if big_chunks >= 100_000 else big_chunks // 4
    edge_id = load_exact_user(app, threshold - 1)
    with app.app_context():
        session = db.session
        latencies = []
        embedder = Fixed()
        for vector in vectors[:30]:
            embedder.vector = vector
            started = time.perf_counter()
            from dashboard.memory.search import search_memory
            search_memory(session, edge_id, "q", 10, embedder=embedder)
            latencies.append(time.perf_counter() - started)
            session.rollback()
        print(f"a user of {threshold - 1:,} chunks, just below ANN_MIN_CHUNKS (exact path): "
              f"p50 {ms(statistics.median(latencies))}  p95 {ms(p95(latencies))}")
        db.session.remove()


def load_exact_user(app, chunks: int) -> int:
    (user_id,) = make_users(app, 1, "edge")
    vectors = unit_rows(np.random.default_rng(11).standard_normal((chunks, 384)))
    raw = raw_connection(app)
    try:
        conn = raw.driver_connection
        copy_vectors(conn, ((user_id, i, vectors[i], False) for i in range(chunks)))
        conn.commit()
        conn.autocommit = True
        conn.execute("VACUUM ANALYZE memory_chunks")
        conn.autocommit = False
    finally:
        raw.close()
    return user_id


def ef_sweep(session, user_id: int, queries, truth_of, ef: int):
    """The approximate path's statement at another ef_search, timed alone."""
    from dashboard.memory.models import MemoryChunk

    latencies, recalls = [], []
    for vector in queries:
        session.execute(text(
            "SELECT set_config('hnsw.iterative_scan', 'strict_order', true), "
            "set_config('hnsw.ef_search', :ef, true), set_config('enable_sort', 'off', true), "
            "set_config('enable_bitmapscan', 'off', true)"), {"ef": str(ef)})
        distance = MemoryChunk.embedding.cosine_distance(vector)
        started = time.perf_counter()
        ids = session.scalars(select(MemoryChunk.id)
                              .where(MemoryChunk.user_id == user_id, MemoryChunk.ann)
                              .order_by(distance).limit(10)).all()
        latencies.append(time.perf_counter() - started)
        session.rollback()
        recalls.append(len(set(ids) & truth_of(vector)) / 10)
    return latencies, recalls


def hnsw_plan_line(session, user_id: int, vector: np.ndarray) -> str:
    """The scan node of the statement the approximate path runs, under its settings."""
    from sqlalchemy import event

    from dashboard.memory import search

    ran: list[tuple[str, object]] = []

    def record(conn, cursor, statement, parameters, context, executemany):
        ran.append((statement, parameters))

    embedder = Fixed()
    embedder.vector = vector
    event.listen(db.engine, "before_cursor_execute", record)
    try:
        search.search_memory(session, user_id, "q", 10, embedder=embedder)
    finally:
        event.remove(db.engine, "before_cursor_execute", record)
    settings = next((s, p) for s, p in ran if "set_config" in s)
    query = next((s, p) for s, p in ran if "<=>" in s)
    cursor = session.connection().connection.driver_connection.cursor()
    cursor.execute(*settings)
    lines = [row[0] for row in cursor.execute("EXPLAIN " + query[0], query[1])]
    session.rollback()
    return next(line.strip() for line in lines if "Scan" in line)


# -- 4. crossing the threshold -----------------------------------------------------------------

def bench_crossing(app, pairs: int) -> None:
    from dashboard.memory.embedders import get_embedder
    from dashboard.orbitpilot.models import Message

    print(f"\n== crossing ANN_MIN_CHUNKS: a user of {pairs:,} chunks, the threshold set to "
          f"{pairs + 1:,} {load_note()} ==")
    embedder = get_embedder("hashing")
    with app.app_context():
        session = db.session
        user, question_ids = make_chat_user(session, pairs + 1, email="cross@bench.test")
        session.execute(update(Message).where(Message.id == question_ids[-1])
                        .values(not_remembered=True))
        session.commit()
        below_s, below = timed_build(session, user, "full", embedder, ann_threshold=pairs + 1)
        session.execute(update(Message).where(Message.id == question_ids[-1])
                        .values(not_remembered=False))
        session.commit()
        up_s, up = timed_build(session, user, "quick", embedder, ann_threshold=pairs + 1)
        print(f"below (full build):    {ms(below_s)}  chunks={below.added:,}  ann={below.ann}")
        print(f"crossing up (quick):   {ms(up_s)}  added={up.added} flipped={up.flipped:,} "
              f"into the HNSW index: {up.flipped / (up.timings['write_ms'] / 1000):,.0f} "
              f"rows/s  ann={up.ann}")
        session.execute(update(Message).where(Message.id == question_ids[0])
                        .values(not_remembered=True))
        session.commit()
        down_s, down = timed_build(session, user, "quick", embedder, ann_threshold=pairs + 1)
        print(f"crossing down (quick): {ms(down_s)}  removed={down.removed} "
              f"flipped={down.flipped:,} out  ann={down.ann}")
        db.session.remove()


def main() -> int:
    args = parse_args()
    app, admin = bench_app("orbitpilot_bench")
    try:
        bench_builds(app, args.pairs, args.previews)
        if not args.skip_minilm:
            bench_minilm(app, args.minilm_texts, args.minilm_pairs)
        if not args.skip_retrieval:
            bench_retrieval(app, args.chunks, args.users, args.big_user_chunks, args.queries)
        if not args.skip_crossing:
            bench_crossing(app, args.cross_pairs)
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
