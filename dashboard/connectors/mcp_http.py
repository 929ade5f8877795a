"""``/mcp`` on the app's own origin: the MCP server's Streamable HTTP app (stateless, JSON
answers, so any web worker serves any request) inside the app's WSGI stack, behind the
same Host check and input guard as every page. Pages never reach it: requests for
``/mcp`` are handed over before Flask routes anything.

The ASGI side runs on an event loop thread of each worker process, started on the first
``/mcp`` request (never before a fork). A bearer token is checked against the OAuth
server's tokens for this origin's ``/mcp`` (RFC 8707), in a worker thread."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
from collections.abc import Callable, Iterable
from typing import Any

import anyio.to_thread
from a2wsgi import ASGIMiddleware
from flask import Flask
from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings
from werkzeug.wsgi import get_current_url

from dashboard.connectors import services as connections
from dashboard.connectors.mcp import build_server
from dashboard.extensions import db

log = logging.getLogger(__name__)

PATH = "/mcp"
_START_SECONDS = 10


class TokenCheck:
    """The SDK's token verifier, answered by the OAuth server's own tables."""

    def __init__(self, app: Flask, resource: str) -> None:
        self.app, self.resource = app, resource

    async def verify_token(self, token: str) -> AccessToken | None:
        return await anyio.to_thread.run_sync(self._verify, token)

    def _verify(self, token: str) -> AccessToken | None:
        with self.app.app_context():
            try:
                caller = connections.authenticate_access_token(db.session, token,
                                                               resource=self.resource)
                db.session.commit()  # the call counted on the connection
            except Exception as exc:
                db.session.rollback()
                log.error("token check failed: %s", type(exc).__name__)
                return None
            finally:
                db.session.remove()
        if caller is None:
            return None
        return AccessToken(token=token, client_id=str(caller.grant_id),
                           scopes=list(caller.scopes), resource=self.resource,
                           expires_at=int(caller.token_expires_at.timestamp()),
                           subject=str(caller.user_id),
                           claims={"caller": dataclasses.asdict(caller)})


class MCPMount:
    """A WSGI app serving ``/mcp``: one MCP server per origin it is reached at (tokens
    are bound to the origin's ``/mcp``), on one event loop thread per process."""

    def __init__(self, app: Flask) -> None:
        self.app = app
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._apps: dict[str, Any] = {}

    def base_of(self, environ: dict[str, Any]) -> str:
        configured = self.app.config.get("PUBLIC_URL")
        if configured:
            return str(configured).rstrip("/")
        return get_current_url(environ, root_only=True).rstrip("/")

    def _start_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="mcp-loop", daemon=True).start()
            self._loop = loop
        return self._loop

    def _serve(self, base: str) -> Any:
        loop = self._start_loop()
        resource = base + PATH
        server = build_server(self.app, auth=AuthSettings(
            issuer_url=base, resource_server_url=resource, required_scopes=None,
            validate_token_resource=False),  # TokenCheck binds tokens to this resource
            token_verifier=TokenCheck(self.app, resource))
        # host 0.0.0.0: the SDK's own Host allow-list stays off; the app's TRUSTED_HOSTS
        # check runs before this, and a bearer token is needed for everything.
        asgi = server.streamable_http_app(streamable_http_path=PATH, stateless_http=True,
                                          json_response=True, host="0.0.0.0")
        running = threading.Event()

        async def keep_running() -> None:
            async with server.session_manager.run():
                running.set()
                await asyncio.Event().wait()

        asyncio.run_coroutine_threadsafe(keep_running(), loop)
        if not running.wait(_START_SECONDS):
            raise RuntimeError("the MCP session manager did not start")
        return ASGIMiddleware(asgi, loop=loop)

    def __call__(self, environ: dict[str, Any], start_response: Callable) -> Iterable[bytes]:
        if environ.get("REQUEST_METHOD") != "POST":
            # Stateless and JSON-only: no server-sent stream to GET (which would hold a
            # web worker for as long as a client keeps it open), no session to DELETE.
            body = b'{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":' \
                   b'"Send MCP messages with POST; this server keeps no stream open."}}'
            start_response("405 Method Not Allowed", [
                ("Content-Type", "application/json"), ("Allow", "POST"),
                ("Content-Length", str(len(body)))])
            return [body]
        base = self.base_of(environ)
        served = self._apps.get(base)
        if served is None:
            with self._lock:
                served = self._apps.get(base)
                if served is None:
                    served = self._apps[base] = self._serve(base)
        return served(environ, start_response)


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
