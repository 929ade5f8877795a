"""The erasure VACUUM: after redactions and hard deletes, VACUUM the memory tables on an
autocommit connection of its own, then stamp ``vacuumed_at`` on exactly the receipts whose
old row versions it really removed — committed before it started, and it really ran and
really removed them (docs/architecture/erasure.md)."""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import bindparam, text
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.orm import Session, scoped_session
from sqlalchemy.types import BigInteger, DateTime

from dashboard.database import VACUUMED_TABLES

log = logging.getLogger(__name__)

# The markers waiting for a VACUUM, and whether a VACUUM starting now could remove what
# their forget left behind. ``age(x) > age(y)``: x precedes y (wraparound-safe; a frozen
# xmin has the largest age). Every horizon term may be NULL (nothing running, no slot).
_PENDING = text("""
WITH horizon AS (
    SELECT max(held) AS age FROM (
        SELECT age(xid(pg_snapshot_xmin(pg_current_snapshot()))) AS held
        UNION ALL
        SELECT greatest(age(backend_xmin), age(backend_xid)) FROM pg_stat_activity
        WHERE pid <> pg_backend_pid()
          AND (datid IS NULL
               OR datid = (SELECT oid FROM pg_database WHERE datname = current_database()))
        UNION ALL
        SELECT age(xmin) FROM pg_replication_slots
    ) AS held
)
SELECT m.id, horizon.age IS NULL OR age(m.xmin) > horizon.age AS clear
FROM forget_markers AS m CROSS JOIN horizon
WHERE m.vacuum_due AND m.vacuumed_at IS NULL
ORDER BY m.id
""")

# A table's manual VACUUM count, and the dead row versions left in it and its TOAST table.
_TABLE_STATS = text("""
SELECT coalesce(sum(s.vacuum_count) FILTER (WHERE s.relid = c.oid), 0),
       coalesce(sum(s.n_dead_tup), 0)
FROM pg_class AS c JOIN pg_stat_all_tables AS s ON s.relid IN (c.oid, c.reltoastrelid)
WHERE c.oid = to_regclass(:table)
""")

_STAMP = text("""
UPDATE forget_markers SET vacuumed_at = :at
WHERE id = ANY(:ids) AND vacuum_due AND vacuumed_at IS NULL
""").bindparams(bindparam("ids", type_=ARRAY(BigInteger)),
                bindparam("at", type_=DateTime(timezone=True)))


@dataclass(frozen=True)
class VacuumResult:
    pending: int  # markers waiting for a VACUUM when the job looked
    stamped: int  # markers given their vacuumed_at by this run
    vacuumed: tuple[str, ...] = ()  # tables VACUUM really ran on
    refused: tuple[str, ...] = ()  # tables it was asked to VACUUM but skipped or refused
    # Dead row versions each vacuumed table (with its TOAST table) still held right after:
    # ones a snapshot could still read, or on a page VACUUM found pinned.
    dead_left: dict[str, int] = field(default_factory=dict)

    @property
    def waiting(self) -> int:
        """Markers still pending after this run."""
        return self.pending - self.stamped

    def describe(self) -> str:
        if not self.pending:
            return "No erasure waits for a VACUUM."
        line = (f"{self.pending} erasure(s) waited for a VACUUM: {self.stamped} stamped, "
                f"{self.waiting} still waiting")
        if self.vacuumed:
            line += f"; vacuumed {', '.join(self.vacuumed)}"
        if self.refused:
            line += f"; could not vacuum {', '.join(self.refused)}"
        elif self.waiting:
            line += "; open transactions could still read what the rest removed"
        return line + "."


def _engine_of(bind: Engine | Connection | Session | scoped_session) -> Engine:
    if isinstance(bind, Session | scoped_session):
        bind = bind.get_bind()
    return bind.engine if isinstance(bind, Connection) else bind


def _stats(conn: Connection, table: str) -> tuple[int, int]:
    runs, dead = conn.execute(_TABLE_STATS, {"table": table}).one()
    return int(runs), int(dead)


