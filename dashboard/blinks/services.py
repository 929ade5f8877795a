"""Blinks: create, edit, delete, and the "AI reads this" switch. Services flush; the view
commits. Every change here alters what the owner's next build holds, and
``memory.changes`` requests that build in the same transaction."""

from __future__ import annotations

from sqlalchemy.orm import Session

from dashboard.blinks.models import Blink

MAX_TITLE = 200
MAX_CONTENT = 20_000


class BlinkError(ValueError):
    """A Blink refused, with the form field it is about."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field


def _clean(title: str, content: str) -> tuple[str, str]:
    title, content = (title or "").strip(), (content or "").strip()
    if not content:
        raise BlinkError("Write something in the Blink.", "content")
    if len(content) > MAX_CONTENT:
        raise BlinkError(f"Use at most {MAX_CONTENT:,} characters.", "content")
    if len(title) > MAX_TITLE:
        raise BlinkError(f"Use at most {MAX_TITLE} characters.", "title")
    return title, content


def create_blink(session: Session, *, user_id: int, title: str, content: str) -> Blink:
    """A new Blink, read by the AI (not excluded) until its owner says otherwise."""
    title, content = _clean(title, content)
    blink = Blink(user_id=user_id, title=title, content=content)
    session.add(blink)
    session.flush()
    return blink
