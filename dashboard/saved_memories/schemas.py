"""The memory API's request and response models (pydantic v2): spectree validates requests
with them and writes the OpenAPI document from them (``/v1/openapi.json``). The document
says what the API accepts, null and a mode's own fields included; what JSON Schema cannot
say (blank text, metadata's size, an unknown cursor) the service answers with a 422."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    RootModel,
    StringConstraints,
    model_validator,
)
from pydantic.json_schema import SkipJsonSchema

from dashboard.saved_memories.listing import DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE
from dashboard.saved_memories.models import MEMORY_SOURCES, MEMORY_STATUSES
from dashboard.saved_memories.reading import MAX_RECALL_K
from dashboard.saved_memories.rules import FORGET_MODES, MAX_CONTENT, MAX_METADATA_BYTES, MAX_REASON

# Literal[tuple] spells Literal["a", "b", …]: the registries stay the one list.
Source = Literal[MEMORY_SOURCES]  # type: ignore[valid-type]
Status = Literal[MEMORY_STATUSES]  # type: ignore[valid-type]
ForgetMode = Literal[FORGET_MODES]  # type: ignore[valid-type]
ReceiptMode = Literal[(*FORGET_MODES, "restore")]  # type: ignore[valid-type]

# Text PostgreSQL can store: no NUL (the input guard answers it with a 400). Constraints on
# the string itself, not on ``str | None``: on the union pydantic would apply a length to a
# JSON null and fail with a TypeError (a 500) instead of a 422.
NO_NUL = r"^[^\x00]*$"
Text = Annotated[str, StringConstraints(min_length=1, max_length=MAX_CONTENT, pattern=NO_NUL)]
Reason = Annotated[str, StringConstraints(max_length=MAX_REASON, pattern=NO_NUL)]
Metadata = dict[str, Any]
# A team's slug (or "personal" where a filter takes it): whatever it says, a team the key
# does not reach is the same 404 as one that does not exist.
TeamSlug = Annotated[str, StringConstraints(min_length=1, max_length=100, pattern=NO_NUL)]
AppFilter = Annotated[str, StringConstraints(min_length=1, max_length=2048, pattern=NO_NUL)]
PersonId = Annotated[int, Field(ge=1, le=2**31 - 1)]


def _whole_number(value: Any) -> Any:
    """A JSON number with no fraction is an integer (JSON Schema's own rule: 18.0 is
    18); a bool, a string or 18.5 stays what it is, for the strict check to refuse."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


WholeNumber = Annotated[int, BeforeValidator(_whole_number), Field(strict=True)]

METADATA_HELP = (f"A JSON object of your own (at most {MAX_METADATA_BYTES:,} bytes as compact "
                 "JSON). Never read by OrbitPilot, never recalled.")
REASON_HELP = f"Why (at most {MAX_REASON} characters); kept on the erasure receipt."
TEAM_FILTER_HELP = ("Only this team's memories (its slug), or \"personal\" for the key "
                    "owner's own; left out: both, every team the key acts for.")
AUTHOR_HELP = "Only memories this person saved (their user id)."
APP_HELP = ("Only memories saved through this app: an OAuth client_id, key:<id> for an API "
            "key, or orbitpilot for OrbitPilot's own pages.")


def _no_default(schema: dict[str, Any]) -> None:
    schema.pop("default", None)


def optional(**kwargs: Any) -> Any:
    """An optional field: omitted or null alike (the document says both)."""
    return Field(None, json_schema_extra=_no_default, **kwargs)


def null_unless(field: str, mode_is: dict[str, Any]) -> dict[str, Any]:
    """JSON Schema: ``field`` may only be omitted or null unless ``mode`` matches."""
    return {"if": {"not": {"properties": {"mode": mode_is}, "required": ["mode"]}},
            "then": {"properties": {field: {"type": "null"}}}}


class _Body(BaseModel):
    # A misspelt field is refused, not silently ignored.
    model_config = ConfigDict(extra="forbid")


# -- requests ------------------------------------------------------------------------------

class MemoryCreate(_Body):
    content: Text = Field(description=(
        f"The memory's text: 1 to {MAX_CONTENT:,} characters, not blank."))
    metadata: Metadata | None = optional(description=METADATA_HELP)
    source: Source = Field("api", description=(
        "The client that saves it, as it says: kept as its claim. Who saved it is read "
        "from the key (attribution)."))
    team: TeamSlug | None = optional(description=(
        "Save to this team (its slug) instead of your own memory: deliberate, never a "
        "default. The key must act for the team and your role must let you write there."))


