"""Erasure leaves nothing behind: a memory whose content, metadata and earlier version carry
a unique canary is saved, changed, built, then redacted or hard-deleted — all committed,
through the real runner. Afterwards the canary is in no text, char, array or json column
of any table (read from the catalogue, so a table added later is covered), in no log
record (root logger at DEBUG) and in no queued job. A second canary given as replacement
text may be in ``memories.content`` and nowhere else, and goes with a hard delete."""

from __future__ import annotations

import json
import logging

import pytest
from sqlalchemy import select, text

from dashboard.audit.services import Actor
from dashboard.extensions import db
from dashboard.memory import MemoryBuild
from dashboard.saved_memories import find_memory, forget_memory, save_memory, update_memory
from tests.factories import ALL_SCOPES
from tests.saved_memories.helpers import (
    unique_canary,
)
from tests.workers import run_build

SCANNED_TYPES = ("text", "character varying", "character", "json", "jsonb", "ARRAY")
REASON = "the owner asked for this to be erased"
WHERE_IT_LIVES = {("memories", "content"), ("memories", "metadata"),
                  ("memory_versions", "content"), ("memory_versions", "metadata"),
                  ("memory_chunks", "content")}


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def scanned_columns() -> list[tuple[str, str]]:
    with db.engine.connect() as conn:
        return [tuple(row) for row in conn.execute(text(
            "SELECT c.table_name, c.column_name FROM information_schema.columns c "
            "JOIN information_schema.tables t "
            "  ON t.table_schema = c.table_schema AND t.table_name = c.table_name "
            "WHERE c.table_schema = 'public' AND t.table_type = 'BASE TABLE' "
            "  AND c.data_type = ANY(:types) "
            "ORDER BY c.table_name, c.ordinal_position"), {"types": list(SCANNED_TYPES)})]


def where_is(needle: str) -> set[tuple[str, str]]:
    """Every (table, column) of the public schema holding ``needle`` in some row."""
    columns = scanned_columns()
    statement = " UNION ALL ".join(
        f"SELECT {n} AS i FROM {_quote(table)} "
        f"WHERE strpos(CAST({_quote(column)} AS text), :needle) > 0"
        for n, (table, column) in enumerate(columns))
    with db.engine.connect() as conn:
        hits = {row.i for row in conn.execute(text(statement), {"needle": needle})}
    return {columns[i] for i in hits}


def in_logs(caplog, needle: str) -> list[str]:
    return [f"{r.name}: {r.getMessage()}" for r in caplog.records
            if needle in r.getMessage() or needle in (r.exc_text or "")]


def in_jobs(queue, needle: str) -> list[str]:
    found = []
    for job in queue.jobs:
        blob = json.dumps([job.func_name, job.args, job.kwargs, job.description, job.meta],
                          default=str)
        if needle in blob:
            found.append(job.id)
    return found


def run_queued_build(session, user_id: int) -> None:
    session.expire_all()
    build_id = session.scalar(select(MemoryBuild.id).where(MemoryBuild.user_id == user_id,
                                                           MemoryBuild.status == "queued"))
    assert build_id is not None
    assert run_build(build_id) == "succeeded"


@pytest.fixture
def scenario(app, committed, queue, caplog):
    """A committed memory whose content, metadata and earlier version hold the canary,
    built into chunks; logs captured at DEBUG from the start."""
    caplog.set_level(logging.DEBUG)
    canary = unique_canary()
    owner = committed.user()
    session = committed.session
    actor = Actor("api_key", "1")
    saved = save_memory(session, owner=owner, content=f"The garage door code is {canary}.",
                        metadata={"note": f"from {canary}", canary: "as a key"},
                        source="chatgpt", actor=actor)
    session.commit()
    memory_id = saved.memory.id
    memory = find_memory(session, owner.id, memory_id)
    update_memory(session, memory, content=f"The garage door code changed; it was {canary}.",
                  metadata={"note": f"still {canary}"}, actor=actor)
    session.commit()
    run_queued_build(session, owner.id)
    # The scan finds the canary where it lives before the erasure (it can fail).
    assert where_is(canary) == WHERE_IT_LIVES
    return {"canary": canary, "owner": owner, "memory_id": memory_id, "actor": actor,
            "session": session, "queue": queue, "caplog": caplog}


def test_the_scan_reads_every_table_the_catalogue_lists(app):
    with app.app_context():
        columns = set(scanned_columns())
        with db.engine.connect() as conn:
            tables = set(conn.scalars(text(
                "SELECT tablename FROM pg_tables WHERE schemaname = 'public'")))
    assert {table for table, _ in columns} <= tables
    assert {("audit_events", "details"), ("audit_events", "target_id"),
            ("forget_markers", "reason"), ("memory_builds", "resolution"),
            ("memory_builds", "error"), ("api_keys", "scopes"), *WHERE_IT_LIVES} <= columns


def assert_nowhere(s, needle: str) -> None:
    assert where_is(needle) == set()
    assert in_logs(s["caplog"], needle) == []
    assert in_jobs(s["queue"], needle) == []


@pytest.mark.parametrize("mode", ["redact", "hard_delete"])
def test_after_erasure_the_canary_is_in_no_table_log_or_job(scenario, mode):
    s = scenario
    session, owner = s["session"], s["owner"]
    receipt = forget_memory(session, owner.id, s["memory_id"], mode=mode, actor=s["actor"],
                            scopes=ALL_SCOPES, reason=REASON)
    session.commit()
    run_queued_build(session, owner.id)  # the build the erasure asked for
    assert s["canary"] not in json.dumps(receipt.to_dict())
    assert_nowhere(s, s["canary"])


def test_a_soft_delete_keeps_the_content_restorable_but_out_of_chunks(scenario):
    """The contrast: a soft delete is not an erasure — content and versions stay (for a
    restore), only the chunks go; and still nothing reaches markers, audit or logs."""
    s = scenario
    session, owner = s["session"], s["owner"]
    forget_memory(session, owner.id, s["memory_id"], mode="soft_delete", actor=s["actor"],
                  scopes=ALL_SCOPES, reason=REASON)
    session.commit()
    assert where_is(s["canary"]) == WHERE_IT_LIVES - {("memory_chunks", "content")}
    assert in_logs(s["caplog"], s["canary"]) == []
    assert in_jobs(s["queue"], s["canary"]) == []


def test_replacement_text_lives_only_in_the_memorys_content(scenario):
    s = scenario
    session, owner = s["session"], s["owner"]
    replacement = unique_canary("REPLACEMENT")
    receipt = forget_memory(session, owner.id, s["memory_id"], mode="redact",
                            actor=s["actor"], scopes=ALL_SCOPES, reason=REASON,
                            replacement_content=f"A door code was here ({replacement}).")
    session.commit()
    run_queued_build(session, owner.id)
    assert where_is(replacement) == {("memories", "content")}
    assert replacement not in json.dumps(receipt.to_dict())
    assert in_logs(s["caplog"], replacement) == []
    assert in_jobs(s["queue"], replacement) == []
    assert_nowhere(s, s["canary"])

    forget_memory(session, owner.id, s["memory_id"], mode="hard_delete", actor=s["actor"],
                  scopes=ALL_SCOPES, reason=REASON)
    session.commit()
    assert_nowhere(s, replacement)
    assert_nowhere(s, s["canary"])
