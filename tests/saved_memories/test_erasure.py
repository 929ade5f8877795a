"""The erasure VACUUM: after redactions and hard deletes a maintenance job
VACUUMs the memory tables, so the dead row versions holding the old content leave them,
and records on each receipt when that happened — only on receipts it really cleaned up
after, and only once the database confirms the VACUUM ran.

These tests commit (VACUUM sees only committed rows, on its own connection): the users of
``committed`` are deleted afterwards, and their memories and markers with them."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import create_engine, delete, select, text
from sqlalchemy.orm import Session

from dashboard.audit.services import Actor
from dashboard.auth.models import User
from dashboard.database import VACUUMED_TABLES, app_role_for, grant_app_privileges
from dashboard.exports import DataExport, DataExportPart
from dashboard.extensions import db
from dashboard.leases import MaintenanceLease
from dashboard.memory.models import EMBEDDING_DIMENSIONS, MemoryChunk
from dashboard.orbitpilot.models import ReplyRecall
from dashboard.queues import build_queue
from dashboard.saved_memories import (
    erasure,
    find_receipt,
    forget_memory,
    save_memory,
    update_memory,
)
from dashboard.saved_memories.erasure import VacuumResult, vacuum_after_erasures
from dashboard.saved_memories.models import ForgetMarker, Memory
from dashboard.sources import SAVED
from jobs.periodic import PERIODIC_TASKS, run_due_tasks
from tests.factories import make_conversation

SCOPES = ["memory:delete", "memory:redact", "memory:hard_delete"]
CONTENT = "the orchard gate code is 4412"
# A run may rightly leave a marker for the next one: another connection's statistics
# landing right after a VACUUM look like dead rows left, and another test run's older
# transaction on the same server keeps the snapshot rule from clearing it for a moment.
ATTEMPTS = 300
WAIT = 0.1


# -- helpers ------------------------------------------------------------------------------

@contextmanager
def own_session() -> Iterator[Session]:
    """A session on a connection of its own, committed at the end; its statistics reach
    the server before the connection is handed back, so ``n_dead_tup`` counts the dead
    rows it left before the job runs."""
    with db.engine.connect() as conn:
        session = Session(bind=conn)
        try:
            yield session
            session.commit()
            conn.execute(text("SELECT pg_stat_force_next_flush()"))
            conn.commit()  # the backend flushes as it goes idle, before it answers
        finally:
            session.close()
            # save_memory reads the plan through the app's own session (get_user_plan):
            # left open, its snapshot would hold the VACUUM back.
            db.session.commit()


def remembered(owner_id: int) -> str:
    """A committed memory with an earlier version (holding content) and two chunks, a chat
    reply that quoted it (with its "Drew on" record) and a ready export holding it: an
    erasure rewrites the reply and deletes the export's piece, leaving dead rows there too."""
    with own_session() as session:
        owner = session.get(User, owner_id)
        actor = Actor.of(owner)
        memory = save_memory(session, owner=owner, content=CONTENT, actor=actor).memory
        update_memory(session, memory, content=CONTENT + " (changed)", actor=actor)
        for index in range(2):
            session.add(MemoryChunk(user_id=owner_id, source_key=SAVED, source_id=str(memory.id),
                                    chunk_index=index, content_hash=uuid.uuid4().hex,
                                    content=CONTENT, embedding=[0.01] * EMBEDDING_DIMENSIONS,
                                    embedding_model="test"))
        _, (_, reply) = make_conversation(session, owner, [("gate?", f"“{CONTENT}”")])
        session.flush()
        session.add(ReplyRecall(message_id=reply.id, user_id=owner_id, rank=0,
                                source_key=SAVED, source_id=str(memory.id), chunk_id=0,
                                distance=0.1))
        export = DataExport(user_id=owner_id, status="ready", finished_at=datetime.now(UTC),
                            expires_at=datetime.now(UTC) + timedelta(hours=1))
        session.add(export)
        session.flush()
        session.add(DataExportPart(export_id=export.id, seq=0, data=CONTENT.encode()))
        session.flush()
        return str(memory.id)


def forget(owner_id: int, memory_id: str, mode: str) -> int:
    """Forget in a committed transaction of its own; the marker's id."""
    with own_session() as session:
        receipt = forget_memory(session, owner_id, memory_id, mode=mode,
                                actor=Actor.of(session.get(User, owner_id)), scopes=SCOPES)
        return receipt.marker_id


def vacuumed_at(marker_id: int) -> datetime | None:
    with db.engine.connect() as conn:
        return conn.scalar(select(ForgetMarker.vacuumed_at).where(ForgetMarker.id == marker_id))


