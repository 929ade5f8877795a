"""What every request and response passes through: a Host that is no host name, a body
that cannot be read and input PostgreSQL could not store are refused with a clear 400,
every response carries the security headers (a CSP with a per-request nonce, which
Flask-Admin's pages work under too), and the rate limiter keeps its counts on the app's
Redis."""

from __future__ import annotations

import json
import logging
import re
import secrets
from typing import Any
from urllib.parse import parse_qsl

from flask import Flask, Response, abort, current_app, request
from flask_limiter import Limiter
from flask_limiter.util import get_remote_address
from werkzeug.exceptions import ClientDisconnected
from werkzeug.middleware.proxy_fix import ProxyFix
from werkzeug.sansio.utils import host_is_trusted

log = logging.getLogger(__name__)

UNREADABLE = ("The request held characters that cannot be stored (a NUL byte, or text "
              "that is not UTF-8: stray bytes, or half of a surrogate pair). Remove them "
              "and try again.")
TOO_DEEP = "The JSON body is nested too deeply to read."
NAMELESS_PART = ("A part of this form has no name, so it cannot be read. Send every field "
                 "with its name.")
HOST_NOT_SERVED = "This server does not answer for that host name (see TRUSTED_HOSTS)."
HOST_INVALID = ("The Host header of this request is not a valid host name (parts of at most "
                "63 letters, digits or hyphens, then an optional port).")
BODY_UNREADABLE = ("The request body could not be read: it ended early, or its chunked "
                   "encoding is malformed. Nothing was changed; send it again.")


# -- input ---------------------------------------------------------------------------------

def _strict_pairs(raw: bytes) -> list[tuple[str, str]]:
    """Parse a query string or urlencoded body, refusing what is not UTF-8 (werkzeug
    would quietly replace it with U+FFFD, and a different string would be stored)."""
    return parse_qsl(raw.decode("utf-8"), keep_blank_values=True, encoding="utf-8",
                     errors="strict")


