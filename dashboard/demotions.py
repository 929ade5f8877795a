"""Items a person marked "not relevant" under a reply's "Drew on": in that person's later
searches (the chat's recall, the API's and the MCP tool's) each ranks after every hit not
so marked and is never labelled relevant. The marks are the chat's rows; the chat's reader
is installed here by ``dashboard.catalog``, so the memories domain demotes without
importing the chat (docs/architecture/recall.md)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from sqlalchemy.orm import Session

from dashboard.memory import POSSIBLY_RELATED

# An item as the marks and hits name it: (whose memory, source key, item id).
Item = tuple[int, str, str]
Reader = Callable[[Session, int], frozenset[Item]]
H = TypeVar("H")

_reader: Reader | None = None


def install_reader(reader: Reader) -> None:
    global _reader
    _reader = reader


def demoted_for(session: Session, user_id: int) -> frozenset[Item]:
    """The items ``user_id`` marked not relevant (one query)."""
    if _reader is None:
        raise RuntimeError("no demotion reader is installed: import dashboard.catalog first")
    return _reader(session, user_id)


def widened(k: int, demoted: frozenset[Item]) -> int:
    """How many hits to ask for, so that demoted ones need not take the places of hits
    that are not (at most twice ``k``)."""
    return k + min(k, len(demoted))


def demote(hits: Sequence[H], demoted: frozenset[Item], k: int | None = None) -> list[H]:
    """``hits`` with the demoted ones after every other, in their own order, each
    labelled possibly related (a hit with a ``relevance`` field); the first ``k``."""
    if not demoted:
        return list(hits)[:k]
    kept: list[H] = []
    moved: list[H] = []
    for hit in hits:
        if _item(hit) in demoted:
            moved.append(_unsure(hit))
        else:
            kept.append(hit)
    return (kept + moved)[:k]


def _item(hit: Any) -> Item:
    return (hit.owner_id, hit.source_key, hit.source_id)


def _unsure(hit: H) -> H:
    if dataclasses.is_dataclass(hit) and "relevance" in {f.name for f in
                                                         dataclasses.fields(hit)}:
        return dataclasses.replace(hit, relevance=POSSIBLY_RELATED)  # type: ignore[type-var]
    return hit
