"""The memory API, ``/v1/memories``, for clients holding an ``X-API-Key``: the key (header
only), the scope of the route's operation (the services' one table) and the JSON body
are checked here, then the service, which checks the scope again; every refusal is
``application/problem+json``, the OpenAPI document is spectree's, written from these
routes. A call reaches the key owner's memory and the teams the key acts for
(``reach``). docs/architecture/api.md has the order of checks."""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from flask import Blueprint, Flask, current_app, request, url_for
from flask_limiter.errors import RateLimitExceeded
from flask_limiter.util import get_remote_address
from werkzeug.exceptions import BadRequest
from werkzeug.routing import BaseConverter

from dashboard.access import Reach, reach_of
from dashboard.audit.services import Actor
from dashboard.extensions import csrf, db
from dashboard.memory import BuildRequest, get_embedder, recall_cut
from dashboard.refusals import Busy, Refusal
from dashboard.saved_memories import editing, forgetting, reading, rules
from dashboard.saved_memories import reach as reached
from dashboard.saved_memories.keys import authenticate_key, credential_of
from dashboard.saved_memories.models import ApiKey
from dashboard.saved_memories.openapi import (
    ALWAYS,
    BODY,
    HEADER,
    MEMORY_ID_SEGMENT,
    TARGET,
    Problem,
    Responses,
    answer,
    document,
    spec,
)
from dashboard.saved_memories.receipts import find_receipt, receipts_of_memory
from dashboard.saved_memories.schemas import (
    DeleteOut,
    DeleteQuery,
    ExportOut,
    ForgetOut,
    ListQuery,
    MemoryCreate,
    MemoryForgetRequest,
    MemoryOut,
    MemoryPage,
    MemoryPatch,
    MemoryRestoreRequest,
    OpenApiDocument,
    ReceiptList,
    ReceiptOut,
    RestoreOut,
    SaveOut,
    SearchOut,
    SearchRequest,
    ShareRequest,
)
from dashboard.security import get_limiter

log = logging.getLogger(__name__)

# Query parameters a client might put a key in (compared lower-cased, "-" as "_").
KEY_PARAMETERS = frozenset({"api_key", "apikey", "key", "x_api_key", "token", "access_token"})
_ENVIRON_KEY = "orbitpilot.api_key"

UNAUTHORIZED = (f"Send a live API key in the {HEADER} header (create one on "
                "/settings/keys).")
KEY_IN_URL = f"API keys go in the {HEADER} header, never in the URL."

bp = Blueprint("api", __name__, url_prefix="/v1")


# -- refusals ------------------------------------------------------------------------------

def _rollback() -> None:
    try:
        db.session.rollback()
    except Exception as exc:  # the connection may be what failed
        log.warning("rollback after an API refusal failed: %s", type(exc).__name__)


@bp.errorhandler(Problem)
def _refused(problem: Problem):
    _rollback()
    return answer(problem)


# A service refusal's kind → the status and title the API answers with.
REFUSALS = {
    "invalid": (422, "Invalid input"),
    "forbidden": (403, "Missing scope"),
    "not_found": (404, "Not found"),
    "gone": (410, "Gone"),
    "conflict": (409, "Conflict"),
    "busy": (503, "Busy"),
    "too_soon": (429, "Too Many Requests"),
    "failed": (502, "Bad Gateway"),
}


@bp.errorhandler(Refusal)
def _service_refused(exc: Refusal):
    status, title = REFUSALS.get(exc.kind, (400, "Bad request"))
    if status == 403 and not isinstance(exc, rules.ScopeMissing):
        title = "Forbidden"  # a team role or policy, not the key's scopes
    errors = [{"field": exc.field or "body", "detail": exc.sentence}] if status == 422 \
        else None
    headers = {"Retry-After": str(exc.retry_after)} if isinstance(exc, Busy) else None
    return _refused(Problem(status, title, exc.sentence, errors=errors, headers=headers))


@bp.errorhandler(RateLimitExceeded)
def _too_many(exc: RateLimitExceeded):
    current = get_limiter().current_limit
    wait = max(1, int(current.reset_at - time.time())) if current else 60
    return answer(Problem(
        429, "Too Many Requests",
        f"More calls than this API key (or, without one, this address) may make; try "
        f"again in {wait} s.",
        headers={"Retry-After": str(wait)}))


# -- keys, scopes and bodies ---------------------------------------------------------------

