"""What an export holds, section by section, and how it is written: the person's
("download everything about me") and a team's (for its owners and admins), each a JSON
document described by a JSON Schema derived from its sections (the shipped files are held
equal to them by tests) and a readable HTML report, written side by side a row at a time
from streamed rows. Content-free bookkeeping (the job, the pieces, the links) lives in
``services``."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import IO, Any

from markupsafe import escape
from sqlalchemy import (
    Boolean,
    DateTime,
    Integer,
    Numeric,
    Select,
    String,
    case,
    func,
    literal,
    select,
    tuple_,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, UUID
from sqlalchemy.orm import Session

from dashboard.access import Reach, TeamSeat
from dashboard.audit.models import AuditEvent
from dashboard.auth.models import User
from dashboard.blinks.models import Blink
from dashboard.connectors.models import ConnectorAccess, OAuthClient, OAuthGrant
from dashboard.documents.models import Document
from dashboard.holds.models import HeldVersion
from dashboard.memory import MemoryBuild, MemoryChunk
from dashboard.orbitpilot.models import Conversation, Message, ProfileFact
from dashboard.plans.sentences import state_sentence
from dashboard.plans.services import get_plan_for_user, resolve_sources
from dashboard.saved_memories.models import ApiKey, ForgetMarker, Memory, MemoryVersion
from dashboard.saved_memories.reach import attribute
from dashboard.teams.models import Team, TeamApp, TeamInvitation, TeamMember

JSON_NAME = "orbitpilot-export.json"
SCHEMA_NAME = "orbitpilot-export.schema.json"
REPORT_NAME = "report.html"
FORMAT = "orbitpilot-export"
FORMAT_VERSION = 1
TEAM_JSON_NAME = "orbitpilot-team-export.json"
TEAM_SCHEMA_NAME = "orbitpilot-team-export.schema.json"
TEAM_FORMAT = "orbitpilot-team-export"
TEAM_FORMAT_VERSION = 1
# Progress as the sections go: (percent, stage), committed by the job.
Progress = Callable[[int, str], None]


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
             join: tuple[Any, Any] | None = None,
             outer: tuple[tuple[Any, Any], ...] = ()) -> Section:
    """``join``: (table, on) when the owner is on another table than the rows; ``outer``:
    (table, on) pairs a row may lack (a memory saved without a key)."""
    def query(uid: int) -> Select:
        rows = select(*columns)
        if join is not None:
            rows = rows.join(*join)
        for table, on in outer:
            rows = rows.outerjoin(table, on)
        return rows.where(where(uid)).order_by(*order)

    return Section(name, title, description, columns, query)


# The credential that carried a save, in the words attribution uses (memories.reach): an
# API key by its name and prefix, a registered app by its client_id, else the pages.
_VIA = case(
    (ApiKey.id.is_not(None),
     func.concat("API key \u201c", ApiKey.name, "\u201d (", ApiKey.prefix, "\u2026)")),
    (OAuthClient.id.is_not(None), func.concat("app ", OAuthClient.client_id)),
    else_=literal("OrbitPilot", String))

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
    _section("team_memberships", "Your teams",
             "The teams you are in, your role in each, and when you joined.",
             _cols(Team.id.label("team_id"), Team.slug.label("team"),
                   Team.name.label("team_name"), TeamMember.role, TeamMember.joined_at,
                   TeamMember.last_active_at),
             lambda uid: TeamMember.user_id == uid, (Team.slug,),
             join=(Team, Team.id == TeamMember.team_id)),
    _section("team_contributions", "What you saved to teams",
             "Memories you saved to a team (the team holds them; you are their author), "
             "in every state, with the credential that carried each: also those of teams "
             "you have left.",
             _cols(Memory.id, Team.slug.label("team"), Team.name.label("team_name"),
                   Memory.content, Memory.status, Memory.source, Memory.shared_from_id,
                   _VIA.label("via"), Memory.client_name.label("app_claimed_name"),
                   Memory.created_at, Memory.updated_at, Memory.deleted_at,
                   Memory.redacted_at),
             lambda uid: Memory.author_id == uid, (Memory.created_at, Memory.id),
             join=(Team, Team.id == Memory.owner_id),
             outer=((ApiKey, ApiKey.id == Memory.api_key_id),
                    (OAuthClient, OAuthClient.id == Memory.oauth_client_pk))),
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


_MEMORY_STATUS = {"type": "array", "items": {
    "type": "object", "additionalProperties": False,
    "required": ["source_key", "label", "rank", "state", "sentence", "keep_days"],
    "properties": {
        "source_key": {"type": "string"}, "label": {"type": "string"},
        "rank": {"type": "integer"}, "state": {"type": "string"},
        "sentence": {"type": "string"}, "keep_days": {"type": ["integer", "null"]}}}}


def export_schema() -> dict[str, Any]:
    row = {"type": "object", "additionalProperties": False}
    sections = {
        s.name: {"description": s.description, "type": "array", "items": {
            **row, "required": s.fields(),
            "properties": {c.key: _type_of(c) for c in s.columns}}}
        for s in SECTIONS}
    memory_status = _MEMORY_STATUS
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



# -- a team's export: its memories with who saved them, members, policies, receipts, audit --

POLICIES = ("write_policy", "forget_policy", "app_policy", "max_key_days", "leaver_policy")
ATTRIBUTED_BATCH = 500


@dataclass(frozen=True)
class TeamSection:
    """A section of a team's export: its rows (plain JSON values) and their schema."""

    name: str
    title: str
    description: str
    properties: dict[str, dict[str, Any]]
    rows: Callable[[Session, Team], Iterator[dict[str, Any]]]


