"""What answers in the chat: a responder is any callable taking a ``ResponderContext`` and
returning a ``Reply``, named by ``ORBITPILOT_RESPONDER`` (a dotted path; a class is made
once). The context holds every turn of the conversation, those marked "Not remembered"
too. The built-in one needs no network or model and answers from what recall found."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
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
    """A memory chunk retrieved for this turn, with its source's label; ``team``: the
    name of the team whose memory it is (None: the person's own)."""

    source_key: str
    label: str
    source_id: str
    content: str
    distance: float
    chunk_id: int | None = None
    owner_id: int | None = None
    team: str | None = None


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


def drew_on_summary(context: ResponderContext) -> dict[str, Any]:
    """What a reply drew on, for the JSON answer (every responder says the same)."""
    return {"earlier_turns": len(context.earlier_turns),
            "sources": _labels_in_order(context.memory), "memory_items": len(context.memory)}


def reply_pieces(responder: Any, context: ResponderContext) -> Iterator[str]:
    """The reply piece by piece: a responder with ``stream`` yields as it goes; any other
    gives its whole text at once."""
    stream = getattr(responder, "stream", None)
    if callable(stream):
        yield from stream(context)
    else:
        reply = responder(context)
        yield reply.text if isinstance(reply, Reply) else ""


def one_line(text: str, limit: int = QUOTE_CHARS) -> str:
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


def drew_on_sentence(earlier_turns: int, labels: list[str], hits: int,
                     teams: dict[str, int] | None = None) -> str:
    """"I drew on …": how many earlier turns of this conversation, which sources; of the
    ``hits``, ``teams`` says how many were each team's memory (by the team's name)."""
    parts = []
    if earlier_turns:
        parts.append(f"{_plural(earlier_turns, 'earlier message')} of this conversation")
    teams = teams or {}
    own = hits - sum(teams.values())
    if own:
        parts.append(f"{_plural(own, 'item')} from your memory ({join_labels(labels)})"
                     if not teams else f"{_plural(own, 'item')} from your own memory")
    for team, count in teams.items():
        parts.append(f"{_plural(count, 'item')} from the memory of the team {team}")
    if not parts:
        return "I drew on this message only: nothing earlier in this conversation, and " \
               "nothing from your memory."
    return f"I drew on {' and '.join(parts)}."


# How the built-in responder names what it recalled, by source key (unknown: its label).
RECALLED_AS = {
    "xmemo.saved": "your saved memory", "blink.blinks": "a Blink",
    "docs.documents": "a document", "orbitpilot.profile": "your profile",
    "orbitpilot.chat_history": "an earlier conversation",
}
NOTHING_RELEVANT = "I found nothing in your memory that bears on this."


def recalled_as(hit: MemoryHit) -> str:
    """What a recalled item is, in the reply's words: a team's is named by its team."""
    if hit.team is not None:
        what = "saved memory" if hit.source_key == "xmemo.saved" else hit.label
        return f"the team {hit.team}'s {what}"
    return RECALLED_AS.get(hit.source_key, hit.label)


def teams_in(hits: tuple[MemoryHit, ...]) -> dict[str, int]:
    """How many of the hits were each team's memory, by team name, in order."""
    counts: dict[str, int] = {}
    for hit in hits:
        if hit.team is not None:
            counts[hit.team] = counts.get(hit.team, 0) + 1
    return counts


def recalled_line(hit: MemoryHit) -> str:
    """One recalled item as the reply cites it: what it is (and whose: a team's memory is
    named by its team), and its words (of a chat pair, what the person said). A reply
    that drew on memory is remembered by its question alone, so a quote here never
    outlives the item's forgetting."""
    kind = recalled_as(hit)
    text = hit.content
    if hit.source_key == "orbitpilot.chat_history":
        said = text.split("\nOrbitPilot: ", 1)[0].removeprefix("User: ")
        return f"• From {kind}, where you said: “{one_line(said)}”"
    return f"• From {kind}: “{one_line(text)}”"


def said_line(message: str) -> str:
    """The built-in responder's first line: the turn it answers, echoed."""
    return f"You said: “{one_line(message)}”"


def is_builtin_reply(reply: str) -> bool:
    """Whether ``reply`` is the built-in responder's (its first line echoes the turn, its
    last says what it drew on): it holds nothing of its own, only the turn again and what
    recall found, which memory holds anyway. By its shape, so a reply stored before
    another responder was set, or whose turn was edited since, is still known."""
    lines = reply.strip().splitlines()
    return len(lines) >= 2 and lines[0].startswith("You said: “") \
        and lines[-1].startswith("I drew on ")


class BuiltinResponder:
    """The offline default: it answers from what recall handed it (quoting saved items,
    naming earlier conversations), says so when nothing relevant came back, and quotes no
    earlier turn of this conversation."""

    def __call__(self, context: ResponderContext) -> Reply:
        earlier = len(context.earlier_turns)
        labels = _labels_in_order(context.memory)
        lines = [said_line(context.message.content)]
        if context.guest:
            lines.append("I remember nothing between visits while you are signed out.")
        elif context.memory:
            lines.append("From what I remember of you:" if not teams_in(context.memory)
                         else "From what I remember of you and your teams:")
            lines.extend(recalled_line(hit) for hit in context.memory)
        else:
            lines.append(NOTHING_RELEVANT)
        lines.append(drew_on_sentence(earlier, labels, len(context.memory),
                                      teams_in(context.memory)))
        return Reply("\n".join(lines), drew_on_summary(context))


@lru_cache(maxsize=16)
def load_responder(path: str) -> Callable[[ResponderContext], Reply]:
    """The responder a dotted path (or an alias: "builtin", "openai") names; a class is
    instantiated once."""
    aliases = {"builtin": DEFAULT_RESPONDER,
               "openai": "dashboard.orbitpilot.openai_responder.OpenAIResponder"}
    path = aliases.get(path.strip(), path)
    module_name, sep, attr = path.partition(":")
    if not sep:
        module_name, _, attr = path.rpartition(".")
    if not module_name or not attr:
        raise ValueError(f"ORBITPILOT_RESPONDER must be a dotted path or an alias "
                         f"({', '.join(sorted(aliases))}), not {path!r}")
    target = getattr(importlib.import_module(module_name), attr)
    responder = target() if isinstance(target, type) else target
    if not callable(responder):
        raise TypeError(f"ORBITPILOT_RESPONDER {path!r} is not callable")
    return responder
