"""Scale benchmark: a plan change for many users, small users' builds, Memory Status for
a large user, and a large user crossing ANN_MIN_CHUNKS; one run, counts and ratios.

    .venv/bin/python bench/scale.py              # 10,000 and 100,000 users, the full run
    .venv/bin/python bench/scale.py --quick      # small sizes, a smoke run

On a database of its own (dropped after unless --keep), users written in bulk by SQL as
builds would have left them. (1) An eviction (the cap lowered): the fan-out's bulk apply,
confirm to every user agreeing; (2) an inclusion for 10,000 small users: the apply, then
real burst workers building; (3) tiny builds/s on 1 and 2 workers; (4) Memory Status at
1k/10k/100k pairs (``bench/memory_status.py``); (5) the crossing (``bench/_crossing.py``).
Nothing passes or fails."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sqlalchemy import any_, func, literal, select, text  # noqa: E402

from bench._setup import drop_database, fresh_database, migrated_app  # noqa: E402
from dashboard.extensions import db  # noqa: E402
from dashboard.memory.models import EMBEDDING_DIMENSIONS  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DATABASE = "orbitpilot_bench_scale"
QUEUE = "builds-bench-scale"
PROFILE, BLINKS, CHAT = "orbitpilot.profile", "blink.blinks", "orbitpilot.chat_history"
NO_PERIODIC = {name: "0" for name in ("BUILD_SWEEP_SECONDS", "BUILD_SCHEDULE_SECONDS",
                                      "AUDIT_CHECKPOINT_SECONDS", "ERASURE_VACUUM_SECONDS",
                                      "RETENTION_SECONDS", "MEMORY_VERIFY_SECONDS")}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, a smoke run")
    parser.add_argument("--keep", action="store_true", help="keep the bench database")
    parser.add_argument("--skip-status", action="store_true")
    parser.add_argument("--skip-crossing", action="store_true")
    return parser.parse_args()


def bench_app():
    from dashboard.embedded import OWNER_ROLE

    urls, admin = fresh_database(DATABASE)
    app = migrated_app({"SQLALCHEMY_DATABASE_URI": urls.database_url(DATABASE),
                        "MIGRATIONS_DATABASE_URI": urls.database_url(DATABASE, OWNER_ROLE),
                        "BUILD_QUEUE": QUEUE, "EMBEDDER": "hashing",
                        "ANN_MIN_CHUNKS": 10**9})
    return app, admin


def empty_queue(app) -> None:
    from dashboard.queues import build_queue

    with app.app_context():
        build_queue().rq().empty()


# -- the data --------------------------------------------------------------------------------

def make_plan(app, name: str, cap: int) -> int:
    from dashboard.plans.models import Plan

    with app.app_context():
        plan = Plan(name=name, slug=name.lower(), included_sources=cap)
        db.session.add(plan)
        db.session.commit()
        plan_id = plan.id
        db.session.remove()
    return plan_id


def insert_users(conn, plan_id: int, count: int, tag: str) -> str:
    """``count`` users of the plan, by one statement; SQL selecting the plan's user ids."""
    conn.execute(text(
        "INSERT INTO users (email, display_name, password_hash, plan_id) "
        "SELECT :tag || n || '@bench.test', 'u', 'x', :plan FROM generate_series(1, :n) n"),
        {"tag": tag, "plan": plan_id, "n": count})
    return f"SELECT id FROM users WHERE plan_id = {plan_id}"


