"""Blinks: create, edit, delete, and the "AI reads this" switch. Services flush; the view
commits. Every change here alters what the owner's next build holds, and
``memory.changes`` requests that build in the same transaction."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from dashboard.blinks.models import Blink
from dashboard.holds import keep_held_version, refuse_while_held
from dashboard.refusals import FieldError

MAX_TITLE = 200
MAX_CONTENT = 20_000
PAGE_SIZE = 50
# Beyond this a page number is a typo or a probe; clamping keeps OFFSET cheap.
MAX_PAGE = 10_000

# What the eye says, in the partial, in JSON answers and in flash messages alike.
READS_LABEL = "AI reads this"
EXCLUDED_LABEL = "Excluded from AI memory"
# A Blink its owner left in, on a plan whose resolution leaves Blinks out (switched off,
# or past the cap): the AI does not read it, whatever the switch says.
PLAN_LEAVES_OUT_LABEL = "Not remembered on your plan"


class BlinkError(FieldError):
    """A Blink refused, with the form field it is about."""


def memory_label(excluded: bool, plan_reads: bool = True) -> str:
    """The eye's words: the person's choice first, then what the plan's resolution
    (``plans.services.resolve_build_sources``, as Memory Status shows it) allows."""
    if excluded:
        return EXCLUDED_LABEL
    return READS_LABEL if plan_reads else PLAN_LEAVES_OUT_LABEL


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


@dataclass(frozen=True)
class BlinkPage:
    blinks: list[Blink]
    page: int
    has_next: bool

    @property
    def has_previous(self) -> bool:
        return self.page > 1


def list_blinks(session: Session, *, user_id: int, page: int = 1,
                per_page: int = PAGE_SIZE) -> BlinkPage:
    """One page of the owner's Blinks, newest first, in one query (one row more than the
    page tells whether another page follows, without a count)."""
    page = min(max(page, 1), MAX_PAGE)
    rows = session.scalars(
        select(Blink).where(Blink.user_id == user_id)
        .order_by(Blink.created_at.desc(), Blink.id.desc())
        .offset((page - 1) * per_page).limit(per_page + 1)
    ).all()
    return BlinkPage(list(rows[:per_page]), page, len(rows) > per_page)


def update_blink(session: Session, blink: Blink, *, title: str, content: str) -> Blink:
    """Change a Blink; under a legal hold the text it replaced is kept until the hold ends
    (``holds.keep_held_version``), since a Blink keeps no versions of its own."""
    title, content = _clean(title, content)
    before = (blink.title, blink.content)
    if before == (title, content):
        return blink
    blink.title, blink.content = title, content
    session.flush()
    keep_held_version(session, blink.user_id, "blink", blink.id, title=before[0],
                      content=before[1])
    return blink


def set_excluded(session: Session, blink: Blink, excluded: bool | None = None) -> Blink:
    """Exclude the Blink from AI memory, or let the AI read it again. ``None`` flips it;
    the page's forms send the state they ask for, so a double submit lands where the
    person meant rather than back where it started."""
    blink.excluded_from_memory = (not blink.excluded_from_memory) if excluded is None \
        else excluded
    session.flush()
    return blink


def delete_blink(session: Session, blink: Blink) -> None:
    refuse_while_held(session, blink.user_id, "a Blink",
                      "You can exclude it from memory meanwhile.")
    session.delete(blink)
    session.flush()
