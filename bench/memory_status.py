"""Memory Status page benchmark: one user with 10,000 chat pairs.

    .venv/bin/python bench/memory_status.py               # 10,000 pairs, 30 loads
    .venv/bin/python bench/memory_status.py --pairs 1000  # a smaller run

On a database of its own (dropped afterwards unless --keep): a user whose plan includes
chat history (the dry run's heaviest case), one real build through the runner, then a few
flagged pairs and new Blinks. The page is loaded through the test client, signed in, as
the app role; it prints ms per load (median, p95), queries per load and the dry run's
share, beside the target. Nothing here passes or fails."""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sqlalchemy import create_engine, insert, select, text, update  # noqa: E402

from bench._setup import (  # noqa: E402
    PASSWORD,
    counted,
    drop_database,
    fresh_database,
    migrated_app,
    signed_in,
)
from dashboard.extensions import db  # noqa: E402

DATABASE = "orbitpilot_bench_status"
QUEUE = "builds-bench-status"
EMAIL = "status@bench.test"
TARGET_MS = 150.0
WORDS = ("lisbon porto budget flight hotel museum dinner recipe garden meeting project "
         "deadline invoice puppy training running marathon coffee book chapter").split()


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=10_000)
    parser.add_argument("--loads", type=int, default=30, help="page loads measured")
    parser.add_argument("--keep", action="store_true", help="keep the bench database")
    parser.add_argument("--flag-one", action="store_true",
                        help="measure with one pair flagged since the build")
    parser.add_argument("--unchanged", action="store_true",
                        help="measure with nothing changed since the build (else 25 pairs "
                             "flagged and 5 Blinks written since)")
    return parser.parse_args()


def bench_app():
    """An app on a fresh database of its own, migrated as the owner role; the app itself
    connects as the app role, with a build queue of its own. Returns (app, owner URL,
    admin engine)."""
    from dashboard.embedded import OWNER_ROLE

    urls, admin = fresh_database(DATABASE)
    owner_url = urls.database_url(DATABASE, OWNER_ROLE)
    app = migrated_app({"SQLALCHEMY_DATABASE_URI": urls.database_url(DATABASE),
                        "MIGRATIONS_DATABASE_URI": owner_url,
                        "BUILD_QUEUE": QUEUE, "EMBEDDER": "hashing",
                        # The page, not the HNSW index: the user's rows stay out of it (a
                        # first build crossing ANN_MIN_CHUNKS is bench/builds.py's subject).
                        "ANN_MIN_CHUNKS": 10**9})
    return app, owner_url, admin


# -- the data --------------------------------------------------------------------------------

