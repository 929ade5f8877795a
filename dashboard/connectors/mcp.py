"""The MCP server: a user's memory as tools, over the memory API's own services (never a
second copy of their rules: the services check each operation's scope from one table,
as for the tool's REST twin); every refusal is a tool error in a plain sentence; what a
call hands the app is logged by id.

The same tools serve Streamable HTTP (a bearer token from the OAuth server) and stdio
(an API key from the environment): ``Principal`` is who calls, either way, and what its
credential reaches (the person's memory and the teams it acts for) is worked out anew
at every call. Attribution comes from the credential, never from what a client says."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from flask import Flask
from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations
from pydantic import Field
from sqlalchemy.orm import Session

import dashboard.saved_memories as memories
from dashboard.access import Credential, Reach, reach_of
from dashboard.audit.services import Actor
from dashboard.auth.models import User
from dashboard.connectors import services as connections
from dashboard.extensions import db
from dashboard.memory import embedder_model_name, get_embedder, recall_cut, settings_from
from dashboard.refusals import Refusal
from dashboard.saved_memories import reach as reached
from dashboard.saved_memories.keys import authenticate_key, credential_of
from dashboard.sources import SAVED

log = logging.getLogger(__name__)

INSTRUCTIONS = (
    "The user's long-term memory in OrbitPilot, and their teams' shared memory where they "
    "let this app act for a team. Search it before answering questions about the user's "
    "preferences, projects or past decisions; save durable facts the user wants "
    "remembered (to a team only when the user asks for that team); forget only a memory "
    "the user asked to forget, by its id.")
TEAM_FILTER = ("Only this team's memories (its slug), or \"personal\" for the user's own; "
               "left out: both.")
AUTHOR_FILTER = "Only memories this person saved (their user id)."
APP_FILTER = ("Only memories saved through this app: an OAuth client_id, key:<id> for an "
              "API key, or orbitpilot.")
FAILED = "Something went wrong on OrbitPilot's side; nothing was changed. Try again."


@dataclass(frozen=True)
class Principal:
    """Who calls a tool: a connected app (its connection) or an API key."""

    user_id: int
    scopes: tuple[str, ...]
    actor: Actor
    source: str  # what memories saved through it name as their source (a claim)
    client_name: str | None = None  # the app's name for itself (a claim)
    caller: connections.Caller | None = None  # set for a connected app: its access log
    api_key_id: int | None = None
    oauth_client_pk: int | None = None  # the registered app a connection is of
    credential: Credential = Credential(team_ids=())  # the teams it may act for


def from_token(session: Session) -> Principal:
    """The connected app the request's bearer token speaks for (checked by then)."""
    token = get_access_token()
    if token is None or not token.claims:
        raise ToolError("Sign in again: this call carries no valid access token.")
    claims = dict(token.claims["caller"])
    claims["team_ids"] = tuple(claims.get("team_ids") or ())
    caller = connections.Caller(**claims)
    return Principal(caller.user_id, caller.scopes, caller.actor, caller.attribution,
                     caller.client_name, caller, oauth_client_pk=caller.client_pk,
                     credential=caller.credential)


def from_api_key(raw: str, *, source: str = "api") -> Callable[[Session], Principal]:
    """For stdio: the API key a local agent was started with, checked on every call (a
    revoked key stops working at once)."""
    def principal(session: Session) -> Principal:
        key = authenticate_key(session, raw)
        if key is None:
            raise ToolError("The API key this server was started with is not a live key: "
                            "create one on /settings/keys and start it again.")
        return Principal(key.owner_id, tuple(key.scopes), Actor("api_key", str(key.id)),
                         source, api_key_id=key.id, credential=credential_of(key))
    return principal


# -- the tools: each a plain function of (session, who, reach, config, its arguments) ----
# The arguments after ``config`` are the tool's input: the SDK reads their names, types and
# descriptions for its schema; the docstring is the tool's description.

