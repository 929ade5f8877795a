"""The one factory module: users, plans, conversations, memories, keys, Blinks, builds
and the embedders tests build with. Factories flush, never commit, so the per-test
rollback undoes them (``committed`` callers commit themselves)."""

from __future__ import annotations

import dataclasses
import itertools
import os
import threading
import time
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import select, update
from werkzeug.security import generate_password_hash

from dashboard import sources
from dashboard.audit.services import Actor
from dashboard.auth.models import User
from dashboard.blinks.models import Blink
from dashboard.memory import MemoryBuild, get_embedder
from dashboard.memory.embedders import HashingEmbedder
from dashboard.memory.pipeline import BuildResult, run_memory_build
from dashboard.memory.settings import DEFAULT_ANN_MIN_CHUNKS
from dashboard.plans.models import Plan, SourceAssignment
from dashboard.plans.services import UserPlans
from dashboard.saved_memories import save_memory
from dashboard.saved_memories.keys import create_key
from dashboard.saved_memories.models import ApiKey, Memory

ALL_SCOPES = ["memory:read", "memory:write", "memory:delete", "memory:redact",
              "memory:hard_delete"]

PASSWORD = "correct-horse-battery"
# One cheap hash for every factory user: scrypt per user would dominate the suite's time.
_FAST_HASH = generate_password_hash(PASSWORD, method="pbkdf2:sha256:1000")
_seq = itertools.count(1)


def make_plan(session, *, name: str | None = None, cap: int = 3,
              assignments: dict[str, bool] | None = None) -> Plan:
    n = next(_seq)
    plan = Plan(name=name or f"Plan {n}", slug=f"plan-{n}", included_sources=cap)
    session.add(plan)
    session.flush()
    for key, enabled in (assignments or {}).items():
        session.add(SourceAssignment(plan_id=plan.id, source_key=key, enabled=enabled))
    session.flush()
    return plan


def default_plan(session) -> Plan:
    return session.scalars(select(Plan).where(Plan.is_default)).one()


def make_user(session, *, plan: Plan | None = None, role: str = "user",
              email: str | None = None) -> User:
    n = next(_seq)
    user = User(email=email or f"user{n}@example.test", display_name=f"User {n}",
                password_hash=_FAST_HASH, role=role, plan_id=plan.id if plan else None)
    session.add(user)
    session.flush()
    return user


def make_conversation(session, user: User, pairs: list[tuple[str, str | None]], *,
                      flagged: set[int] = frozenset(), title: str = "Chat"):
    """A conversation of (question, answer) turns; ``answer=None`` leaves it unanswered.
    ``flagged`` holds pair indexes whose user turn is marked not remembered."""
    from dashboard.orbitpilot.models import Conversation, Message

    conversation = Conversation(user_id=user.id, title=title)
    session.add(conversation)
    session.flush()
    position = 0
    messages = []
    for index, (question, answer) in enumerate(pairs):
        asked = Message(conversation_id=conversation.id, user_id=user.id, role="user",
                        position=position, content=question, not_remembered=index in flagged)
        session.add(asked)
        session.flush()
        position += 1
        messages.append(asked)
        if answer is not None:
            reply = Message(conversation_id=conversation.id, user_id=user.id,
                            role="assistant", position=position, content=answer,
                            reply_to_id=asked.id)
            session.add(reply)
            position += 1
            messages.append(reply)
    session.flush()
    return conversation, messages


def user_turns(messages):
    return [m for m in messages if m.role == "user"]


def settle(session) -> None:
    """Pretend every queued build ran, so the next change must request a new one."""
    session.execute(update(MemoryBuild).where(MemoryBuild.status == "queued")
                    .values(status="succeeded"))


def queued_triggers(session, user) -> list[str]:
    """The triggers of ``user``'s queued builds."""
    return list(session.scalars(select(MemoryBuild.trigger).where(
        MemoryBuild.user_id == user.id, MemoryBuild.status == "queued")))