def _by_team(section: Section, *, title: str | None = None,
             description: str | None = None) -> TeamSection:
    """One of the person's sections, of the team's account (the same code path)."""
    return TeamSection(section.name, title or section.title,
                       description or section.description,
                       {c.key: _type_of(c) for c in section.columns},
                       lambda session, team: _rows(session, section, team.id))


def _team_section(name: str, title: str, description: str, columns: tuple[Any, ...],
                  where: Callable[[int], Any], order: tuple[Any, ...],
                  join: tuple[Any, Any] | None = None,
                  outer: tuple[tuple[Any, Any], ...] = ()) -> TeamSection:
    return _by_team(_section(name, title, description, columns, where, order, join, outer))


_NULLABLE_STRING = {"type": ["string", "null"]}
_MEMORY_FIELDS = (Memory.id, Memory.content, Memory.metadata_.label("metadata"),
                  Memory.source, Memory.status, Memory.version, Memory.shared_from_id,
                  Memory.created_at, Memory.updated_at, Memory.deleted_at,
                  Memory.redacted_at)
_ATTRIBUTE = {"metadata": "metadata_"}
ATTRIBUTION_PROPERTIES: dict[str, dict[str, Any]] = {
    "saved_by": {"type": "string"},
    "author_id": {"type": ["integer", "null"]},
    "author": {"type": "string"},
    "via": {"type": "string"},
    "key": {"type": ["object", "null"], "additionalProperties": False,
            "required": ["id", "name", "prefix"],
            "properties": {"id": {"type": "integer"}, "name": {"type": "string"},
                           "prefix": {"type": "string"}}},
    "app": {"type": ["object", "null"], "additionalProperties": False,
            "required": ["client_id", "claimed_name"],
            "properties": {"client_id": {"type": "string"},
                           "claimed_name": _NULLABLE_STRING}},
}


def _attributed_memories(session: Session, team: Team) -> Iterator[dict[str, Any]]:
    """The team's memories, every state, each with who saved it with what — as the team's
    pages say it (``memories.reach.attribute``: a former member is "a former member",
    their key's name no longer shown), a batch at a time (keyset)."""
    seat = TeamSeat(team.id, team.slug, team.name, "owner")
    reach = Reach(0, {team.id: seat})  # nobody's "you": each author by name
    after: tuple[Any, Any] | None = None
    while True:
        query = select(Memory).where(Memory.owner_id == team.id)
        if after is not None:
            query = query.where(tuple_(Memory.created_at, Memory.id) > tuple_(*after))
        batch = list(session.scalars(query.order_by(Memory.created_at, Memory.id)
                                     .limit(ATTRIBUTED_BATCH)))
        if not batch:
            return
        said = attribute(session, reach, batch)
        for memory in batch:
            who = said[memory.id].to_dict()
            yield {**{c.key: _jsonable(getattr(memory, _ATTRIBUTE.get(c.key, c.key)))
                      for c in _MEMORY_FIELDS},
                   "saved_by": said[memory.id].sentence, "author_id": who["author_id"],
                   "author": who["author"], "via": who["via"], "key": who["key"],
                   "app": who["app"]}
        for memory in batch:  # a batch at a time in memory, whatever the team's size
            session.expunge(memory)
        after = (batch[-1].created_at, batch[-1].id)


_BY_NAME = {section.name: section for section in SECTIONS}

