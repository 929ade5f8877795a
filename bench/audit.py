"""Audit log benchmark: the staff view and the verifier over a large, valid chain.

    .venv/bin/python bench/audit.py                  # 1,000,000 events
    .venv/bin/python bench/audit.py --events 100000  # a smaller run

Fills its own database (``orbitpilot_bench_audit`` on the embedded server, dropped
afterwards unless --keep) with chained events whose hashes come from the service's own
functions, loaded by COPY as the owner role. The view is then measured through the Flask
test client, signed in as an admin, connected as the app role as in production. Prints
milliseconds (median of --repeat), queries per page, and the verifier's speed; nothing
here passes or fails.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sqlalchemy import create_engine, select  # noqa: E402

from bench._setup import (  # noqa: E402
    PASSWORD,
    counted,
    drop_database,
    fresh_database,
    migrated_app,
    ms,
    signed_in,
)
from dashboard.extensions import db  # noqa: E402

DATABASE = "orbitpilot_bench_audit"
START = datetime(2024, 1, 1, tzinfo=UTC)
STEP = timedelta(seconds=60)
SEQ_CELL = re.compile(r'<td class="col-seq">\s*(\d+)\s*</td>')

# (action, share of the log, target type, modes): a common action and a rare one to filter.
ACTIONS = [
    ("memory.forget", 0.30, "memory", ("soft_delete", "redact", "hard_delete")),
    ("message.remember_toggle", 0.30, "message", (None,)),
    ("build.request", 0.22, "user", ("quick", "full")),
    ("memory.restore", 0.08, "memory", ("restore",)),
    ("api_key.create", 0.05, "api_key", (None,)),
    ("api_key.revoke", 0.03, "api_key", (None,)),
    ("assignment.update", 0.018, "plan", (None,)),
    ("plan.update", 0.002, "plan", (None,)),
]
OWNERS = 100_000


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=15, help="requests per measurement")
    parser.add_argument("--keep", action="store_true", help="keep the bench database")
    return parser.parse_args()


def bench_app():
    """An app on a fresh database of its own, migrated as the owner role; the app itself
    connects as the app role. Returns (app, owner URL, admin engine)."""
    from dashboard.embedded import OWNER_ROLE

    urls, admin = fresh_database(DATABASE)
    owner_url = urls.database_url(DATABASE, OWNER_ROLE)
    # A queue of its own: nothing the bench might request reaches a real worker.
    app = migrated_app({"SQLALCHEMY_DATABASE_URI": urls.database_url(DATABASE),
                        "MIGRATIONS_DATABASE_URI": owner_url,
                        "BUILD_QUEUE": "builds-bench-audit"})
    return app, owner_url, admin


# -- the data --------------------------------------------------------------------------------

class Row:
    """What ``event_hash`` reads: the columns, as the database will give them back."""

    __slots__ = ("seq", "occurred_at", "action", "actor_type", "actor_id", "owner_id",
                 "target_type", "target_id", "mode", "details", "prev_hash", "hash")


def make_events(total: int) -> Iterator[Row]:
    from dashboard.audit.services import GENESIS_HASH, event_hash

    rng = random.Random(8)
    actions = [a for a, *_ in ACTIONS]
    weights = [w for _, w, *_ in ACTIONS]
    spec = {a: (target, modes) for a, _, target, modes in ACTIONS}
    prev = GENESIS_HASH
    for seq, action in enumerate(rng.choices(actions, weights, k=total), start=1):
        target_type, modes = spec[action]
        owner = rng.randrange(1, OWNERS + 1)
        row = Row()
        row.seq = seq
        row.occurred_at = START + STEP * seq + timedelta(microseconds=rng.randrange(10**6))
        row.action = action
        row.owner_id = owner
        row.mode = rng.choice(modes)
        row.target_type = target_type
        row.target_id = str(rng.randrange(1, 10**7))
        if action.startswith(("memory.", "api_key.")) and rng.random() < 0.5:
            row.actor_type, row.actor_id = "api_key", f"k{rng.randrange(1, 50_000)}"
        elif action.startswith(("plan.", "assignment.")):
            row.actor_type, row.actor_id = "admin", str(rng.randrange(1, 5))
        else:
            row.actor_type, row.actor_id = "user", str(owner)
        if action in ("plan.update", "assignment.update"):
            cap = rng.randrange(1, 6)
            row.details = {"before": {"included_sources": cap},
                           "after": {"included_sources": cap + 1}}
        elif action.startswith("memory."):
            row.details = {"memory_id": int(row.target_id), "version": rng.randrange(1, 9),
                           "reason": "requested by the owner"}
        else:
            row.details = {"id": int(row.target_id)}
        row.prev_hash = prev
        row.hash = prev = event_hash(row)
        yield row


def load(owner_url: str, total: int) -> None:
    """COPY as the owner, with the secondary indexes dropped and made again after (one
    sort each instead of a million inserts into each)."""
    started = time.perf_counter()
    engine = create_engine(owner_url)
    raw = engine.raw_connection()
    try:
        conn = raw.driver_connection
        with conn.cursor() as cur:
            cur.execute("SELECT indexname, indexdef FROM pg_indexes WHERE tablename = "
                        "'audit_events' AND indexname LIKE 'ix_%'")
            indexes = cur.fetchall()
            for name, _ in indexes:
                cur.execute(f'DROP INDEX "{name}"')
            columns = ("seq, occurred_at, action, actor_type, actor_id, owner_id, "
                       "target_type, target_id, mode, details, prev_hash, hash")
            with cur.copy(f"COPY audit_events ({columns}) FROM STDIN") as copy:
                for row in make_events(total):
                    copy.write_row((row.seq, row.occurred_at, row.action, row.actor_type,
                                    row.actor_id, row.owner_id, row.target_type,
                                    row.target_id, row.mode, json.dumps(row.details),
                                    row.prev_hash, row.hash))
            loaded = time.perf_counter()
            cur.execute("SET maintenance_work_mem = '512MB'")
            for _, definition in indexes:
                cur.execute(definition)
        conn.commit()
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute("VACUUM ANALYZE audit_events")
    finally:
        raw.close()
        engine.dispose()
    print(f"loaded {total:,} chained events in {loaded - started:,.1f} s (hashing + COPY), "
          f"indexes and VACUUM ANALYZE {time.perf_counter() - loaded:,.1f} s")


# -- measuring -------------------------------------------------------------------------------

def median_of(repeat: int, call: Callable[[], Any]) -> float:
    call()  # warm: caches, the plan, the connection
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def signed_in_admin(app):
    from werkzeug.security import generate_password_hash

    from dashboard.auth.models import User

    with app.app_context():
        db.session.add(User(email="admin@bench.test", display_name="bench", role="admin",
                            password_hash=generate_password_hash(PASSWORD)))
        db.session.commit()
        db.session.remove()
    return signed_in(app, "admin@bench.test")


def bench_view(app, total: int, repeat: int) -> None:
    print(f"\n== the audit view over {total:,} events (median of {repeat}) ==")
    client = signed_in_admin(app)
    middle = START + STEP * (total // 2)
    pages = [
        ("first page", "/admin/audit/"),
        ("filtered: common action (30%)", "/admin/audit/?flt0_action_equals=memory.forget"),
        ("filtered: rare action (0.2%)", "/admin/audit/?flt0_action_equals=plan.update"),
        ("filtered: one owner", "/admin/audit/?flt0_owner_id_equals=4242"),
        ("filtered: actor type + id", "/admin/audit/?flt0_actor_type_equals=admin"
                                      "&flt1_actor_id_equals=3"),
        ("filtered: one day", "/admin/audit/?flt0_date_between="
                              f"{middle:%Y-%m-%d} 00:00:00 to {middle:%Y-%m-%d} 23:59:59"),
        ("filtered: before mid-log date", f"/admin/audit/?flt0_date_before={middle:%Y-%m-%d}"),
        ("deep page, keyset (half way)", f"/admin/audit/?before_seq={total // 2}"),
        ("deep page, keyset (the oldest)", "/admin/audit/?before_seq=51"),
        ("deep page, keyset, filtered", "/admin/audit/?flt0_action_equals=memory.forget"
                                        f"&before_seq={total // 10}"),
        ("oldest first (sort ascending)", "/admin/audit/?sort=0"),
    ]
    with app.app_context():
        engine = db.engine
    for label, url in pages:
        with counted(engine) as statements:
            response = client.get(url)
        assert response.status_code == 200, (url, response.status_code)
        rows = len(SEQ_CELL.findall(response.get_data(as_text=True)))
        seconds = median_of(repeat, lambda url=url: client.get(url))
        print(f"{label:34} {ms(seconds):>10}  rows {rows:>2}  queries per page "
              f"{len(statements)}")
    export = "/admin/audit/export/csv/?flt0_action_equals=memory.forget"
    seconds = median_of(3, lambda: client.get(export).get_data())
    lines = client.get(export).get_data(as_text=True).count("\n") - 1
    print(f"{'CSV export (' + format(lines, ',') + ' rows)':34} {ms(seconds):>10}")


def bench_offset(app, total: int, repeat: int) -> None:
    """Flask-Admin's own offset paging (the base class's get_list), for the decision
    recorded in dashboard/audit/views.py; then the same pages' SQL alone."""
    from flask_admin.contrib.sqla import ModelView

    from dashboard.audit.models import AuditEvent

    print(f"\n== offset (Flask-Admin) against keyset paging, 50 rows (median of {repeat}) ==")
    view = app.view_functions["audit.index_view"].__self__
    pages = total // 50
    with app.test_request_context("/admin/audit/"):
        for page in (0, pages // 100, pages // 2, pages - 1):
            offset = median_of(repeat, lambda page=page: ModelView.get_list(
                view, page, None, True, None, None, page_size=50))
            before = total - page * 50 + 1
            keyset = median_of(repeat, lambda before=before: db.session.scalars(
                select(AuditEvent).where(AuditEvent.seq < before)
                .order_by(AuditEvent.seq.desc()).limit(51)).all())
            print(f"page {page:>6,} (rows {page * 50 + 1:,}-{page * 50 + 50:,}): "
                  f"offset {ms(offset):>10}   keyset {ms(keyset):>8}")
        db.session.rollback()


def bench_verify(app, total: int) -> None:
    from dashboard.audit.services import verify_chain

    print("\n== flask audit verify ==")
    with app.app_context():
        started = time.perf_counter()
        result = verify_chain(db.session)
        seconds = time.perf_counter() - started
        db.session.rollback()
    print(result.describe())
    print(f"verify: {seconds:,.1f} s for {result.events:,} events = "
          f"{seconds / result.events * 100_000:,.2f} s per 100,000 events")


def main() -> int:
    args = parse_args()
    app, owner_url, admin = bench_app()
    try:
        load(owner_url, args.events)
        bench_view(app, args.events, args.repeat)
        bench_offset(app, args.events, args.repeat)
        bench_verify(app, args.events)
    finally:
        with app.app_context():
            db.engine.dispose()
        if not args.keep:
            drop_database(admin, DATABASE)
        admin.dispose()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
