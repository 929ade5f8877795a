"""A responder that records every context it is handed (ORBITPILOT_RESPONDER in tests)."""

from __future__ import annotations

from dashboard.orbitpilot.responder import BuiltinResponder, Reply, ResponderContext

RECORDED: list[ResponderContext] = []


def recording_responder(context: ResponderContext) -> Reply:
    RECORDED.append(context)
    return BuiltinResponder()(context)