TEAM_SECTIONS: tuple[TeamSection, ...] = (
    _team_section("members", "Members and roles",
                  "Who is in the team, with which role, since when.",
                  _cols(TeamMember.user_id, User.email, User.display_name, TeamMember.role,
                        TeamMember.joined_at, TeamMember.last_active_at),
                  lambda tid: TeamMember.team_id == tid,
                  (TeamMember.joined_at, TeamMember.user_id),
                  join=(User, User.id == TeamMember.user_id)),
    _team_section("invitations", "Invitations",
                  "Each invitation: to which address, which role, and what became of it "
                  "(its link is never kept, only its hash).",
                  _cols(TeamInvitation.id, TeamInvitation.email, TeamInvitation.role,
                        TeamInvitation.created_by_id, TeamInvitation.created_at,
                        TeamInvitation.expires_at, TeamInvitation.accepted_at,
                        TeamInvitation.accepted_by_id, TeamInvitation.revoked_at),
                  lambda tid: TeamInvitation.team_id == tid, (TeamInvitation.id,)),
    _team_section("allowed_apps", "Apps the team lets act for it",
                  "The team's allow list (or approvals); an app's name is its own claim.",
                  _cols(OAuthClient.client_id, OAuthClient.name.label("claimed_name"),
                        TeamApp.approved_by_id, TeamApp.approved_at),
                  lambda tid: TeamApp.team_id == tid, (TeamApp.approved_at,),
                  join=(OAuthClient, OAuthClient.id == TeamApp.client_pk)),
    TeamSection("memories", "The team's memories",
                "Every memory the team holds, in every state, with who saved it and "
                "through which credential.",
                {**{c.key: _type_of(c) for c in _MEMORY_FIELDS}, **ATTRIBUTION_PROPERTIES},
                _attributed_memories),
    _by_team(_BY_NAME["memory_versions"]),
    _by_team(_BY_NAME["erasure_receipts"],
             description="Every forget, redaction, deletion and restore of the team's "
                         "memories, what it removed (copies too) and what was found after."),
    _by_team(_BY_NAME["audit_events"], title="The team's audit events",
             description="The audit log's events about the team, as they are: ids, roles, "
                         "states and counts."),
    _by_team(_BY_NAME["builds"], description="Each build of the team's memory."),
)


def team_export_schema() -> dict[str, Any]:
    row = {"type": "object", "additionalProperties": False}
    sections = {
        s.name: {"description": s.description, "type": "array", "items": {
            **row, "required": list(s.properties), "properties": s.properties}}
        for s in TEAM_SECTIONS}
    team = {**row, "required": ["id", "slug", "name", "plan", "created_by_id", "created_at"],
            "properties": {"id": {"type": "integer"}, "slug": {"type": "string"},
                           "name": {"type": "string"}, "plan": _NULLABLE_STRING,
                           "created_by_id": {"type": ["integer", "null"]},
                           "created_at": {"type": "string", "format": "date-time"}}}
    policies = {**row, "required": list(POLICIES), "properties": {
        "write_policy": {"type": "string"}, "forget_policy": {"type": "string"},
        "app_policy": {"type": "string"}, "max_key_days": {"type": ["integer", "null"]},
        "leaver_policy": {"type": "string"}}}
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "Everything OrbitPilot holds about one team",
        "type": "object", "additionalProperties": False,
        "required": ["format", "version", "generated_at", "team", "policies",
                     "memory_status", *sections],
        "properties": {"format": {"const": TEAM_FORMAT},
                       "version": {"const": TEAM_FORMAT_VERSION},
                       "generated_at": {"type": "string", "format": "date-time"},
                       "team": team, "policies": policies,
                       "memory_status": _MEMORY_STATUS, **sections},
    }


# -- writing --------------------------------------------------------------------------------

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


# -- the report: a statement a person keeps, readable on a phone -------------------------------

# A column's name in words where the plain rule ("last_used_at" → "Last used") reads badly.
_COLUMN_WORDS = {"id": "Id", "seq": "Number", "grant_id": "Connection id",
                 "marker_id": "Receipt id", "metadata": "Details", "app": "App",
                 "team": "Team", "team_name": "Team name", "mode": "Mode",
                 "keep_days": "Days kept"}


def column_words(name: str) -> str:
    """A column's name as a heading: "created_at" → "Created", "reply_to_id" → "Reply
    to id", "excluded_from_memory" → "Excluded from memory"."""
    if name in _COLUMN_WORDS:
        return _COLUMN_WORDS[name]
    words = name.removesuffix("_at").replace("_", " ")
    return words[:1].upper() + words[1:]


