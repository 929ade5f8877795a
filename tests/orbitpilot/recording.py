"""A responder that records every context it is handed (ORBITPILOT_RESPONDER in tests)."""

from __future__ import annotations

from dashboard.orbitpilot.responder import BuiltinResponder, Reply, ResponderContext

RECORDED: list[ResponderContext] = []


def recording_responder(context: ResponderContext) -> Reply:
    RECORDED.append(context)
    return BuiltinResponder()(context)


def failing_responder(context):
    """A responder that breaks (a network timeout, a bug in a plug-in)."""
    raise TimeoutError("the model did not answer in time")