# view → its operation in rules.SCOPE_FOR_OPERATION; None: the mode in the request
# decides (the service checks it once the mode is read).
_OPERATION: dict[str, str | None] = {}
_BODY: dict[str, bool] = {}  # view → whether its JSON body is required


def _needs(operation: str | None) -> str:
    """What the document says a route needs, read from the services' table."""
    if operation is not None:
        return f"Needs {rules.SCOPE_FOR_OPERATION[operation]}."
    return "Needs, by mode: " + "; ".join(
        f"{mode} {rules.SCOPE_FOR_OPERATION[mode]}" for mode in rules.FORGET_MODES) + "."


def _route(rule: str, method: str, *, operation: str | None,
           body: bool | None = None) -> Callable[[Callable], Callable]:
    def register(view: Callable) -> Callable:
        view.__doc__ = f"{inspect.cleandoc(view.__doc__ or '')}\n\n{_needs(operation)}"
        _OPERATION[view.__name__] = operation
        if body is not None:
            _BODY[view.__name__] = body
        bp.add_url_rule(rule, view_func=view, methods=[method],
                        provide_automatic_options=False)
        return view
    return register


def _refuse_key_in_url() -> None:
    if not any(name.lower().replace("-", "_") in KEY_PARAMETERS for name in request.args):
        return
    # The access log reads the request line from the environ after we answer: cut it
    # back to the path, so a key sent here is not written down there either.
    environ = request.environ
    environ["QUERY_STRING"] = ""
    for name in ("RAW_URI", "REQUEST_URI"):
        if isinstance(environ.get(name), str):
            environ[name] = environ[name].split("?", 1)[0]
    raise Problem(400, "Bad Request", KEY_IN_URL)


def _read_body(view: str) -> None:
    required = _BODY.get(view)
    if required is None or (not required and not request.get_data(cache=True)):
        return
    if not request.is_json:
        raise Problem(415, "Unsupported Media Type",
                      "Send the body as JSON, with Content-Type: application/json.")
    try:
        body = request.get_json()
    except BadRequest:
        raise Problem(400, "Malformed JSON", "The body is not valid JSON.") from None
    if not isinstance(body, dict):
        raise Problem(422, "Invalid input", "The body must be a JSON object.",
                      errors=[{"field": "body", "detail": "must be a JSON object"}])


_NO_KEY = object()  # authenticated once per request: no live key in the header


def current_key() -> ApiKey | None:
    """The live key in this request's X-API-Key header, authenticated once per request
    (the rate limit, which runs first, counts by it). Its last use is committed at once:
    a key that only probes (refused ids, missing scopes) must not look unused."""
    found = request.environ.get(_ENVIRON_KEY)
    if found is None:
        now = datetime.now(UTC)
        found = authenticate_key(db.session, request.headers.get(HEADER), now=now) or _NO_KEY
        if found is not _NO_KEY and found.last_used_at == now:  # stamped: at most once a
            db.session.commit()  # minute, so most calls add no commit (and no reload)
        request.environ[_ENVIRON_KEY] = found
    return None if found is _NO_KEY else found


@bp.before_request
def _authenticate() -> None:
    _refuse_key_in_url()
    view = (request.endpoint or "").rpartition(".")[2]
    if view not in _OPERATION:
        return  # the document is public
    key = current_key()
    if key is None:
        raise Problem(401, "Unauthorized", UNAUTHORIZED,
                      headers={"WWW-Authenticate": "ApiKey"})
    operation = _OPERATION[view]
    if operation is not None:
        # Before the body is read (415, 400, 422): a key without the scope learns
        # nothing more. The service the view calls checks it again.
        rules.check_scope(key.scopes, operation)
    _read_body(view)


@bp.after_request
def _no_store(response):
    # Memories, receipts and exports are personal: no browser or proxy keeps a copy.
    response.headers["Cache-Control"] = "no-store"
    return response


def rate_limit_key() -> str:
    """Calls with a live key are counted per key; every other call (no key, a forged or
    revoked one) per client address. Never by the key's public prefix alone: anyone
    could then spend someone else's allowance, or rotate prefixes to escape counting."""
    key = current_key() if not _is_document() else None
    if key is not None:
        return f"key:{key.id}"
    return "address:" + get_remote_address()


def _key() -> ApiKey:
    key = current_key()
    assert key is not None  # _authenticate refused the call otherwise
    return key


def _actor(key: ApiKey) -> Actor:
    return Actor("api_key", str(key.id))


def _reach(key: ApiKey) -> Reach:
    """What this call reaches: the key owner's memory and each team the key names, the
    owner is in now, and whose longest key lifetime it fits (read at every call)."""
    return reach_of(db.session, key.owner_id, credential_of(key))


