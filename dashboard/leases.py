"""Leases: a periodic task runs once per interval across every worker, whichever wins
the compare-and-set on the task's row."""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import DateTime, String, func
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.orm import Mapped, Session, mapped_column

from dashboard.extensions import db


class MaintenanceLease(db.Model):
    """When a periodic task last ran, across every worker."""

    __tablename__ = "maintenance_leases"

    task: Mapped[str] = mapped_column(String(32), primary_key=True)
    last_run_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    holder: Mapped[str] = mapped_column(String(128), default="", server_default="")


def claim_lease(session: Session, task: str, every_seconds: float, holder: str = "") -> bool:
    """True for exactly one caller per interval, however many workers ask at once.

    Commits the claim on its own: the task that follows runs in later transactions."""
    stmt = pg_insert(MaintenanceLease).values(task=task, last_run_at=func.clock_timestamp(),
                                              holder=holder[:128])
    stmt = stmt.on_conflict_do_update(
        index_elements=[MaintenanceLease.task],
        set_={"last_run_at": func.clock_timestamp(), "holder": stmt.excluded.holder},
        where=MaintenanceLease.last_run_at
        <= func.clock_timestamp() - timedelta(seconds=every_seconds),
    ).returning(MaintenanceLease.task)
    won = session.execute(stmt).first() is not None
    session.commit()
    return won
