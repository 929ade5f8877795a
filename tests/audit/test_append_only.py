"""The audit table refuses UPDATE, DELETE and TRUNCATE at the database level (§8)."""

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError


def insert_event(db_session, seq: int) -> None:
    db_session.execute(text(
        "INSERT INTO audit_events (seq, action, actor_type, details, prev_hash, hash) "
        "VALUES (:seq, 'test', 'system', '{}'::jsonb, :prev, :hash)"
    ), {"seq": seq, "prev": "0" * 64, "hash": f"{seq:064d}"})


@pytest.mark.parametrize("statement", [
    "UPDATE audit_events SET action = 'tampered'",
    "DELETE FROM audit_events",
    "TRUNCATE audit_events",
])
def test_audit_events_refuse_changes(db_session, statement):
    insert_event(db_session, 1)
    with pytest.raises(DBAPIError, match="append-only"), db_session.begin_nested():
        db_session.execute(text(statement))
    assert db_session.scalar(text("SELECT count(*) FROM audit_events")) == 1