def stamped(marker_id: int) -> bool:
    return vacuumed_at(marker_id) is not None


@dataclass(frozen=True)
class TableStats:
    vacuum_count: int
    dead: int
    last_vacuum: datetime | None


def table_stats(*tables: str) -> dict[str, TableStats]:
    with db.engine.connect() as conn:  # a new transaction: no cached statistics
        rows = conn.execute(text(
            "SELECT relname, vacuum_count, n_dead_tup, last_vacuum FROM pg_stat_user_tables "
            "WHERE schemaname = current_schema() AND relname = ANY(:tables)"),
            {"tables": list(tables or VACUUMED_TABLES)})
        return {name: TableStats(count, dead, last) for name, count, dead, last in rows}


def vacuum_until(done: Callable[[object], bool],
                 run: Callable[[], object] = lambda: vacuum_after_erasures(db.engine)):
    """Run the job until ``done(result)``; the last result."""
    for _ in range(ATTEMPTS):
        result = run()
        if done(result):
            return result
        time.sleep(WAIT)
    pytest.fail("the job never got to the markers (a transaction kept them back)")


def drain() -> None:
    """Whatever earlier tests left pending is dealt with first, so counts are ours."""
    vacuum_until(lambda result: result.pending == 0)


def app_role(app) -> str:
    role = app_role_for(app.config["SQLALCHEMY_DATABASE_URI"],
                        app.config["MIGRATIONS_DATABASE_URI"])
    assert role is not None  # the suite runs the app as a role that owns nothing
    return role


@pytest.fixture
def owner(committed, queue) -> int:
    """A committed user's id. Nothing stays open on the session: its snapshot would hold
    the VACUUM back (the job would rightly stamp nothing)."""
    user = committed.user()
    committed.session.commit()
    owner_id = user.id
    committed.session.commit()
    return owner_id


# -- the job ----------------------------------------------------------------------------------

def test_redactions_and_hard_deletes_are_stamped_and_their_dead_rows_are_gone(app, owner):
    redacted, deleted, soft = (remembered(owner) for _ in range(3))
    markers = {mode: forget(owner, memory_id, mode) for mode, memory_id in
               (("redact", redacted), ("hard_delete", deleted), ("soft_delete", soft))}
    before = table_stats()
    # The forgets left dead row versions in every memory table and where they reached
    # copies (a reply rewritten, an export's piece deleted): old content, until VACUUM.
    assert all(before[table].dead > 0 for table in VACUUMED_TABLES)

    at = datetime(2031, 5, 4, 3, 2, 1, tzinfo=UTC)
    result = vacuum_until(
        lambda result: stamped(markers["redact"]) and stamped(markers["hard_delete"]),
        run=lambda: vacuum_after_erasures(db.engine, now=at))
    after = table_stats()

    assert (vacuumed_at(markers["redact"]), vacuumed_at(markers["hard_delete"])) == (at, at)
    assert vacuumed_at(markers["soft_delete"]) is None  # a soft delete keeps its content
    assert (result.vacuumed, result.refused) == (VACUUMED_TABLES, ())
    assert result.dead_left == {table: 0 for table in VACUUMED_TABLES}
    assert {table: after[table].dead for table in VACUUMED_TABLES} == \
        {table: 0 for table in VACUUMED_TABLES}
    assert all(after[table].vacuum_count > before[table].vacuum_count
               for table in VACUUMED_TABLES)
    # Readable again later, on the receipt.
    with own_session() as session:
        assert find_receipt(session, owner, markers["redact"]).to_dict()["vacuum"] == \
            {"due": True, "vacuumed_at": at.isoformat()}
        assert find_receipt(session, owner, markers["soft_delete"]).to_dict()["vacuum"] == \
            {"due": False, "vacuumed_at": None}


def test_an_erasure_an_open_snapshot_still_sees_waits_for_a_later_run(app, owner):
    memory_id = remembered(owner)
    drain()
    with db.engine.connect().execution_options(isolation_level="REPEATABLE READ") as reader:
        reader.execute(text("SELECT 1"))  # its snapshot is taken: before the redaction
        marker = forget(owner, memory_id, "redact")

        result = vacuum_after_erasures(db.engine)

        # VACUUM ran, and could not remove the old version: that snapshot still reads it.
        assert reader.scalar(select(Memory.content).where(Memory.id == uuid.UUID(memory_id))) \
            == CONTENT + " (changed)"
        assert (result.pending, result.stamped, result.vacuumed) == (1, 0, VACUUMED_TABLES)
        assert result.dead_left["memories"] > 0
        assert vacuumed_at(marker) is None
        reader.rollback()
    vacuum_until(lambda result: stamped(marker))