def date_in_words(value: str | datetime) -> str:
    """A moment as a person writes it: "4 December 2026 at 11:40 UTC"."""
    moment = datetime.fromisoformat(value) if isinstance(value, str) else value
    moment = moment.astimezone(UTC)
    return f"{moment.day} {moment:%B %Y} at {moment:%H:%M} UTC"


def _is_date(kind: dict[str, Any]) -> bool:
    return kind.get("format") == "date-time"


def _cell(value: Any, kind: dict[str, Any] | None = None) -> str:
    """One value in words: a date as a date, yes or no, a list as a list, the rest as
    written (escaped); nothing is a dash."""
    if value is None or value == [] or value == {}:
        return '<span class="none">—</span>'
    if isinstance(value, bool):
        return "Yes" if value else "No"
    if kind is not None and _is_date(kind) and isinstance(value, str):
        try:
            words = date_in_words(value)
        except ValueError:  # not a date after all: shown as it is
            return str(escape(value))
        return f'<time datetime="{escape(value)}">{escape(words)}</time>'
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return str(escape(", ".join(value)))
    if isinstance(value, dict | list):
        return f"<code>{escape(json.dumps(value, ensure_ascii=False))}</code>"
    return str(escape(str(value)))


# Phone first: under 48rem each row is a card of "heading, value" pairs (the headings a
# screen reader reads from the table's own <th>s), so no table is wider than the screen.
_STYLE = ("body{font-family:system-ui,sans-serif;margin:0 auto;padding:1rem;max-width:64rem;"
          "line-height:1.45;color:#222}"
          "h1{font-size:1.5rem;overflow-wrap:anywhere}"
          "h2{font-size:1.2rem;margin-top:2.5rem;padding-bottom:.2rem;"
          "border-bottom:1px solid #ccc}"
          "table{border-collapse:collapse;width:100%;font-size:.9rem}"
          ".rows{overflow-x:auto;margin-bottom:1rem}"
          "th,td{border:1px solid #ccc;padding:.3rem .5rem;text-align:left;vertical-align:top;"
          "overflow-wrap:break-word}"
          "td{white-space:pre-wrap}th{background:#f3f3f3}.none{color:#666}"
          "code{font-size:.85em;white-space:pre-wrap;overflow-wrap:anywhere}"
          ".status li{margin-bottom:.4rem}.count{color:#555;font-size:.9rem}"
          "@media (max-width:48rem){"
          ".rows table,.rows tbody,.rows tr,.rows th,.rows td{display:block;width:auto}"
          ".rows thead{position:absolute;width:1px;height:1px;overflow:hidden;"
          "clip:rect(0 0 0 0)}"
          ".rows tr{border:1px solid #ccc;border-radius:.3rem;margin-bottom:.75rem}"
          ".rows td{border:0;border-top:1px solid #eee;overflow-wrap:anywhere}"
          ".rows tr td:first-child{border-top:0}"
          ".rows td::before{content:attr(data-label);display:block;font-weight:600;"
          "font-size:.8rem;color:#555;white-space:normal}}")


MEMORY_STATUS_TITLE = "What is remembered, and why"


def _kinds(section: Section) -> dict[str, dict[str, Any]]:
    return {c.key: _type_of(c) for c in section.columns}


class _Writer:
    """The JSON document and the report, written side by side a row at a time."""

    def __init__(self, json_out: IO[str], html_out: IO[str]) -> None:
        self.json, self.html, self.first_key = json_out, html_out, True

    def key(self, name: str, value: Any) -> None:
        self.json.write(("{" if self.first_key else ",") + json.dumps(name) + ":"
                        + json.dumps(value, ensure_ascii=False))
        self.first_key = False

    def rows(self, section: Section | TeamSection, rows: Iterator[dict[str, Any]],
             kinds: dict[str, dict[str, Any]]) -> int:
        self.json.write("," + json.dumps(section.name) + ":[")
        self.html.write(f'<section id="{section.name}"><h2>{escape(section.title)}</h2>'
                        f"<p>{escape(section.description)}</p>")
        count = 0
        labels: list[str] = []
        for row in rows:
            if count == 0:
                labels = [str(escape(column_words(name))) for name in row]
                self.html.write('<div class="rows"><table><thead><tr>' + "".join(
                    f'<th scope="col">{label}</th>' for label in labels)
                    + "</tr></thead><tbody>")
            self.json.write(("," if count else "") + json.dumps(row, ensure_ascii=False))
            self.html.write("<tr>" + "".join(
                f'<td data-label="{label}">{_cell(value, kinds.get(name))}</td>'
                for label, (name, value) in zip(labels, row.items(), strict=True))
                + "</tr>")
            count += 1
        self.json.write("]")
        self.html.write(f'</tbody></table></div><p class="count">{count} in all.</p>'
                        "</section>" if count else "<p>None.</p></section>")
        return count