def built_users(app, plan_id: int, count: int, tag: str) -> None:
    """``count`` users, each with a profile chunk and a Blink chunk as a build leaves
    them (the chunk, the note, a succeeded record): by SQL, in a few statements."""
    from dashboard.memory import embedder_model_name

    model = embedder_model_name("hashing")
    vector = "[" + ",".join(["0.05"] * EMBEDDING_DIMENSIONS) + "]"
    with app.app_context():
        conn = db.session.connection()
        ids = insert_users(conn, plan_id, count, tag)
        conn.execute(text(
            "INSERT INTO memory_chunks (user_id, source_key, source_id, chunk_index, "
            "content_hash, content, embedding, embedding_model, ann) "
            f"SELECT u.id, k.key, '1', 0, md5(k.key || u.id), 'x', CAST(:v AS vector), :m, "
            f"false FROM ({ids}) u CROSS JOIN (VALUES (:p), (:b)) AS k(key)"),
            {"v": vector, "m": model, "p": PROFILE, "b": BLINKS})
        conn.execute(text(
            "INSERT INTO memory_builds (user_id, mode, trigger, status, attempts, added, "
            "source_counts, inputs_read_at, started_at, finished_at) "
            "SELECT id, 'full', 'admin', 'succeeded', 1, 2, CAST(:counts AS jsonb), now(), "
            f"now(), now() FROM ({ids}) u"),
            {"counts": json.dumps({key: {"added": 1, "removed": 0, "kept": 0}
                                   for key in (PROFILE, BLINKS)})})
        conn.execute(text(
            "INSERT INTO memory_states (user_id, inputs_read_at, snapshot, included_keys, "
            "embedding_model) SELECT id, now(), pg_current_snapshot()::text, "
            f"ARRAY[:p, :b]::varchar[], :m FROM ({ids}) u"),
            {"p": PROFILE, "b": BLINKS, "m": model})
        db.session.commit()
        db.session.remove()


def small_chatters(app, plan_id: int, count: int, tag: str) -> None:
    """``count`` users with a profile fact and two chat pairs each, never built."""
    with app.app_context():
        conn = db.session.connection()
        ids = insert_users(conn, plan_id, count, tag)
        conn.execute(text("INSERT INTO profile_facts (user_id, key, value) "
                          f"SELECT id, 'city', 'Lisbon ' || id FROM ({ids}) u"))
        conn.execute(text("INSERT INTO conversations (user_id, title, status) "
                          f"SELECT id, 'chat', 'ended' FROM ({ids}) u"))
        for pair in range(2):
            conn.execute(text(
                "WITH q AS (INSERT INTO messages (conversation_id, user_id, role, position, "
                "content) SELECT c.id, c.user_id, 'user', :pos, 'question ' || c.id || ' ' "
                f"|| :pos FROM conversations c WHERE c.user_id IN ({ids}) "
                "RETURNING id, conversation_id, user_id) "
                "INSERT INTO messages (conversation_id, user_id, role, position, content, "
                "reply_to_id) SELECT conversation_id, user_id, 'assistant', :pos + 1, "
                "'answer ' || id, id FROM q"), {"pos": 2 * pair})
        db.session.commit()
        db.session.remove()


def vacuum(admin) -> None:
    """Statistics and the visibility map, as a live database has them."""
    from sqlalchemy import create_engine

    engine = create_engine(admin.url.set(database=DATABASE), isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(text("VACUUM ANALYZE"))
    engine.dispose()


# -- (1) and (2): a plan change ------------------------------------------------------------

def change_cap(app, plan_id: int, cap: int) -> float:
    """The confirm: the cap changed and committed (the fan-out job is deferred to the
    commit); returns the moment of the commit."""
    from dashboard.plans.models import Plan

    with app.app_context():
        db.session.get(Plan, plan_id).included_sources = cap
        db.session.commit()
        at = time.perf_counter()
        db.session.remove()
    empty_queue(app)  # the fan-out runs here, timed, not on a stray worker
    return at


def apply(app, plan_id: int):
    from dashboard.memory import apply_plan_change, settings_from

    with app.app_context():
        batch = settings_from(app.config).fanout_batch
        result = apply_plan_change(db.session, plan_id, batch_size=batch)
        db.session.remove()
    return result


def agreement(app, plan_id: int, gone: str) -> tuple[int, int]:
    """(users still holding chunks of ``gone``, notes still listing it)."""
    from dashboard.auth.models import User
    from dashboard.memory import MemoryChunk, MemoryState

    with app.app_context():
        users = select(User.id).where(User.plan_id == plan_id)
        chunks = db.session.scalar(select(func.count(MemoryChunk.user_id.distinct())).where(
            MemoryChunk.user_id.in_(users), MemoryChunk.source_key == gone))
        notes = db.session.scalar(select(func.count()).select_from(MemoryState).where(
            MemoryState.user_id.in_(users), literal(gone) == any_(MemoryState.included_keys)))
        db.session.remove()
    return int(chunks), int(notes)


def eviction(app, admin, users: int) -> None:
    plan_id = make_plan(app, f"Evict{users}", cap=2)
    started = time.perf_counter()
    built_users(app, plan_id, users, f"e{users}-")
    vacuum(admin)
    print(f"\n-- eviction for {users:,} users (made in {time.perf_counter() - started:,.1f} s:"
          f" {2 * users:,} chunks) --")
    confirmed = change_cap(app, plan_id, 1)
    result = apply(app, plan_id)
    settled = time.perf_counter() - confirmed
    chunks, notes = agreement(app, plan_id, BLINKS)
    print(f"confirm → every user settled: {settled:,.1f} s (target ≤ 60 s)   "
          f"{result.batches} batches, {result.applied:,} users applied in bulk, "
          f"{result.chunks_removed:,} chunks removed, builds asked {result.builds_requested}")
    print(f"after: users still holding Blinks {chunks}, notes still listing them {notes}")


def run_workers(app, count: int) -> float:
    env = dict(os.environ)
    env.update(FLASK_APP="wsgi.py", DATABASE_URL=app.config["SQLALCHEMY_DATABASE_URI"],
               REDIS_URL=app.config["REDIS_URL"], BUILD_QUEUE=QUEUE, EMBEDDER="hashing",
               ANN_MIN_CHUNKS=str(10**9), **NO_PERIODIC)
    started = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, "-m", "flask", "worker", "--burst"],
                              cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL) for _ in range(count)]
    for proc in procs:
        proc.wait(timeout=3600)
    return time.perf_counter() - started


