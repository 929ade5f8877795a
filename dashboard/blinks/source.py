"""Blinks as a memory source: each Blink not excluded from memory."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from dashboard.blinks.models import Blink
from dashboard.sources import BLINKS, Record, Source, Watch


def extract_blinks(session: Session, user_id: int) -> list[Record]:
    rows = session.execute(
        select(Blink.id, Blink.title, Blink.content)
        .where(Blink.user_id == user_id, Blink.excluded_from_memory.is_(False))
        .order_by(Blink.id)
    ).all()
    return [
        Record(BLINKS, str(id_), f"{title}\n{content}" if title else content)
        for id_, title, content in rows
    ]


BLINKS_SOURCE = Source(
    BLINKS, "Your Blinks", True, "each Blink not excluded from memory", extract_blinks,
    (Watch(Blink, "user_id", frozenset({"title", "content", "excluded_from_memory"})),))
