"""Conversations: the events that request memory builds (§5)."""

from __future__ import annotations

from sqlalchemy import func
from sqlalchemy.orm import Session

from dashboard.memory.requests import BuildRequest, request_build
from dashboard.orbitpilot.models import Conversation


def end_conversation(session: Session, conversation: Conversation) -> BuildRequest:
    """Close a conversation and ask for a quick build of its owner's memory."""
    conversation.status = "ended"
    conversation.ended_at = func.now()
    session.flush()
    return request_build(session, conversation.user_id, trigger="conversation_end")
