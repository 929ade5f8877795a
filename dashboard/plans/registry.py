"""The source registry (§3): defined in code, ordered, and the order is the rank."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Source:
    key: str
    label: str
    default_visible: bool
    # Dotted path of the extractor, resolved by the build pipeline; a string keeps the
    # registry importable without the pipeline (and the pipeline swappable in tests).
    extractor: str
    records: str


SOURCES: tuple[Source, ...] = (
    Source("orbitpilot.profile", "Your profile", True,
           "dashboard.pipeline.extract:extract_profile", "the user's profile facts (one record)"),
    Source("blink.blinks", "Your Blinks", True,
           "dashboard.pipeline.extract:extract_blinks", "each Blink not excluded from memory"),
    Source("xmemo.saved", "Saved memories", True,
           "dashboard.pipeline.extract:extract_saved_memories",
           "each memory saved through /v1/memories with status active"),
    Source("orbitpilot.chat_history", "Chat history", True,
           "dashboard.pipeline.extract:_extract_chat_history",
           "each answered (user message, assistant reply) pair not marked not-remembered"),
    Source("docs.documents", "Uploaded documents", False,
           "dashboard.pipeline.extract:extract_documents", "each document's text"),
)

CHAT_HISTORY = "orbitpilot.chat_history"
SOURCE_KEYS: tuple[str, ...] = tuple(s.key for s in SOURCES)
_BY_KEY = {s.key: s for s in SOURCES}


def get_source(key: str) -> Source:
    try:
        return _BY_KEY[key]
    except KeyError:
        raise KeyError(f"unknown source {key!r}; known: {', '.join(SOURCE_KEYS)}") from None


def rank_of(key: str) -> int:
    """1-based rank, as staff pages show it."""
    return SOURCE_KEYS.index(get_source(key).key) + 1