def save_memory(
    session: Session, who: Principal, reach: Reach, config: Mapping[str, Any], /,
    content: Annotated[str, Field(description="The fact to remember, in a sentence.")],
    metadata: Annotated[dict[str, Any] | None,
                        Field(description="Optional labels (JSON object).")] = None,
    team: Annotated[str | None, Field(description=(
        "A team's slug, only when the user asks to save this to that team (its members "
        "will read it); left out, it is the user's own memory."))] = None,
) -> dict[str, Any]:
    """Save a durable fact about the user (a preference, a project fact, a decision).
    Saving to a team is deliberate: name a team only when the user asked for it."""
    saved = reached.save_for(session, reach, team=team, content=content, metadata=metadata,
                             source=who.source, actor=who.actor, api_key_id=who.api_key_id,
                             oauth_client_pk=who.oauth_client_pk,
                             client_name=who.client_name, scopes=who.scopes)
    return {"memory": reached.described(session, reach, [saved.memory], scopes=who.scopes)[0],
            "remembered": saved.remembered, "memory_notice": saved.sentence}


def search_memory(
    session: Session, who: Principal, reach: Reach, config: Mapping[str, Any], /,
    query: Annotated[str, Field(description="What to recall, in words.")],
    k: Annotated[int, Field(ge=1, le=memories.MAX_RECALL_K,
                            description="How many results.")] = 5,
    team: Annotated[str | None, Field(description=TEAM_FILTER)] = None,
    author: Annotated[int | None, Field(description=AUTHOR_FILTER)] = None,
    app: Annotated[str | None, Field(description=APP_FILTER)] = None,
) -> dict[str, Any]:
    """Recall what the user's memory (and their teams', where this app acts for
    them) holds about something, in any language: the best memories and records, each
    with its id, source, owner (personal or the team), who saved it, distance (smaller is
    closer) and relevance ("relevant", or "possibly_related": say you are unsure)."""
    hits = reached.recall_for(
        session, reach, query, k, embedder=get_embedder(config["EMBEDDER"]),
        max_distance=recall_cut(config["RECALL_MAX_DISTANCE"]),
        scopes=who.scopes, filters=reached.Filters.parse(team, author, app))
    return {"results": reached.described_hits(session, reach, hits),
            "notice": memories.recall_notice(hits)}


def list_memories(
    session: Session, who: Principal, reach: Reach, config: Mapping[str, Any], /,
    status: Annotated[Literal["active", "deleted", "redacted"] | None,
                      Field(description="Only memories in this state.")] = None,
    limit: Annotated[int, Field(ge=1, le=100)] = 20,
    cursor: Annotated[str | None, Field(description="next_cursor of the last page.")] = None,
    team: Annotated[str | None, Field(description=TEAM_FILTER)] = None,
    author: Annotated[int | None, Field(description=AUTHOR_FILTER)] = None,
    app: Annotated[str | None, Field(description=APP_FILTER)] = None,
) -> dict[str, Any]:
    """List the user's saved memories (and their teams', where this app acts for
    them), newest first, a page at a time; each names its owner and who saved it."""
    page = reached.list_for(session, reach, filters=reached.Filters.parse(team, author, app),
                            status=status, limit=limit, cursor=cursor or None,
                            scopes=who.scopes)
    return {"items": reached.described(session, reach, page.items, scopes=who.scopes),
            "next_cursor": page.next_cursor}


def get_memory(
    session: Session, who: Principal, reach: Reach, config: Mapping[str, Any], /,
    memory_id: Annotated[str, Field(description="The memory's id.")],
) -> dict[str, Any]:
    """One saved memory by its id (the user's own or a team's)."""
    memory = reached.find_for(session, reach, memory_id, operation="get", scopes=who.scopes)
    return reached.described(session, reach, [memory], scopes=who.scopes)[0]


