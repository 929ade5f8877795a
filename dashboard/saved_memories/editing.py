"""Saving and changing a memory: each keeps the version it replaced and asks the owner's
build; a content change takes the old content's chunks away at once, as a forget does."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session

from dashboard.audit.services import Actor, record_event
from dashboard.memory import BuildRequest, build_for_change, forget_chunks, wait_for_builds
from dashboard.plans.sentences import source_sentence
from dashboard.plans.services import SourceState, get_plan_for_user, resolve_sources
from dashboard.saved_memories.models import Memory, MemoryVersion
from dashboard.saved_memories.rules import (
    InvalidMemoryInput,
    MemoryConflict,
    Scopes,
    check_content,
    check_metadata,
    check_scope,
    check_source,
    find_memory,
)
from dashboard.sources import SAVED


@dataclass
class Saved:
    memory: Memory
    build: BuildRequest
    remembered: bool
    sentence: str
    created: bool = True  # False: an earlier request's memory, answered again


def saved_before(session: Session, memory: Memory, owner: Any) -> Saved:
    """What a request that finds its memory already saved (a second click, a retry)
    answers: that memory, and the owner's pending quick build (merged, if one waits)."""
    remembered, sentence = _remembered(session, owner)
    return Saved(memory, build_for_change(session, owner.id), remembered, sentence,
                 created=False)


def _remembered(session: Session, owner: Any) -> tuple[bool, str]:
    source, sentence = source_sentence(resolve_sources(get_plan_for_user(owner, session)),
                                       SAVED)
    return source.state is SourceState.INCLUDED, sentence


def save_memory(session: Session, *, owner: Any, content: object, metadata: object = None,
                source: object = "api", actor: Actor, api_key_id: int | None = None,
                client_name: str | None = None, scopes: Scopes = None,
                author_id: int | None = None, oauth_client_pk: int | None = None,
                shared_from_id: uuid.UUID | None = None) -> Saved:
    """Save a memory and request a quick update for its owner (a person, or a team's
    account); says whether saved memories are remembered on the owner's plan (the status
    sentence). ``author_id``: who saved it (the owner when not given); the key or the
    registered app it came through."""
    check_scope(scopes, "save")
    memory = Memory(owner_id=owner.id, content=check_content(content),
                    metadata_=check_metadata(metadata), source=check_source(source),
                    status="active", version=1, api_key_id=api_key_id,
                    client_name=client_name,
                    author_id=author_id if author_id is not None else owner.id,
                    oauth_client_pk=oauth_client_pk, shared_from_id=shared_from_id)
    session.add(memory)
    session.flush()
    record_event(session, action="memory.create", actor=actor, owner_id=owner.id,
                 target_type="memory", target_id=str(memory.id),
                 details={"source": memory.source, "version": 1})
    build = build_for_change(session, owner.id)  # the flush's request (memory.changes)
    remembered, sentence = _remembered(session, owner)
    return Saved(memory, build, remembered, sentence)


def snapshot(session: Session, memory: Memory) -> None:
    """Keep the memory as it is now as a version (before an edit, a forget, a restore)."""
    session.add(MemoryVersion(memory_id=memory.id, version=memory.version,
                              content=memory.content, metadata_=memory.metadata_,
                              status=memory.status))


def drop_chunks(session: Session, memory: Memory) -> int:
    # The caller took the build lock first (wait_for_builds), before any row write.
    return forget_chunks(session, memory.owner_id, SAVED, [str(memory.id)], locked=True)


def change_memory(session: Session, owner_id: int, memory_id: object, *,
                  content: object = None, metadata: object = None, actor: Actor,
                  scopes: Scopes = None) -> tuple[Memory, BuildRequest | None]:
    """``update_memory`` for a caller naming a memory by id: its scope (403), the values
    (422), the target among the owner's (404/410), then its state (409)."""
    check_scope(scopes, "update")
    if content is not None:
        check_content(content)
    if metadata is not None:
        check_metadata(metadata)
    memory = find_memory(session, owner_id, memory_id)
    return update_memory(session, memory, content=content, metadata=metadata, actor=actor)


def update_memory(session: Session, memory: Memory, *, content: object = None,
                  metadata: object = None, actor: Actor
                  ) -> tuple[Memory, BuildRequest | None]:
    """Change content and/or metadata of an active memory (found by the caller, whose
    scope was checked: ``change_memory``): the previous version is snapshotted, the
    version goes up by one, and a quick update is requested.

    A content change takes the old content's chunks away at once, under the build lock
    as a forget does: an edit that takes sensitive text out must not leave it recallable
    until the next build. The new content is recalled from that build on."""
    if content is None and metadata is None:
        raise InvalidMemoryInput("Give content, metadata or both.")
    new_content = check_content(content) if content is not None else None
    new_metadata = check_metadata(metadata) if metadata is not None else None
    if new_content is not None:
        wait_for_builds(session, memory.owner_id)
    # Re-read under the row lock: a hard delete that committed meanwhile is a 410.
    memory = find_memory(session, memory.owner_id, memory.id, lock=True)
    if memory.status != "active":
        raise MemoryConflict(f"Only an active memory can be changed; this one is "
                             f"{memory.status}.")
    changed = [name for name, value, now in (("content", new_content, memory.content),
                                             ("metadata", new_metadata, memory.metadata_))
               if value is not None and value != now]
    snapshot(session, memory)
    before = memory.version
    if new_content is not None and new_content != memory.content:
        drop_chunks(session, memory)
    if new_content is not None:
        memory.content = new_content
    if new_metadata is not None:
        memory.metadata_ = new_metadata
    memory.version += 1
    session.flush()
    # Metadata is never chunked: only new content gives the next build something to do.
    # Requested before the audit event: row writes come before the chain's lock.
    build = build_for_change(session, memory.owner_id) if "content" in changed else None
    record_event(session, action="memory.update", actor=actor, owner_id=memory.owner_id,
                 target_type="memory", target_id=str(memory.id),
                 details={"changed": changed, "before": {"version": before},
                          "after": {"version": memory.version}})
    return memory, build
