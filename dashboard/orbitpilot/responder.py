"""What answers in the chat: a responder is any callable taking a ``ResponderContext`` and
returning a ``Reply``, named by ``ORBITPILOT_RESPONDER`` (a dotted path; a class is made
once). The context holds every turn of the conversation, those marked "Not remembered"
too. The built-in one needs no network or model and answers from what recall found."""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Protocol

from dashboard.memory import RELEVANT

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
    # How sure recall is that it is about the message: ``relevant`` or
    # ``possibly_related`` (shown as uncertain, not hidden).
    relevance: str = RELEVANT


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


def _labels_in_order(hits: tuple[MemoryHit, ...]) -> list[str]:
    seen: list[str] = []
    for hit in hits:
        if hit.label not in seen:
            seen.append(hit.label)
    return seen


# How the built-in responder names what it recalled, by source key (unknown: its label);
# also what "Drew on" calls an item.
RECALLED_AS = {
    "xmemo.saved": "your saved memory", "blink.blinks": "a Blink",
    "docs.documents": "a document", "orbitpilot.profile": "your profile",
    "orbitpilot.chat_history": "an earlier conversation",
}


def recalled_as(hit: MemoryHit) -> str:
    """What a recalled item is, in English: a team's is named by its team."""
    return _kind(hit, EN)


# -- the built-in responder's words, in the question's language -----------------------------

EN, FR, ZH = "en", "fr", "zh"
_HAN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
_FRENCH_LETTERS = re.compile(r"[àâæçéèêëîïôœùûÿ]", re.IGNORECASE)
_WORDS = re.compile(r"\b[a-zà-ÿœæ]+\b", re.IGNORECASE)  # whole words: not "d" of "50d3"
# Words common in one language and rare in the other (no "de", "la": names carry them).
_FRENCH_WORDS = frozenset(
    "le les des du au aux est sont je tu il elle nous vous mon ma mes ton ta tes votre vos "
    "notre quel quelle quels quelles quoi pourquoi comment combien une avec pour dans sur "
    "que qui ne pas suis ai aime c j qu d l et alors mais ou oui non moi merci bonjour "
    "salut".split())
_ENGLISH_WORDS = frozenset(
    "the is are was do does did what where which who why how my i you your me to of and "
    "in on for with about have has like".split())


def language_of(text: str) -> str:
    """The language to answer ``text`` in: Chinese if it holds Han characters; French if
    its French words (a French letter counting as one: "où", "préféré") outnumber its
    English ones ("Where is my résumé?" stays English); else English."""
    if _HAN.search(text):
        return ZH
    words = [w.lower() for w in _WORDS.findall(text.replace("\u2019", "'"))]
    french = sum(w in _FRENCH_WORDS for w in words) + bool(_FRENCH_LETTERS.search(text))
    english = sum(w in _ENGLISH_WORDS for w in words)
    return FR if french > english else EN


# Each line the built-in responder writes, by language: ``{kind}`` is what the item is,
# ``{text}`` its words (of a chat pair: what the person said). ``is_builtin_reply`` reads
# a reply back by these same shapes.
WORDING: dict[str, dict[str, str]] = {
    EN: {"sure": "From {kind}: \u201c{text}\u201d",
         "sure_pair": "From {kind}, where you said: \u201c{text}\u201d",
         "also": "Also, from {kind}: \u201c{text}\u201d",
         "also_pair": "Also, from {kind}, where you said: \u201c{text}\u201d",
         "unsure": "I'm not sure, but this may be related:",
         "nothing": "I found nothing in your memory that bears on this.",
         "guest": "I remember nothing between visits while you are signed out, so I have "
                  "nothing saved to answer from."},
    FR: {"sure": "D'après {kind} : « {text} »",
         "sure_pair": "D'après {kind}, où vous disiez : « {text} »",
         "also": "Et d'après {kind} : « {text} »",
         "also_pair": "Et d'après {kind}, où vous disiez : « {text} »",
         "unsure": "Je n'en suis pas sûr, mais ceci pourrait s'y rapporter :",
         "nothing": "Je n'ai rien trouvé dans votre mémoire qui s'y rapporte.",
         "guest": "Je ne me souviens de rien d'une visite à l'autre tant que vous n'êtes "
                  "pas connecté : je n'ai rien d'enregistré pour vous répondre."},
    ZH: {"sure": "根据{kind}：\u201c{text}\u201d",
         "sure_pair": "根据{kind}，你曾说：\u201c{text}\u201d",
         "also": "另外，根据{kind}：\u201c{text}\u201d",
         "also_pair": "另外，根据{kind}，你曾说：\u201c{text}\u201d",
         "unsure": "我不确定，但这可能相关：",
         "nothing": "我在你的记忆中没有找到与此相关的内容。",
         "guest": "你未登录时，我不会在两次访问之间记住任何内容，所以没有已保存的内容可供回答。"},
}
NOTHING_RELEVANT = WORDING[EN]["nothing"]
_KINDS = {
    EN: RECALLED_AS,
    FR: {"xmemo.saved": "votre mémoire enregistrée", "blink.blinks": "un Blink",
         "docs.documents": "un document", "orbitpilot.profile": "votre profil",
         "orbitpilot.chat_history": "une conversation précédente"},
    ZH: {"xmemo.saved": "你保存的记忆", "blink.blinks": "一条 Blink",
         "docs.documents": "一份文档", "orbitpilot.profile": "你的个人资料",
         "orbitpilot.chat_history": "之前的一次对话"},
}
_TEAM_KINDS = {EN: "the team {team}'s {what}", FR: "{what} de l'équipe {team}",
               ZH: "团队 {team} 的{what}"}