def _described(reach: Reach, memory, key) -> dict[str, Any]:
    return reached.described(db.session, reach, [memory], scopes=key.scopes)[0]


def _build(build: BuildRequest | None) -> dict[str, Any] | None:
    return {"id": build.build_id, "merged": build.merged} if build else None


ApiResult = tuple[dict[str, Any], int] | tuple[dict[str, Any], int, dict[str, str]]
MEMORIES, RECEIPTS, DOCUMENT = ("memories",), ("erasure receipts",), ("document",)


# -- routes --------------------------------------------------------------------------------

@spec.validate(resp=Responses(200, OpenApiDocument, 400, 503), security={},
               operation_id="openapi", tags=DOCUMENT)
def openapi() -> ApiResult:
    """This document: OpenAPI 3.1, generated from the routes; no key needed."""
    return document(), 200


bp.add_url_rule("/openapi.json", view_func=openapi, methods=["GET"],
                provide_automatic_options=False)


@_route("/memories", "POST", operation="save", body=True)
@spec.validate(json=MemoryCreate, resp=Responses(201, SaveOut, *ALWAYS, 404, *BODY),
               operation_id="create_memory", tags=MEMORIES)
def create_memory() -> ApiResult:
    """Save a memory: the key owner's own, or a team's when team names one.

    Says whether saved memories are remembered on the owner's plan (the team's, for a
    team memory), in the words the Memory Status page uses; a quick memory build is
    requested either way. The memory names its owner and who saved it with which key."""
    body: MemoryCreate = request.context.json
    key = _key()
    reach = _reach(key)
    saved = reached.save_for(db.session, reach, team=body.team, content=body.content,
                             metadata=body.metadata, source=body.source, actor=_actor(key),
                             api_key_id=key.id, scopes=key.scopes)
    payload = {"memory": _described(reach, saved.memory, key), "remembered": saved.remembered,
               "memory_notice": saved.sentence, "build": _build(saved.build)}
    db.session.commit()
    return payload, 201 if saved.created else 200, \
        {"Location": url_for(".get_memory", memory_id=saved.memory.id)}


@_route("/memories", "GET", operation="list")
@spec.validate(query=ListQuery, resp=Responses(200, MemoryPage, *ALWAYS, 404, 422),
               operation_id="list_memories", tags=MEMORIES)
def list_memories() -> ApiResult:
    """List the memories the key reaches (the owner's and its teams'), newest first;
    team, author and app narrow it.

    Pass next_cursor as cursor for the next page; it is null on the last."""
    query: ListQuery = request.context.query
    key = _key()
    reach = _reach(key)
    page = reached.list_for(db.session, reach,
                            filters=reached.Filters.parse(query.team, query.author, query.app),
                            status=query.status, limit=query.limit,
                            cursor=query.cursor or None, scopes=key.scopes)
    payload = {"items": reached.described(db.session, reach, page.items,
                                        scopes=key.scopes),
               "next_cursor": page.next_cursor}
    db.session.commit()
    return payload, 200


@_route("/memories/search", "POST", operation="search", body=True)
@spec.validate(json=SearchRequest, resp=Responses(200, SearchOut, *ALWAYS, 404, *BODY),
               operation_id="search_memories", tags=MEMORIES)
def search_memories() -> ApiResult:
    """Recall: the k memory chunks nearest the query, in one search over the owner's
    memory (every source their last build stored) and the teams the key acts for; each
    names whose memory it is and where it came from. team, author and app narrow it."""
    body: SearchRequest = request.context.json
    embedder = get_embedder(current_app.config["EMBEDDER"])  # one per process
    key = _key()
    reach = _reach(key)
    hits = reached.recall_for(
        db.session, reach, body.query, body.k, embedder=embedder,
        max_distance=recall_cut(current_app.config["RECALL_MAX_DISTANCE"]),
        scopes=key.scopes, filters=reached.Filters.parse(body.team, body.author, body.app))
    payload = {"results": reached.described_hits(db.session, reach, hits),
               "notice": reading.recall_notice(hits)}
    db.session.commit()
    return payload, 200


@_route("/memories/export", "GET", operation="export")
@spec.validate(resp=Responses(200, ExportOut, *ALWAYS, headers={
                   "Content-Disposition": "attachment; filename=orbitpilot-memories-….json"}),
               operation_id="export_memories", tags=MEMORIES)
