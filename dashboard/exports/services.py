"""Download everything about me: one zip of what the product holds about a user — a JSON
document with its JSON Schema, and a readable HTML report — built by a job a section at a
time (rows streamed from the database, written into a temporary file, then stored in 1 MB
pieces), so a large user never sits in memory whole. The owner alone downloads it, for
24 hours; requests are rate-limited; audit events hold ids and counts only."""

from __future__ import annotations

import io
import json
import shutil
import tempfile
import uuid
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import IO, Any

from markupsafe import escape
from sqlalchemy import (
    Boolean,
    DateTime,
    Integer,
    Numeric,
    Select,
    delete,
    func,
    insert,
    select,
    text,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, UUID
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.orm import Session

from dashboard.audit.models import AuditEvent
from dashboard.audit.services import Actor, record_event
from dashboard.auth.models import User
from dashboard.blinks.models import Blink
from dashboard.connectors.models import ConnectorAccess, OAuthClient, OAuthGrant
from dashboard.copies import CopyCount, Erasure
from dashboard.documents.models import Document
from dashboard.exports.models import DataExport, DataExportPart
from dashboard.holds.models import HeldVersion
from dashboard.ids import find_owned
from dashboard.memories.models import ApiKey, ForgetMarker, Memory, MemoryVersion
from dashboard.memory import Call, MemoryBuild, MemoryChunk, defer_job
from dashboard.orbitpilot.models import Conversation, Message, ProfileFact
from dashboard.plans.sentences import state_sentence
from dashboard.plans.services import get_plan_for_user, resolve_sources
from dashboard.refusals import Gone, NotFound, TooSoon

LINK_HOURS = 24
PART_BYTES = 1024 * 1024
JSON_NAME = "orbitpilot-export.json"
SCHEMA_NAME = "orbitpilot-export.schema.json"
REPORT_NAME = "report.html"
FORMAT = "orbitpilot-export"
FORMAT_VERSION = 1


WITHDRAWN = ("This export was withdrawn: something in it was erased after it was made, so "
             "its copy was deleted. Ask for a new one.")


class ExportNotFound(NotFound):
    """Not an export of this user's (the same answer for someone else's and for none)."""


class ExportGone(Gone):
    """Its 24 hours are over and its copy is deleted."""


def export_job_id(export_id: int) -> str:
    return f"export-{export_id}"


# -- what goes in: one section per kind of thing held about the user --------------------------

@dataclass(frozen=True)
class Section:
    name: str
    title: str
    description: str
    columns: tuple[Any, ...]  # labelled columns: each row's fields, in order
    query: Callable[[int], Select]

    def fields(self) -> list[str]:
        return [c.key for c in self.columns]


def _cols(*columns: Any) -> tuple[Any, ...]:
    return columns


def _section(name: str, title: str, description: str, columns: tuple[Any, ...],
             where: Callable[[int], Any], order: tuple[Any, ...],
             join: tuple[Any, Any] | None = None) -> Section:
    """``join``: (table, on) when the owner is on another table than the rows."""
    def query(uid: int) -> Select:
        rows = select(*columns)
        if join is not None:
            rows = rows.join(*join)
        return rows.where(where(uid)).order_by(*order)

    return Section(name, title, description, columns, query)


SECTIONS: tuple[Section, ...] = (
    _section("profile", "Profile facts", "What OrbitPilot knows about you as facts.",
             _cols(ProfileFact.key, ProfileFact.value, ProfileFact.created_at,
                   ProfileFact.updated_at),
             lambda uid: ProfileFact.user_id == uid, (ProfileFact.key,)),
    _section("blinks", "Blinks", "Replies you saved with Catch, and whether memory reads them.",
             _cols(Blink.id, Blink.title, Blink.content, Blink.excluded_from_memory,
                   Blink.created_at, Blink.updated_at),
             lambda uid: Blink.user_id == uid, (Blink.id,)),
    _section("memories", "Saved memories",
             "Memories saved through the API or a connected app, with who saved them.",
             _cols(Memory.id, Memory.content, Memory.metadata_.label("metadata"),
                   Memory.source, Memory.client_name, Memory.status, Memory.version,
                   Memory.created_at, Memory.updated_at, Memory.deleted_at,
                   Memory.redacted_at),
             lambda uid: Memory.owner_id == uid, (Memory.created_at, Memory.id)),
    _section("memory_versions", "Earlier versions of saved memories",
             "Each change kept the version before it; a redaction erased their content.",
             _cols(MemoryVersion.memory_id, MemoryVersion.version, MemoryVersion.content,
                   MemoryVersion.metadata_.label("metadata"), MemoryVersion.status,
                   MemoryVersion.created_at),
             lambda uid: Memory.owner_id == uid,
             (MemoryVersion.memory_id, MemoryVersion.version),
             join=(Memory, Memory.id == MemoryVersion.memory_id)),
    _section("conversations", "Conversations", "Your chats with OrbitPilot.",
             _cols(Conversation.id, Conversation.title, Conversation.status,
                   Conversation.created_at, Conversation.last_activity_at,
                   Conversation.ended_at),
             lambda uid: Conversation.user_id == uid, (Conversation.id,)),
    _section("messages", "Messages",
             "Every message, with whether you marked it \u201cNot remembered\u201d.",
             _cols(Message.id, Message.conversation_id, Message.role, Message.position,
                   Message.content, Message.not_remembered, Message.reply_to_id,
                   Message.created_at),
             lambda uid: Message.user_id == uid, (Message.conversation_id, Message.position)),
    _section("documents", "Documents", "Documents you uploaded, with their text.",
             _cols(Document.id, Document.title, Document.filename, Document.content_type,
                   Document.content, Document.created_at, Document.updated_at),
             lambda uid: Document.user_id == uid, (Document.id,)),
    _section("held_versions", "Versions kept by a legal hold",
             "While a legal hold held your data, an edit of a Blink or a profile fact kept "
             "the text it replaced; kept until the hold ends.",
             _cols(HeldVersion.kind, HeldVersion.item_id, HeldVersion.title,
                   HeldVersion.content, HeldVersion.held_at),
             lambda uid: HeldVersion.user_id == uid, (HeldVersion.id,)),
    _section("chunks", "Your memory as stored",
             "The chunks your memory is made of, as stored, with the source and record "
             "each came from (their vectors are numbers derived from the text, left out).",
             _cols(MemoryChunk.id, MemoryChunk.source_key, MemoryChunk.source_id,
                   MemoryChunk.chunk_index, MemoryChunk.content, MemoryChunk.record_at,
                   MemoryChunk.embedding_model, MemoryChunk.created_at),
             lambda uid: MemoryChunk.user_id == uid,
             (MemoryChunk.source_key, MemoryChunk.source_id, MemoryChunk.chunk_index)),
    _section("erasure_receipts", "Erasure receipts",
             "Every forget, redaction, deletion and restore, what it removed (of copies "
             "too: chat replies, \u201cDrew on\u201d records, exports) and what was found "
             "after it.",
             _cols(ForgetMarker.id.label("marker_id"), ForgetMarker.memory_id,
                   ForgetMarker.mode, ForgetMarker.reason, ForgetMarker.actor_type,
                   ForgetMarker.from_status, ForgetMarker.to_status, ForgetMarker.version,
                   ForgetMarker.removed_versions, ForgetMarker.removed_chunks,
                   ForgetMarker.audit_event_id, ForgetMarker.created_at,
                   ForgetMarker.vacuumed_at, ForgetMarker.probed_at, ForgetMarker.probe_rows,
                   ForgetMarker.pending_hold, ForgetMarker.completed_by_id,
                   ForgetMarker.copies),
             lambda uid: ForgetMarker.owner_id == uid, (ForgetMarker.id,)),
    _section("connected_apps", "Connected apps", "Apps you connected, and their access.",
             _cols(OAuthGrant.id.label("grant_id"), OAuthClient.name.label("app"),
                   OAuthGrant.scopes, OAuthGrant.created_at, OAuthGrant.last_used_at,
                   OAuthGrant.calls, OAuthGrant.revoked_at),
             lambda uid: OAuthGrant.user_id == uid, (OAuthGrant.id,),
             join=(OAuthClient, OAuthClient.id == OAuthGrant.client_pk)),
    _section("app_reads", "What connected apps read",
             "Each item a connected app was handed (never the question it asked).",
             _cols(ConnectorAccess.grant_id, ConnectorAccess.tool, ConnectorAccess.source_key,
                   ConnectorAccess.memory_id, ConnectorAccess.source_id,
                   ConnectorAccess.created_at),
             lambda uid: OAuthGrant.user_id == uid, (ConnectorAccess.id,),
             join=(OAuthGrant, OAuthGrant.id == ConnectorAccess.grant_id)),
    _section("api_keys", "API keys", "Keys to your memory (their secrets are never kept).",
             _cols(ApiKey.id, ApiKey.name, ApiKey.prefix, ApiKey.scopes, ApiKey.created_at,
                   ApiKey.expires_at, ApiKey.revoked_at, ApiKey.last_used_at),
             lambda uid: ApiKey.owner_id == uid, (ApiKey.id,)),
    _section("audit_events", "Audit events about you",
             "The audit log's events about you, as they are: ids, states and counts.",
             _cols(AuditEvent.seq, AuditEvent.occurred_at, AuditEvent.action,
                   AuditEvent.actor_type, AuditEvent.actor_id, AuditEvent.target_type,
                   AuditEvent.target_id, AuditEvent.mode, AuditEvent.details,
                   AuditEvent.hash),
             lambda uid: AuditEvent.owner_id == uid, (AuditEvent.seq,)),
    _section("builds", "Memory builds", "Each build of your memory: what it did, and when.",
             _cols(MemoryBuild.id, MemoryBuild.mode, MemoryBuild.trigger, MemoryBuild.status,
                   MemoryBuild.added, MemoryBuild.removed, MemoryBuild.kept,
                   MemoryBuild.embedded, MemoryBuild.created_at, MemoryBuild.finished_at,
                   MemoryBuild.error),
             lambda uid: MemoryBuild.user_id == uid, (MemoryBuild.id,)),
)


# -- the schema, derived from the sections' columns (tests hold it equal to the shipped file) --

def _type_of(column: Any) -> dict[str, Any]:
    kind = column.type
    if isinstance(kind, Boolean):
        base: dict[str, Any] = {"type": "boolean"}
    elif isinstance(kind, Integer | Numeric):
        base = {"type": "integer"}
    elif isinstance(kind, DateTime):
        base = {"type": "string", "format": "date-time"}
    elif isinstance(kind, UUID):
        base = {"type": "string", "format": "uuid"}
    elif isinstance(kind, ARRAY):
        base = {"type": "array", "items": {"type": "string"}}
    elif isinstance(kind, JSONB):
        base = {"type": "object"}
    else:
        base = {"type": "string"}
    expression = getattr(column, "element", column)
    nullable = getattr(expression, "nullable", True)
    if nullable:
        base = {**base, "type": [base["type"], "null"]}
    return base


def export_schema() -> dict[str, Any]:
    row = {"type": "object", "additionalProperties": False}
    sections = {
        s.name: {"description": s.description, "type": "array", "items": {
            **row, "required": s.fields(),
            "properties": {c.key: _type_of(c) for c in s.columns}}}
        for s in SECTIONS}
    memory_status = {"type": "array", "items": {**row, "required": [
        "source_key", "label", "rank", "state", "sentence", "keep_days"], "properties": {
        "source_key": {"type": "string"}, "label": {"type": "string"},
        "rank": {"type": "integer"}, "state": {"type": "string"},
        "sentence": {"type": "string"}, "keep_days": {"type": ["integer", "null"]}}}}
    user = {**row, "required": ["id", "email", "display_name", "plan", "created_at"],
            "properties": {"id": {"type": "integer"}, "email": {"type": "string"},
                           "display_name": {"type": "string"},
                           "plan": {"type": ["string", "null"]},
                           "created_at": {"type": "string", "format": "date-time"}}}
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "Everything OrbitPilot holds about one user",
        "type": "object", "additionalProperties": False,
        "required": ["format", "version", "generated_at", "user", "memory_status",
                     *sections],
        "properties": {"format": {"const": FORMAT}, "version": {"const": FORMAT_VERSION},
                       "generated_at": {"type": "string", "format": "date-time"},
                       "user": user, "memory_status": memory_status, **sections},
    }


