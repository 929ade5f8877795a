"""The product's sources, in rank order (the order is the rank), the keepers of the
copies an erasure must reach, who works out a caller's reach (teams), and what a person
demoted in their searches (the chat's "not relevant" marks), installed in
their registries when this is imported: the app and every command import it before any
build, forget or authenticated call."""

from __future__ import annotations

from dashboard.access import install_resolver
from dashboard.blinks.source import BLINKS_SOURCE
from dashboard.copies import Keeper, install_keepers
from dashboard.demotions import install_reader
from dashboard.documents.source import DOCUMENTS_SOURCE
from dashboard.exports.services import withdraw_exports
from dashboard.orbitpilot.copies import erase_chat_copies
from dashboard.orbitpilot.marks import not_relevant_items
from dashboard.orbitpilot.source import CHAT_HISTORY_SOURCE, PROFILE_SOURCE
from dashboard.saved_memories.source import SAVED_SOURCE
from dashboard.sources import Source, install
from dashboard.teams.services import reach_of

SOURCES: tuple[Source, ...] = (
    PROFILE_SOURCE, BLINKS_SOURCE, SAVED_SOURCE, CHAT_HISTORY_SOURCE, DOCUMENTS_SOURCE)

install(SOURCES)

# The chat's replies and "Drew on" records, then the exports (which copy everything).
KEEPERS: tuple[Keeper, ...] = (erase_chat_copies, withdraw_exports)

install_keepers(KEEPERS)

# A person's teams, as far as the credential of a call lets it act for them.
install_resolver(reach_of)

# What a person marked "not relevant" under a reply, demoted in their later searches.
install_reader(not_relevant_items)
