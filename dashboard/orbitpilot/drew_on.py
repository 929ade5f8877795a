"""What a reply drew on ("Drew on"), as pages show it: each item read from memory now
(so a forgotten one leaves every list), whose it is, and who saved a team's."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, aliased

from dashboard.access import Action, Reach, may, reach_of
from dashboard.memory import RELEVANT, MemoryChunk
from dashboard.orbitpilot.models import Message, ReplyRecall
from dashboard.orbitpilot.responder import MemoryHit, one_line, recalled_as
from dashboard.saved_memories.models import Memory
from dashboard.saved_memories.reach import attribute
from dashboard.sources import CHAT_HISTORY, PROFILE, SAVED, get_source, source_keys

DREW_ON_TITLE_CHARS = 80

PERSONAL = "personal"


@dataclass(frozen=True)
class DrewOn:
    """One item a reply drew on, as the page shows it (``item`` is its words, read from
    memory now; ``message_id``: for a chat pair, the user turn it stands for). Whose it
    is: ``owner`` is ``personal`` or the team's slug, ``team`` the team's name; a team's
    saved memory says who saved it with what (``saved_by``, from the credential)."""

    recall_id: int
    source_key: str
    source_id: str
    distance: float
    item: str
    message_id: int | None = None
    owner: str = PERSONAL
    team: str | None = None
    saved_by: str | None = None
    may_forget: bool = False  # a team's item: the person's role there lets them forget it
    relevance: str = RELEVANT  # or POSSIBLY_RELATED: recall was not sure of it

    @property
    def kind(self) -> str:
        label = get_source(self.source_key).label if self.source_key in source_keys() \
            else self.source_key
        return recalled_as(MemoryHit(self.source_key, label, self.source_id, "", 0.0,
                                     team=self.team))

    @property
    def whose(self) -> str:
        """Personal, or which team's."""
        return "Personal" if self.team is None else f"Team {self.team}"

    @property
    def title(self) -> str:
        first = next((line for line in self.item.splitlines() if line.strip()), "")
        if self.source_key == CHAT_HISTORY and first.startswith("User: "):
            first = first[len("User: "):]
        return "" if self.source_key == PROFILE else one_line(first, DREW_ON_TITLE_CHARS)

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.recall_id, "source": self.source_key, "item_id": self.source_id,
                "distance": round(self.distance, 4), "kind": self.kind, "title": self.title,
                "owner": self.owner, "team": self.team, "saved_by": self.saved_by,
                "relevance": self.relevance}


def drew_on_of(session: Session, conversation_id: int) -> dict[int, tuple[DrewOn, ...]]:
    """Each reply's "Drew on" in one query: an item shows while some chunk of it is in
    memory (its own chunk first), so a forgotten item leaves every list at once; one
    marked "not relevant" is left out, and so is a team's the person no longer reaches
    (membership is read now: one query more, only if a reply drew on a team's memory).
    A chat pair also names its user turn, a team's saved memory who saved it (a few
    queries more, only if there is one)."""
    chunk = aliased(MemoryChunk)
    item_text = (
        select(chunk.content)
        .where(chunk.user_id == ReplyRecall.owner_id,
               chunk.source_key == ReplyRecall.source_key,
               chunk.source_id == ReplyRecall.source_id)
        .order_by((chunk.id == ReplyRecall.chunk_id).desc(), chunk.chunk_index)
        .limit(1).scalar_subquery()
    )
    rows = session.execute(
        select(ReplyRecall.id, ReplyRecall.message_id, ReplyRecall.source_key,
               ReplyRecall.source_id, ReplyRecall.distance, item_text, ReplyRecall.user_id,
               ReplyRecall.owner_id, ReplyRecall.relevance)
        .join(Message, Message.id == ReplyRecall.message_id)
        .where(Message.conversation_id == conversation_id, ReplyRecall.not_relevant.is_(False))
        .order_by(ReplyRecall.message_id, ReplyRecall.rank)
    ).all()
    rows = [row for row in rows if row[5] is not None]
    if not rows:
        return {}
    user_id = rows[0].user_id
    reach = reach_of(session, user_id) if any(r.owner_id != user_id for r in rows) \
        else Reach.personal(user_id)
    rows = [row for row in rows if reach.reaches(row.owner_id)]
    items = shown_drew_on(session, reach, [
        (id_, key, source_id, distance, item, owner, relevance)
        for id_, _, key, source_id, distance, item, _, owner, relevance in rows])
    out: dict[int, list[DrewOn]] = {}
    for row, shown in zip(rows, items, strict=True):
        out.setdefault(row.message_id, []).append(shown)
    return {message_id: tuple(shown) for message_id, shown in out.items()}


def shown_drew_on(session: Session, reach: Reach,
                  rows: list[tuple[int, str, str, float, str, int, str]]
                  ) -> tuple[DrewOn, ...]:
    """``(recall id, source, item id, distance, words, owner, relevance)`` rows as shown:
    whose each
    is, a chat pair with the user turn it stands for (one query, only if there is a
    pair), a team's saved memory with who saved it (``attribute``: a few queries, only
    if there is one)."""
    turns = _pair_turns(session, {source_id for _, key, source_id, _, _, _, _ in rows
                                  if key == CHAT_HISTORY})
    saved_by = _saved_by(session, reach, [(source_id, owner)
                                          for _, key, source_id, _, _, owner, _ in rows
                                          if key == SAVED and reach.seat_of(owner)])
    shown = []
    for id_, key, source_id, distance, item, owner, relevance in rows:
        seat = reach.seat_of(owner)
        memory = saved_by.get(source_id) if seat is not None else None
        shown.append(DrewOn(
            id_, key, source_id, distance, item,
            turns.get(source_id) if key == CHAT_HISTORY else None,
            owner=seat.slug if seat else PERSONAL, team=seat.name if seat else None,
            saved_by=memory[0] if memory else None,
            may_forget=memory[1] if memory else False, relevance=relevance))
    return tuple(shown)


def _saved_by(session: Session, reach: Reach, items: list[tuple[str, int]]
              ) -> dict[str, tuple[str, bool]]:
    """For each team memory (id, owner): "Saved by <member> via <credential>", and whether
    the person's role there lets them delete it."""
    ids = set()
    for source_id, _ in items:
        try:
            ids.add(uuid.UUID(source_id))
        except ValueError:
            continue
    if not ids:
        return {}
    memories = list(session.scalars(select(Memory).where(
        Memory.id.in_(ids), Memory.owner_id.in_(sorted({owner for _, owner in items})))))
    said = attribute(session, reach, memories)
    out = {}
    for memory in memories:
        seat = reach.seat_of(memory.owner_id)
        out[str(memory.id)] = (said[memory.id].sentence, seat is not None and may(
            seat, Action.FORGET, author=memory.author_id == reach.user_id))
    return out


def _pair_turns(session: Session, pair_ids: set[str]) -> dict[str, int]:
    """The user turn each chat pair ``"<conversation>:<n>"`` stands for (its n-th)."""
    conversations = {int(p.split(":", 1)[0]) for p in pair_ids if p.split(":", 1)[0].isdigit()}
    if not conversations:
        return {}
    rows = session.execute(
        select(Message.id, Message.conversation_id).where(
            Message.conversation_id.in_(conversations), Message.role == "user")
        .order_by(Message.conversation_id, Message.position)
    ).all()
    turns: dict[str, int] = {}
    counts: dict[int, int] = {}
    for id_, conversation in rows:
        n = counts.get(conversation, 0)
        counts[conversation] = n + 1
        turns[f"{conversation}:{n}"] = id_
    return {p: turns[p] for p in pair_ids if p in turns}
