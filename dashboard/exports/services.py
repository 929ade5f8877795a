"""Download everything about me, and a team's export: one zip of what the product holds
about a person (or a team) — a JSON document with its JSON Schema, and a readable HTML
report (``sections``) — built by a job a section at a time (rows streamed from the
database, written into a temporary file, then stored in 1 MB pieces), so a large account
never sits in memory whole. The person alone (a team's owners and admins) download it, for
24 hours; requests are rate-limited; audit events hold ids and counts only."""

from __future__ import annotations

import io
import json
import math
import shutil
import tempfile
import uuid
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import IO, Any

from sqlalchemy import delete, func, insert, select, text, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.orm import Session

from dashboard.access import Action
from dashboard.audit.models import AuditEvent
from dashboard.audit.services import Actor, record_event
from dashboard.auth.models import User
from dashboard.copies import CopyCount, Erasure
from dashboard.exports.models import DataExport, DataExportPart
from dashboard.exports.sections import (
    JSON_NAME,
    REPORT_NAME,
    SCHEMA_NAME,
    TEAM_JSON_NAME,
    TEAM_SCHEMA_NAME,
    export_schema,
    team_export_schema,
    write_person,
    write_team,
)
from dashboard.holds import is_held
from dashboard.ids import find_owned
from dashboard.memory import Call, defer_job
from dashboard.refusals import Gone, NotFound, TooSoon
from dashboard.saved_memories import Receipt, receipt_of
from dashboard.saved_memories import reach as reached
from dashboard.saved_memories.models import ForgetMarker, Memory
from dashboard.sources import SAVED
from dashboard.teams.models import Team, TeamMember
from dashboard.teams.services import team_for

LINK_HOURS = 24
PART_BYTES = 1024 * 1024


WITHDRAWN = ("This export was withdrawn: something in it was erased after it was made, so "
             "its copy was deleted. Ask for a new one.")


class ExportNotFound(NotFound):
    """Not an export of this user's (the same answer for someone else's and for none)."""


class ExportGone(Gone):
    """Its 24 hours are over and its copy is deleted."""


class ExportTooSoon(TooSoon):
    """Asked again within the interval: the sentence says when, in words, and
    ``latest_id`` names the export asked for last (ready to download, as a rule), so
    the page can lead to it."""

    def __init__(self, sentence: str, retry_after: int, latest_id: int) -> None:
        super().__init__(sentence, retry_after)
        self.latest_id = latest_id


def _minutes(minutes: int) -> str:
    return f"{minutes} minute{'' if minutes == 1 else 's'}"


def ago_in_words(seconds: float) -> str:
    """``seconds`` ago, as a person says it: "less than a minute ago", "1 minute ago"."""
    return "less than a minute ago" if seconds < 60 else f"{_minutes(int(seconds // 60))} ago"


def wait_in_words(seconds: float) -> str:
    """A wait of ``seconds``, rounded up to the minute: "in 1 minute", "in 10 minutes"."""
    return f"in {_minutes(max(1, math.ceil(seconds / 60)))}"


def export_job_id(export_id: int) -> str:
    return f"export-{export_id}"



# -- requesting, reading, downloading ---------------------------------------------------------