def build_span(app, ids_query) -> float:
    """Seconds from the first build's start to the last one's finish (workers' start-up
    left out)."""
    from dashboard.memory import MemoryBuild

    with app.app_context():
        first, last = db.session.execute(
            select(func.min(MemoryBuild.started_at), func.max(MemoryBuild.finished_at))
            .where(MemoryBuild.id.in_(ids_query))).one()
        db.session.remove()
    return (last - first).total_seconds() if first and last else float("nan")


def build_counts(app, plan_id: int) -> dict[str, int]:
    from dashboard.auth.models import User
    from dashboard.memory import MemoryBuild

    with app.app_context():
        rows = db.session.execute(
            select(MemoryBuild.status, func.count()).where(
                MemoryBuild.user_id.in_(select(User.id).where(User.plan_id == plan_id)))
            .group_by(MemoryBuild.status)).all()
        db.session.remove()
    return {status: int(n) for status, n in rows}


def push_queued(app, plan_id: int) -> None:
    """The queued builds' jobs, pushed as their commit pushed them (batches)."""
    from dashboard.auth.models import User
    from dashboard.memory import MemoryBuild
    from dashboard.queues import build_queue

    with app.app_context():
        ids = db.session.scalars(select(MemoryBuild.id).where(
            MemoryBuild.status == "queued",
            MemoryBuild.user_id.in_(select(User.id).where(User.plan_id == plan_id)))
            .order_by(MemoryBuild.id)).all()
        queue = build_queue()
        size = app.config["BUILD_FANOUT_BATCH"]
        for start in range(0, len(ids), size):  # a commit's worth at a time
            queue.push([("build", i) for i in ids[start:start + size]])
        db.session.remove()


def inclusion(app, admin, users: int, workers: int) -> int:
    plan_id = make_plan(app, f"Include{users}", cap=1)
    small_chatters(app, plan_id, users, f"i{users}-")
    vacuum(admin)
    print(f"\n-- inclusion for {users:,} small users (chat history joins), "
          f"{workers} workers --")
    confirmed = change_cap(app, plan_id, 4)
    result = apply(app, plan_id)
    applied = time.perf_counter() - confirmed
    push_queued(app, plan_id)  # the apply's commits pushed these; change_cap emptied them
    drained = run_workers(app, workers)
    settled = time.perf_counter() - confirmed
    counts = build_counts(app, plan_id)
    done = counts.get("succeeded", 0)
    from dashboard.auth.models import User
    from dashboard.memory import MemoryBuild

    span = build_span(app, select(MemoryBuild.id).where(
        MemoryBuild.user_id.in_(select(User.id).where(User.plan_id == plan_id))))
    print(f"apply {applied:,.1f} s ({result.builds_requested:,} builds asked), workers "
          f"{drained:,.1f} s: {done:,} builds succeeded, {counts.get('failed', 0)} failed, "
          f"{done / drained:,.0f} builds/s ({done / span:,.0f}/s from the first start to "
          f"the last finish)")
    print(f"confirm → every user built: {settled:,.1f} s (target ≤ 600 s)")
    return plan_id