def update_memory(
    session: Session, who: Principal, reach: Reach, config: Mapping[str, Any], /,
    memory_id: Annotated[str, Field(description="The memory's id.")],
    content: Annotated[str | None, Field(description="The new text.")] = None,
    metadata: Annotated[dict[str, Any] | None,
                        Field(description="New labels (replace the old).")] = None,
) -> dict[str, Any]:
    """Change a saved memory's text or labels (the old version is kept)."""
    found = reached.find_for(session, reach, memory_id, operation="update",
                             scopes=who.scopes)
    memory, _ = memories.change_memory(session, found.owner_id, memory_id, content=content,
                                       metadata=metadata, actor=who.actor, scopes=who.scopes)
    return reached.described(session, reach, [memory], scopes=who.scopes)[0]


def forget_memory(
    session: Session, who: Principal, reach: Reach, config: Mapping[str, Any], /,
    memory_id: Annotated[str, Field(description="The id of the memory the user asked "
                                                "to forget (never a search's top hit).")],
    mode: Annotated[Literal["soft_delete", "redact", "hard_delete"],
                    Field(description="soft_delete: restorable; redact: the words are "
                                      "gone; hard_delete: erased for good.")] = "soft_delete",
    reason: Annotated[str | None, Field(description="Why, if the user said.")] = None,
) -> dict[str, Any]:
    """Forget one memory by its id: it stops being recalled at once."""
    found = reached.find_for(session, reach, memory_id, operation=mode, scopes=who.scopes)
    receipt = memories.forget_memory(session, found.owner_id, memory_id, mode=mode,
                                     actor=who.actor, scopes=who.scopes, reason=reason)
    return {"receipt": receipt.to_dict()}


def restore_memory(
    session: Session, who: Principal, reach: Reach, config: Mapping[str, Any], /,
    memory_id: Annotated[str, Field(description="The memory's id.")],
) -> dict[str, Any]:
    """Bring back a soft-deleted memory."""
    found = reached.find_for(session, reach, memory_id, operation="restore",
                             scopes=who.scopes)
    receipt = memories.restore_memory(session, found.owner_id, memory_id, actor=who.actor,
                                      scopes=who.scopes)
    return {"receipt": receipt.to_dict()}


def memory_status(
    session: Session, who: Principal, reach: Reach, config: Mapping[str, Any], /,
    team: Annotated[str | None, Field(description=(
        "A team's slug: that team's Memory Status instead of the user's."))] = None,
) -> dict[str, Any]:
    """Which of the user's sources their memory holds (or a team's, when named), each
    in the sentence the Memory Status page shows, and when it was last built."""
    memories.check_scope(who.scopes, "status")
    seat = reached.seat_for(reach, team)  # a team out of reach: as none at all
    user = session.get(User, seat.team_id if seat else reach.user_id)
    status = memories.status_of(session, user, scopes=who.scopes, embedder_name=(
        embedder_model_name(settings_from(config).embedder)))
    last = status.last_success or status.last_build
    return {"plan": status.plan_name, "sources": [
        {"key": s.key, "label": s.label, "state": str(s.state), "sentence": s.sentence,
         "chunks": s.chunks} for s in status.sources],
        "last_build": last.finished_at.isoformat() if last and last.finished_at else None}


def _saved_items(items: Iterable[dict[str, Any]]) -> list[connections.Handed]:
    return [connections.Handed(SAVED, m["id"], m["id"]) for m in items]


def _hits_handed(result: dict[str, Any]) -> list[connections.Handed]:
    return [connections.Handed(hit["source_key"], hit["source_id"], hit["memory_id"])
            for hit in result["results"]]


@dataclass(frozen=True)
class Tool:
    """One MCP tool: its function, its hints for the client, and what of its result a
    connected app's access log records (``handed``; None: the call is not logged)."""

    work: Callable[..., dict[str, Any]]
    title: str
    read_only: bool
    destructive: bool
    idempotent: bool
    handed: Callable[[dict[str, Any]], Iterable[connections.Handed]] | None = None

    @property
    def name(self) -> str:
        return self.work.__name__


