"""The memory API's OpenAPI 3.1 document, written by spectree from the routes' declarations
(``api.py``) and the models (``schemas.py``), and its problems: every refusal is
``application/problem+json``, and each route documents the statuses it answers with."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from flask import current_app, jsonify, request
from spectree import Response, SpecTree
from spectree.models import InType, SecureType, SecurityScheme, SecuritySchemeData
from spectree.utils import get_model_key

from dashboard.saved_memories.schemas import ProblemDetails

log = logging.getLogger(__name__)

HEADER = "X-API-Key"
PROBLEM = "application/problem+json"


class Problem(Exception):
    """A refusal, answered as application/problem+json."""

    def __init__(self, status: int, title: str, detail: str, *,
                 errors: list[dict[str, str]] | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(detail)
        self.status, self.title, self.detail = status, title, detail
        self.errors, self.headers = errors, headers or {}


def answer(problem: Problem):
    body: dict[str, Any] = {"type": "about:blank", "title": problem.title,
                            "status": problem.status, "detail": problem.detail}
    if problem.errors is not None:
        body["errors"] = problem.errors
    response = jsonify(body)
    response.status_code = problem.status
    response.mimetype = PROBLEM
    response.headers.update(problem.headers)
    return response


def _invalid(_request: Any, _response: Any, error: Any, _instance: Any, _adapter: Any) -> None:
    """spectree's hook before a view: its validation errors become our 422."""
    if error is None:
        return
    first: dict[str, str] = {}
    for item in error.errors(include_url=False, include_input=False, include_context=False):
        # The models are flat: the field is the first step of the location; the rest
        # names a branch of an optional field's type, one error each — the first says it.
        field = str(item["loc"][0]) if item["loc"] else "body"
        first.setdefault(field, item["msg"].removeprefix("Value error, "))
    errors = [{"field": field, "detail": detail} for field, detail in first.items()]
    raise Problem(422, "Invalid input",
                  "; ".join(f"{e['field']}: {e['detail']}" for e in errors), errors=errors)


def _drifted(_request: Any, _response: Any, error: Any, _instance: Any, _adapter: Any) -> None:
    # Tests only (Responses.find_model). The endpoint, not the errors: they quote content.
    if error is not None:
        log.error("the response of %s does not match its documented model", request.endpoint)


# Every call can meet: a key in the URL or unreadable input (400), no live key (401), the
# route's scope (403), the rate limit (429), the database or queue down (503).
ALWAYS = (400, 401, 403, 429, 503)
TARGET = (404, 410)
BODY = (413, 415, 422)
PROBLEM_DESCRIPTIONS = {
    400: "A key in the URL, malformed JSON, or input that cannot be stored (NUL, not UTF-8).",
    401: f"No live API key in {HEADER}: missing, malformed, unknown, revoked or expired.",
    403: "The key lacks the scope this call, or this mode, needs; or, in a team, the key "
         "owner's role (or the team's policy) does not allow it.",
    404: "Nothing with this id (or no team by this name) among what the key reaches: its "
         "owner's memory and the teams it acts for (the same answer for someone else's, "
         "and for a team the key does not act for).",
    409: "The memory's state does not allow this (e.g. restoring a redacted memory).",
    410: "The memory was permanently deleted; only its erasure receipts remain.",
    413: "The body is larger than the server accepts.",
    415: "The body is not application/json.",
    422: "A value is not valid; errors names each field.",
    429: "Too many calls for this key; see Retry-After.",
    503: "The database or queue cannot be reached, or (a forget or an edit) a memory build "
         "of the owner held on longer than the call may wait; nothing was changed.",
}
_RESPONSE_HEADERS = {
    201: {"Location": "The new memory's URL."},
    401: {"WWW-Authenticate": f"ApiKey (send the key in the {HEADER} header)."},
    429: {"Retry-After": "Seconds until this key may call again."},
}


class Responses(Response):
    """The statuses a route answers with: the success model, then ProblemDetails for each
    refusal, documented as application/problem+json."""

    def __init__(self, status: int, model: Any, *problems: int,
                 headers: dict[str, str] | None = None, also: dict[int, Any] | None = None,
                 ) -> None:
        # ``also``: other success statuses (a retry answered with the first one's result).
        super().__init__(**{f"HTTP_{status}": model},
                         **{f"HTTP_{code}": other for code, other in (also or {}).items()},
                         **{f"HTTP_{code}": (ProblemDetails, PROBLEM_DESCRIPTIONS[code])
                            for code in sorted(set(problems))})
        self.headers = {**_RESPONSE_HEADERS, status: {**_RESPONSE_HEADERS.get(status, {}),
                                                      **(headers or {})}}

    def add_model(self, code: int, model: Any, replace: bool = True,
                  description: str | None = None) -> None:
        # spectree adds a 422 to every route (replace=False); ours list what they answer.
        if replace:
            super().add_model(code, model, replace, description)

    def find_model(self, code: int) -> Any:
        return super().find_model(code) if current_app.testing else None

    def generate_spec(self, naming_strategy: Callable = get_model_key) -> dict[str, Any]:
        spec = super().generate_spec(naming_strategy)
        for code, entry in spec.items():
            if int(code) >= 400 and "content" in entry:
                entry["content"] = {PROBLEM: entry["content"].pop("application/json")}
            if int(code) in self.headers:
                entry["headers"] = {name: {"description": text, "schema": {"type": "string"}}
                                    for name, text in self.headers[int(code)].items()}
        return spec


spec = SpecTree(
    "flask",
    title="OrbitPilot memory API",
    version="1",
    description=("Save, recall, change and forget memories. Authenticate with the "
                 f"{HEADER} header (keys: /settings/keys). Errors are "
                 "application/problem+json."),
    mode="strict",  # only the routes declared here, not the rest of the app
    annotations=False,
    page_templates={},  # no Swagger/Redoc pages: they load scripts from a CDN
    security_schemes=[SecurityScheme(name="ApiKey", data=SecuritySchemeData(
        type=SecureType.API_KEY, name=HEADER, field_in=InType.HEADER,
        description="An API key from /settings/keys."))],
    security={"ApiKey": []},
    naming_strategy=lambda model: model.__name__,
    nested_naming_strategy=lambda _parent, child: child,
    validation_error_model=ProblemDetails,
    before=_invalid,
    after=_drifted,
)


# A memory's id in a path: any segment but the collection's own words (the routes'
# converter, ``api.MemoryIdConverter``, and the document say the same).
MEMORY_ID_SEGMENT = r"(?!(?:export|search)$)[^/]+"
MEMORY_ID_HELP = ("The memory's id (a UUID); a malformed or unknown one is a 404, like "
                  "someone else's.")


def document() -> dict[str, Any]:
    document = spec.spec  # generated once per process, from the app's routes
    # spectree marks every request body required; restore's may be left out.
    document["paths"]["/v1/memories/{memory_id}/restore"]["post"]["requestBody"][
        "required"] = False
    # Its converter is ours (the collection's own words are no memory): spectree knows
    # only werkzeug's, and leaves the schema out.
    for operations in document["paths"].values():
        for operation in operations.values():
            for parameter in operation.get("parameters", ()):
                if parameter["name"] == "memory_id" and parameter.get("schema") is None:
                    parameter["schema"] = {"type": "string",
                                           "pattern": f"^{MEMORY_ID_SEGMENT}$"}
                    parameter["description"] = MEMORY_ID_HELP
    return document


