"""The request's own ``UserPlans``: every surface of a page (the chat notice, Memory
Status, a source's sentence) shares it, so the plan costs one query per request."""

from __future__ import annotations

from typing import Any

from flask import has_request_context, request

from dashboard.extensions import db
from dashboard.plans.sentences import source_sentence
from dashboard.plans.services import (
    Resolution,
    SourceResolution,
    UserPlans,
    resolve_build_sources,
)

# In the WSGI environ, which lives exactly as long as the request (``g`` lives as long as
# the app context, which can span several requests in tests and CLI code).
_KEY = "orbitpilot.user_plans"


def request_plans() -> UserPlans:
    """This request's plans; outside a request, a fresh one (plain queries)."""
    if not has_request_context():
        return UserPlans(db.session)
    plans = request.environ.get(_KEY)
    if plans is None:
        plans = request.environ[_KEY] = UserPlans(db.session)
    return plans


def resolution_of(user: Any) -> Resolution:
    """``resolve_build_sources`` for ``user`` with this request's plans."""
    return resolve_build_sources(user, request_plans())


def sentence_for(user: Any, key: str) -> tuple[SourceResolution, str]:
    """One source's state for ``user`` and its sentence, as a page about it shows them."""
    return source_sentence(resolution_of(user), key)
