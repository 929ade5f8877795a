"""The audit log's hash chain: strictly increasing ``seq`` assigned under a lock, each
event carrying the previous event's hash; ``flask audit verify`` names the first broken
link; checkpoints of the chain head show a log that was cut short.

Tampering needs the owner role with the guard switched off (the app role cannot switch
it off, see test_append_only.py). Those tests do it on one owner connection in one
transaction that is rolled back, the trigger switch included, so nothing persists
(``owner_session``, tests/audit/conftest.py). Other tests of a full run may have
committed events, so nothing here assumes the chain starts at seq 1 — except the
concurrency test, which runs in a scratch database."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from types import SimpleNamespace

import pytest
from sqlalchemy import create_engine, select, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

from dashboard import create_app
from dashboard.audit.models import AuditCheckpoint, AuditEvent
from dashboard.audit.services import (
    GENESIS_HASH,
    SYSTEM,
    Actor,
    checkpoint_chain,
    event_hash,
    record_event,
    verify_chain,
)
from dashboard.extensions import db
from tests.conftest import make_test_config, server_admin_url

DISABLE_GUARD = "ALTER TABLE audit_events DISABLE TRIGGER audit_events_no_update_delete"


def head(session) -> tuple[int, str]:
    row = session.execute(select(AuditEvent.seq, AuditEvent.hash)
                          .order_by(AuditEvent.seq.desc()).limit(1)).first()
    return (row.seq, row.hash) if row else (0, GENESIS_HASH)


def record(session, n: int, action: str = "test.chain") -> list[AuditEvent]:
    return [record_event(session, action=action, actor=Actor("admin", "1"), owner_id=7,
                         target_type="plan", target_id=i, mode="edit",
                         details={"before": {"cap": i}, "after": {"cap": i + 1}})
            for i in range(n)]


def verify_cli(runner, session) -> tuple[int, str]:
    """``flask audit verify`` reading through ``session`` (it sees uncommitted rows)."""
    original = db.session
    db.session = session
    try:
        result = runner.invoke(args=["audit", "verify"])
    finally:
        db.session = original
    return result.exit_code, result.output.strip()


# -- appending ------------------------------------------------------------------------------

def test_events_chain_in_sequence_and_each_hash_can_be_recomputed(db_session):
    start_seq, start_hash = head(db_session)
    events = record(db_session, 3)
    assert [e.seq for e in events] == [start_seq + 1, start_seq + 2, start_seq + 3]
    assert [e.prev_hash for e in events] == [start_hash, events[0].hash, events[1].hash]
    assert len({e.hash for e in events}) == 3
    # From the stored row alone (JSONB, timestamptz as the database gives them back).
    table = AuditEvent.__table__
    rows = db_session.execute(select(table).where(table.c.seq > start_seq)
                              .order_by(table.c.seq)).all()
    assert [event_hash(row) for row in rows] == [e.hash for e in events]


def test_the_hash_is_over_what_the_row_holds(db_session):
    """Values the database stores differently from how they were given (an int actor id
    into a text column, numbers JSONB writes back another way) are hashed as stored:
    otherwise verify would call an untouched event changed."""
    event = record_event(db_session, action="test.types", actor=Actor("api_key", 5),
                         owner_id="7", target_id=9,
                         details={"big": 1e16, "bigger": 1.2345678901234567e19,
                                  "zero": -0.0, "small": 1.5e-7, "third": 1 / 3, "n": 3,
                                  "nested": {"list": [1.0, 2e20, "x"]}})
    table = AuditEvent.__table__
    row = db_session.execute(select(table).where(table.c.id == event.id)).one()
    assert (row.actor_id, row.owner_id, row.target_id) == ("5", 7, "9")
    assert row.details == event.details
    assert event_hash(row) == event.hash


@pytest.mark.parametrize("number", [float("nan"), float("inf"), float("-inf")])
def test_numbers_jsonb_cannot_hold_are_refused(db_session, number):
    with pytest.raises(ValueError, match="cannot hold"):
        record_event(db_session, action="test.types", actor=SYSTEM, details={"x": number})


def test_verify_says_ok_on_an_intact_chain(runner, db_session):
    events = record(db_session, 3)
    exit_code, output = verify_cli(runner, db_session)
    assert exit_code == 0
    assert output.startswith("OK: ")
    assert f"chain head seq {events[-1].seq} hash {events[-1].hash}," in output


# -- tampering ------------------------------------------------------------------------------

@pytest.mark.parametrize("change", [
    "details = '{\"before\": {\"cap\": 1}, \"after\": {\"cap\": 99}}'::jsonb",
    "actor_id = '2'",
    "action = 'test.other'",
    "occurred_at = occurred_at - interval '1 second'",
])
def test_a_changed_row_is_named_by_verify(runner, owner_session, change):
    events = record(owner_session, 3)
    victim = events[1]
    owner_session.execute(text(DISABLE_GUARD))
    owner_session.execute(text(f"UPDATE audit_events SET {change} WHERE id = :id"),
                          {"id": victim.id})
    exit_code, output = verify_cli(runner, owner_session)
    assert exit_code == 1
    assert output == (f"BROKEN at event id {victim.id} (seq {victim.seq}): its content "
                      "does not match its hash (the row was changed after it was written)")


def stored(session, event_id: int) -> SimpleNamespace:
    """The row as the database holds it now (not the session's copy)."""
    table = AuditEvent.__table__
    return SimpleNamespace(**session.execute(select(table).where(table.c.id == event_id))
                           .one()._mapping)


def rehash(session, event_id: int, prev_hash: str) -> str:
    """What a forger does after changing a row: link it and give it a matching hash."""
    row = stored(session, event_id)
    row.prev_hash = prev_hash
    forged = event_hash(row)
    session.execute(text("UPDATE audit_events SET prev_hash = :p, hash = :h WHERE id = :id"),
                    {"p": prev_hash, "h": forged, "id": event_id})
    return forged


def test_a_changed_row_given_a_matching_hash_breaks_the_next_link(runner, owner_session):
    events = record(owner_session, 3)
    owner_session.execute(text(DISABLE_GUARD))
    owner_session.execute(text("UPDATE audit_events SET actor_id = '2' WHERE id = :id"),
                          {"id": events[1].id})
    rehash(owner_session, events[1].id, events[0].hash)
    exit_code, output = verify_cli(runner, owner_session)
    assert exit_code == 1
    assert output == (f"BROKEN at event id {events[2].id} (seq {events[2].seq}): it does "
                      "not link to the event before it")


def test_a_rewritten_tail_is_caught_by_the_checkpoint(runner, owner_session):
    """A forger who changes a row and re-hashes every later one leaves a chain that links;
    the checkpoint written before names the event where it no longer matches."""
    events = record(owner_session, 3)
    checkpoint = checkpoint_chain(owner_session)
    assert (checkpoint.seq, checkpoint.hash) == (events[-1].seq, events[-1].hash)
    owner_session.execute(text(DISABLE_GUARD))
    owner_session.execute(text("UPDATE audit_events SET actor_id = '2' WHERE id = :id"),
                          {"id": events[1].id})
    prev = events[0].hash
    for event in events[1:]:
        prev = rehash(owner_session, event.id, prev)
    exit_code, output = verify_cli(runner, owner_session)
    assert exit_code == 1
    assert output == (f"BROKEN at event id {events[-1].id} (seq {events[-1].seq}): it "
                      "differs from the checkpoint written for it")


def test_a_deleted_event_is_named_by_the_gap_it_leaves(runner, owner_session):
    events = record(owner_session, 3)
    owner_session.execute(text(DISABLE_GUARD))
    owner_session.execute(text("DELETE FROM audit_events WHERE id = :id"),
                          {"id": events[1].id})
    exit_code, output = verify_cli(runner, owner_session)
    assert exit_code == 1
    assert output == (f"BROKEN at event id {events[2].id} (seq {events[2].seq}): sequence "
                      f"jumps from {events[0].seq} to {events[2].seq}: events are missing")


def test_a_log_cut_short_below_its_checkpoint_is_reported(runner, owner_session):
    events = record(owner_session, 3)
    checkpoint_chain(owner_session)
    owner_session.execute(text(DISABLE_GUARD))
    owner_session.execute(text("DELETE FROM audit_events WHERE id = :id"),
                          {"id": events[-1].id})
    exit_code, output = verify_cli(runner, owner_session)
    assert exit_code == 1
    assert output == (f"BROKEN at seq {events[-1].seq}: a checkpoint names seq "
                      f"{events[-1].seq}, but the log ends at seq {events[1].seq}: it was "
                      "cut short")


# -- checkpoints ----------------------------------------------------------------------------

def test_checkpoint_writes_the_head_and_nothing_when_it_has_not_moved(db_session):
    events = record(db_session, 2)
    first = checkpoint_chain(db_session)
    assert (first.seq, first.hash) == (events[-1].seq, events[-1].hash)
    written = db_session.scalar(select(AuditCheckpoint.id).order_by(AuditCheckpoint.id.desc())
                                .limit(1))
    assert checkpoint_chain(db_session) is None
    assert db_session.scalar(select(AuditCheckpoint.id).order_by(AuditCheckpoint.id.desc())
                             .limit(1)) == written
    (later,) = record(db_session, 1)
    second = checkpoint_chain(db_session)
    assert (second.seq, second.hash) == (later.seq, later.hash)
    result = verify_chain(db_session)
    assert result.ok and result.checkpoints >= 2


def test_the_checkpoint_command_says_what_it_wrote(app, runner, db_session):
    (event,) = record(db_session, 1)
    first = runner.invoke(args=["audit", "checkpoint"])
    again = runner.invoke(args=["audit", "checkpoint"])
    assert first.exit_code == 0
    assert first.output.splitlines() == [
        f"Checkpoint at seq {event.seq}: {event.hash}",
        f"Signed anchor of seq {event.seq} appended to {app.config['AUDIT_ANCHOR_PATH']}."]
    assert again.output.strip() == "No new events since the last checkpoint."


# -- concurrency ----------------------------------------------------------------------------

@pytest.fixture
def scratch_database(app) -> Iterator[str]:
    """A database of this test's own, migrated, whose committed events are dropped with
    it: concurrent writers must really commit for each to see the other's event."""
    import psycopg
    from flask_migrate import upgrade
    from psycopg import sql

    from dashboard.embedded import ensure_database

    name = f"{app.config['EMBEDDED_DATABASE']}_chain"
    app_url = make_url(app.config["SQLALCHEMY_DATABASE_URI"]).set(database=name)
    owner_url = make_url(app.config["MIGRATIONS_DATABASE_URI"]).set(database=name)
    admin_url = server_admin_url(app)

    def drop() -> None:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)")
                         .format(sql.Identifier(name)))

    drop()
    ensure_database(admin_url, name, owner=owner_url.username, app_role=app_url.username)
    try:
        scratch = create_app(make_test_config(
            SQLALCHEMY_DATABASE_URI=app_url.render_as_string(hide_password=False),
            MIGRATIONS_DATABASE_URI=owner_url.render_as_string(hide_password=False)))
        with scratch.app_context():
            upgrade()
            db.engine.dispose()
        yield app_url.render_as_string(hide_password=False)
    finally:
        drop()


def test_concurrent_writers_make_one_gap_free_chain(scratch_database):
    engine = create_engine(scratch_database, pool_size=4)
    per_writer, writers = 25, 3
    start = threading.Barrier(writers)
    errors: list[BaseException] = []

    def write(n: int) -> None:
        try:
            start.wait()
            for i in range(per_writer):
                with Session(engine) as session:
                    record_event(session, action=f"test.writer{n}", actor=SYSTEM,
                                 target_type="n", target_id=i)
                    # Hold the lock a moment: the other writers queue on it meanwhile.
                    time.sleep(0.002)
                    session.commit()
        except BaseException as exc:  # surfaced by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(n,)) for n in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    try:
        assert errors == []
        with Session(engine) as session:
            seqs = session.scalars(select(AuditEvent.seq).order_by(AuditEvent.seq)).all()
            result = verify_chain(session)
            writers_seen = session.scalars(select(AuditEvent.action).distinct()).all()
        assert seqs == list(range(1, per_writer * writers + 1))
        assert result.ok, result.describe()
        assert result.events == per_writer * writers
        assert sorted(writers_seen) == [f"test.writer{n}" for n in range(writers)]
    finally:
        engine.dispose()
