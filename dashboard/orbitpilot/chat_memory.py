"""The one sentence about whether chat history is remembered: the line under the
composer, and the honesty note a reply carries when it is not."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dashboard.plans.sentences import CHAT_REMEMBERED, GUEST_INVITATION, state_sentence
from dashboard.plans.services import Resolution, UserPlans, get_user_plan, resolve_sources
from dashboard.sources import CHAT_HISTORY, get_source


@dataclass(frozen=True)
class ChatMemory:
    """What the notice says, and whether chat history is remembered for this person."""

    text: str
    remembered: bool
    guest: bool

    @property
    def honesty_note(self) -> str | None:
        """The reply's note: the notice's sentence, when chat is not remembered."""
        return None if self.remembered else self.text


def honesty_about() -> str:
    """What the honesty note is about, named before its sentence: the sentence alone
    ("Not remembered on the Free plan: your plan includes 3 sources, and …") never says
    it is chat history that is left out."""
    return get_source(CHAT_HISTORY).label


GUEST_CHAT_MEMORY = ChatMemory(GUEST_INVITATION, remembered=False, guest=True)


def chat_memory_for(resolution: Resolution) -> ChatMemory:
    """The notice for a resolution: the full cap logic, in the status page's words."""
    if resolution.guest:
        return GUEST_CHAT_MEMORY
    source = resolution.get(CHAT_HISTORY)
    if source.remembered:
        return ChatMemory(CHAT_REMEMBERED, remembered=True, guest=False)
    return ChatMemory(state_sentence(source, resolution), remembered=False, guest=False)


def _is_guest(user: Any) -> bool:
    return user is None or not getattr(user, "is_authenticated", False)


def get_chat_memory(user: Any, plans: UserPlans) -> ChatMemory:
    """The notice and the honesty note for ``user``: one query the first time ``plans``
    (the request's) reads the plan, shared with every other surface; none after."""
    if _is_guest(user):
        return GUEST_CHAT_MEMORY
    return chat_memory_for(resolve_sources(get_user_plan(user, plans)))