# VACUUM VERBOSE's report of each relation it finished: "tuples: N removed, …", and, when
# it had to leave dead versions on pages another backend held pinned, "tuples missed: N
# dead from M pages not removed due to cleanup lock contention".
_FINISHED = re.compile(r"^tuples: \d+ removed", re.MULTILINE)
_MISSED = re.compile(r"^tuples missed: (\d+) dead", re.MULTILINE)


def _vacuum_table(conn: Connection, table: str) -> int | None:
    """VACUUM ``table`` (and its TOAST table); the dead versions it had to leave behind
    on pages it could not lock (contention), or ``None`` when its report could not be read
    (another message language): then nothing proves those pages were cleaned."""
    # INDEX_CLEANUP ON: by default VACUUM may skip the indexes when few pages hold dead
    # rows — exactly the case after a handful of erasures — and their entries (the chunk
    # key's content hash, the embedding in the HNSW graph) would stay behind.
    name = conn.dialect.identifier_preparer.quote(table)
    reports: list[str] = []
    raw = conn.connection.driver_connection

    def keep(diagnostic: Any) -> None:
        reports.append(diagnostic.message_primary or "")

    raw.add_notice_handler(keep)
    try:
        conn.exec_driver_sql(f"VACUUM (INDEX_CLEANUP ON, VERBOSE) {name}")
    finally:
        raw.remove_notice_handler(keep)
    finished = [report for report in reports if _FINISHED.search(report)]
    if not finished:
        return None
    return sum(int(count) for report in finished for count in _MISSED.findall(report))


def _analyze_table(conn: Connection, table: str) -> None:
    # After the dead count is read: ANALYZE replaces it with an estimate from a sample.
    conn.exec_driver_sql(f"ANALYZE {conn.dialect.identifier_preparer.quote(table)}")


def vacuum_after_erasures(bind: Engine | Connection | Session | scoped_session, *,
                          now: datetime | None = None) -> VacuumResult:
    """VACUUM the memory tables if redactions or hard deletes wait for it, then stamp
    ``vacuumed_at`` on exactly the markers it removed the old rows of (see the module).

    ``bind`` only names the database: the work runs on a new autocommit connection of its
    engine, outside any transaction the caller has open. ``now``: the time to record
    (default: when the VACUUM finished)."""
    engine = _engine_of(bind)
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        markers = conn.execute(_PENDING).all()
        if not markers:
            return VacuumResult(pending=0, stamped=0)
        vacuumed, refused, dead_left = [], [], {}
        missed: int | None = 0
        for table in VACUUMED_TABLES:
            runs_before, _ = _stats(conn, table)
            left_on_pinned = _vacuum_table(conn, table)
            missed = None if missed is None or left_on_pinned is None \
                else missed + left_on_pinned
            runs_after, dead = _stats(conn, table)
            if runs_after > runs_before:
                vacuumed.append(table)
                dead_left[table] = dead
                _analyze_table(conn, table)
            else:
                refused.append(table)
        if refused:
            # No exception text, no statement: which tables, and what it means.
            log.warning("erasure vacuum: VACUUM did not run on %s (the app role needs "
                        "MAINTAIN on them, PostgreSQL 17+); %d erasure receipt(s) stay "
                        "pending", ", ".join(refused), len(markers))
            return VacuumResult(pending=len(markers), stamped=0, vacuumed=tuple(vacuumed),
                                refused=tuple(refused), dead_left=dead_left)
        if not any(dead_left.values()):
            ids = [marker_id for marker_id, _ in markers]
        elif missed == 0:
            # What remains is only what open snapshots may still read: the markers whose
            # forget precedes all of them were removed.
            ids = [marker_id for marker_id, clear in markers if clear]
        else:
            # Dead versions were left on pinned pages (or the report could not be read):
            # any erasure's may be among them, so none is stamped this time.
            ids = []
        if dead_left and any(dead_left.values()):
            log.info("erasure vacuum: dead row versions remain after the VACUUM (%s)%s",
                     ", ".join(f"{t} {n}" for t, n in dead_left.items() if n),
                     "" if missed == 0 else "; some on pages it could not lock")
        stamped = conn.execute(_STAMP, {"ids": ids, "at": now or datetime.now(UTC)}
                               ).rowcount if ids else 0
    return VacuumResult(pending=len(markers), stamped=stamped or 0, vacuumed=tuple(vacuumed),
                        dead_left=dead_left)
