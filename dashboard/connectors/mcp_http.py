"""``/mcp`` on the app's own origin: the MCP server's Streamable HTTP app (stateless, JSON
answers, so any web worker serves any request) inside the app's WSGI stack, behind the
same Host check and input guard as every page. Pages never reach it: requests for
``/mcp`` are handed over before Flask routes anything.

Before the SDK sees a request, this module refuses, in order: another method than POST
(405), an ``Origin`` that is neither the app's own nor allowed (403: DNS rebinding), and
no live bearer token for this origin's ``/mcp`` (401, RFC 8707). One MCP server per
process, built on the first authenticated call (never before a fork), on one event loop
thread; the token's caller reaches the tools through the SDK's auth context."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import threading
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from flask import Flask
from werkzeug.wsgi import get_current_url, get_host

from dashboard.connectors import services as connections
from dashboard.extensions import db

if TYPE_CHECKING:
    from mcp.server.auth.provider import AccessToken
    from mcp.server.mcpserver import MCPServer

# The MCP SDK (half a second to import) loads at the first /mcp call a process serves,
# with its server: a build worker or a command that never serves MCP never pays for it.

log = logging.getLogger(__name__)

PATH = "/mcp"
METADATA_PATH = "/.well-known/oauth-protected-resource/mcp"
_START_SECONDS = 10
_DEFAULT_PORTS = {"http": 80, "https": 443}
# Where the mount leaves the token it verified for the ASGI side (a2wsgi hands the WSGI
# environ on as scope["wsgi_environ"]); a client can set headers, never environ keys.
_TOKEN = "orbitpilot.mcp.access_token"

NOT_POST = "Send MCP messages with POST; this server keeps no stream open."
FOREIGN_ORIGIN = ("This server does not answer pages of another origin (see "
                  "MCP_ALLOWED_ORIGINS).")
NO_TOKEN_CHECK = "OrbitPilot cannot check access tokens right now; try again shortly."


def origin_of(value: str, *, exact: bool = True) -> str | None:
    """``scheme://host[:port]``, lower-cased, without a default port; ``None`` for what is
    no http(s) origin. ``exact``: nothing else may follow (as in an Origin header)."""
    try:
        parts = urlsplit(value.strip())
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in _DEFAULT_PORTS or not parts.hostname or "@" in parts.netloc:
        return None
    if exact and (parts.path or parts.query or parts.fragment):
        return None
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{parts.scheme}://{host}" + (
        "" if port in (None, _DEFAULT_PORTS[parts.scheme]) else f":{port}")


def _answer(start_response: Callable, status: str, body: dict[str, Any],
            headers: Iterable[tuple[str, str]] = ()) -> list[bytes]:
    data = json.dumps(body).encode()
    start_response(status, [("Content-Type", "application/json"),
                            ("Content-Length", str(len(data))), ("Cache-Control", "no-store"),
                            *headers])
    return [data]


def _rpc_error(message: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": message}}


class _AuthContext:
    """ASGI: the token the mount verified, set as the SDK's auth context the way its
    ``AuthContextMiddleware`` does (the tools read it with ``get_access_token()``)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        from mcp.server.auth.middleware.auth_context import auth_context_var
        from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
        from mcp.server.auth.provider import AccessToken
        from starlette.authentication import AuthCredentials

        token = scope.get("wsgi_environ", {}).get(_TOKEN) if scope["type"] == "http" else None
        if not isinstance(token, AccessToken):
            raise RuntimeError("an /mcp request reached the SDK unauthenticated")
        user = AuthenticatedUser(token)
        scope["user"], scope["auth"] = user, AuthCredentials(token.scopes)
        reset = auth_context_var.set(user)
        try:
            await self.app(scope, receive, send)
        finally:
            auth_context_var.reset(reset)