def request_export(session: Session, user: Any, *, interval: int,
                   now: datetime | None = None, actor: Actor | None = None
                   ) -> tuple[DataExport, bool]:
    """The account's export (a person's, or a team's: ``actor`` is then the member who
    asked): the one in the making (joined), else a new one if the last was asked for at
    least ``interval`` seconds ago (``TooSoon`` otherwise). Its job is pushed after the
    commit; audited without content. Whether it is new."""
    now = now or datetime.now(UTC)
    latest = session.scalars(select(DataExport).where(DataExport.user_id == user.id)
                             .order_by(DataExport.id.desc()).limit(1)
                             .with_for_update()).first()
    if latest is not None and latest.status in ("queued", "running"):
        return latest, False
    # A withdrawn export was taken away by an erasure, not used: asking again is not "too soon".
    if latest is not None and latest.status != "withdrawn":
        waited = (now - latest.created_at).total_seconds()
        if waited < interval:
            left = int(interval - waited) + 1
            asked = "You asked for an export" if actor is None else \
                "An export of this team was asked for"
            raise ExportTooSoon(f"{asked} {ago_in_words(max(0.0, waited))}; you can ask for "
                                f"a new one {wait_in_words(interval - waited)}.", left,
                                latest.id)
    # A first export asked twice at once: neither saw a row to lock, so the one-in-the-
    # making index decides. The second insert waits for the first transaction, then does
    # nothing, and joins the export the first one made (never an IntegrityError).
    export_id = session.scalar(
        pg_insert(DataExport).values(user_id=user.id, status="queued", created_at=now)
        .on_conflict_do_nothing(index_elements=[DataExport.user_id],
                                index_where=text("status IN ('queued', 'running')"))
        .returning(DataExport.id))
    if export_id is None:
        pending = session.scalars(
            select(DataExport).where(DataExport.user_id == user.id,
                                     DataExport.status.in_(("queued", "running")))
            .execution_options(populate_existing=True)).first()
        if pending is not None:
            return pending, False
        # It was made and finished in between: what the user now sees is that one.
        return latest_export(session, user.id), False
    export = session.get(DataExport, export_id)
    record_event(session, action="export.request", actor=actor or Actor.of(user),
                 owner_id=user.id, target_type="export", target_id=export.id, details={})
    defer_job(session, ("call", export_call(export.id)))
    return export, True


def export_call(export_id: int) -> Call:
    return Call("jobs.exports.run_export", (export_id,), export_job_id(export_id),
                f"data export {export_id}")


def find_export(session: Session, user_id: int, export_id: Any) -> DataExport:
    export = find_owned(session, DataExport, export_id, user_id, bits=64)
    if export is None:
        raise ExportNotFound("There is no such export among yours.")
    return export


def latest_export(session: Session, user_id: int) -> DataExport | None:
    return session.scalars(select(DataExport).where(DataExport.user_id == user_id)
                           .order_by(DataExport.id.desc()).limit(1)).first()


def is_expired(export: DataExport, now: datetime | None = None) -> bool:
    return export.expires_at is not None and export.expires_at <= (now or datetime.now(UTC))


def open_download(session: Session, user: Any, export_id: Any, *,
                  now: datetime | None = None, owner_id: int | None = None) -> DataExport:
    """The owner's ready export (``owner_id``: a team's, downloaded by ``user``), audited
    as downloaded (the caller commits, then streams ``export_parts``). Someone else's:
    404; expired or not ready: 410 / 404."""
    owner_id = user.id if owner_id is None else owner_id
    export = find_export(session, owner_id, export_id)
    if export.status == "withdrawn":
        raise ExportGone(WITHDRAWN)
    if export.status == "expired" or (export.status == "ready" and is_expired(export, now)):
        raise ExportGone("This export's link has expired (24 hours). Ask for a new one.")
    if export.status != "ready":
        raise ExportNotFound("This export is not ready yet.")
    record_event(session, action="export.download", actor=Actor.of(user), owner_id=owner_id,
                 target_type="export", target_id=export.id,
                 details={"bytes": export.size_bytes})
    return export


def export_parts(session_factory: Callable[[], Session], export_id: int) -> Iterator[bytes]:
    """The zip's bytes, one stored piece per query: a download holds one piece at a time."""
    seq = 0
    while True:
        session = session_factory()
        data = session.scalar(select(DataExportPart.data).where(
            DataExportPart.export_id == export_id, DataExportPart.seq == seq))
        if data is None:
            return
        yield bytes(data)
        seq += 1


# -- building it (the job) ------------------------------------------------------------------


def _progress(session: Session, export: DataExport, percent: int, stage: str) -> None:
    session.execute(update(DataExport).where(DataExport.id == export.id).values(
        progress=percent, stage=stage, heartbeat_at=datetime.now(UTC)))
    session.commit()