def export_memories() -> ApiResult:
    """Everything remembered about the key's owner, as one JSON file: saved memories in
    every status and the chunks of the last builds."""
    key = _key()
    payload = reading.export_memories(db.session, key.owner_id, scopes=key.scopes)
    db.session.commit()
    name = f"orbitpilot-memories-{datetime.now(UTC):%Y-%m-%d}.json"
    return payload, 200, {"Content-Disposition": f"attachment; filename={name}"}


@_route("/memories/<memory_id:memory_id>", "GET", operation="get")
@spec.validate(resp=Responses(200, MemoryOut, *ALWAYS, *TARGET),
               operation_id="get_memory", tags=MEMORIES)
def get_memory(memory_id: str) -> ApiResult:
    """Read one memory (the owner's or a team's the key acts for); 410 once it was
    hard-deleted."""
    key = _key()
    reach = _reach(key)
    memory = reached.find_for(db.session, reach, memory_id, operation="get",
                              scopes=key.scopes)
    payload = _described(reach, memory, key)
    db.session.commit()
    return payload, 200


@_route("/memories/<memory_id:memory_id>", "PATCH", operation="update", body=True)
@spec.validate(json=MemoryPatch, resp=Responses(200, MemoryOut, *ALWAYS, *TARGET, 409, *BODY),
               operation_id="update_memory", tags=MEMORIES)
def update_memory(memory_id: str) -> ApiResult:
    """Change an active memory's content and/or metadata: the previous version is kept
    as a snapshot, the version goes up by one. In a team: its admins, or its author if
    the team's policy lets members change their own."""
    body: MemoryPatch = request.context.json
    key = _key()
    reach = _reach(key)
    found = reached.find_for(db.session, reach, memory_id, operation="update",
                             scopes=key.scopes)
    memory, _ = editing.change_memory(db.session, found.owner_id, memory_id,
                                       content=body.content, metadata=body.metadata,
                                       actor=_actor(key), scopes=key.scopes)
    payload = _described(reach, memory, key)
    db.session.commit()
    return payload, 200


@_route("/memories/<memory_id:memory_id>", "DELETE", operation=None)
@spec.validate(query=DeleteQuery, resp=Responses(200, DeleteOut, *ALWAYS, *TARGET, 409, 422),
               operation_id="delete_memory", tags=MEMORIES)
def delete_memory(memory_id: str) -> ApiResult:
    """Forget a memory; mode soft_delete (the default), redact or hard_delete. Returns the
    erasure receipt."""
    query: DeleteQuery = request.context.query
    key = _key()
    found = reached.find_for(db.session, _reach(key), memory_id, operation=query.mode,
                             scopes=key.scopes)
    receipt = forgetting.forget_memory(db.session, found.owner_id, memory_id, mode=query.mode,
                                     actor=_actor(key), scopes=key.scopes, reason=query.reason)
    payload = {"receipt": receipt.to_dict()}
    db.session.commit()
    return payload, 200


@_route("/memories/<memory_id:memory_id>/forget", "POST", operation=None, body=True)
@spec.validate(json=MemoryForgetRequest,
               resp=Responses(200, ForgetOut, *ALWAYS, *TARGET, 409, *BODY),
               operation_id="forget_memory", tags=MEMORIES)
def forget_memory(memory_id: str) -> ApiResult:
    """Forget a memory, with a reason, a redaction's replacement text or new metadata.

    soft_delete can be restored; redact purges the content of every earlier version;
    hard_delete leaves only the erasure receipt. It stops being recalled at once."""
    body: MemoryForgetRequest = request.context.json
    key = _key()
    reach = _reach(key)
    found = reached.find_for(db.session, reach, memory_id, operation=body.mode,
                             scopes=key.scopes)
    owner_id = found.owner_id
    receipt = forgetting.forget_memory(
        db.session, owner_id, memory_id, mode=body.mode, actor=_actor(key),
        scopes=key.scopes, reason=body.reason, replacement_content=body.replacement_content,
        metadata=body.metadata)
    # What the forget left, read as its own result (no second scope, as its receipt).
    memory = None if body.mode == "hard_delete" else \
        _described(reach, rules.find_memory(db.session, owner_id, memory_id), key)
    payload = {"receipt": receipt.to_dict(), "memory": memory}
    db.session.commit()
    return payload, 200


@_route("/memories/<memory_id:memory_id>/restore", "POST", operation="restore", body=False)
@spec.validate(json=MemoryRestoreRequest,
               resp=Responses(200, RestoreOut, *ALWAYS, *TARGET, 409, *BODY),
               operation_id="restore_memory", tags=MEMORIES)
