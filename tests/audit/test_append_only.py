"""The audit log is append-only at the database level: the app's own role may only
read and append, and cannot switch the guard off; the owner is stopped by triggers."""

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.exc import DBAPIError

EVENT = ("INSERT INTO audit_events (seq, action, actor_type, details, prev_hash, hash) "
         "VALUES (:seq, 'test', 'system', '{}'::jsonb, :prev, :hash)")
CHECKPOINT = "INSERT INTO audit_checkpoints (seq, hash) VALUES (:seq, :hash)"
CHANGES = [
    "UPDATE audit_events SET action = 'tampered'",
    "DELETE FROM audit_events",
    "TRUNCATE audit_events",
]
# The checkpoints vouch for the chain head: rewriting one would hide a log cut short.
CHECKPOINT_CHANGES = [
    "UPDATE audit_checkpoints SET seq = seq - 1",
    "DELETE FROM audit_checkpoints",
    "TRUNCATE audit_checkpoints",
]


def insert_event(conn, seq: int) -> None:
    """An event ``seq`` places after whatever the log already holds (other tests commit
    events, and nobody can delete them)."""
    seq += conn.scalar(text("SELECT coalesce(max(seq), 0) FROM audit_events"))
    conn.execute(text(EVENT), {"seq": seq, "prev": "0" * 64, "hash": f"{seq:064d}"})


def insert_checkpoint(conn, seq: int) -> None:
    conn.execute(text(CHECKPOINT), {"seq": seq, "hash": f"{seq:064d}"})


def count(conn, table: str) -> int:
    return conn.scalar(text(f"SELECT count(*) FROM {table}"))


@pytest.fixture
def owner_conn(app):
    """A connection as the owner role (the one migrations run as), rolled back after."""
    engine = create_engine(app.config["MIGRATIONS_DATABASE_URI"])
    with engine.connect() as conn:
        transaction = conn.begin()
        yield conn
        transaction.rollback()
    engine.dispose()


@pytest.mark.parametrize("statement", CHANGES)
def test_the_app_role_may_not_change_audit_events(db_session, statement):
    insert_event(db_session, 1)
    before = count(db_session, "audit_events")
    with pytest.raises(DBAPIError, match="permission denied for table audit_events"), \
            db_session.begin_nested():
        db_session.execute(text(statement))
    assert count(db_session, "audit_events") == before


@pytest.mark.parametrize("statement", CHECKPOINT_CHANGES)
def test_the_app_role_may_not_change_audit_checkpoints(db_session, statement):
    insert_checkpoint(db_session, 10**12)
    before = count(db_session, "audit_checkpoints")
    with pytest.raises(DBAPIError, match="permission denied for table audit_checkpoints"), \
            db_session.begin_nested():
        db_session.execute(text(statement))
    assert count(db_session, "audit_checkpoints") == before


@pytest.mark.parametrize("statement", [
    "ALTER TABLE audit_events DISABLE TRIGGER audit_events_no_update_delete",
    "ALTER TABLE audit_events DISABLE TRIGGER ALL",
    "DROP TRIGGER audit_events_no_update_delete ON audit_events",
    "SET session_replication_role = replica",
    "ALTER TABLE audit_checkpoints DISABLE TRIGGER audit_checkpoints_no_update_delete",
    "DROP TRIGGER audit_checkpoints_no_truncate ON audit_checkpoints",
])
def test_the_app_role_cannot_switch_the_guard_off(db_session, statement):
    with pytest.raises(DBAPIError, match="must be owner|permission denied"), \
            db_session.begin_nested():
        db_session.execute(text(statement))


def test_the_app_role_owns_nothing_and_holds_no_special_powers(db_session):
    me = db_session.scalar(text("SELECT current_user"))
    owned = db_session.scalar(text(
        "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = 'public' AND pg_get_userbyid(c.relowner) = current_user"))
    powers = db_session.execute(text(
        "SELECT rolsuper, rolcreatedb, rolcreaterole, rolbypassrls FROM pg_roles "
        "WHERE rolname = current_user")).one()
    assert me == "orbitpilot_app"
    assert owned == 0
    assert tuple(powers) == (False, False, False, False)


@pytest.mark.parametrize("statement", CHANGES)
def test_even_the_owner_is_refused_by_the_triggers(owner_conn, statement):
    insert_event(owner_conn, 1)
    before = count(owner_conn, "audit_events")
    with pytest.raises(DBAPIError, match="append-only"), owner_conn.begin_nested():
        owner_conn.execute(text(statement))
    assert count(owner_conn, "audit_events") == before


@pytest.mark.parametrize("statement", CHECKPOINT_CHANGES)
def test_even_the_owner_is_refused_by_the_checkpoint_triggers(owner_conn, statement):
    insert_checkpoint(owner_conn, 10**12)
    before = count(owner_conn, "audit_checkpoints")
    with pytest.raises(DBAPIError, match="append-only"), owner_conn.begin_nested():
        owner_conn.execute(text(statement))
    assert count(owner_conn, "audit_checkpoints") == before