def build_export(session: Session, export_id: int, *, now: datetime | None = None) -> str:
    """The job: write the zip a section at a time, store it in pieces, mark it ready for
    ``LINK_HOURS``. Commits as it goes (progress). What it did, in a word."""
    export = session.get(DataExport, export_id)
    if export is None or export.status not in ("queued", "running"):
        return "nothing to do"
    user = session.get(User, export.user_id)
    export.status, export.heartbeat_at = "running", datetime.now(UTC)
    session.commit()
    counts: dict[str, int] = {}
    try:
        with tempfile.TemporaryFile() as spool:
            with zipfile.ZipFile(spool, "w", zipfile.ZIP_DEFLATED) as zf:
                _write_zip(session, zf, export, user, counts)
            _store(session, export, spool)
    except Exception as exc:
        session.rollback()
        session.execute(update(DataExport).where(DataExport.id == export_id).values(
            status="failed", error=type(exc).__name__[:64], finished_at=datetime.now(UTC)))
        session.commit()
        raise
    finished = now or datetime.now(UTC)
    # Only if it is still running: an erasure meanwhile withdrew it (what it read before
    # may hold the erased words), and then its pieces go with this rollback.
    made = session.execute(update(DataExport).where(
        DataExport.id == export_id, DataExport.status == "running").values(
        status="ready", progress=100, stage="ready", finished_at=finished,
        expires_at=finished + timedelta(hours=LINK_HOURS))).rowcount
    if not made:
        session.rollback()
        return "withdrawn"
    record_event(session, action="export.ready", actor=Actor("system"), owner_id=user.id,
                 target_type="export", target_id=export_id,
                 details={"rows": counts, "bytes": session.scalar(
                     select(DataExport.size_bytes).where(DataExport.id == export_id))})
    session.commit()
    return "ready"


def _write_zip(session: Session, zf: zipfile.ZipFile, export: DataExport, user: User,
               counts: dict[str, int]) -> None:
    """The JSON straight into the zip, the report beside it in a temporary file (a zip
    takes one entry at a time), copied in after. A team's account gets the team's."""
    team = user.kind == "team"
    schema, json_name, write = (team_export_schema(), TEAM_JSON_NAME, write_team) if team \
        else (export_schema(), JSON_NAME, write_person)
    zf.writestr(TEAM_SCHEMA_NAME if team else SCHEMA_NAME, json.dumps(schema, indent=2))
    with tempfile.TemporaryFile() as report_spool:
        with zf.open(json_name, "w", force_zip64=True) as raw_json:
            json_out = io.TextIOWrapper(raw_json, "utf-8")
            html_out = io.TextIOWrapper(report_spool, "utf-8")
            counts.update(write(session, json_out, html_out, user,
                                lambda percent, stage: _progress(session, export, percent,
                                                                 stage)))
            json_out.flush()
            html_out.flush()
            json_out.detach()
            html_out.detach()
        report_spool.seek(0)
        with zf.open(REPORT_NAME, "w", force_zip64=True) as raw_html:
            shutil.copyfileobj(report_spool, raw_html, PART_BYTES)


def _store(session: Session, export: DataExport, spool: IO[bytes]) -> None:
    _progress(session, export, 92, "storing")
    session.execute(delete(DataExportPart).where(DataExportPart.export_id == export.id))
    spool.seek(0)
    seq = size = 0
    while piece := spool.read(PART_BYTES):
        # A core insert: no ORM object (with its megabyte) stays in the session.
        session.execute(insert(DataExportPart).values(export_id=export.id, seq=seq,
                                                      data=piece))
        seq, size = seq + 1, size + len(piece)
    session.execute(update(DataExport).where(DataExport.id == export.id)
                    .values(size_bytes=size))
    session.flush()


# -- upkeep (a periodic task) -----------------------------------------------------------------

