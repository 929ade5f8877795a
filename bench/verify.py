"""Truth check benchmark: users/s over a world of small users, and its query count.

    .venv/bin/python bench/verify.py              # 1,000 users
    .venv/bin/python bench/verify.py --users 200  # a smaller run

On a database of its own (dropped afterwards unless --keep): each user gets a few Blinks,
saved memories and chat pairs and one build (hashing embedder), recorded as the runner
records one. Then the check runs over everyone (a few times), and once more after a few
violations are written behind the services' back. Nothing here passes or fails."""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sqlalchemy import func, text  # noqa: E402

from bench._setup import counted, drop_database, fresh_database, migrated_app  # noqa: E402
from dashboard.extensions import db  # noqa: E402

DATABASE = "orbitpilot_bench_verify"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=1_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--violations", type=int, default=10)
    parser.add_argument("--keep", action="store_true", help="keep the database afterwards")
    parser.add_argument("--show-sql", action="store_true",
                        help="print the first statements of one check")
    return parser.parse_args()


def populate(users: int) -> list[int]:
    from dashboard.auth.models import User
    from dashboard.blinks.models import Blink
    from dashboard.memory import get_embedder
    from dashboard.memory.models import MemoryBuild
    from dashboard.memory.pipeline import run_memory_build
    from dashboard.orbitpilot.models import Conversation, Message
    from dashboard.saved_memories.models import Memory

    session, embedder = db.session, get_embedder("hashing")
    ids = []
    for n in range(users):
        user = User(email=f"verify{n}@bench.test", password_hash="x", role="user")
        session.add(user)
        session.flush()
        session.add_all([Blink(user_id=user.id, title=f"Blink {i}", content=f"note {n} {i}")
                         for i in range(3)])
        session.add_all([Memory(owner_id=user.id, content=f"memory {n} {i}", source="api")
                         for i in range(2)])
        conversation = Conversation(user_id=user.id, title="chat")
        session.add(conversation)
        session.flush()
        for i in range(4):
            asked = Message(conversation_id=conversation.id, user_id=user.id, role="user",
                            position=2 * i, content=f"question {n} {i}")
            session.add(asked)
            session.flush()
            session.add(Message(conversation_id=conversation.id, user_id=user.id,
                                role="assistant", position=2 * i + 1,
                                content=f"answer {n} {i}", reply_to_id=asked.id))
        session.flush()
        result = run_memory_build(user, "full", session=session, embedder=embedder)
        session.execute(text("UPDATE memory_builds SET status = 'succeeded', "
                             "finished_at = now() WHERE user_id = :u AND status = 'queued'"),
                        {"u": user.id})
        session.add(MemoryBuild(user_id=user.id, mode="full", trigger="schedule",
                                status="succeeded", source_counts=result.per_source,
                                finished_at=func.clock_timestamp()))
        ids.append(user.id)
        if n % 100 == 99:
            session.commit()
    session.commit()
    return ids


def main() -> None:
    from dashboard.embedded import OWNER_ROLE
    from dashboard.memory import verify_memory

    args = parse_args()
    urls, admin = fresh_database(DATABASE)
    app = migrated_app({"SQLALCHEMY_DATABASE_URI": urls.database_url(DATABASE),
                        "MIGRATIONS_DATABASE_URI": urls.database_url(DATABASE, OWNER_ROLE),
                        "BUILD_QUEUE": "builds-bench-verify", "EMBEDDER": "hashing"})
    try:
        with app.app_context():
            started = time.perf_counter()
            ids = populate(args.users)
            print(f"world: {len(ids)} users built in {time.perf_counter() - started:.1f} s")
            seconds, chunks, queries = [], 0, 0
            for _ in range(args.runs):
                with counted(db.engine) as statements:
                    began = time.perf_counter()
                    report = verify_memory(db.session, ann_threshold=10**9, repair=False)
                    seconds.append(time.perf_counter() - began)
                db.session.rollback()
                chunks, queries = report.chunks_checked, len(statements)
                if _ == 0 and args.show_sql:
                    print("\n".join(s.split("\n")[0][:120] for s in statements[:40]))
            best = statistics.median(seconds)
            print(f"clean check: {report.users_checked} users, {chunks} chunks, "
                  f"{len(report.violations)} findings; median {best:.2f} s = "
                  f"{report.users_checked / best:,.0f} users/s, {chunks / best:,.0f} chunks/s; "
                  f"{queries} queries ({queries / max(1, report.users_checked):.3f} per user)")
            picked = ids[:: max(1, len(ids) // args.violations)][: args.violations]
            db.session.execute(text("UPDATE memories SET status = 'deleted' "
                                    "WHERE owner_id = ANY(:ids)"), {"ids": picked})
            db.session.commit()
            report = verify_memory(db.session, ann_threshold=10**9, repair=False)
            db.session.rollback()
            print(f"after {len(picked)} users' memories were soft-deleted behind the "
                  f"services' back: {report.users_with_violations} users with findings, "
                  f"{len(report.violations)} findings")
            db.engine.dispose()
    finally:
        if not args.keep:
            drop_database(admin, DATABASE)


if __name__ == "__main__":
    main()
