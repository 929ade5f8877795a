"""Saved memories as a caller reaches them: their own and those of each team their
``Reach`` holds (``dashboard.access``), every rule of ``services`` still applying. Saving
to a team is deliberate (a team named), a personal memory is shared as a copy with its
provenance, and every memory says who saved it with which credential — the person, the
API key, the registered app — never what a client called itself (that is shown as its
claim). docs/architecture/teams.md."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, Integer, String, and_, column, select, table
from sqlalchemy.orm import Session

from dashboard.access import (
    ACTION_FOR_MODE,
    Action,
    Reach,
    TeamSeat,
    may,
    members_among,
    note_activity,
)
from dashboard.audit.services import Actor, record_event
from dashboard.auth.models import User
from dashboard.demotions import demote, demoted_for, widened
from dashboard.memory import Embedder, RecallCut
from dashboard.refusals import Forbidden, NotFound
from dashboard.saved_memories import editing, forgetting, listing, reading, receipts, rules
from dashboard.saved_memories.listing import Page
from dashboard.saved_memories.models import ApiKey, ForgetMarker, Memory
from dashboard.saved_memories.reading import Recalled
from dashboard.saved_memories.rules import (
    GONE,
    NOT_FOUND,
    InvalidMemoryInput,
    MemoryConflict,
    MemoryGone,
    MemoryNotFound,
    Scopes,
    check_scope,
    parse_memory_id,
)

PERSONAL = "personal"
# The connected apps' table, read for attribution only (its domain builds on this one).
CLIENTS = table("oauth_clients", column("id", Integer), column("client_id", String),
                column("name", String), column("kind", String))
# Operations (the scope table's names) → what the caller's team role must allow.
ACTION_FOR_OPERATION = {"get": Action.READ, "update": Action.EDIT, **ACTION_FOR_MODE}
NO_SUCH_TEAM = "You are in no team with that name, or this key or app may not act for it."


class TeamNotReached(NotFound):
    """A team the caller is not in, or their credential does not name: alike."""

    def __init__(self) -> None:
        super().__init__(NO_SUCH_TEAM, "team")


class RoleTooLow(Forbidden):
    """A member whose role (or the team's policy) does not allow this."""


def seat_for(reach: Reach, team: object) -> TeamSeat | None:
    """The team ``team`` (a slug) names, or None for the caller's own memory (no team,
    or ``personal``). A team out of reach: ``TeamNotReached``."""
    if team in (None, "", PERSONAL):
        return None
    seat = reach.by_slug(team) if isinstance(team, str) else None
    if seat is None:
        raise TeamNotReached()
    return seat


def _refuse(seat: TeamSeat, action: Action) -> None:
    what = {Action.WRITE: "save to it", Action.SHARE: "share to it",
            Action.EDIT: "change this memory", Action.FORGET: "delete or restore this memory",
            Action.REDACT: "redact this memory",
            Action.HARD_DELETE: "erase this memory for good"}.get(action, str(action))
    raise RoleTooLow(f"Your role in {seat.name} ({seat.role}) does not let you {what}.")


# -- saving ----------------------------------------------------------------------------------

def save_for(session: Session, reach: Reach, *, team: object = None, content: object,
             metadata: object = None, source: object = "api", actor: Actor,
             api_key_id: int | None = None, oauth_client_pk: int | None = None,
             client_name: str | None = None, scopes: Scopes = None) -> editing.Saved:
    """Save to the caller's own memory, or to the team ``team`` names if their role may
    write there; the caller is its author, with the credential that carried the call."""
    check_scope(scopes, "save")
    seat = seat_for(reach, team)
    if seat is not None and not may(seat, Action.WRITE):
        _refuse(seat, Action.WRITE)
    owner = session.get(User, seat.team_id if seat else reach.user_id)
    if seat is not None:
        note_activity(session, seat.team_id, reach.user_id)
    return editing.save_memory(session, owner=owner, content=content, metadata=metadata,
                                source=source, actor=actor, api_key_id=api_key_id,
                                client_name=client_name, author_id=reach.user_id,
                                oauth_client_pk=oauth_client_pk)


def share_to_team(session: Session, reach: Reach, memory_id: object, team: object, *,
                  actor: Actor, api_key_id: int | None = None,
                  oauth_client_pk: int | None = None, scopes: Scopes = None
                  ) -> editing.Saved:
    """Copy one of the caller's own active memories to a team, with its provenance (the
    original's id): deliberate, never silent; the original stays the caller's. Shared
    again (a second click, a retry) while the copy is active: that copy, not another
    (``created`` False); the original's row lock makes two requests at once take turns."""
    check_scope(scopes, "save")
    seat = seat_for(reach, team)
    if seat is None:
        raise InvalidMemoryInput("Name the team to share to.", "team")
    original = rules.find_memory(session, reach.user_id, memory_id, lock=True)
    if not may(seat, Action.SHARE):
        _refuse(seat, Action.SHARE)
    if original.status != "active":
        raise MemoryConflict("Only an active memory can be shared.")
    owner = session.get(User, seat.team_id)
    note_activity(session, seat.team_id, reach.user_id)
    earlier = session.scalars(select(Memory).where(
        Memory.owner_id == seat.team_id, Memory.shared_from_id == original.id,
        Memory.author_id == reach.user_id, Memory.status == "active").limit(1)).first()
    if earlier is not None:
        return editing.saved_before(session, earlier, owner)
    saved = editing.save_memory(session, owner=owner, content=original.content,
                                 metadata=original.metadata_, source=original.source,
                                 actor=actor, api_key_id=api_key_id,
                                 client_name=None, author_id=reach.user_id,
                                 oauth_client_pk=oauth_client_pk,
                                 shared_from_id=original.id)
    record_event(session, action="memory.share", actor=actor, owner_id=seat.team_id,
                 target_type="memory", target_id=str(saved.memory.id),
                 details={"from": str(original.id), "team": seat.team_id})
    return saved


# -- finding ---------------------------------------------------------------------------------

def find_for(session: Session, reach: Reach, memory_id: object, *, operation: str = "get",
             scopes: Scopes = None, lock: bool = False, acting: bool = True) -> Memory:
    """A memory the caller reaches (their own or a team's), if their role there allows
    ``operation``: the scope first (403), then the target (404, the same for someone
    else's and for none; 410 hard-deleted), then the team role (403). A change to a
    team's memory stamps the member's activity there, unless the caller is not about to
    make it (``acting``: a page asking first; the team pages stamp every POST)."""
    check_scope(scopes, operation)
    parsed = parse_memory_id(memory_id)
    if parsed is None:
        raise MemoryNotFound(NOT_FOUND)
    query = select(Memory).where(Memory.id == parsed, Memory.owner_id.in_(reach.owner_ids))
    if lock:
        query = query.with_for_update().execution_options(populate_existing=True)
    memory = session.scalars(query).first()
    if memory is None:
        gone = session.scalar(select(ForgetMarker.id).where(
            ForgetMarker.memory_id == parsed, ForgetMarker.owner_id.in_(reach.owner_ids),
            ForgetMarker.mode == "hard_delete").limit(1))
        raise MemoryGone(GONE) if gone else MemoryNotFound(NOT_FOUND)
    seat = reach.seat_of(memory.owner_id)
    if seat is not None:
        action = ACTION_FOR_OPERATION[operation]
        if not may(seat, action, author=memory.author_id == reach.user_id):
            _refuse(seat, action)
        if acting and action != Action.READ:
            note_activity(session, seat.team_id, reach.user_id)
    return memory


# -- listing ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Filters:
    """Which memories a list or search keeps: a team's (slug) or the caller's own
    (``personal``) or all they reach (None); by author (a person's id); by app (an OAuth
    client_id, ``key:<id>`` for an API key, ``orbitpilot`` for the pages)."""

    team: str | None = None
    author: int | None = None
    app: str | None = None

    @classmethod
    def parse(cls, team: object = None, author: object = None, app: object = None
              ) -> Filters:
        if team is not None and not isinstance(team, str):
            raise InvalidMemoryInput("team is a team's slug, or personal.", "team")
        author_id = None
        if author not in (None, ""):
            try:
                author_id = int(str(author))
            except ValueError:
                raise InvalidMemoryInput("author is a person's id (a number).",
                                         "author") from None
            if not 0 < author_id < 2**31:
                raise InvalidMemoryInput("author is a person's id (a number).", "author")
        if app is not None and (not isinstance(app, str) or not 0 < len(app) <= 2048):
            raise InvalidMemoryInput("app is an app's client_id, key:<id>, or orbitpilot.",
                                     "app")
        return cls(team or None, author_id, app or None)


def _owners(reach: Reach, filters: Filters) -> list[int]:
    if filters.team is None:
        return reach.owner_ids
    seat = seat_for(reach, filters.team)
    return [seat.team_id if seat else reach.user_id]


def _app_condition(session: Session, app: str) -> ColumnElement[bool]:
    if app == "orbitpilot":
        return and_(Memory.api_key_id.is_(None), Memory.oauth_client_pk.is_(None))
    if app.startswith("key:"):
        try:
            key_id = int(app[4:])
        except ValueError:
            raise InvalidMemoryInput("app is an app's client_id, key:<id>, or orbitpilot.",
                                     "app") from None
        return Memory.api_key_id == key_id
    client = select(CLIENTS.c.id).where(CLIENTS.c.client_id == app).scalar_subquery()
    return Memory.oauth_client_pk == client


def _filtered(session: Session, reach: Reach, filters: Filters) -> list[ColumnElement[bool]]:
    where = [Memory.owner_id.in_(_owners(reach, filters))]
    if filters.author is not None:
        where.append(Memory.author_id == filters.author)
    if filters.app is not None:
        where.append(_app_condition(session, filters.app))
    return where


def list_for(session: Session, reach: Reach, *, filters: Filters = Filters(),
             status: str | None = None, limit: object = None, cursor: str | None = None,
             scopes: Scopes = None) -> Page:
    """What the caller reaches (their own and their teams' memories, or as ``filters``
    narrow it), newest first, a page at a time (keyset)."""
    check_scope(scopes, "list")
    size = listing.clamp_limit(limit)
    return listing.page_of(session, select(Memory).where(*_filtered(session, reach, filters)),
                           size, status=status, cursor=cursor)


# -- recall ----------------------------------------------------------------------------------

def recall_for(session: Session, reach: Reach, query: str, k: int, *, embedder: Embedder,
               max_distance: RecallCut = None, scopes: Scopes = None,
               filters: Filters = Filters()) -> list[Recalled]:
    """Top-k over every owner the caller reaches (one search, however many teams), each
    result naming whose memory it is; filtered by author or app, saved memories only.
    What the person marked "not relevant" in the chat ranks last (``demotions``)."""
    check_scope(scopes, "search")
    owners = _owners(reach, filters)
    k = max(1, min(int(k), reading.MAX_RECALL_K))
    demoted = demoted_for(session, reach.user_id)
    hits = demote(reading.recall(session, owners, query, widened(k, demoted),
                                 embedder=embedder, max_distance=max_distance), demoted, k)
    if filters.author is None and filters.app is None:
        return hits
    ids = [parse_memory_id(h.memory_id) for h in hits if h.memory_id]
    kept = set(session.scalars(select(Memory.id).where(
        Memory.id.in_([i for i in ids if i is not None]), *_filtered(session, reach,
                                                                      filters))))
    return [h for h in hits if h.memory_id and uuid.UUID(h.memory_id) in kept]


# -- who saved it ----------------------------------------------------------------------------

FORMER_MEMBER = "a former member"


@dataclass(frozen=True)
class Attribution:
    """Whose memory it is and who saved it with what, as every surface shows it:
    "saved by <author> via <credential>". A client's name for itself is its claim."""

    owner: str            # "personal", or the team's slug
    owner_name: str       # "Your memory", or the team's name
    author_id: int | None
    author: str           # "you", a member's name, or "a former member"
    via: str              # "OrbitPilot", "API key “codex-cli” (op_1a2b…)", "app opc_… …"
    key_id: int | None = None
    key_name: str | None = None
    key_prefix: str | None = None
    client_id: str | None = None
    client_claim: str | None = None  # the name the app gave itself: its claim, not a fact

    @property
    def sentence(self) -> str:
        return f"Saved by {self.author} via {self.via}"

    def to_dict(self) -> dict[str, Any]:
        return {"owner": self.owner, "owner_name": self.owner_name,
                "author_id": self.author_id, "author": self.author, "via": self.via,
                "key": {"id": self.key_id, "name": self.key_name, "prefix": self.key_prefix}
                if self.key_id is not None else None,
                "app": {"client_id": self.client_id, "claimed_name": self.client_claim}
                if self.client_id is not None else None}


def _via(key: ApiKey | None, client: Any, claim: str | None) -> str:
    if key is not None:
        return f"API key \u201c{key.name}\u201d ({key.prefix}\u2026)"
    if client is not None:
        said = claim or client.name
        return (f"app {client.client_id} (it calls itself \u201c{said}\u201d)"
                if client.kind == "registered" else
                f"app {client.client_id} (\u201c{said}\u201d, its published name)")
    return "OrbitPilot"


def attribute(session: Session, reach: Reach, memories: Iterable[Memory]
              ) -> dict[uuid.UUID, Attribution]:
    """Who saved each memory and with what: three queries for any number of memories
    (the authors with their membership of the owning team, the keys, the apps)."""
    memories = list(memories)
    author_ids = {m.author_id for m in memories if m.author_id is not None}
    key_ids = {m.api_key_id for m in memories if m.api_key_id is not None}
    client_pks = {m.oauth_client_pk for m in memories if m.oauth_client_pk is not None}
    authors = {u.id: u for u in session.scalars(select(User).where(User.id.in_(author_ids)))} \
        if author_ids else {}
    members = members_among(session, {(m.owner_id, m.author_id) for m in memories
                                      if m.author_id is not None
                                      and reach.seat_of(m.owner_id) is not None})
    keys = {k.id: k for k in session.scalars(select(ApiKey).where(ApiKey.id.in_(key_ids)))} \
        if key_ids else {}
    clients = {c.id: c for c in session.execute(
        select(CLIENTS).where(CLIENTS.c.id.in_(client_pks)))} if client_pks else {}
    out = {}
    for memory in memories:
        seat = reach.seat_of(memory.owner_id)
        author = authors.get(memory.author_id) if memory.author_id is not None else None
        if memory.author_id == reach.user_id:
            who = "you"
        elif author is None or (seat is not None
                                and (memory.owner_id, memory.author_id) not in members):
            who = FORMER_MEMBER
        else:
            who = author.display_name or author.email
        key = keys.get(memory.api_key_id) if memory.api_key_id is not None else None
        client = clients.get(memory.oauth_client_pk) \
            if memory.oauth_client_pk is not None else None
        # A key of someone no longer a member, or the key itself: shown by the key's name
        # to the team only while its author is a member (a former member's key is theirs).
        if who == FORMER_MEMBER:
            key = None
        out[memory.id] = Attribution(
            owner=seat.slug if seat else PERSONAL,
            owner_name=seat.name if seat else "Your memory",
            author_id=memory.author_id if who != FORMER_MEMBER else None,
            author=who, via=_via(key, client, memory.client_name),
            key_id=key.id if key else None, key_name=key.name if key else None,
            key_prefix=key.prefix if key else None,
            client_id=client.client_id if client else None,
            client_claim=(memory.client_name or client.name) if client else None)
    return out


def owner_label(reach: Reach, owner_id: int) -> str:
    """Whose memory, as answers name it: ``personal``, or the team's slug."""
    seat = reach.seat_of(owner_id)
    return seat.slug if seat is not None else PERSONAL


def described(session: Session, reach: Reach, memories: Iterable[Memory], *,
              scopes: Scopes = None) -> list[dict[str, Any]]:
    """Each memory as the API and the MCP tools answer with it: its fields, whose it is
    (``owner``) and who saved it with what (``attribution``), three queries in all. A
    credential without the read scope (one that may only write or forget) is shown no
    content and no metadata: changing a memory must not be a way to read it."""
    memories = list(memories)
    said = attribute(session, reach, memories)
    hidden = {} if rules.allows(scopes, "get") else {"content": None, "metadata": None}
    return [{**reading.memory_dict(m), **hidden, "owner": said[m.id].owner,
             "attribution": said[m.id].to_dict()} for m in memories]


def described_hits(session: Session, reach: Reach, hits: Iterable[Recalled]
                   ) -> list[dict[str, Any]]:
    """Search results as answers give them: each names whose memory it is (``owner``)
    and, for a saved memory, who saved it with what (``attribution``)."""
    hits = list(hits)
    ids = {uuid.UUID(h.memory_id) for h in hits if h.memory_id}
    memories = list(session.scalars(select(Memory).where(
        Memory.id.in_(ids), Memory.owner_id.in_(reach.owner_ids)))) if ids else []
    said = attribute(session, reach, memories)
    out = []
    for hit in hits:
        row = dataclasses.asdict(hit)
        del row["owner_id"]  # named by the owner label: an account id says nothing
        attribution = said.get(uuid.UUID(hit.memory_id)) if hit.memory_id else None
        row["owner"] = owner_label(reach, hit.owner_id)
        row["attribution"] = attribution.to_dict() if attribution is not None else None
        out.append(row)
    return out


# -- leaving and erasure ---------------------------------------------------------------------

# Erasures a team's policy or a person's own request makes: as retention's purges, every
# scope (the rule that asks is the team's or the person's, not a credential's).
ERASER_SCOPES = list(rules.SCOPE_FOR_OPERATION.values())


def erase_authored(session: Session, team_id: int, author_id: int, *, actor: Actor,
                   reason: str) -> list[receipts.Receipt]:
    """Hard delete every memory ``author_id`` saved to the team (a leaver under an
    "erase" policy, or the person's own request), each with its receipt; under a legal
    hold on the team each becomes a pending receipt (recall stops at once)."""
    ids = list(session.scalars(select(Memory.id).where(
        Memory.owner_id == team_id, Memory.author_id == author_id).order_by(Memory.id)))
    receipts = []
    for memory_id in ids:
        memory = session.get(Memory, memory_id)
        if memory is None or _waiting(session, memory):
            continue
        receipts.append(forgetting.forget_memory(
            session, team_id, memory_id, mode="hard_delete", actor=actor,
            scopes=ERASER_SCOPES, reason=reason))
    return receipts


def _waiting(session: Session, memory: Memory) -> bool:
    return session.scalar(select(ForgetMarker.id).where(
        ForgetMarker.memory_id == memory.id, ForgetMarker.pending_hold,
        ForgetMarker.completed_by_id.is_(None)).limit(1)) is not None