def tend_exports(session: Session, *, lost: Callable[[dict[str, int]], list[int]],
                 push: Callable[[list[Call]], int], now: datetime | None = None,
                 stale_seconds: int = 600) -> dict[str, int]:
    """Re-push queued exports whose job Redis lost, fail running ones whose job stopped
    beating, and expire ready ones past their link (their pieces deleted)."""
    now = now or datetime.now(UTC)
    queued = dict(session.execute(select(DataExport.id, DataExport.id).where(
        DataExport.status == "queued",
        DataExport.created_at < now - timedelta(seconds=60))).all())
    missing = lost({export_job_id(i): i for i in queued})
    pushed = push([export_call(i) for i in missing]) if missing else 0
    failed = session.execute(update(DataExport).where(
        DataExport.status == "running",
        DataExport.heartbeat_at < now - timedelta(seconds=stale_seconds))
        .values(status="failed", error="stopped", finished_at=now)).rowcount or 0
    expired_ids = list(session.scalars(select(DataExport.id).where(
        DataExport.status == "ready", DataExport.expires_at <= now)))
    if expired_ids:
        session.execute(delete(DataExportPart).where(
            DataExportPart.export_id.in_(expired_ids)))
        session.execute(update(DataExport).where(DataExport.id.in_(expired_ids))
                        .values(status="expired"))
    session.flush()
    return {"pushed": pushed, "failed": failed, "expired": len(expired_ids)}


# -- an erasure's copies (a keeper of ``dashboard.copies``) -----------------------------------

EXPORTS = "exports"
EXPORT_PARTS = "export_parts"


def withdraw_exports(session: Session, erasure: Erasure) -> list[CopyCount]:
    """An erasure withdraws the exports that may hold the erased words — the owner's
    (a team's own export), its author's (who saved it to a team: "what you saved to
    teams"), and those of the people whose chat replies quoted it (``holders``) — those
    ready to download and the one being made (it may have read them already; its job
    then stores nothing). Their pieces are deleted now. A queued one reads after this
    commit, so it stays. Then both are counted again: exports still downloadable or in the
    making from before, and pieces still stored."""
    people = _holding(session, erasure)
    withdrawn = list(session.scalars(
        update(DataExport).where(DataExport.user_id.in_(people),
                                 DataExport.status.in_(("running", "ready")))
        .values(status="withdrawn", withdrawn_at=datetime.now(UTC))
        .returning(DataExport.id)))
    of_owner = select(DataExport.id).where(DataExport.user_id.in_(people))
    parts = session.execute(delete(DataExportPart).where(
        DataExportPart.export_id.in_(of_owner))).rowcount or 0
    exports_left = session.scalar(select(func.count()).select_from(DataExport).where(
        DataExport.user_id.in_(people), DataExport.status.in_(("running", "ready")))) or 0
    parts_left = session.scalar(select(func.count()).select_from(DataExportPart).where(
        DataExportPart.export_id.in_(of_owner))) or 0
    return [CopyCount(EXPORTS, len(withdrawn), exports_left),
            CopyCount(EXPORT_PARTS, parts, parts_left)]


def _holding(session: Session, erasure: Erasure) -> list[int]:
    """Whose exports may hold the item's words: its owner, the people whose replies drew
    on it, and the author of a saved memory (a team's memory is in its author's own
    export too)."""
    people = {erasure.owner_id, *erasure.holders}
    if erasure.source_key == SAVED:
        try:
            memory_id = uuid.UUID(erasure.source_id)
        except ValueError:
            memory_id = None
        author = session.scalar(select(Memory.author_id).where(Memory.id == memory_id)) \
            if memory_id is not None else None
        if author is not None:
            people.add(author)
    return sorted(people)


# -- a team's export: asked for and downloaded by its owners and admins ----------------------

def team_export_for(session: Session, user: Any, slug: object) -> tuple[Team, User]:
    """The team ``slug`` names and its account, if ``user``'s role there may export
    (owners and admins). Not a member (or no such team): ``TeamNotFound``; a member or a
    reader: ``RoleTooLow``."""
    team, _ = team_for(session, user.id, slug, action=Action.EXPORT)
    account = session.get(User, team.id)
    assert account is not None  # the team row's id is its account's
    return team, account