class MemoryPatch(_Body):
    # Content, metadata or both: at least one of them given and not null.
    model_config = ConfigDict(extra="forbid", json_schema_extra={"anyOf": [
        {"required": ["content"], "properties": {"content": {"type": "string"}}},
        {"required": ["metadata"], "properties": {"metadata": {"type": "object"}}}]})

    content: Text | None = optional(description="The new text.")
    metadata: Metadata | None = optional(
        description="Replaces the metadata. " + METADATA_HELP)

    @model_validator(mode="after")
    def _something(self) -> MemoryPatch:
        if self.content is None and self.metadata is None:
            raise ValueError("Give content, metadata or both.")
        return self


class SearchRequest(_Body):
    query: Text = Field(description=(
        "What to recall: at least one word to search on (a query of only punctuation or "
        "very common words such as \u201cthe\u201d is refused with 422)."))
    k: WholeNumber = Field(5, ge=1, le=MAX_RECALL_K,
                           description=f"How many chunks, 1 to {MAX_RECALL_K}.")
    team: TeamSlug | None = optional(description=TEAM_FILTER_HELP)
    author: PersonId | None = optional(description=AUTHOR_HELP)
    app: AppFilter | None = optional(description=APP_HELP)


class ShareRequest(_Body):
    team: TeamSlug = Field(description=(
        "The team (its slug) to share a copy to; the original stays yours, the copy "
        "names it as its provenance."))


class MemoryForgetRequest(_Body):
    # A mode's own fields: replacement text for redact only, metadata not for hard_delete.
    model_config = ConfigDict(extra="forbid", json_schema_extra={"allOf": [
        null_unless("replacement_content", {"const": "redact"}),
        null_unless("metadata", {"enum": ["soft_delete", "redact"]})]})

    mode: ForgetMode = Field(description="soft_delete (restorable), redact, or hard_delete "
                                         "(needs memory:hard_delete).")
    reason: Reason | None = optional(description=REASON_HELP)
    replacement_content: Text | None = optional(
        description="redact only: the text that stays instead of [REDACTED].")
    metadata: Metadata | None = optional(
        description="soft_delete and redact: replaces the metadata (redact clears it "
                    "otherwise). " + METADATA_HELP)


class MemoryRestoreRequest(_Body):
    reason: Reason | None = optional(description=REASON_HELP)
    metadata: Metadata | None = optional(
        description="Replaces the metadata. " + METADATA_HELP)


class ListQuery(BaseModel):
    limit: int = Field(DEFAULT_PAGE_SIZE, description=(
        f"Page size; the server clamps it to 1–{MAX_PAGE_SIZE}."))
    cursor: str = Field("", description="next_cursor of the previous page; empty: the first.")
    status: Status | SkipJsonSchema[None] = optional(description="Only memories in this "
                                                                 "status.")
    team: TeamSlug | SkipJsonSchema[None] = optional(description=TEAM_FILTER_HELP)
    author: PersonId | SkipJsonSchema[None] = optional(description=AUTHOR_HELP)
    app: AppFilter | SkipJsonSchema[None] = optional(description=APP_HELP)


class DeleteQuery(BaseModel):
    mode: ForgetMode = Field("soft_delete", description="How to forget; hard_delete needs "
                                                        "memory:hard_delete.")
    reason: Reason | SkipJsonSchema[None] = optional(description=REASON_HELP)


# -- responses -----------------------------------------------------------------------------

class ExportedMemory(BaseModel):
    id: uuid.UUID
    content: str
    metadata: dict[str, Any]
    source: Source = Field(description="The client that saved it, as that client said: a "
                                       "claim (attribution says what the credential proves).")
    client_name: str | None = Field(description="The connected app it was saved through, "
                                                "by the name it gave itself: a claim.")
    status: Status
    version: int
    created_at: datetime
    updated_at: datetime | None
    deleted_at: datetime | None
    redacted_at: datetime | None


class KeyRef(BaseModel):
    id: int
    name: str
    prefix: str


class AppRef(BaseModel):
    client_id: str = Field(description="The registered app's client_id (proved by its "
                                       "token).")
    claimed_name: str | None = Field(description="The name the app gave itself: its claim, "
                                                 "not a fact.")


class Attribution(BaseModel):
    """Who saved a memory and with which credential, as the credential proves it."""

    owner: str = Field(description="\"personal\", or the team's slug.")
    owner_name: str
    author_id: int | None = Field(description="Who saved it (null: a former member of the "
                                              "team).")
    author: str = Field(description="\"you\", a member's name, or \"a former member\".")
    via: str = Field(description="The credential it came through, in words: an API key "
                                 "by its name and prefix, an app by its client_id (its "
                                 "own name marked as its claim), or OrbitPilot.")
    key: KeyRef | None
    app: AppRef | None


class MemoryOut(ExportedMemory):
    content: str | None = Field(description="null for a key without memory:read (one that "
                                            "may only write or forget): changing a memory "
                                            "is no way to read it.")
    metadata: dict[str, Any] | None = Field(description="null, as content, for a key "
                                                        "without memory:read.")
    owner: str = Field(description="Whose memory: \"personal\" (the key owner's) or the "
                                   "team's slug.")
    attribution: Attribution


