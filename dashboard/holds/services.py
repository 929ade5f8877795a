"""Placing, reading and releasing holds. Audit events name the user and the dates, never
the reason. Services flush; the caller commits."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime

from sqlalchemy import ColumnElement, or_, select
from sqlalchemy.orm import Session

from dashboard.audit.services import Actor, record_event
from dashboard.holds.models import LegalHold
from dashboard.refusals import Conflict, FieldError

MAX_REASON = 500


class HoldError(FieldError):
    """A hold refused, with the form field it is about."""


class HeldByLaw(Conflict):
    """A deletion refused while a legal hold keeps the user's data."""

    def __init__(self, what: str, instead: str = "") -> None:
        super().__init__(f"Your account is under a legal hold: {what} cannot be deleted "
                         f"until the hold ends.{(' ' + instead) if instead else ''}")


def refuse_while_held(session: Session, user_id: int, what: str, instead: str = "") -> None:
    """Raise ``HeldByLaw`` if a hold keeps ``user_id``'s data now."""
    if is_held(session, user_id):
        raise HeldByLaw(what, instead)


def _holding(now: datetime) -> ColumnElement[bool]:
    return (LegalHold.released_at.is_(None)) & or_(LegalHold.ends_at.is_(None),
                                                    LegalHold.ends_at > now)


def hold_condition(user_id: int, now: datetime) -> ColumnElement[bool]:
    """SQL on ``legal_holds``: a hold that holds ``user_id`` at ``now``."""
    return (LegalHold.user_id == user_id) & _holding(now)


def active_hold(session: Session, user_id: int, *, now: datetime | None = None,
                ) -> LegalHold | None:
    return session.scalars(select(LegalHold).where(
        LegalHold.user_id == user_id, _holding(now or datetime.now(UTC))).limit(1)).first()


def is_held(session: Session, user_id: int, *, now: datetime | None = None) -> bool:
    return active_hold(session, user_id, now=now) is not None


def held_users(session: Session, user_ids: Iterable[int], *,
               now: datetime | None = None) -> set[int]:
    ids = list(user_ids)
    if not ids:
        return set()
    return set(session.scalars(select(LegalHold.user_id).where(
        LegalHold.user_id.in_(ids), _holding(now or datetime.now(UTC)))))


def holds_of(session: Session, user_id: int) -> list[LegalHold]:
    return list(session.scalars(select(LegalHold).where(LegalHold.user_id == user_id)
                                .order_by(LegalHold.id.desc())))


def place_hold(session: Session, user_id: int, *, reason: object, ends_at: datetime | None,
               actor: Actor, now: datetime | None = None) -> LegalHold:
    now = now or datetime.now(UTC)
    text = reason.strip() if isinstance(reason, str) else ""
    if not text:
        raise HoldError("Say why the data is held (a matter or case reference).", "reason")
    if len(text) > MAX_REASON:
        raise HoldError(f"Use at most {MAX_REASON} characters.", "reason")
    if ends_at is not None and ends_at <= now:
        raise HoldError("The end must be in the future (or left empty: until released).",
                        "ends_at")
    open_hold = session.scalars(select(LegalHold).where(
        LegalHold.user_id == user_id, LegalHold.released_at.is_(None))
        .with_for_update()).first()
    if open_hold is not None:
        if open_hold.holds_at(now):
            raise HoldError("This user is already under a legal hold.", "user")
        open_hold.released_at = open_hold.ends_at  # it ended by itself; close it
    hold = LegalHold(user_id=user_id, reason=text, placed_by_id=actor.user_id,
                     placed_at=now, ends_at=ends_at)
    session.add(hold)
    session.flush()
    record_event(session, action="legal_hold.place", actor=actor, owner_id=user_id,
                 target_type="legal_hold", target_id=hold.id,
                 details={"ends_at": ends_at.isoformat() if ends_at else None})
    return hold


def release_hold(session: Session, hold: LegalHold, *, actor: Actor,
                 now: datetime | None = None) -> LegalHold:
    """End the hold now. The erasures that waited for it are completed by the caller
    (``dashboard.retention.complete_released``), in the same transaction."""
    if hold.released_at is not None:
        raise HoldError("This hold was released already.", "hold")
    hold.released_at, hold.released_by_id = now or datetime.now(UTC), actor.user_id
    session.flush()
    record_event(session, action="legal_hold.release", actor=actor, owner_id=hold.user_id,
                 target_type="legal_hold", target_id=hold.id, details={})
    return hold
