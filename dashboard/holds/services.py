"""Placing, reading and releasing holds. Audit events name the user and the dates, never
the reason. Services flush; the caller commits."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime

from sqlalchemy import ColumnElement, delete, or_, select, update
from sqlalchemy import text as sql_text
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.orm import Session

from dashboard.audit.services import Actor, record_event
from dashboard.holds.models import HELD_KINDS, HeldVersion, LegalHold
from dashboard.refusals import Conflict, FieldError

MAX_REASON = 500
ALREADY_HELD = "This user is already under a legal hold."


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
            raise HoldError(ALREADY_HELD, "user")
        open_hold.released_at = open_hold.ends_at  # it ended by itself; close it
        session.flush()
    # Two holds placed at once: neither saw an open one to lock, so the one-open-hold index
    # decides. The second insert waits for the first transaction, then does nothing, and
    # is told what the first did (never an IntegrityError).
    hold_id = session.scalar(
        pg_insert(LegalHold).values(user_id=user_id, reason=text, placed_by_id=actor.user_id,
                                    placed_at=now, ends_at=ends_at)
        .on_conflict_do_nothing(index_elements=[LegalHold.user_id],
                                index_where=sql_text("released_at IS NULL"))
        .returning(LegalHold.id))
    if hold_id is None:
        raise HoldError(ALREADY_HELD, "user")
    hold = session.get(LegalHold, hold_id)
    if open_hold is not None:
        # What the ended hold kept is the user's data now: the new hold keeps it.
        session.execute(update(HeldVersion).where(HeldVersion.hold_id == open_hold.id)
                        .values(hold_id=hold.id))
    record_event(session, action="legal_hold.place", actor=actor, owner_id=user_id,
                 target_type="legal_hold", target_id=hold.id,
                 details={"ends_at": ends_at.isoformat() if ends_at else None})
    return hold


def release_hold(session: Session, hold: LegalHold, *, actor: Actor,
                 now: datetime | None = None) -> LegalHold:
    """End the hold now, and let go of the versions it kept. The erasures that waited for
    it are completed by the caller (``dashboard.retention.complete_released``), in the
    same transaction."""
    if hold.released_at is not None:
        raise HoldError("This hold was released already.", "hold")
    hold.released_at, hold.released_by_id = now or datetime.now(UTC), actor.user_id
    session.flush()
    released = session.execute(delete(HeldVersion).where(HeldVersion.hold_id == hold.id)
                               ).rowcount or 0
    record_event(session, action="legal_hold.release", actor=actor, owner_id=hold.user_id,
                 target_type="legal_hold", target_id=hold.id,
                 details={"held_versions": released} if released else {})
    return hold


# -- what an edit replaces while a hold holds ---------------------------------------------------

def keep_held_version(session: Session, user_id: int, kind: str, item_id: int, *,
                      title: str, content: str, now: datetime | None = None
                      ) -> HeldVersion | None:
    """Call after an edit of a Blink or a profile fact is flushed, with the text it
    replaced: while a hold holds ``user_id``, that text is kept (until the hold ends, in
    the owner's export) and the keeping audited — ids only, never the text. ``None``:
    no hold, nothing kept."""
    if kind not in HELD_KINDS:
        raise ValueError(f"no held versions of {kind!r}")
    hold = active_hold(session, user_id, now=now)
    if hold is None:
        return None
    version = HeldVersion(user_id=user_id, hold_id=hold.id, kind=kind, item_id=item_id,
                          title=title, content=content)
    session.add(version)
    session.flush()  # the row before the audit chain's lock
    record_event(session, action="legal_hold.keep_version", actor=Actor("user", str(user_id)),
                 owner_id=user_id, target_type=kind, target_id=item_id,
                 details={"legal_hold": hold.id, "held_version": version.id})
    return version


def held_versions_of(session: Session, user_id: int, kind: str, item_id: int
                     ) -> list[HeldVersion]:
    return list(session.scalars(select(HeldVersion).where(
        HeldVersion.user_id == user_id, HeldVersion.kind == kind,
        HeldVersion.item_id == item_id).order_by(HeldVersion.id)))


def release_ended_versions(session: Session, *, now: datetime | None = None) -> int:
    """The versions kept by holds that ended by reaching their end (a release by hand lets
    go of its own at once): deleted, one audit event per hold with the count. How many."""
    now = now or datetime.now(UTC)
    ended = (select(LegalHold.id).where(~_holding(now))).scalar_subquery()
    gone = session.execute(delete(HeldVersion).where(HeldVersion.hold_id.in_(ended))
                           .returning(HeldVersion.hold_id, HeldVersion.user_id)).all()
    by_hold: dict[tuple[int, int], int] = {}
    for hold_id, user_id in gone:
        by_hold[hold_id, user_id] = by_hold.get((hold_id, user_id), 0) + 1
    for (hold_id, user_id), count in sorted(by_hold.items()):
        record_event(session, action="legal_hold.versions_released", actor=Actor("system"),
                     owner_id=user_id, target_type="legal_hold", target_id=hold_id,
                     details={"held_versions": count})
    return len(gone)
