"""Clear errors, never a bare 500 page: HTML for people, problem+json for the API, and
an RFC 6749 error (JSON, not stored) at the OAuth client endpoints."""

from __future__ import annotations

import logging
import time

from flask import Flask, g, jsonify, make_response, render_template, request
from flask_limiter.errors import RateLimitExceeded
from flask_wtf.csrf import CSRFError
from redis.exceptions import ConnectionError as RedisConnectionError
from sqlalchemy.exc import DataError, InterfaceError, OperationalError
from werkzeug.exceptions import ClientDisconnected, HTTPException, InternalServerError

from dashboard.embedded import EmbeddedError
from dashboard.extensions import db, login_manager
from dashboard.refusals import Refusal
from dashboard.security import BODY_UNREADABLE, get_limiter

log = logging.getLogger(__name__)

# A service refusal's kind → the status a page (or a page's JSON) answers with.
PAGE_STATUS = {"invalid": 400, "forbidden": 403, "not_found": 404, "gone": 410,
               "conflict": 409, "busy": 503, "too_soon": 429, "failed": 502}
TITLES = {400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found",
          409: "Conflict", 410: "Gone", 429: "Too Many Requests", 502: "Bad Gateway",
          503: "Service Unavailable"}


# What an error page says, in our words, when the error brought none of its own.
PAGE_WORDS = {
    400: ("That did not work", "This page could not take that request. Go back and try "
                               "again."),
    401: ("Sign in first", "This page is for signed-in people."),
    403: ("Not for this account", "Your account cannot open this page. If you think it "
                                  "should, ask an administrator."),
    404: ("Page not found", "There is nothing at this address: it may have moved, or the "
                            "link may be mistyped."),
    405: ("Not this way", "This address does not take that kind of request."),
    410: ("Gone for good", "What was here has been removed."),
    413: ("Too large", "That is more than this page accepts."),
    500: ("Something went wrong", "Something went wrong on our side. Try again in a moment."),
}
STAFF_PATHS = ("/admin", "/support")


def page_words(exc: HTTPException) -> tuple[str, str]:
    """A page's title and sentence: ours, unless the code that raised it gave a sentence
    of its own (werkzeug's stock ones are not ours)."""
    code = exc.code or 500
    title, sentence = PAGE_WORDS.get(code, (exc.name, exc.description or exc.name))
    own = exc.description and exc.description != type(exc).description
    return title, exc.description if own else sentence


def _error_page(code: int, title: str, detail: str):
    """The error page, in the context it happened in: the staff console's own way back
    and no chat dock there; the home page (or sign-in) elsewhere. The page reads the
    database (who is signed in, the chat notice): if that fails too, the transaction is
    rolled back and the page sent bare, rather than an error escaping the error handler
    (werkzeug's own 500 would carry none of our headers)."""
    staff = request.path.startswith(STAFF_PATHS)
    try:
        return render_template("error.html", code=code, title=title, detail=detail,
                               staff=staff), code
    except Exception as again:
        _rollback()
        log.error("the error page failed too: %s", type(again).__name__)
        response = make_response(f"{title}\n\n{detail}\n", code)
        response.mimetype = "text/plain"
        return response


# The endpoints OAuth clients (not people) call: every error there is an RFC 6749 error.
OAUTH_CLIENT_PATHS = ("/oauth/token", "/oauth/revoke", "/oauth/register")
OAUTH_ERRORS = {400: "invalid_request", 401: "invalid_client", 405: "invalid_request",
                413: "invalid_request", 429: "temporarily_unavailable",
                503: "temporarily_unavailable"}


def oauth_client_path() -> bool:
    return request.path.rstrip("/") in OAUTH_CLIENT_PATHS


def oauth_error(status: int, detail: str, error: str | None = None):
    """An RFC 6749 error body (``error``, ``error_description``: printable ASCII without
    a quote or backslash), marked not to be stored."""
    text = "".join(c if " " <= c <= "~" and c not in "\\\"" else "'" for c in detail)
    response = jsonify(error=error or OAUTH_ERRORS.get(status, "invalid_request"
                                                       if status < 500 else "server_error"),
                       error_description=text)
    response.status_code = status
    response.headers["Cache-Control"] = "no-store"
    response.headers["Pragma"] = "no-cache"
    return response


def refusal_status(refusal: Refusal) -> int:
    return PAGE_STATUS.get(refusal.kind, 400)