def _head(writer: _Writer, title: str, generated: str, json_name: str, schema_name: str,
          status: list[dict[str, Any]], contents: list[tuple[str, str]]) -> None:
    """The title, when it was made, what else the zip holds, the contents, and what is
    remembered and why (the Memory Status page's sentences)."""
    writer.html.write(
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{escape(title)}</title><style>{_STYLE}</style></head><body>"
        f"<h1>{escape(title)}</h1>"
        f'<p>Made on <time datetime="{escape(generated)}">{date_in_words(generated)}</time>. '
        f"The same data, for a program to read, is in {json_name} beside this file "
        f"(described by {schema_name}).</p>"
        '<nav aria-labelledby="contents"><h2 id="contents">Contents</h2><ol>'
        + "".join(f'<li><a href="#{name}">{escape(heading)}</a></li>'
                  for name, heading in contents)
        + f'</ol></nav><section id="memory_status"><h2>{MEMORY_STATUS_TITLE}</h2>'
        '<ul class="status">'
        + "".join(f"<li><strong>{escape(s['label'])}</strong>: {escape(s['sentence'])}"
                  "</li>" for s in status) + "</ul></section>")


def write_person(session: Session, json_out: IO[str], html_out: IO[str], user: User,
                 progress: Progress) -> dict[str, int]:
    """Everything about ``user``, a section at a time; the rows written, by section."""
    writer = _Writer(json_out, html_out)
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
    _head(writer, f"Everything OrbitPilot holds about {user.email}", generated, JSON_NAME,
          SCHEMA_NAME, status, [("memory_status", MEMORY_STATUS_TITLE),
                                *((s.name, s.title) for s in SECTIONS)])
    counts = {}
    for n, section in enumerate(SECTIONS):
        progress(5 + 85 * n // len(SECTIONS), section.name)
        counts[section.name] = writer.rows(section, _rows(session, section, user.id),
                                           _kinds(section))
    writer.json.write("}")
    html_out.write("</body></html>")
    return counts


def write_team(session: Session, json_out: IO[str], html_out: IO[str], account: User,
               progress: Progress) -> dict[str, int]:
    """Everything about the team whose account is ``account``, a section at a time; the
    rows written, by section."""
    team = session.get(Team, account.id)
    if team is None:  # an account of kind 'team' always has its team row
        raise LookupError("no team row for this account")
    writer = _Writer(json_out, html_out)
    generated = datetime.now(UTC).isoformat()
    plan = get_plan_for_user(account, session)
    writer.key("format", TEAM_FORMAT)
    writer.key("version", TEAM_FORMAT_VERSION)
    writer.key("generated_at", generated)
    writer.key("team", {"id": team.id, "slug": team.slug, "name": team.name,
                        "plan": plan.name if plan else None,
                        "created_by_id": team.created_by_id,
                        "created_at": _jsonable(team.created_at)})
    policies = {name: getattr(team, name) for name in POLICIES}
    writer.key("policies", policies)
    status = _status_rows(session, account)
    writer.key("memory_status", status)
    _head(writer, f"Everything OrbitPilot holds about the team {team.name} ({team.slug})",
          generated, TEAM_JSON_NAME, TEAM_SCHEMA_NAME, status,
          [("memory_status", MEMORY_STATUS_TITLE), ("policies", "Policies"),
           *((s.name, s.title) for s in TEAM_SECTIONS)])
    html_out.write('<section id="policies"><h2>Policies</h2><div class="rows"><table><tbody>'
                   + "".join(f'<tr><th scope="row">{escape(column_words(name))}</th>'
                             f"<td>{_cell(value)}</td></tr>"
                             for name, value in policies.items())
                   + "</tbody></table></div></section>")
    counts = {}
    for n, section in enumerate(TEAM_SECTIONS):
        progress(5 + 85 * n // len(TEAM_SECTIONS), section.name)
        counts[section.name] = writer.rows(section, section.rows(session, team),
                                           section.properties)
    writer.json.write("}")
    html_out.write("</body></html>")
    return counts