def make_user(app, pairs: int) -> int:
    """The user and their content, inserted in a few multi-row statements."""
    import random

    from werkzeug.security import generate_password_hash

    from dashboard.auth.models import User
    from dashboard.blinks.models import Blink
    from dashboard.orbitpilot.models import Conversation, Message, ProfileFact
    from dashboard.plans.models import Plan
    from dashboard.saved_memories.models import Memory

    rng = random.Random(4)

    def words(n: int) -> str:
        return " ".join(rng.choice(WORDS) for _ in range(n))

    started = time.perf_counter()
    with app.app_context():
        session = db.session
        plan = Plan(name="Plus", slug="plus", included_sources=4)
        session.add(plan)
        session.flush()
        user = User(email=EMAIL, display_name="bench", plan_id=plan.id,
                    password_hash=generate_password_hash(PASSWORD))
        session.add(user)
        session.flush()
        session.add_all([ProfileFact(user_id=user.id, key=f"fact{n}", value=words(6))
                         for n in range(8)])
        session.add_all([Blink(user_id=user.id, title=words(3), content=words(40))
                         for _ in range(50)])
        session.add_all([Memory(owner_id=user.id, content=words(20)) for _ in range(50)])
        # 100 conversations of pairs / 100 pairs each, as a long-time user would have.
        conversations = max(1, min(100, pairs // 100))
        conv_ids = session.execute(insert(Conversation).returning(Conversation.id), [
            {"user_id": user.id, "title": f"chat {n}", "status": "ended"}
            for n in range(conversations)
        ]).scalars().all()
        turns = [(conv_ids[i % conversations], i // conversations) for i in range(pairs)]
        question_ids = session.execute(insert(Message).returning(Message.id), [
            {"conversation_id": conv, "user_id": user.id, "role": "user",
             "position": 2 * index, "content": words(12) + f" #{n}?"}
            for n, (conv, index) in enumerate(turns)
        ]).scalars().all()
        session.execute(insert(Message), [
            {"conversation_id": conv, "user_id": user.id, "role": "assistant",
             "position": 2 * index + 1, "content": "Answer: " + words(25),
             "reply_to_id": question_ids[n]}
            for n, (conv, index) in enumerate(turns)
        ])
        user_id = user.id
        session.commit()
        session.remove()
    print(f"made the user: {pairs:,} chat pairs, 8 profile facts, 50 Blinks, 50 saved "
          f"memories in {time.perf_counter() - started:,.1f} s")
    return user_id


def first_build(app, user_id: int) -> None:
    """One real build, requested and run the way a worker runs it."""
    from dashboard.memory import MemoryBuild, execute_build, request_build, settings_from
    from dashboard.queues import build_queue

    started = time.perf_counter()
    with app.app_context():
        request = request_build(db.session, user_id, mode="full", trigger="admin")
        db.session.commit()
        build_queue().rq().empty()  # run here, not by whatever worker listens
        status = execute_build(db.engine, request.build_id, settings=settings_from(app.config))
        build = db.session.get(MemoryBuild, request.build_id)
        print(f"first build: {status} in {time.perf_counter() - started:,.1f} s, "
              f"added {build.added:,} chunks")
        db.session.remove()


def change_a_little(app, owner_url: str, user_id: int, *, nothing: bool = False,
                    one: bool = False) -> None:
    """What the dry run should find: 25 pairs flagged, 5 Blinks written since (or, with
    ``nothing``, no change at all)."""
    from dashboard.blinks.models import Blink
    from dashboard.orbitpilot.models import Message
    from dashboard.queues import build_queue

    if nothing:
        return _analyze(owner_url)
    with app.app_context():
        ids = db.session.scalars(select(Message.id).where(
            Message.user_id == user_id, Message.role == "user").order_by(Message.id)
            .limit(1 if one else 25)).all()
        db.session.execute(update(Message).where(Message.id.in_(ids))
                           .values(not_remembered=True))
        if not one:
            db.session.add_all([Blink(user_id=user_id, title="new",
                                      content=f"a new Blink {n}") for n in range(5)])
        db.session.commit()  # the Blinks' ORM flush requests a build: it stays queued
        build_queue().rq().empty()
        db.session.remove()
    return _analyze(owner_url)


def _analyze(owner_url: str) -> None:
    # Statistics, as a live database has them (the app role owns no table to ANALYZE).
    owner = create_engine(owner_url, isolation_level="AUTOCOMMIT")
    with owner.connect() as conn:
        conn.execute(text("VACUUM ANALYZE"))
    owner.dispose()


# -- measuring -------------------------------------------------------------------------------

def timings(repeat: int, call: Callable[[], Any]) -> list[float]:
    call()  # warm: templates, the connection, the plan cache of the database
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        call()
        times.append((time.perf_counter() - started) * 1000)
    return times


def p95(times: list[float]) -> float:
    return statistics.quantiles(times, n=20, method="inclusive")[18] if len(times) > 1 \
        else times[0]


def bench_page(app, user_id: int, loads: int) -> tuple[float, float]:
    from dashboard.auth.models import User
    from dashboard.memory.embedders import embedder_model_name
    from dashboard.memory.pipeline import preview_memory_build

    client = signed_in(app, EMAIL)

    def load() -> None:
        response = client.get("/memory/status")
        assert response.status_code == 200, response.status_code

    with app.app_context():
        engine = db.engine
    load()
    with counted(engine) as statements:
        response = client.get("/memory/status")
    html = response.get_data(as_text=True)
    total = re.search(r'<tr id="next-build-total" data-add="(\d+)" data-remove="(\d+)"', html)
    chunks = re.search(r'id="total-chunks">(\d+)<', html)
    print(f"\n== the Memory Status page ({loads} loads, signed in) ==")
    adds, removes = total.groups() if total else ("0", "0")  # "Nothing" has no table
    print(f"page shows: {int(chunks.group(1)):,} chunks stored; next build adds "
          f"{adds}, removes {removes}")

    page = timings(loads, load)
    print(f"page load:  median {statistics.median(page):,.1f} ms   p95 {p95(page):,.1f} ms   "
          f"min {min(page):,.1f} ms   queries per load {len(statements)}")

    with app.app_context():
        user = db.session.get(User, user_id)
        name = embedder_model_name(app.config["EMBEDDER"])
        dry = timings(loads, lambda: preview_memory_build(user, session=db.session,
                                                          embedder_name=name))
        with counted(engine) as preview_statements:
            preview_memory_build(user, session=db.session, embedder_name=name)
        db.session.rollback()
        db.session.remove()
    print(f"preview_memory_build alone: median {statistics.median(dry):,.1f} ms   "
          f"p95 {p95(dry):,.1f} ms   queries {len(preview_statements)}   "
          f"({statistics.median(dry) / statistics.median(page):.0%} of the page's median)")
    print(f"the rest of the page (median page − median dry run): "
          f"{statistics.median(page) - statistics.median(dry):,.1f} ms")
    return statistics.median(page), p95(page)


def main() -> int:
    args = parse_args()
    started = time.perf_counter()
    app, owner_url, admin = bench_app()
    try:
        user_id = make_user(app, args.pairs)
        first_build(app, user_id)
        change_a_little(app, owner_url, user_id, nothing=args.unchanged, one=args.flag_one)
        median, high = bench_page(app, user_id, args.loads)
        met = high < TARGET_MS
        print(f"\ntarget: a page load under {TARGET_MS:.0f} ms with {args.pairs:,} pairs — "
              + ("met" if met else "NOT met") + f" (median {median:,.1f} ms, p95 {high:,.1f} ms)")
        print(f"bench ran {time.perf_counter() - started:,.1f} s")
    finally:
        with app.app_context():
            from dashboard.queues import build_queue

            queue = build_queue().rq()
            queue.empty()
            queue.delete(delete_jobs=True)
            db.engine.dispose()
        if not args.keep:
            drop_database(admin, DATABASE)
        admin.dispose()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
