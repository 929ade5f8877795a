"""The product's sources, in rank order (the order is the rank), installed in the
registry when this is imported: the app and every command import it before any build."""

from __future__ import annotations

from dashboard.blinks.source import BLINKS_SOURCE
from dashboard.documents.source import DOCUMENTS_SOURCE
from dashboard.memories.source import SAVED_SOURCE
from dashboard.orbitpilot.source import CHAT_HISTORY_SOURCE, PROFILE_SOURCE
from dashboard.sources import Source, install

SOURCES: tuple[Source, ...] = (
    PROFILE_SOURCE, BLINKS_SOURCE, SAVED_SOURCE, CHAT_HISTORY_SOURCE, DOCUMENTS_SOURCE)

install(SOURCES)