def wants_json() -> bool:
    if request.path == "/v1" or request.path.startswith("/v1/"):
        return True
    best = request.accept_mimetypes.best_match(["text/html", "application/json"])
    return best == "application/json" and request.accept_mimetypes[best] > \
        request.accept_mimetypes["text/html"]


def problem(status: int, title: str, detail: str):
    response = jsonify(type="about:blank", title=title, status=status, detail=detail)
    response.status_code = status
    response.mimetype = "application/problem+json"
    return response


UNAVAILABLE = ("OrbitPilot cannot reach its database or queue right now. Nothing was "
               "changed; try again in a minute.")
NOT_VALID = "A value in this request is not valid here (a number out of range, say)."
TOO_MANY = "Too many attempts. Please wait {wait} and try again."


def _rollback() -> None:
    try:
        db.session.rollback()
    except Exception as exc:  # the connection may be what failed
        log.warning("rollback after an error failed: %s", type(exc).__name__)


def wait_words(seconds: int) -> str:
    if seconds >= 90:
        minutes = round(seconds / 60)
        return f"{minutes} minute{'s' if minutes != 1 else ''}"
    return f"{seconds} second{'s' if seconds != 1 else ''}"


def _page(code: int, title: str, detail: str):
    if oauth_client_path():
        return oauth_error(code, detail)
    if wants_json():
        return problem(code, title, detail)
    return _error_page(code, title, detail)


def register_error_handlers(app: Flask) -> None:
    @app.errorhandler(RateLimitExceeded)
    def too_many(exc: RateLimitExceeded):
        current = get_limiter().current_limit
        wait = max(1, int(current.reset_at - time.time())) if current else 60
        return _page(429, "Too many attempts", TOO_MANY.format(wait=wait_words(wait)))

    @app.errorhandler(DataError)
    def data_error(exc: DataError):
        # Bad input that reached the database (a 2^64 id, say): the kind goes to the log,
        # never the statement or its parameters.
        _rollback()
        log.info("refused input the database could not take: %s on %s %s",
                 type(exc.orig).__name__, request.method, request.path)
        return _page(400, "Bad Request", NOT_VALID)

    @app.errorhandler(OperationalError)
    @app.errorhandler(InterfaceError)
    @app.errorhandler(EmbeddedError)
    @app.errorhandler(RedisConnectionError)
    def unavailable(exc: Exception):
        _rollback()
        # The page must not ask the database who is signed in: it is what just failed.
        g._login_user = login_manager.anonymous_user()
        log.error("service unavailable: %s on %s %s", type(exc).__name__, request.method,
                  request.path)
        return _page(503, "Service Unavailable", UNAVAILABLE)

    @app.errorhandler(CSRFError)
    def csrf_error(exc: CSRFError):
        detail = "The form expired or was sent without its security token. Reload and try again."
        if oauth_client_path():
            return oauth_error(400, detail)
        if wants_json():
            return problem(400, "CSRF token missing or invalid", detail)
        return _error_page(400, "Form expired", detail)

    @app.errorhandler(ClientDisconnected)
    def unreadable_body(exc: ClientDisconnected):
        return _page(400, "Bad Request", BODY_UNREADABLE)

    @app.errorhandler(HTTPException)
    def http_error(exc: HTTPException):
        code = exc.code or 500
        if oauth_client_path():
            response = oauth_error(code, page_words(exc)[1])
        elif wants_json():
            response = problem(code, exc.name, exc.description or exc.name)
        else:
            response = make_response(_error_page(code, *page_words(exc)))
        # The exception's own headers: Allow on a 405, WWW-Authenticate on a 401.
        for name, value in exc.get_headers():
            if name.lower() != "content-type":
                response.headers[name] = value
        return response

    @app.errorhandler(Exception)
    def unhandled(exc: Exception):
        # The transaction may be what failed (a race's IntegrityError): the page reads the
        # database, so roll back first.
        _rollback()
        # The exception type only: messages can quote user content.
        log.error("unhandled %s on %s %s", type(exc).__name__, request.method, request.path,
                  exc_info=app.debug)
        if app.testing and app.config.get("PROPAGATE_TEST_ERRORS", True):
            raise exc
        err = InternalServerError()
        if oauth_client_path():
            return oauth_error(500, "Something went wrong on our side.")
        if wants_json():
            return problem(500, err.name, "Something went wrong on our side.")
        return _error_page(500, *page_words(err))
