"""Factory helpers: they flush, never commit, so the per-test rollback undoes them."""

from __future__ import annotations

import itertools

from sqlalchemy import select, update
from werkzeug.security import generate_password_hash

from dashboard.auth.models import User
from dashboard.memory.models import MemoryBuild
from dashboard.plans.models import Plan, SourceAssignment

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