class CountingEmbedder:
    """Wraps an embedder and counts what it was asked to embed."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.name = inner.name
        self.dimensions = inner.dimensions
        self.texts: list[str] = []

    def embed(self, texts):
        self.texts.extend(texts)
        return self.inner.embed(texts)

    def reset(self) -> None:
        self.texts.clear()


# -- memories, keys, Blinks ------------------------------------------------------------------

def make_memory(session, owner, content: str = "Prefers window seats on long flights.", *,
                metadata: dict[str, Any] | None = None, source: str = "api",
                actor: Actor | None = None) -> Memory:
    """A memory saved through the service (version 1, audited, a build requested)."""
    return save_memory(session, owner=owner, content=content, metadata=metadata,
                       source=source, actor=actor or Actor.of(owner)).memory


def insert_memory(session, owner, content: str, *, created_at: datetime,
                  status: str = "active") -> Memory:
    """A memory row written directly, with a chosen creation time (keyset ordering)."""
    memory = Memory(owner_id=owner.id, content=content, status=status, created_at=created_at)
    session.add(memory)
    session.flush()
    return memory


def make_key(session, owner, *, scopes: Iterable[str] = ("memory:read", "memory:write"),
             name: str = "test client", actor: Actor | None = None,
             expires_at: datetime | None = None, team_ids: Iterable[int] = ()
             ) -> tuple[ApiKey, str]:
    """A key of ``owner`` made through the service, and its secret, acting for the teams
    ``team_ids`` names. ``memory:hard_delete`` among the scopes is granted as an admin
    would (the owner may not pick it)."""
    scopes = list(scopes)
    elevated = "memory:hard_delete" in scopes
    key, raw = create_key(session, owner=owner, name=name,
                          scopes=[s for s in scopes if s != "memory:hard_delete"] or
                          ["memory:read"], expires_at=expires_at,
                          actor=actor or Actor.of(owner), team_ids=team_ids)
    if elevated:
        key.scopes = [*key.scopes, "memory:hard_delete"]
        session.flush()
    return key, raw


def make_blink(session, user, content: str = "a blink", *, title: str = "t",
               excluded: bool = False) -> Blink:
    blink = Blink(user_id=user.id, title=title, content=content,
                  excluded_from_memory=excluded)
    session.add(blink)
    session.flush()
    return blink


# -- builds -----------------------------------------------------------------------------------

def build(session, user, mode: str = "quick", embedder: Any = None, *,
          threshold: int = DEFAULT_ANN_MIN_CHUNKS, commit: bool = False) -> BuildResult:
    """One build of ``user``'s memory in the test's transaction (a counting embedder is
    reset first, so its texts are this build's)."""
    embedder = embedder or get_embedder("hashing")
    if isinstance(embedder, CountingEmbedder):
        embedder.reset()
    result = run_memory_build(user, mode, session=session, embedder=embedder,
                              ann_threshold=threshold)
    if commit:
        session.commit()
    return result


def mark_ann_ready(session, user_id: int) -> None:
    """``user_id``'s note says ``ann_ready`` (a note written if none is), as the indexing
    job's last batch leaves it: for tests that write ``ann`` rows themselves."""
    from sqlalchemy.dialects.postgresql import insert

    from dashboard.memory.models import MemoryState

    session.execute(insert(MemoryState).values(
        user_id=user_id, inputs_read_at=datetime.now(UTC), snapshot="1:1:",
        included_keys=[], embedding_model="random", ann_ready=True)
        .on_conflict_do_update(index_elements=[MemoryState.user_id],
                               set_={"ann_ready": True}))
    session.flush()


def builds_of(session, user_id: int) -> list[MemoryBuild]:
    """``user_id``'s build records, oldest first."""
    return list(session.scalars(select(MemoryBuild).where(MemoryBuild.user_id == user_id)
                                .order_by(MemoryBuild.id)))


def make_build_record(user, status: str = "succeeded", **fields) -> MemoryBuild:
    """A build record as the runner leaves one (not added: the caller adds it)."""
    now = datetime.now(UTC)
    defaults = {"mode": "quick", "trigger": "schedule",
                "started_at": now - timedelta(seconds=2) if status != "queued" else None,
                "finished_at": now if status in ("succeeded", "failed") else None}
    return MemoryBuild(user_id=user.id, status=status, **{**defaults, **fields})


def with_source(monkeypatch, key: str, **changes: Any) -> sources.Source:
    """For the rest of the test, the installed source ``key`` with ``changes`` (a spy on
    its extractor, another default); the registry is as installed again afterwards."""
    changed = tuple(dataclasses.replace(s, **changes) if s.key == key else s
                    for s in sources.registered_sources())
    monkeypatch.setattr(sources, "_installed", changed)
    monkeypatch.setattr(sources, "_by_key", {s.key: s for s in changed})
    return sources.get_source(key)


def replace_parts_extract(monkeypatch, key: str, extract: Any) -> Any:
    """For the rest of the test, the source re-reads its parts with ``extract``; returns
    the extractor it had (for a spy to call)."""
    parts = sources.get_source(key).parts
    with_source(monkeypatch, key, parts=dataclasses.replace(parts, extract=extract))
    return parts.extract


def make_connection(session, user, *, scopes: Iterable[str] = ("memory:read",),
                    name: str = "Test app", resource: str = "http://localhost/mcp"):
    """A connected app as the consent page makes one, and a live access token for it."""
    from dashboard.connectors import services as connections

    client, _ = connections.register_client(session, {
        "client_name": name, "redirect_uris": ["http://127.0.0.1:33418/callback"],
        "token_endpoint_auth_method": "none"})
    grant = connections.consent(session, user=user, client=client, scopes=list(scopes),
                                resource=resource, allowed=True)
    access = connections.new_secret(connections.ACCESS_PREFIX)
    connections.store_tokens(session, grant, access=access, refresh=None, scopes=list(scopes),
                             lifetimes=connections.Lifetimes())
    return grant, access


def make_team(session, owner, *, slug: str | None = None, name: str | None = None,
              members: dict | None = None, **policies: Any):
    """A team led by ``owner`` (made through the service, as the team page makes one),
    with ``members`` ({user: role}) joined as an accepted invitation makes them."""
    from dashboard.teams.models import TeamMember
    from dashboard.teams.services import create_team

    n = next(_seq)
    team = create_team(session, creator=owner, name=name or f"Team {n}",
                       slug=slug or f"team-{n}", actor=Actor.of(owner))
    for user, role in (members or {}).items():
        session.add(TeamMember(team_id=team.id, user_id=user.id, role=role))
    for field_name, value in policies.items():
        setattr(team, field_name, value)
    session.flush()
    return team


def plans_of(session) -> UserPlans:
    """What a request's edge would pass the services: each user's plan, read once."""
    return UserPlans(session)


class PausedEmbedder:
    """The hashing embedder whose first call (a build that has read its inputs) waits for
    ``release``, the build holding its user's lock mid-transaction meanwhile: a test
    double of the embedder, never of the database. ``texts``: what that call was given."""

    def __init__(self, hold: float = 60.0) -> None:
        inner = get_embedder("hashing")
        self.inner, self.name, self.dimensions = inner, inner.name, inner.dimensions
        self.hold = hold
        self.reading, self.release = threading.Event(), threading.Event()
        self.texts: list[str] = []

    def embed(self, texts):
        if not self.reading.is_set():
            self.texts.extend(texts)
            self.reading.set()
            self.release.wait(self.hold)
        return self.inner.embed(texts)


GATE_VARIABLE = "ORBITPILOT_TEST_GATE"


class GatedEmbedder(HashingEmbedder):
    """For a worker in another process (``EMBEDDER=tests.factories:GatedEmbedder``): the
    hashing embedder (same name, same vectors), answering only once the file named by
    ORBITPILOT_TEST_GATE exists, so the test holds a real build "running" with a few
    pairs and opens the gate when it is done looking."""

    def embed(self, texts):
        gate = os.environ.get(GATE_VARIABLE)
        deadline = time.monotonic() + 120
        while gate and not os.path.exists(gate) and time.monotonic() < deadline:
            time.sleep(0.05)
        return super().embed(texts)


def wait_for(predicate, timeout: float = 30.0) -> bool:
    """Poll ``predicate`` until it holds; the deadline only bounds a broken run."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


class ShiftedHashingEmbedder(HashingEmbedder):
    """Another model, for a model change (``EMBEDDER=tests.factories:ShiftedHashingEmbedder``):
    every token one slot over, so a query in it finds nothing among the hashing model's
    vectors, and vice versa."""

    name = "hashing-shifted-test"

    def _slot(self, token: str) -> tuple[int, float]:
        index, signed = super()._slot(token)
        self._memo[token] = slot = ((index + 1) % self.dimensions, signed)  # over the parent's
        return slot