def test_an_erasure_older_than_every_open_snapshot_is_stamped_though_newer_dead_rows_stay(
        app, owner):
    drain()
    marker = forget(owner, remembered(owner), "redact")
    other = remembered(owner)
    # Until nothing older than the redaction runs anywhere on the server (another test
    # run's transaction would be the xmin of any new snapshot, ours included).
    older = text("SELECT age(xmin) > age(xid(pg_snapshot_xmin(pg_current_snapshot()))) "
                 "FROM forget_markers WHERE id = :id")
    for _ in range(ATTEMPTS * 4):
        with db.engine.connect() as conn:
            if conn.scalar(older, {"id": marker}):
                break
        time.sleep(WAIT)
    else:
        pytest.fail("a transaction older than the redaction never ended")
    with db.engine.connect().execution_options(isolation_level="REPEATABLE READ") as reader:
        reader.execute(text("SELECT 1"))  # a snapshot newer than the redaction...
        forget(owner, other, "soft_delete")  # ...that still reads this row's old version

        result = vacuum_after_erasures(db.engine)

        assert result.dead_left["memories"] > 0
        assert (result.pending, result.stamped) == (1, 1)
        assert vacuumed_at(marker) is not None
        reader.rollback()


@pytest.mark.parametrize("left_on_pinned_pages", [3, None], ids=["missed", "unreadable"])
def test_dead_rows_left_on_pinned_pages_stamp_nothing_while_any_dead_rows_remain(
        app, owner, monkeypatch, left_on_pinned_pages):
    """VACUUM VERBOSE says when it left dead versions on pages another backend held
    pinned; any erasure's may be among them. (Contention cannot be staged reliably: the
    report is what is replaced here, the VACUUM still runs.)"""
    from dashboard.saved_memories import erasure

    drain()
    marker = forget(owner, remembered(owner), "redact")
    real = erasure._vacuum_table
    assert real.__name__ == "_vacuum_table"

    def reporting(conn, table):
        real(conn, table)
        return left_on_pinned_pages

    monkeypatch.setattr(erasure, "_vacuum_table", reporting)
    other = remembered(owner)
    with db.engine.connect().execution_options(isolation_level="REPEATABLE READ") as reader:
        reader.execute(text("SELECT 1"))
        forget(owner, other, "soft_delete")  # a dead row an open snapshot still reads
        result = vacuum_after_erasures(db.engine)
        reader.rollback()
    assert result.dead_left["memories"] > 0
    assert result.stamped == 0
    assert vacuumed_at(marker) is None


def test_this_servers_vacuum_report_is_read(app):
    """The precise rule above needs VACUUM VERBOSE's report; on this server it is read
    (no page was pinned, so nothing was left behind)."""
    from dashboard.saved_memories.erasure import _vacuum_table

    with app.app_context(), \
            db.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        assert _vacuum_table(conn, "memories") == 0


def test_an_erasure_committed_after_the_vacuum_began_is_left_for_the_next_run(
        app, owner, monkeypatch):
    first = forget(owner, remembered(owner), "redact")
    late: list[int] = []
    vacuum_table = erasure._vacuum_table

    def forget_then_vacuum(conn, table):
        if table == VACUUMED_TABLES[1]:  # memories is done: this redaction's row stays
            late.append(forget(owner, remembered(owner), "redact"))
        vacuum_table(conn, table)

    monkeypatch.setattr(erasure, "_vacuum_table", forget_then_vacuum)
    vacuum_until(lambda result: stamped(first))

    assert late  # the VACUUM that stamped the first marker had begun before this one
    assert vacuumed_at(late[-1]) is None
    assert table_stats("memories")["memories"].dead > 0  # its old row is still there
    monkeypatch.setattr(erasure, "_vacuum_table", vacuum_table)
    vacuum_until(lambda result: stamped(late[-1]))


def test_with_nothing_pending_no_vacuum_runs(app, owner, count_queries):
    drain()
    soft = forget(owner, remembered(owner), "soft_delete")  # waits for no VACUUM
    before = table_stats()

    with count_queries() as queries:
        result = vacuum_after_erasures(db.engine)

    assert result == VacuumResult(pending=0, stamped=0)
    assert [s for s in queries.statements if s.lstrip().upper().startswith("VACUUM")] == []
    assert {t: s.vacuum_count for t, s in table_stats().items()} == \
        {t: s.vacuum_count for t, s in before.items()}
    assert vacuumed_at(soft) is None


