"""Blinks as a memory source: each Blink not excluded from memory."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from dashboard.blinks.models import Blink
from dashboard.sources import BLINKS, Record, Source, Watch, by_user


def extract_many_blinks(session: Session, user_ids: list[int]) -> dict[int, list[Record]]:
    rows = session.execute(
        select(Blink.user_id, Blink.id, Blink.title, Blink.content, Blink.created_at)
        .where(Blink.user_id.in_(user_ids), Blink.excluded_from_memory.is_(False))
        .order_by(Blink.user_id, Blink.id)
    )
    return by_user(rows, lambda r: Record(BLINKS, str(r.id),
                                          f"{r.title}\n{r.content}" if r.title else r.content,
                                          r.created_at))


BLINKS_SOURCE = Source(
    BLINKS, "Your Blinks", True, "each Blink not excluded from memory", extract_many_blinks,
    (Watch(Blink, "user_id", frozenset({"title", "content", "excluded_from_memory"})),))