# NUL, and the halves of a surrogate pair: a JSON escape ("\ud800") can spell one alone,
# which is a Python string but no UTF-8 can hold (nor PostgreSQL, nor a page showing it).
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def _unstorable(value: Any) -> bool:
    if isinstance(value, str):
        return _UNSTORABLE.search(value) is not None
    if isinstance(value, dict):
        return any(_unstorable(k) or _unstorable(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_unstorable(v) for v in value)
    return False


def reject_unreadable_input() -> None:
    """400 for a NUL byte, undecodable bytes or a lone surrogate anywhere a view could
    read them, and for a form part without a name."""
    try:
        # PATH_INFO is the raw path as latin-1 (PEP 3333): it must be UTF-8 underneath.
        texts: list[str] = [request.environ.get("PATH_INFO", "").encode("latin-1")
                            .decode("utf-8")]
        for key, value in _strict_pairs(request.query_string):
            texts += [key, value]
        if request.mimetype == "application/x-www-form-urlencoded":
            for key, value in _strict_pairs(request.get_data(cache=True)):
                texts += [key, value]
        elif request.mimetype == "multipart/form-data":
            # werkzeug keeps a part without a name under None (or ""): no field reads it.
            if not all(request.form.keys()) or not all(request.files.keys()):
                abort(400, NAMELESS_PART)
            for key, value in request.form.items(multi=True):
                texts += [key, value]
            texts += [f.filename or "" for f in request.files.values()]
            if any("\ufffd" in t for t in texts):
                abort(400, UNREADABLE)
        elif request.is_json and _unstorable(request.get_json(silent=True)):
            abort(400, UNREADABLE)
    except (UnicodeDecodeError, ValueError):
        abort(400, UNREADABLE)
    except RecursionError:  # JSON nested thousands deep: no view could read it either
        abort(400, TOO_DEEP)
    if any("\x00" in t for t in texts):
        abort(400, UNREADABLE)


class ReadableInput:
    """The server's ``wsgi.input``, whose every failure to read is werkzeug's
    ``ClientDisconnected`` (a 400, errors.py). gunicorn raises parser errors of its own
    for a malformed chunked body (werkzeug's server an OSError), which would be a 500."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def _read(self, method: str, *args: Any) -> Any:
        try:
            return getattr(self._stream, method)(*args)
        except Exception:
            # Not chained: the server's message quotes the bytes that were sent.
            raise ClientDisconnected() from None

    def read(self, *args: Any) -> bytes:
        return self._read("read", *args)

    def readline(self, *args: Any) -> bytes:
        return self._read("readline", *args)

    def readlines(self, *args: Any) -> list[bytes]:
        return self._read("readlines", *args)

    def __iter__(self) -> Any:
        return iter(self.readline, b"")


def readable_input(wsgi_app: Any) -> Any:
    """``wsgi_app`` reading every request's body through ``ReadableInput``."""
    def app(environ: dict[str, Any], start_response: Any) -> Any:
        if "wsgi.input" in environ:
            environ["wsgi.input"] = ReadableInput(environ["wsgi.input"])
        return wsgi_app(environ, start_response)
    return app


# A Host header as RFC 9110 has it and the URL map can bind: dot-separated labels of 1 to 63
# characters (253 in all, an optional final dot; "_" for names like compose's "web_1"), or
# an IPv6 address in brackets; then an optional port.
_HOST = re.compile(r"(?:(?P<name>[A-Za-z0-9_-]{1,63}(?:\.[A-Za-z0-9_-]{1,63})*\.?)"
                   r"|\[[0-9A-Fa-f:.]+\])(?::(?P<port>[0-9]{1,5}))?")


def valid_host(host: str) -> bool:
    match = _HOST.fullmatch(host)
    return match is not None and len(match["name"] or "") <= 253 \
        and (match["port"] is None or 0 < int(match["port"]) <= 65535)


def _host_refused(environ: dict[str, Any], sentence: str = HOST_INVALID) -> Response:
    """The 400 for a bad Host: built here, as no page can be (url_for needs the host)."""
    path = environ.get("PATH_INFO", "")
    if path.startswith("/v1"):
        response = Response(json.dumps({"type": "about:blank", "title": "Bad Request",
                                        "status": 400, "detail": sentence}),
                            400, mimetype="application/problem+json")
    elif path.rstrip("/") in ("/oauth/token", "/oauth/revoke", "/oauth/register"):
        # An OAuth client's endpoint: an RFC 6749 error, as errors.py answers there.
        response = Response(json.dumps({"error": "invalid_request",
                                        "error_description": sentence}),
                            400, mimetype="application/json")
        response.headers["Cache-Control"] = "no-store"
    else:
        response = Response(sentence + "\n", 400, mimetype="text/plain")
    response.headers.update(FIXED_HEADERS)
    response.headers["Content-Security-Policy"] = "default-src 'none'; frame-ancestors 'none'"
    return response


def valid_hosts_only(wsgi_app: Any, trusted: list[str] | None = None) -> Any:
    """Refuse a Host header that is no host name (a label over 63 characters, say) before
    Flask binds the URL map to it: werkzeug's BadHost would leave the request without a
    URL adapter, and its error page would fail in turn. With ``trusted`` (TRUSTED_HOSTS),
    a host that is none of them is refused too. It checks what ProxyFix (as
    TRUSTED_PROXIES sets it) hands on; an absent or empty Host is werkzeug's to handle."""
    def app(environ: dict[str, Any], start_response: Any) -> Any:
        host = environ.get("HTTP_HOST")
        if host and not valid_host(host):
            return _host_refused(environ)(environ, start_response)
        if host and trusted and not host_is_trusted(host, trusted):
            return _host_refused(environ, HOST_NOT_SERVED)(environ, start_response)
        return wsgi_app(environ, start_response)
    return app


# -- response headers -----------------------------------------------------------------------

def csp_nonce() -> str:
    """One nonce per request, kept in the request's environ (``g`` can outlive a request
    when an app context spans several, as in tests and CLI code)."""
    if "orbitpilot.csp_nonce" not in request.environ:
        request.environ["orbitpilot.csp_nonce"] = secrets.token_urlsafe(18)
    return request.environ["orbitpilot.csp_nonce"]


def content_security_policy(nonce: str, form_targets: tuple[str, ...] = ()) -> str:
    """The policy; ``form_targets``: sources a form here may lead to beyond this origin
    (the consent page's answer redirects to the app's own address)."""
    return "; ".join([
        "default-src 'self'",
        f"script-src 'self' 'nonce-{nonce}'",
        f"style-src 'self' 'nonce-{nonce}'",
        "img-src 'self' data:",
        "font-src 'self' data:",
        "connect-src 'self'",
        "object-src 'none'",
        "base-uri 'none'",
        " ".join(("form-action 'self'", *form_targets)),
        "frame-ancestors 'none'",
    ])


FIXED_HEADERS = {
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Permissions-Policy": "camera=(), microphone=(), geolocation=()",
}


def add_security_headers(response: Any) -> Any:
    headers = response.headers
    headers.setdefault("Content-Security-Policy", content_security_policy(csp_nonce()))
    for name, value in FIXED_HEADERS.items():
        headers.setdefault(name, value)
    if request.is_secure:
        headers.setdefault("Strict-Transport-Security", "max-age=31536000")
    return response


# -- sign-in throttling ---------------------------------------------------------------------

def limiter_storage_uri(redis_url: str) -> str:
    """The app's Redis, in the spelling the ``limits`` library expects."""
    if redis_url.startswith("unix://"):
        return "redis+unix://" + redis_url[len("unix://"):]
    return redis_url


def get_limiter(app: Flask | None = None) -> Limiter:
    return (app or current_app).extensions["orbitpilot.limiter"]


def init_security(app: Flask) -> None:
    """Before any limit is set: the limiter lives here (``auth.views.throttle_signin`` sets
    sign-in's)."""
    # Inside ProxyFix: they see the environ it hands on.
    app.wsgi_app = valid_hosts_only(readable_input(app.wsgi_app), app.config["TRUSTED_HOSTS"])
    proxies = app.config["TRUSTED_PROXIES"]
    if proxies:  # the client's own address, not the proxy's, for throttling and logs
        app.wsgi_app = ProxyFix(app.wsgi_app, x_for=proxies, x_proto=proxies)

    # First of all request hooks: CSRF protection parses the form, after which the raw
    # body (needed to tell bytes that are not UTF-8) is gone.
    app.before_request_funcs.setdefault(None, []).insert(0, reject_unreadable_input)
    app.after_request(add_security_headers)
    app.jinja_env.globals["csp_nonce"] = csp_nonce
    app.config.setdefault("RATELIMIT_STORAGE_URI", limiter_storage_uri(app.config["REDIS_URL"]))
    app.config.setdefault("RATELIMIT_STORAGE_OPTIONS", {"socket_connect_timeout": 2,
                                                        "socket_timeout": 2})
    app.config.setdefault("RATELIMIT_HEADERS_ENABLED", True)
    # Redis down: throttle in this process rather than fail every sign-in.
    app.config.setdefault("RATELIMIT_SWALLOW_ERRORS", True)
    app.config.setdefault("RATELIMIT_IN_MEMORY_FALLBACK_ENABLED", True)
    limiter = Limiter(key_func=get_remote_address, app=app)
    app.extensions["orbitpilot.limiter"] = limiter
