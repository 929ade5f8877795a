"""What answers in the chat: a responder is any callable taking a ``ResponderContext`` and
returning a ``Reply``, named by ``ORBITPILOT_RESPONDER`` (a dotted path; a class is made
once). The context holds every turn of the conversation, those marked "Not remembered"
too. The built-in one needs no network or model and says what it drew on."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Protocol

from dashboard.plans.sentences import join_labels

DEFAULT_RESPONDER = "dashboard.orbitpilot.responder.BuiltinResponder"
# How many memory chunks a signed-in user's reply may draw on.
DEFAULT_MEMORY_K = 3
QUOTE_CHARS = 160


@dataclass(frozen=True)
class Turn:
    """One message as the responder sees it (``id`` is None for a guest's turns)."""

    role: str
    content: str
    id: int | None = None
    not_remembered: bool = False


@dataclass(frozen=True)
class MemoryHit:
    """A memory chunk retrieved for this turn, with its source's label."""

    source_key: str
    label: str
    source_id: str
    content: str
    distance: float


@dataclass(frozen=True)
class ResponderContext:
    """``turns`` ends with the message being answered."""

    turns: tuple[Turn, ...]
    memory: tuple[MemoryHit, ...] = ()
    guest: bool = False

    @property
    def message(self) -> Turn:
        return self.turns[-1]

    @property
    def earlier_turns(self) -> tuple[Turn, ...]:
        return self.turns[:-1]


@dataclass(frozen=True)
class Reply:
    text: str
    # What the reply drew on, for the JSON answer: {"earlier_turns": n, "sources": [...]}.
    drew_on: dict[str, Any] = field(default_factory=dict)


class Responder(Protocol):
    def __call__(self, context: ResponderContext) -> Reply: ...


def _one_line(text: str, limit: int = QUOTE_CHARS) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1].rstrip() + "…"


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def _labels_in_order(hits: tuple[MemoryHit, ...]) -> list[str]:
    seen: list[str] = []
    for hit in hits:
        if hit.label not in seen:
            seen.append(hit.label)
    return seen


def drew_on_sentence(earlier_turns: int, labels: list[str], hits: int) -> str:
    """"I drew on …": how many earlier turns of this conversation, which sources."""
    parts = []
    if earlier_turns:
        parts.append(f"{_plural(earlier_turns, 'earlier message')} of this conversation")
    if hits:
        parts.append(f"{_plural(hits, 'item')} from your memory ({join_labels(labels)})")
    if not parts:
        return "I drew on this message only: nothing earlier in this conversation, and " \
               "nothing from your memory."
    return f"I drew on {' and '.join(parts)}."


class BuiltinResponder:
    """The offline default. It quotes only the message it answers: never an earlier turn
    nor a memory chunk, which may hold a turn marked "Not remembered" since (a reply is
    remembered with its own question, so a copy there would outlive the flag)."""

    def __call__(self, context: ResponderContext) -> Reply:
        earlier = len(context.earlier_turns)
        labels = _labels_in_order(context.memory)
        lines = [f"You said: “{_one_line(context.message.content)}”"]
        if context.guest:
            lines.append("I remember nothing between visits while you are signed out.")
        lines.append(drew_on_sentence(earlier, labels, len(context.memory)))
        return Reply("\n".join(lines), {"earlier_turns": earlier, "sources": labels,
                                        "memory_items": len(context.memory)})


@lru_cache(maxsize=16)
def load_responder(path: str) -> Callable[[ResponderContext], Reply]:
    """The responder a dotted path names; a class is instantiated once."""
    module_name, sep, attr = path.partition(":")
    if not sep:
        module_name, _, attr = path.rpartition(".")
    if not module_name or not attr:
        raise ValueError(f"ORBITPILOT_RESPONDER must be a dotted path, not {path!r}")
    target = getattr(importlib.import_module(module_name), attr)
    responder = target() if isinstance(target, type) else target
    if not callable(responder):
        raise TypeError(f"ORBITPILOT_RESPONDER {path!r} is not callable")
    return responder
