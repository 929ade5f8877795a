"""Clear errors, never a bare 500 page: HTML for people, problem+json for the API."""

from __future__ import annotations

import logging

from flask import Flask, jsonify, render_template, request
from flask_wtf.csrf import CSRFError
from werkzeug.exceptions import HTTPException, InternalServerError

log = logging.getLogger(__name__)


def wants_json() -> bool:
    if request.path.startswith("/v1/"):
        return True
    best = request.accept_mimetypes.best_match(["text/html", "application/json"])
    return best == "application/json" and request.accept_mimetypes[best] > \
        request.accept_mimetypes["text/html"]


def problem(status: int, title: str, detail: str):
    response = jsonify(type="about:blank", title=title, status=status, detail=detail)
    response.status_code = status
    response.mimetype = "application/problem+json"
    return response


def register_error_handlers(app: Flask) -> None:
    @app.errorhandler(CSRFError)
    def csrf_error(exc: CSRFError):
        detail = "The form expired or was sent without its security token. Reload and try again."
        if wants_json():
            return problem(400, "CSRF token missing or invalid", detail)
        return render_template("error.html", code=400, title="Form expired", detail=detail), 400

    @app.errorhandler(HTTPException)
    def http_error(exc: HTTPException):
        code = exc.code or 500
        if wants_json():
            return problem(code, exc.name, exc.description or exc.name)
        return render_template("error.html", code=code, title=exc.name,
                               detail=exc.description), code

    @app.errorhandler(Exception)
    def unhandled(exc: Exception):
        # The exception type only: messages can quote user content (§8).
        log.error("unhandled %s on %s %s", type(exc).__name__, request.method, request.path,
                  exc_info=app.debug)
        if app.testing and app.config.get("PROPAGATE_TEST_ERRORS", True):
            raise exc
        err = InternalServerError()
        if wants_json():
            return problem(500, err.name, "Something went wrong on our side.")
        return render_template("error.html", code=500, title=err.name,
                               detail="Something went wrong on our side."), 500