def tiny_builds(app, plan_id: int, workers: int, users: int) -> None:
    """Quick builds of ``users`` tiny users already built (each finds nothing to do)."""
    from dashboard.auth.models import User
    from dashboard.memory import request_builds

    with app.app_context():
        ids = db.session.scalars(select(User.id).where(User.plan_id == plan_id)
                                 .order_by(User.id).limit(users)).all()
        build_ids = [r.build_id for r in request_builds(db.session, ids, trigger="schedule")]
        db.session.commit()
        db.session.remove()
    empty_queue(app)
    push_queued(app, plan_id)
    took = run_workers(app, workers)
    span = build_span(app, build_ids)
    print(f"tiny builds on {workers} worker{'s' if workers > 1 else ''}: {len(ids):,} in "
          f"{took:,.1f} s with the workers' start = {len(ids) / took:,.0f} builds/s; "
          f"first start to last finish {span:,.1f} s = {len(ids) / span:,.0f} builds/s "
          f"(target ≥ 100 on 2)")


# -- (4) Memory Status, (5) the crossing -----------------------------------------------------

def memory_status(pairs: int, flag_one: bool) -> str:
    args = [sys.executable, str(ROOT / "bench" / "memory_status.py"), "--pairs", str(pairs),
            "--loads", "20", "--flag-one" if flag_one else "--unchanged"]
    out = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=3600).stdout
    load = re.search(r"page load:\s+median ([\d.,]+) ms\s+p95 ([\d.,]+) ms.*queries per load "
                     r"(\d+)", out)
    dry = re.search(r"preview_memory_build alone: median ([\d.,]+) ms", out)
    if not load:
        return "failed: " + out[-300:]
    return (f"median {load.group(1)} ms, p95 {load.group(2)} ms, {load.group(3)} queries"
            + (f"; dry run {dry.group(1)} ms" if dry else ""))


def main() -> int:
    args = parse_args()
    began = time.perf_counter()
    app, admin = bench_app()
    try:
        sizes = (1_000, 5_000) if args.quick else (10_000, 100_000)
        print("== (1) a plan change that only removes: applied in bulk ==")
        for users in sizes:
            eviction(app, admin, users)
        print("\n== (2) a plan change that adds: a build per user ==")
        small = 1_000 if args.quick else 10_000
        plan_id = inclusion(app, admin, small, workers=2)
        print("\n== (3) tiny users' builds ==")
        for workers in (1, 2):
            tiny_builds(app, plan_id, workers, small // 2 if args.quick else 3_000)
        if not args.skip_status:
            print("\n== (4) Memory Status (nothing changed | one flagged pair) ==")
            for pairs in ((1_000, 5_000) if args.quick else (1_000, 10_000, 100_000)):
                print(f"{pairs:>7,} pairs: nothing changed: {memory_status(pairs, False)}")
                print(f"{'':>13} one flagged:     {memory_status(pairs, True)}")
        if not args.skip_crossing:
            crossing(app, 2_000 if args.quick else 100_000)
    finally:
        empty_queue(app)
        if not args.keep:
            with app.app_context():
                db.engine.dispose()
            drop_database(admin, DATABASE)
    print(f"\nbench ran {time.perf_counter() - began:,.1f} s")
    return 0


def crossing(app, pairs: int) -> None:
    print(f"\n== (5) a {pairs:,}-pair user crossing ANN_MIN_CHUNKS ==")
    try:
        from bench._crossing import measure_crossing
    except ImportError:
        print("bench/_crossing.py is not here: not measured")
        return
    found = measure_crossing(app, pairs)
    print(", ".join(f"{key} {value}" for key, value in found.items()))


if __name__ == "__main__":
    raise SystemExit(main())