class BuildOut(BaseModel):
    id: int = Field(description="The memory build that will take the change in.")
    merged: bool = Field(description="True: joined a build already queued.")


class SaveOut(BaseModel):
    memory: MemoryOut
    remembered: bool = Field(description="Whether saved memories are remembered on the "
                                         "owner's plan.")
    memory_notice: str = Field(description="Why, in the words the Memory Status page uses.")
    build: BuildOut


class MemoryPage(BaseModel):
    items: list[MemoryOut]
    next_cursor: str | None


class RecallHit(BaseModel):
    content: str
    distance: float
    source_key: str = Field(description="The memory source, e.g. xmemo.saved.")
    source: str = Field(description="Who it came from: the saving client for a saved "
                                    "memory, else the source key.")
    memory_id: str | None = Field(description="The saved memory it came from, if any.")
    source_id: str
    chunk_index: int
    owner: str = Field(description="Whose memory: \"personal\" or the team's slug.")
    attribution: Attribution | None = Field(description="For a saved memory: who saved it "
                                                        "with what.")
    match: Literal["semantic", "lexical", "both"] = Field(
        description="How it matched: near the query by meaning, holding a name or code of "
                    "the query (kept even beyond the cut), or both.")
    relevance: Literal["relevant", "possibly_related"] = Field(
        description="How sure recall is: relevant, or possibly related — shown rather than "
                    "hidden; say so when you use it.")


class SearchOut(BaseModel):
    results: list[RecallHit] = Field(description="Best first; none farther than the recall "
                                                 "cut (RECALL_MAX_DISTANCE).")
    notice: str | None = Field(description="When nothing matches, or nothing recall is sure "
                                           "of: a sentence saying so.")


class RemovedCounts(BaseModel):
    versions: int
    chunks: int
    # A redaction's or hard delete's copies (absent otherwise): docs/architecture/erasure.md.
    replies: int | None = Field(None, description="Chat replies rewritten: the memory's "
                                                  "words in them replaced by [REDACTED].")
    drew_on: int | None = Field(None, description="\"Drew on\" records naming it, deleted.")
    exports: int | None = Field(None, description="Exports made before it, withdrawn.")
    export_parts: int | None = Field(None, description="Their stored pieces, deleted.")


class AuditRef(BaseModel):
    id: int | None
    hash: str | None


class VacuumState(BaseModel):
    due: bool
    vacuumed_at: datetime | None


class ProbeState(BaseModel):
    at: datetime | None = Field(description="When the post-delete probe ran (null for a "
                                            "restore).")
    rows: int | None = Field(description="The memory's chunks an exact count found after "
                                         "the delete: 0.")
    searched: list[str] = Field(description="What the probe counted: \"chunks\", and for "
                                            "a redaction or hard delete each kind of copy "
                                            "(replies, drew_on, exports, export_parts).")
    found: dict[str, int] | None = Field(description="By what was searched, what the exact "
                                                     "counts found left: all 0.")


class ReceiptOut(BaseModel):
    """An erasure receipt: what a forget or restore did. Never content."""

    marker_id: int
    memory_id: uuid.UUID
    mode: ReceiptMode
    from_status: str | None
    to_status: str | None
    version: int
    reason: str
    removed: RemovedCounts
    audit_event: AuditRef
    created_at: datetime
    vacuum: VacuumState
    probe: ProbeState
    pending: Literal["legal_hold"] | None = Field(
        description="\"legal_hold\": the owner is under a legal hold, so this redact or "
                    "hard delete only soft-deleted the memory (no longer recalled) and "
                    "completes when the hold ends.")
    completed_by: int | None = Field(
        description="For an erasure that waited for a legal hold: the marker id of the "
                    "receipt of its completion.")


class DeleteOut(BaseModel):
    receipt: ReceiptOut


class ForgetOut(BaseModel):
    receipt: ReceiptOut
    memory: MemoryOut | None = Field(description="null after hard_delete.")


class RestoreOut(BaseModel):
    memory: MemoryOut
    receipt: ReceiptOut
    build: BuildOut


class ReceiptList(BaseModel):
    items: list[ReceiptOut]


class ExportChunk(BaseModel):
    source_key: str
    source_id: str
    chunk_index: int
    content: str
    created_at: datetime


class ExportOut(BaseModel):
    owner_id: int
    exported_at: datetime
    memories: list[ExportedMemory]
    chunks: list[ExportChunk]


class OpenApiDocument(RootModel[dict[str, Any]]):
    """This document."""


class FieldProblem(BaseModel):
    field: str
    detail: str


class ProblemDetails(BaseModel):
    """RFC 9457 problem details (application/problem+json)."""

    type: str = "about:blank"
    title: str
    status: int
    detail: str
    errors: list[FieldProblem] | SkipJsonSchema[None] = optional(
        description="422 only: each field refused, and why.")