# -- requesting, reading, downloading ---------------------------------------------------------

def request_export(session: Session, user: Any, *, interval: int,
                   now: datetime | None = None) -> tuple[DataExport, bool]:
    """The user's export: the one in the making (joined), else a new one if the last was
    asked for at least ``interval`` seconds ago (``TooSoon`` otherwise). Its job is
    pushed after the commit; audited without content. Whether it is new."""
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
            raise TooSoon(f"You asked for an export {int(waited // 60)} minute(s) ago; you "
                          f"can ask for a new one in {max(1, left // 60)} minute(s).", left)
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
    record_event(session, action="export.request", actor=Actor.of(user), owner_id=user.id,
                 target_type="export", target_id=export.id, details={})
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
                  now: datetime | None = None) -> DataExport:
    """The owner's ready export, audited as downloaded (the caller commits, then streams
    ``export_parts``). Someone else's: 404; expired or not ready: 410 / 404."""
    export = find_export(session, user.id, export_id)
    if export.status == "withdrawn":
        raise ExportGone(WITHDRAWN)
    if export.status == "expired" or (export.status == "ready" and is_expired(export, now)):
        raise ExportGone("This export's link has expired (24 hours). Ask for a new one.")
    if export.status != "ready":
        raise ExportNotFound("This export is not ready yet.")
    record_event(session, action="export.download", actor=Actor.of(user), owner_id=user.id,
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

def _jsonable(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.astimezone(UTC).isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, Decimal):
        return int(value)
    return value


def _rows(session: Session, section: Section, user_id: int) -> Iterator[dict[str, Any]]:
    names = section.fields()
    result = session.execute(section.query(user_id).execution_options(yield_per=500))
    for row in result:
        yield {name: _jsonable(value) for name, value in zip(names, row, strict=True)}


def _status_rows(session: Session, user: User) -> list[dict[str, Any]]:
    resolution = resolve_sources(get_plan_for_user(user, session))
    return [{"source_key": s.key, "label": s.label, "rank": s.rank, "state": s.state.value,
             "sentence": state_sentence(s, resolution), "keep_days": s.keep_days}
            for s in resolution.sources]


def _cell(value: Any) -> str:
    if value is None:
        return '<span class="none">—</span>'
    if isinstance(value, dict | list):
        value = json.dumps(value, ensure_ascii=False)
    return str(escape(str(value)))


_STYLE = ("body{font-family:system-ui,sans-serif;margin:2rem;max-width:80rem}"
          "table{border-collapse:collapse;width:100%;margin-bottom:2rem;font-size:.9rem}"
          "th,td{border:1px solid #ccc;padding:.3rem .5rem;text-align:left;"
          "vertical-align:top;white-space:pre-wrap;overflow-wrap:anywhere}"
          "th{background:#f3f3f3}.none{color:#888}")


class _Writer:
    """The JSON document and the report, written side by side a row at a time."""

    def __init__(self, json_out: IO[str], html_out: IO[str]) -> None:
        self.json, self.html, self.first_key = json_out, html_out, True

    def key(self, name: str, value: Any) -> None:
        self.json.write(("{" if self.first_key else ",") + json.dumps(name) + ":"
                        + json.dumps(value, ensure_ascii=False))
        self.first_key = False

    def rows(self, section: Section, rows: Iterator[dict[str, Any]]) -> int:
        self.json.write("," + json.dumps(section.name) + ":[")
        self.html.write(f'<section id="{section.name}"><h2>{escape(section.title)}</h2>'
                        f"<p>{escape(section.description)}</p>")
        count = 0
        for row in rows:
            if count == 0:
                self.html.write("<table><tr>" + "".join(
                    f"<th>{escape(name)}</th>" for name in row) + "</tr>")
            self.json.write(("," if count else "") + json.dumps(row, ensure_ascii=False))
            self.html.write("<tr>" + "".join(f"<td>{_cell(v)}</td>" for v in row.values())
                            + "</tr>")
            count += 1
        self.json.write("]")
        self.html.write("</table></section>" if count else "<p>None.</p></section>")
        return count


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
    takes one entry at a time), copied in after."""
    zf.writestr(SCHEMA_NAME, json.dumps(export_schema(), indent=2))
    with tempfile.TemporaryFile() as report_spool:
        with zf.open(JSON_NAME, "w", force_zip64=True) as raw_json:
            json_out = io.TextIOWrapper(raw_json, "utf-8")
            html_out = io.TextIOWrapper(report_spool, "utf-8")
            _write_sections(session, _Writer(json_out, html_out), export, user, counts)
            json_out.flush()
            html_out.flush()
            json_out.detach()
            html_out.detach()
        report_spool.seek(0)
        with zf.open(REPORT_NAME, "w", force_zip64=True) as raw_html:
            shutil.copyfileobj(report_spool, raw_html, PART_BYTES)


def _write_sections(session: Session, writer: _Writer, export: DataExport, user: User,
                    counts: dict[str, int]) -> None:
    html_out = writer.html
    generated = datetime.now(UTC).isoformat()
    plan = get_plan_for_user(user, session)
    writer.key("format", FORMAT)
    writer.key("version", FORMAT_VERSION)
    writer.key("generated_at", generated)
    writer.key("user", {"id": user.id, "email": user.email,
                        "display_name": user.display_name,
                        "plan": plan.name if plan else None,
                        "created_at": _jsonable(user.created_at)})
    status = _status_rows(session, user)
    writer.key("memory_status", status)
    html_out.write(
        f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>Everything '
        f"OrbitPilot holds about {escape(user.email)}</title><style>{_STYLE}</style>"
        f"</head><body><h1>Everything OrbitPilot holds about {escape(user.email)}</h1>"
        f"<p>Made {escape(generated)}. The same data, machine-readable, is in "
        f"{JSON_NAME} (described by {SCHEMA_NAME}).</p>"
        '<section id="memory_status"><h2>What is remembered, and why</h2><ul>'
        + "".join(f"<li><strong>{escape(s['label'])}</strong>: {escape(s['sentence'])}"
                  "</li>" for s in status) + "</ul></section>")
    for n, section in enumerate(SECTIONS):
        _progress(session, export, 5 + 85 * n // len(SECTIONS), section.name)
        counts[section.name] = writer.rows(section, _rows(session, section, user.id))
    writer.json.write("}")
    html_out.write("</body></html>")


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
    """An erasure withdraws the owner's exports that may hold the erased words: those
    ready to download and the one being made (it may have read them already; its job
    then stores nothing). Their pieces are deleted now. A queued one reads after this
    commit, so it stays. Then both are counted again: exports still downloadable or in the
    making from before, and pieces still stored."""
    owner = erasure.owner_id
    withdrawn = list(session.scalars(
        update(DataExport).where(DataExport.user_id == owner,
                                 DataExport.status.in_(("running", "ready")))
        .values(status="withdrawn", withdrawn_at=datetime.now(UTC))
        .returning(DataExport.id)))
    of_owner = select(DataExport.id).where(DataExport.user_id == owner)
    parts = session.execute(delete(DataExportPart).where(
        DataExportPart.export_id.in_(of_owner))).rowcount or 0
    exports_left = session.scalar(select(func.count()).select_from(DataExport).where(
        DataExport.user_id == owner, DataExport.status.in_(("running", "ready")))) or 0
    parts_left = session.scalar(select(func.count()).select_from(DataExportPart).where(
        DataExportPart.export_id.in_(of_owner))) or 0
    return [CopyCount(EXPORTS, len(withdrawn), exports_left),
            CopyCount(EXPORT_PARTS, parts, parts_left)]