_TEAM_SAVED = {EN: "saved memory", FR: "la mémoire enregistrée", ZH: "保存记忆"}


def _kind(hit: MemoryHit, language: str) -> str:
    if hit.team is not None:
        what = _TEAM_SAVED[language] if hit.source_key == "xmemo.saved" else hit.label
        return _TEAM_KINDS[language].format(team=hit.team, what=what)
    return _KINDS[language].get(hit.source_key, hit.label)


def recalled_line(hit: MemoryHit, language: str = EN, *, also: bool = False) -> str:
    """One recalled item as the reply cites it: what it is (a team's memory named by its
    team) and its words (of a chat pair, what the person said). A reply that drew on
    memory is remembered by its question alone, so a quote here never outlives the
    item's forgetting."""
    text = hit.content
    pair = hit.source_key == "orbitpilot.chat_history"
    if pair:
        text = text.split("\nOrbitPilot: ", 1)[0].removeprefix("User: ")
    shape = ("also" if also else "sure") + ("_pair" if pair else "")
    return WORDING[language][shape].format(kind=_kind(hit, language), text=one_line(text))


def builtin_answer(context: ResponderContext) -> str:
    """The built-in answer, in the question's language: the best relevant item (and a
    second one), or, when recall is only unsure, the nearest item said to be uncertain;
    else that nothing bears on it. No echo of the turn, nothing of an earlier turn."""
    language = language_of(context.message.content)
    words = WORDING[language]
    if context.guest:
        return words["guest"]
    sure: dict[tuple[int | None, str, str], MemoryHit] = {}
    for hit in context.memory:  # two chunks of one item are one item
        if hit.relevance == RELEVANT:
            sure.setdefault((hit.owner_id, hit.source_key, hit.source_id), hit)
    if sure:
        best, *others = sure.values()
        return "\n".join([recalled_line(best, language),
                          *(recalled_line(hit, language, also=True) for hit in others[:1])])
    if context.memory:
        return "\n".join([words["unsure"], recalled_line(context.memory[0], language)])
    return words["nothing"]


def _line_pattern(shape: str) -> str:
    kind, text = "\0kind\0", "\0text\0"
    return re.escape(shape.format(kind=kind, text=text)).replace(
        re.escape(kind), ".+?").replace(re.escape(text), ".*")


_BUILTIN_LINE = re.compile("|".join(f"(?:{_line_pattern(shape)})"
                                    for words in WORDING.values()
                                    for shape in words.values()))


def is_builtin_reply(reply: str) -> bool:
    """Whether ``reply`` is the built-in responder's: every line one of its shapes (any
    language), or its earlier shape (the turn echoed first, what it drew on last). It
    holds nothing of its own, only what recall found, which memory holds anyway. By its
    shape, so a reply stored before another responder was set is still known."""
    lines = [line.strip() for line in reply.strip().splitlines()]
    if len(lines) >= 2 and lines[0].startswith("You said: \u201c") \
            and lines[-1].startswith("I drew on "):
        return True
    return bool(lines) and all(_BUILTIN_LINE.fullmatch(line) for line in lines)


class BuiltinResponder:
    """The offline default: it answers in a sentence from what recall handed it, in the
    question's language (English, French, Chinese), says when it is unsure or found
    nothing, and quotes no earlier turn of this conversation."""

    def __call__(self, context: ResponderContext) -> Reply:
        return Reply(builtin_answer(context), drew_on_summary(context))


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