def test_a_refused_vacuum_stamps_nothing_and_says_why_by_kind(app, owner, caplog):
    role = app_role(app)
    drain()
    marker = forget(owner, remembered(owner), "hard_delete")
    owner = create_engine(app.config["MIGRATIONS_DATABASE_URI"])
    caplog.set_level(logging.WARNING, logger="dashboard.saved_memories.erasure")
    try:
        with owner.begin() as conn:
            conn.execute(text(f'REVOKE MAINTAIN ON memory_chunks FROM "{role}"'))
        # PostgreSQL only warns and skips the table; the job notices from its statistics.
        result = vacuum_after_erasures(db.engine)
    finally:
        with owner.begin() as conn:
            grant_app_privileges(conn, role)
        owner.dispose()

    assert (result.vacuumed, result.refused, result.stamped) == \
        (("memories", "memory_versions", "messages", "data_export_parts"), ("memory_chunks",), 0)
    assert vacuumed_at(marker) is None
    warnings = [r.getMessage() for r in caplog.records
                if r.name == "dashboard.saved_memories.erasure"]
    assert warnings == ["erasure vacuum: VACUUM did not run on memory_chunks (the app role "
                        "needs MAINTAIN on them, PostgreSQL 17+); 1 erasure receipt(s) stay "
                        "pending"]
    vacuum_until(lambda result: stamped(marker))  # granted again: the next run catches up


def test_the_app_role_may_vacuum_the_memory_tables_and_nothing_else(app):
    with app.app_context(), \
            db.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        assert conn.scalar(text("SELECT current_user")) == app_role(app)
        for table in (*VACUUMED_TABLES, "audit_events"):
            before = table_stats(table)[table]
            conn.exec_driver_sql(f"VACUUM {table}")
            after = table_stats(table)[table]
            if table == "audit_events":  # a warning, and nothing done
                assert (after.vacuum_count, after.last_vacuum) == \
                    (before.vacuum_count, before.last_vacuum)
            else:
                assert after.vacuum_count == before.vacuum_count + 1
                assert after.last_vacuum is not None and after.last_vacuum != before.last_vacuum
        maintain = conn.execute(text(
            "SELECT relname FROM pg_class WHERE relkind = 'r' AND relnamespace = "
            "current_schema()::regnamespace AND has_table_privilege(oid, 'MAINTAIN') "
            "ORDER BY relname")).scalars().all()
        assert maintain == sorted(VACUUMED_TABLES)


# -- the worker and the command line ------------------------------------------------------------

def test_the_worker_runs_it_under_its_lease_outside_its_transaction(app, owner, monkeypatch):
    drain()
    marker = forget(owner, remembered(owner), "hard_delete")
    config = {**app.config, **{task.setting: 0 for task in PERIODIC_TASKS},
              "ERASURE_VACUUM_SECONDS": 300}
    session_open: list[bool] = []
    vacuum_table = erasure._vacuum_table

    def watched(conn, table):
        session_open.append(db.session().in_transaction())
        vacuum_table(conn, table)

    monkeypatch.setattr(erasure, "_vacuum_table", watched)

    def maintenance_pass() -> list[str]:
        db.session.execute(delete(MaintenanceLease)
                           .where(MaintenanceLease.task == "erasure_vacuum"))
        db.session.commit()
        return run_due_tasks(db.session, config, build_queue(app), holder="worker-a")

    ran = vacuum_until(lambda ran: stamped(marker), run=maintenance_pass)

    assert ran == ["erasure_vacuum"]
    assert session_open and not any(session_open)
    assert db.session.get(MaintenanceLease, "erasure_vacuum").holder == "worker-a"
    db.session.commit()
    later = forget(owner, remembered(owner), "redact")
    # Not due yet:
    assert run_due_tasks(db.session, config, build_queue(app), holder="worker-b") == []
    assert vacuumed_at(later) is None


def test_the_command_vacuums_now_and_prints_counts(app, owner):
    drain()
    runner = app.test_cli_runner()
    assert runner.invoke(args=["memories", "vacuum"]).output == \
        "No erasure waits for a VACUUM.\n"
    marker = forget(owner, remembered(owner), "redact")

    result = vacuum_until(lambda result: stamped(marker),
                          run=lambda: runner.invoke(args=["memories", "vacuum"]))

    assert result.exit_code == 0
    assert result.output == ("1 erasure(s) waited for a VACUUM: 1 stamped, 0 still waiting; "
                             "vacuumed memories, memory_versions, memory_chunks, messages, "
                             "data_export_parts.\n")