def request_team_export(session: Session, user: Any, slug: object, *, interval: int,
                        now: datetime | None = None) -> tuple[Team, DataExport, bool]:
    """A team's export, asked for by one of its owners or admins (audited as them, with
    the team as the event's owner); as a person's (one in the making, the interval)."""
    team, account = team_export_for(session, user, slug)
    export, new = request_export(session, account, interval=interval, now=now,
                                 actor=Actor.of(user))
    return team, export, new


def open_team_download(session: Session, user: Any, slug: object, export_id: Any, *,
                       now: datetime | None = None) -> DataExport:
    """A team's ready export, for one of its owners or admins; audited as them."""
    team, _ = team_export_for(session, user, slug)
    return open_download(session, user, export_id, now=now, owner_id=team.id)


# -- "erase what I saved to teams": the person's own request --------------------------------

ERASE_REASON = "Its author asked to erase what they saved to teams."


@dataclass(frozen=True)
class Contribution:
    """What a person saved to one team (still there), and whether a hold keeps it."""

    team_id: int
    slug: str
    name: str
    memories: int
    member: bool
    held: bool


def team_contributions(session: Session, user_id: int) -> list[Contribution]:
    """Per team (also one the person has left), how many memories they saved there that
    are not erased yet, and whether a legal hold on the team would keep them (an erasure
    then waits, as a pending receipt)."""
    rows = session.execute(
        select(Team.id, Team.slug, Team.name, func.count(Memory.id),
               select(TeamMember.user_id).where(TeamMember.team_id == Team.id,
                                                TeamMember.user_id == user_id)
               .exists().label("member"))
        .join(Memory, Memory.owner_id == Team.id)
        .where(Memory.author_id == user_id, ~_waiting(Memory.id))
        .group_by(Team.id).order_by(Team.name, Team.id)).all()
    return [Contribution(team_id, slug, name, count, member, is_held(session, team_id))
            for team_id, slug, name, count, member in rows]


def _waiting(memory_id: Any) -> Any:
    """A memory whose erasure already waits for a legal hold."""
    return select(ForgetMarker.id).where(
        ForgetMarker.memory_id == memory_id, ForgetMarker.pending_hold,
        ForgetMarker.completed_by_id.is_(None)).exists()


def erase_team_contributions(session: Session, user: Any) -> list[Receipt]:
    """Hard delete every memory ``user`` saved to any team, each with its receipt
    (``memories.reach.erase_authored``); under a legal hold on a team, a pending receipt
    (recall stops now, the erasure completes when the hold ends). The person's row is
    locked first: a second request at once waits, then finds nothing left to do."""
    session.execute(select(User.id).where(User.id == user.id).with_for_update())
    receipts: list[Receipt] = []
    for contribution in team_contributions(session, user.id):
        receipts += reached.erase_authored(session, contribution.team_id, user.id,
                                           actor=Actor.of(user), reason=ERASE_REASON)
    return receipts


def erasure_receipts_of(session: Session, user_id: int, *, limit: int = 200
                        ) -> list[tuple[Receipt, str]]:
    """The receipts of the person's requests to erase what they saved to teams, newest
    first, each with its team's name."""
    rows = session.execute(
        select(ForgetMarker, Team.name, AuditEvent.hash)
        .join(Team, Team.id == ForgetMarker.owner_id)
        .outerjoin(AuditEvent, AuditEvent.id == ForgetMarker.audit_event_id)
        .where(ForgetMarker.actor_type == "user", ForgetMarker.actor_id == str(user_id),
               ForgetMarker.reason == ERASE_REASON)
        .order_by(ForgetMarker.id.desc()).limit(limit)).all()
    return [(receipt_of(session, marker, audit_hash=hash_), name)
            for marker, name, hash_ in rows]
