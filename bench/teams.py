"""A member's search across their teams beside a personal-only search.

    .venv/bin/python bench/teams.py            # 10,000 personal chunks, 1,000 team memories
    .venv/bin/python bench/teams.py --quick    # a smoke run

On a database of its own (dropped afterwards): a person with 10,000 chunks of their own, a
team of theirs with 1,000 memories (and two more teams of 100), plus a crowd of other
users' chunks; random structured vectors loaded by COPY. It times ``search_memory`` over
the person alone and over the person and their teams (p50, p95 and their ratio: the goal
is within 1.5x), counts the statements each sends, and checks both answers against an
exact ranking computed here. The load average is printed beside the figures."""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
from sqlalchemy import insert  # noqa: E402

from bench._setup import counted, drop_database, fresh_database, migrated_app  # noqa: E402
from bench.builds import Fixed, Structured, copy_vectors, raw_connection  # noqa: E402
from dashboard.extensions import db  # noqa: E402

DATABASE = "orbitpilot_bench_teams"
GOAL = 1.5


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--personal", type=int, default=10_000)
    parser.add_argument("--team", type=int, default=1_000)
    parser.add_argument("--crowd", type=int, default=100_000, help="other users' chunks")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.personal, args.team, args.crowd, args.queries = 1_000, 100, 5_000, 30
    return args


def owners(app, count: int, kind: str, prefix: str) -> list[int]:
    from dashboard.auth.models import User

    with app.app_context():
        ids = db.session.execute(insert(User).returning(User.id), [
            {"email": f"{prefix}{i}@bench.test", "display_name": prefix, "password_hash": "x",
             "kind": kind} for i in range(count)]).scalars().all()
        db.session.commit()
        db.session.remove()
    return list(ids)


def load(app, plan: dict[int, int], shape: Structured, rng) -> dict[int, np.ndarray]:
    """COPY ``plan`` (owner → chunks) of structured vectors; the vectors by owner."""
    vectors = {}
    raw = raw_connection(app)
    try:
        conn = raw.driver_connection
        for owner, count in plan.items():
            vectors[owner] = shape.draw(rng, count)
            copy_vectors(conn, ((owner, i, vectors[owner][i], False) for i in range(count)))
        conn.commit()
        conn.autocommit = True
        conn.execute("VACUUM ANALYZE memory_chunks")
        conn.autocommit = False  # back to the pool as it came
    finally:
        raw.close()
    return vectors


def timed(session, owner_ids, vectors: list[np.ndarray]) -> tuple[list[float], list]:
    from dashboard.memory.search import search_memory

    embedder = Fixed()
    latencies, answers = [], []
    for vector in vectors:
        session.rollback()
        embedder.vector = vector
        started = time.perf_counter()
        hits = search_memory(session, owner_ids, "q", 10, embedder=embedder)
        latencies.append(time.perf_counter() - started)
        answers.append(hits)
    session.rollback()
    return latencies, answers


def p95(values: list[float]) -> float:
    return sorted(values)[max(0, int(len(values) * 0.95) - 1)]


def main() -> None:
    args = parse_args()
    urls, admin = fresh_database(DATABASE)
    try:
        from dashboard.embedded import OWNER_ROLE

        app = migrated_app({"SQLALCHEMY_DATABASE_URI": urls.database_url(DATABASE),
                            "MIGRATIONS_DATABASE_URI": urls.database_url(DATABASE,
                                                                         OWNER_ROLE),
                            "EMBEDDER": "hashing", "ANN_MIN_CHUNKS": 10**9})
        rng = np.random.default_rng(7)
        shape = Structured(seed=11)
        (person,) = owners(app, 1, "person", "member")
        team, small_a, small_b = owners(app, 3, "team", "team")
        crowd = owners(app, 50, "person", "crowd")
        plan = {person: args.personal, team: args.team, small_a: 100, small_b: 100,
                **{c: args.crowd // len(crowd) for c in crowd}}
        started = time.perf_counter()
        vectors = load(app, plan, shape, rng)
        print(f"loaded {sum(plan.values()):,} chunks in {time.perf_counter() - started:.1f} s")
        queries = list(shape.draw(np.random.default_rng(8), args.queries))
        mine = [person, team, small_a, small_b]
        with app.app_context():
            session = db.session
            timed(session, [person], queries[:5])  # warm the caches
            timed(session, mine, queries[:5])
            with counted(db.engine) as personal_statements:
                personal, _ = timed(session, [person], queries[:1])
            with counted(db.engine) as team_statements:
                timed(session, mine, queries[:1])
            personal, personal_hits = timed(session, [person], queries)
            combined, combined_hits = timed(session, mine, queries)
            db.session.remove()
        # The exact answer, computed here: cosine distance over every owner's vectors.
        everything = np.concatenate([vectors[o] for o in mine])
        right = 0
        for query, hits in zip(queries, combined_hits, strict=True):
            best = np.sort(1 - everything @ query)[:10]
            right += np.allclose(sorted(h.distance for h in hits), best, atol=1e-5)
        load_average = os.getloadavg()
        print(f"load average {load_average[0]:.2f} {load_average[1]:.2f} "
              f"{load_average[2]:.2f} (2 cores)")
        print(f"personal only ({args.personal:,} chunks):       p50 "
              f"{statistics.median(personal) * 1000:6.2f} ms  p95 {p95(personal) * 1000:6.2f} ms"
              f"  statements {len([s for s in personal_statements if 'ROLLBACK' not in s])}")
        print(f"person + 3 teams ({args.team:,} + 200 more):  p50 "
              f"{statistics.median(combined) * 1000:6.2f} ms  p95 {p95(combined) * 1000:6.2f} ms"
              f"  statements {len([s for s in team_statements if 'ROLLBACK' not in s])}")
        ratio = p95(combined) / p95(personal)
        print(f"p95 ratio {ratio:.2f} (goal <= {GOAL}) {'ok' if ratio <= GOAL else 'MISSED'}")
        print(f"combined answers equal to the exact top 10: {right} of {len(queries)}")
    finally:
        drop_database(admin, DATABASE)


if __name__ == "__main__":
    main()