def restore_memory(memory_id: str) -> ApiResult:
    """Undo a soft delete; the body is optional. A redacted memory cannot be restored
    (409); a hard-deleted one is gone (410)."""
    body: MemoryRestoreRequest = request.context.json or MemoryRestoreRequest()
    key = _key()
    reach = _reach(key)
    owner_id = reached.find_for(db.session, reach, memory_id, operation="restore",
                                scopes=key.scopes).owner_id
    receipt = forgetting.restore_memory(db.session, owner_id, memory_id, actor=_actor(key),
                                      scopes=key.scopes, reason=body.reason,
                                      metadata=body.metadata)
    memory = rules.find_memory(db.session, owner_id, memory_id)
    payload = {"memory": _described(reach, memory, key), "receipt": receipt.to_dict(),
               "build": _build(receipt.build)}
    db.session.commit()
    return payload, 200


@_route("/memories/<memory_id:memory_id>/share", "POST", operation="save", body=True)
@spec.validate(json=ShareRequest,
               resp=Responses(201, SaveOut, *ALWAYS, *TARGET, 409, *BODY,
                              also={200: SaveOut}),
               operation_id="share_memory", tags=MEMORIES)
def share_memory(memory_id: str) -> ApiResult:
    """Share one of the key owner's own active memories to a team: a copy owned by the
    team, naming the original as its provenance (the original stays the owner's).

    The key must act for the team, and the owner's role there must let them share.
    Shared again while that copy is active (a retry): 200 with the same copy."""
    body: ShareRequest = request.context.json
    key = _key()
    reach = _reach(key)
    saved = reached.share_to_team(db.session, reach, memory_id, body.team, actor=_actor(key),
                                  api_key_id=key.id, scopes=key.scopes)
    payload = {"memory": _described(reach, saved.memory, key), "remembered": saved.remembered,
               "memory_notice": saved.sentence, "build": _build(saved.build)}
    db.session.commit()
    return payload, 201 if saved.created else 200, \
        {"Location": url_for(".get_memory", memory_id=saved.memory.id)}


@_route("/memories/<memory_id:memory_id>/receipts", "GET", operation="receipts")
@spec.validate(resp=Responses(200, ReceiptList, *ALWAYS, 404),
               operation_id="list_memory_receipts", tags=RECEIPTS)
def list_memory_receipts(memory_id: str) -> ApiResult:
    """The erasure receipts of one memory (the owner's or a team's the key acts for),
    oldest first; they remain after a hard delete."""
    key = _key()
    reach = _reach(key)
    receipts = receipts_of_memory(db.session, reach.owner_ids, memory_id,
                                           scopes=key.scopes)
    if not receipts:
        reached.find_for(db.session, reach, memory_id)  # none at all: 404
    payload = {"items": [receipt.to_dict() for receipt in receipts]}
    db.session.commit()
    return payload, 200


@_route("/erasure-receipts/<marker_id>", "GET", operation="receipts")
@spec.validate(resp=Responses(200, ReceiptOut, *ALWAYS, 404),
               operation_id="get_erasure_receipt", tags=RECEIPTS)
def get_erasure_receipt(marker_id: str) -> ApiResult:
    """One erasure receipt, by the marker_id a forget or restore returned (of the owner's
    memory or a team's the key acts for)."""
    key = _key()
    payload = find_receipt(db.session, _reach(key).owner_ids, marker_id,
                                    scopes=key.scopes).to_dict()
    db.session.commit()
    return payload, 200


# -- mounting ------------------------------------------------------------------------------

def _is_document() -> bool:
    return request.endpoint == "api.openapi"


class MemoryIdConverter(BaseConverter):
    """A memory's id in a path: any segment but the collection's own words, so that
    ``/v1/memories/export`` is never a memory too (nor lists a memory's methods in a
    405's ``Allow``). The service parses the id: a malformed one is a 404 like any other."""

    regex = MEMORY_ID_SEGMENT


def init_api(app: Flask) -> None:
    """Mount the API on ``app``, after ``init_security``: its limiter counts the calls."""
    app.url_map.converters["memory_id"] = MemoryIdConverter
    app.register_blueprint(bp)
    csrf.exempt(bp)  # no cookies, no forms: a key in a header is the credential
    get_limiter(app).shared_limit(lambda: app.config["API_RATE_LIMIT"], scope="api",
                                  key_func=rate_limit_key, exempt_when=_is_document)(bp)