TOOLS = (
    Tool(save_memory, "Save a memory", read_only=False, destructive=False, idempotent=False),
    Tool(search_memory, "Search memory", read_only=True, destructive=False, idempotent=True,
         handed=_hits_handed),
    Tool(list_memories, "List memories", read_only=True, destructive=False, idempotent=True,
         handed=lambda result: _saved_items(result["items"])),
    Tool(get_memory, "Get a memory", read_only=True, destructive=False, idempotent=True,
         handed=lambda result: _saved_items([result])),
    Tool(update_memory, "Update a memory", read_only=False, destructive=False,
         idempotent=True),
    Tool(forget_memory, "Forget a memory", read_only=False, destructive=True,
         idempotent=False),
    Tool(restore_memory, "Restore a memory", read_only=False, destructive=False,
         idempotent=False),
    Tool(memory_status, "Memory status", read_only=True, destructive=False, idempotent=True),
)
# Handed to every tool before its input: the session, the caller, its reach, the config.
_LEADING = 4


def run_tool(app: Flask, principal: Callable[[Session], Principal], tool: Tool,
             arguments: dict[str, Any]) -> dict[str, Any]:
    """One call, in ``app``'s context and a transaction of its own: ``tool`` calls a service
    with the caller's scopes and reach (the person's memory and the teams the credential
    acts for, read now): the service refuses what they do not allow, before it looks at
    anything. A refusal is a tool error in its sentence; anything else is logged by class
    name only."""
    with app.app_context():
        session = db.session
        who: Principal | None = None
        try:
            who = principal(session)
            user = session.get(User, who.user_id)
            if user is None or not user.active:
                raise ToolError("This account cannot be used any more.")
            reach = reach_of(session, user.id, who.credential)
            result = tool.work(session, who, reach, app.config, **arguments)
            if tool.handed is not None and who.caller is not None:
                connections.log_access(session, who.caller, tool.name, tool.handed(result))
            session.commit()
            return result
        except ToolError:
            session.rollback()
            raise
        except memories.ScopeMissing as exc:
            session.rollback()
            if who is None or who.caller is None:  # a key (stdio): the service's words
                raise ToolError(exc.sentence) from None
            raise ToolError(f"This connection may not do that: it needs the {exc.scope} "
                            "scope. Connect again and allow it.") from None
        except Refusal as exc:
            session.rollback()
            raise ToolError(exc.sentence) from None
        except Exception as exc:
            session.rollback()
            log.error("MCP tool %s failed: %s", tool.name, type(exc).__name__)
            raise ToolError(FAILED) from None
        finally:
            db.session.remove()


def _entry(app: Flask, principal: Callable[[Session], Principal], tool: Tool
           ) -> Callable[..., dict[str, Any]]:
    """What the SDK calls: the tool's input parameters only (its schema is read from this
    signature), bound to the app and the caller."""
    def call(**arguments: Any) -> dict[str, Any]:
        return run_tool(app, principal, tool, arguments)

    signature = inspect.signature(tool.work, eval_str=True)
    call.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=list(signature.parameters.values())[_LEADING:])
    call.__name__ = tool.name
    return call


def build_server(app: Flask, principal: Callable[[Session], Principal] = from_token
                 ) -> MCPServer:
    """The tools of ``TOOLS``, each run in ``app``'s context in a transaction of its own.
    Who calls is ``principal``'s to say: over HTTP, the token ``mcp_http`` checked first."""
    server = MCPServer(name="OrbitPilot memory", instructions=INSTRUCTIONS, version="1")
    for tool in TOOLS:
        server.add_tool(_entry(app, principal, tool), name=tool.name,
                        description=inspect.getdoc(tool.work),
                        annotations=ToolAnnotations(
                            title=tool.title, readOnlyHint=tool.read_only,
                            destructiveHint=tool.destructive, idempotentHint=tool.idempotent))
    return server
