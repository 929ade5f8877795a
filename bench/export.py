"""Export benchmark: "download everything about me" for users of 1,000, 10,000 and
100,000 chat pairs (with their chunks), each made in a fresh process: its time, the zip's
size and the process's peak RSS against an empty user's (bounded memory: the peak must
not grow with the user).

    .venv/bin/python bench/export.py                    # 1k, 10k and 100k pairs
    .venv/bin/python bench/export.py --pairs 1000 5000  # other sizes

On a database of its own (dropped afterwards unless --keep), written in bulk by SQL.
Nothing here passes or fails."""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sqlalchemy import text  # noqa: E402

from bench._setup import drop_database, fresh_database, migrated_app  # noqa: E402
from dashboard.extensions import db  # noqa: E402
from dashboard.memory.models import EMBEDDING_DIMENSIONS  # noqa: E402

DATABASE = "orbitpilot_bench_export"
PER_CONVERSATION = 100
VECTOR = "[" + ",".join(["0.051"] * EMBEDDING_DIMENSIONS) + "]"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, nargs="+", default=[1_000, 10_000, 100_000])
    parser.add_argument("--keep", action="store_true", help="keep the database afterwards")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)  # export this user
    parser.add_argument("--url", help=argparse.SUPPRESS)
    return parser.parse_args()


def populate(pairs: int) -> int:
    """A user with ``pairs`` answered chat pairs (100 per conversation) and a chunk each."""
    session = db.session
    user_id = session.execute(text(
        "INSERT INTO users (email, display_name, password_hash, role) "
        "VALUES (:e, 'Bench', 'x', 'user') RETURNING id"), {"e": f"export{pairs}@bench.test"}
    ).scalar_one()
    conversations = max(1, pairs // PER_CONVERSATION)
    session.execute(text("INSERT INTO conversations (user_id, title) "
                         "SELECT :u, 'chat ' || g FROM generate_series(1, :n) AS g"),
                    {"u": user_id, "n": conversations})
    per = min(pairs, PER_CONVERSATION)
    session.execute(text(
        "INSERT INTO messages (conversation_id, user_id, role, position, content) "
        "SELECT c.id, :u, CASE WHEN g % 2 = 0 THEN 'user' ELSE 'assistant' END, g, "
        "'message ' || g || ' of chat ' || c.id || ': ' || repeat('lorem ipsum dolor ', 6) "
        "FROM conversations AS c, generate_series(0, :m - 1) AS g WHERE c.user_id = :u"),
        {"u": user_id, "m": 2 * per})
    session.execute(text(
        "INSERT INTO memory_chunks (user_id, source_key, source_id, chunk_index, "
        "content_hash, content, embedding, embedding_model, ann, record_at) "
        "SELECT :u, 'orbitpilot.chat_history', c.id || ':' || g, 0, md5(c.id || ':' || g), "
        "'User: question ' || g || E'\\nOrbitPilot: ' || repeat('answer ', 12), "
        "CAST(:v AS vector), 'hashing-v1', false, now() "
        "FROM conversations AS c, generate_series(0, :p - 1) AS g WHERE c.user_id = :u"),
        {"u": user_id, "p": per, "v": VECTOR})
    session.commit()
    return user_id


def child(user_id: int, url: str) -> None:
    """Export one user in this (fresh) process; print what it took, as JSON."""
    from dashboard import create_app
    from dashboard.exports import DataExport, build_export

    app = create_app({"SQLALCHEMY_DATABASE_URI": url, "EMBEDDER": "hashing",
                      "BUILD_QUEUE": "builds-bench-export"})
    with app.app_context():
        export = DataExport(user_id=user_id)  # as asked for, without a queue to push to
        db.session.add(export)
        db.session.commit()
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        started = time.perf_counter()
        build_export(db.session, export.id)
        seconds = time.perf_counter() - started
        size = db.session.execute(text("SELECT size_bytes FROM data_exports WHERE id = :i"),
                                  {"i": export.id}).scalar_one()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"seconds": seconds, "bytes": size, "rss_before_kb": before,
                      "rss_peak_kb": peak}))


def run_child(user_id: int, url: str) -> dict:
    done = subprocess.run([sys.executable, __file__, "--child", str(user_id), "--url", url],
                          capture_output=True, text=True, env=dict(os.environ), check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    args = parse_args()
    if args.child is not None:
        child(args.child, args.url)
        return
    from dashboard.embedded import OWNER_ROLE

    urls, admin = fresh_database(DATABASE)
    url = urls.database_url(DATABASE)
    app = migrated_app({"SQLALCHEMY_DATABASE_URI": url,
                        "MIGRATIONS_DATABASE_URI": urls.database_url(DATABASE, OWNER_ROLE),
                        "BUILD_QUEUE": "builds-bench-export", "EMBEDDER": "hashing"})
    try:
        with app.app_context():
            users = {0: populate(0)}
            for pairs in args.pairs:
                started = time.perf_counter()
                users[pairs] = populate(pairs)
                print(f"world: a user of {pairs:,} pairs in "
                      f"{time.perf_counter() - started:.1f} s")
            db.engine.dispose()
        base = None
        print(f"{'pairs':>8} {'seconds':>8} {'zip MB':>8} {'peak RSS MB':>12} "
              f"{'over empty':>11}")
        for pairs, user_id in users.items():
            got = run_child(user_id, url)
            peak = got["rss_peak_kb"] / 1024
            base = peak if base is None else base
            print(f"{pairs:>8,} {got['seconds']:>8.2f} {got['bytes'] / 2**20:>8.1f} "
                  f"{peak:>12.1f} {peak - base:>+11.1f}")
    finally:
        if not args.keep:
            drop_database(admin, DATABASE)


if __name__ == "__main__":
    main()