class MCPMount:
    """A WSGI app serving ``/mcp``: the checks above, then the process's one MCP server
    (``server``) on its event loop thread. Whatever Host a request names, nothing is
    kept for it: its resource, Origin and challenge are worked out per request."""

    def __init__(self, app: Flask) -> None:
        self.app = app
        self._lock = threading.Lock()
        self._served: Any = None  # the server's ASGI app, as WSGI
        self.server: MCPServer | None = None
        self.allowed_origins = frozenset(self._configured_origins())

    def _configured_origins(self) -> Iterable[str]:
        for value in self.app.config.get("MCP_ALLOWED_ORIGINS") or ():
            origin = origin_of(value, exact=False)
            if origin is None:
                raise ValueError(f"MCP_ALLOWED_ORIGINS: {value!r} is not an origin "
                                 "(scheme://host[:port]).")
            yield origin

    def base_of(self, environ: dict[str, Any]) -> str:
        """The origin clients reach us at: PUBLIC_URL, else the request's own."""
        configured = self.app.config.get("PUBLIC_URL")
        if configured:
            return str(configured).rstrip("/")
        return get_current_url(environ, root_only=True).rstrip("/")

    def origin_allowed(self, environ: dict[str, Any]) -> bool:
        """No Origin (not a browser), the app's own, or one configured."""
        header = environ.get("HTTP_ORIGIN")
        if header is None:
            return True
        origin = origin_of(header)
        if origin is None:  # "null", or not an origin at all
            return False
        configured = self.app.config.get("PUBLIC_URL")
        own = origin_of(str(configured), exact=False) if configured else \
            origin_of(f"{environ.get('wsgi.url_scheme', 'http')}://{get_host(environ)}")
        return origin == own or origin in self.allowed_origins

    def authenticate(self, environ: dict[str, Any], resource: str) -> AccessToken | None:
        """The bearer token's caller, if it is live and was issued for ``resource``
        (RFC 8707); the call is counted on its connection. Raises if the check cannot
        be made (the database is down)."""
        scheme, _, raw = environ.get("HTTP_AUTHORIZATION", "").partition(" ")
        raw = raw.strip()
        if scheme.lower() != "bearer" or not raw:
            return None
        with self.app.app_context():
            try:
                caller = connections.authenticate_access_token(db.session, raw,
                                                               resource=resource)
                db.session.commit()  # the call counted on the connection
            except Exception:
                db.session.rollback()
                raise
            finally:
                db.session.remove()
        if caller is None:
            return None
        from mcp.server.auth.provider import AccessToken

        return AccessToken(token=raw, client_id=str(caller.grant_id),
                           scopes=list(caller.scopes), resource=resource,
                           expires_at=int(caller.token_expires_at.timestamp()),
                           subject=str(caller.user_id),
                           claims={"caller": dataclasses.asdict(caller)})

    def _serve(self) -> Any:
        """The one MCP server of this process, started on first use."""
        if self._served is not None:
            return self._served
        with self._lock:
            if self._served is None:
                from a2wsgi import ASGIMiddleware

                from dashboard.connectors.mcp import build_server

                server = build_server(self.app)
                # host 0.0.0.0: the SDK's own Host and Origin lists stay off; the app's
                # TRUSTED_HOSTS and this mount's Origin check run before it.
                asgi = server.streamable_http_app(streamable_http_path=PATH,
                                                  stateless_http=True, json_response=True,
                                                  host="0.0.0.0")
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="mcp-loop",
                                 daemon=True).start()
                running = threading.Event()

                async def keep_running() -> None:
                    async with server.session_manager.run():
                        running.set()
                        await asyncio.Event().wait()

                asyncio.run_coroutine_threadsafe(keep_running(), loop)
                if not running.wait(_START_SECONDS):
                    raise RuntimeError("the MCP session manager did not start")
                self.server = server
                self._served = ASGIMiddleware(_AuthContext(asgi), loop=loop)
        return self._served

    def __call__(self, environ: dict[str, Any], start_response: Callable) -> Iterable[bytes]:
        if environ.get("REQUEST_METHOD") != "POST":
            # Stateless and JSON-only: no server-sent stream to GET (which would hold a
            # web worker for as long as a client keeps it open), no session to DELETE.
            return _answer(start_response, "405 Method Not Allowed", _rpc_error(NOT_POST),
                           [("Allow", "POST")])
        if not self.origin_allowed(environ):
            return _answer(start_response, "403 Forbidden", _rpc_error(FOREIGN_ORIGIN))
        base = self.base_of(environ)
        try:
            token = self.authenticate(environ, base + PATH)
        except Exception as exc:
            log.error("token check failed: %s", type(exc).__name__)
            return _answer(start_response, "503 Service Unavailable",
                           _rpc_error(NO_TOKEN_CHECK), [("Retry-After", "5")])
        if token is None:
            challenge = ('Bearer error="invalid_token", error_description="Authentication '
                         f'required", resource_metadata="{base}{METADATA_PATH}"')
            return _answer(start_response, "401 Unauthorized",
                           {"error": "invalid_token",
                            "error_description": "Authentication required"},
                           [("WWW-Authenticate", challenge)])
        environ[_TOKEN] = token
        return self._serve()(environ, start_response)


def init_mcp(app: Flask) -> None:
    """Hand ``/mcp`` to the MCP server, inside the app's WSGI stack (call before
    ``init_security`` wraps it, so the Host check and input guard cover ``/mcp`` too)."""
    mount = MCPMount(app)
    pages = app.wsgi_app

    def dispatch(environ: dict[str, Any], start_response: Callable) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path == PATH or path.startswith(PATH + "/"):
            return mount(environ, start_response)
        return pages(environ, start_response)

    app.wsgi_app = dispatch  # type: ignore[method-assign]
    app.extensions["orbitpilot.mcp"] = mount
