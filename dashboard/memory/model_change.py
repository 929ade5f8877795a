"""A changed embedding model is a rebuild of every user's memory: the periodic task asks
for a batch of full builds at a time, and what is left is read from the data (each user's
last build names its model), so a stopped worker resumes where it was. Until a user's
rebuild commits, their recall runs in the old model's vectors (``search_memory``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, exists, func, select
from sqlalchemy.orm import Session

from dashboard.memory.models import MemoryBuild, MemoryState
from dashboard.memory.requests import request_builds

MODEL_CHANGE = "model_change"
WAITING = ("queued", "running")


def _waiting() -> Any:
    """SQL: how many model-change builds are queued or running."""
    return (select(func.count()).select_from(MemoryBuild)
            .where(MemoryBuild.trigger == MODEL_CHANGE, MemoryBuild.status.in_(WAITING))
            .scalar_subquery())


@dataclass(frozen=True)
class ModelChange:
    """Where the rebuild into ``model`` stands (``left``: users still in another model)."""

    model: str
    done: int
    left: int
    in_flight: int

    @property
    def total(self) -> int:
        return self.done + self.left

    @property
    def under_way(self) -> bool:
        return self.left > 0


def model_change_progress(session: Session, model: str) -> ModelChange:
    """Two counts, one query: users whose memory is in ``model``, and the rest."""
    in_model = MemoryState.embedding_model == model
    done, left, in_flight = session.execute(select(
        func.count().filter(in_model), func.count().filter(~in_model), _waiting(),
    ).select_from(MemoryState)).one()
    return ModelChange(model, done or 0, left or 0, in_flight or 0)


def request_model_change_builds(session: Session, *, model: str, batch: int) -> int:
    """Full builds for the next users still in another model, keeping at most ``batch``
    of them waiting: the queue is never flooded, and users' own builds go on meanwhile.
    A user with a build waiting already is left for the next round."""
    waiting = session.scalar(select(_waiting())) or 0
    room = batch - waiting
    if room <= 0:
        return 0
    busy = exists().where(and_(MemoryBuild.user_id == MemoryState.user_id,
                               MemoryBuild.status.in_(WAITING)))
    user_ids = session.scalars(
        select(MemoryState.user_id)
        .where(MemoryState.embedding_model != model, ~busy)
        .order_by(MemoryState.user_id).limit(room)
    ).all()
    request_builds(session, user_ids, mode="full", trigger=MODEL_CHANGE)
    return len(user_ids)
