"""A live app for connector tests, a person at its consent page (a real signed-in session
answering with a real POST), and the MCP SDK's own client signing in with OAuth."""

from __future__ import annotations

import html
import os
import re
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from urllib.parse import parse_qs, urljoin, urlsplit

import httpx2
from mcp import ClientSession
from mcp.client.auth import AuthorizationCodeResult, OAuthClientProvider
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import OAuthClientInformationFull, OAuthClientMetadata, OAuthToken
from sqlalchemy import delete

from dashboard import create_app
from dashboard.auth.models import User
from dashboard.connectors.models import OAuthClient
from dashboard.extensions import db
from dashboard.queues import build_queue
from tests.conftest import make_test_config
from tests.connectors.oauth_flow import ticked
from tests.factories import PASSWORD, make_user
from tests.live import serving

CSRF = re.compile(r'name="csrf_token"[^>]*value="([^"]+)"')
FORM_ACTION = re.compile(r'<form id="consent" method="post" action="([^"]+)"')
REDIRECT_URI = "http://127.0.0.1:33418/callback"
SCOPE = "memory:read memory:write memory:delete"


@dataclass
class Live:
    url: str
    app: object
    user_id: int
    email: str


@contextmanager
def live_app(**config) -> Iterator[Live]:
    """A second app on the test database (its own queue), served on a real socket, with a
    committed user; the user and every client registered meanwhile removed afterwards."""
    app = create_app(make_test_config(SERVER_NAME=None, BUILD_QUEUE=f"builds-mcp-{os.getpid()}",
                                      **config))
    with app.app_context():
        user = make_user(db.session)
        email, user_id = user.email, user.id
        db.session.commit()
    try:
        with serving(app) as url:
            yield Live(url, app, user_id, email)
    finally:
        with app.app_context():
            db.session.rollback()
            db.session.execute(delete(User).where(User.id == user_id))
            db.session.execute(delete(OAuthClient))
            db.session.commit()
            db.session.remove()
            queue = build_queue(app).rq()
            queue.empty()
            queue.delete(delete_jobs=True)
            db.engine.dispose()


class Person:
    """Someone signed in to the app in a browser-like session (cookies, CSRF tokens)."""

    def __init__(self, url: str, email: str, password: str = PASSWORD) -> None:
        self.url = url
        self.http = httpx2.Client(base_url=url, follow_redirects=False, timeout=30)
        page = self.http.get("/auth/signin").text
        answer = self.http.post("/auth/signin", data={
            "email": email, "password": password, "csrf_token": CSRF.search(page).group(1)})
        assert answer.status_code == 302, answer.status_code

    def consent(self, authorize_url: str, decision: str = "allow",
                tick: tuple[str, ...] = (), teams: tuple[int, ...] = ()) -> httpx2.Response:
        """Open the consent page the app sent us to, and answer it: the boxes as they
        come, ``tick`` ticked besides, and the team boxes of ``teams`` ticked."""
        page = self.http.get(authorize_url)
        assert page.status_code == 200, (page.status_code, page.text[:500])
        action = html.unescape(FORM_ACTION.search(page.text).group(1))
        self.last_page = page.text
        return self.http.post(urljoin(self.url, action), data={
            "csrf_token": CSRF.search(page.text).group(1), "decision": decision,
            "granted": ticked(page.text, tick), "teams": [str(t) for t in teams]})

    def close(self) -> None:
        self.http.close()


@dataclass
class Storage:
    """The SDK's token storage, in memory."""

    tokens: OAuthToken | None = None
    client: OAuthClientInformationFull | None = None

    async def get_tokens(self) -> OAuthToken | None:
        return self.tokens

    async def set_tokens(self, tokens: OAuthToken) -> None:
        self.tokens = tokens

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        return self.client

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        self.client = client_info


@dataclass
class Flow:
    """What happened on the way in: the authorize URL, the redirect back."""

    person: Person
    decision: str = "allow"
    tick: tuple[str, ...] = ()  # boxes the person ticks beyond what the app asked for
    teams: tuple[int, ...] = ()  # the teams the person lets it act for
    authorize_urls: list[str] = field(default_factory=list)
    callback: dict[str, list[str]] = field(default_factory=dict)

    async def redirect_handler(self, authorization_url: str) -> None:
        self.authorize_urls.append(authorization_url)
        answer = self.person.consent(authorization_url, self.decision, self.tick,
                                     self.teams)
        assert answer.status_code == 302, answer.status_code
        location = answer.headers["location"]
        assert location.startswith(REDIRECT_URI), location
        self.callback = parse_qs(urlsplit(location).query)

    async def callback_handler(self) -> AuthorizationCodeResult:
        if "code" not in self.callback:
            raise RuntimeError("denied: " + ",".join(self.callback.get("error", [])))
        return AuthorizationCodeResult(code=self.callback["code"][0],
                                       state=self.callback.get("state", [None])[0])


def client_metadata(name: str = "Claude (test)", scope: str = SCOPE) -> OAuthClientMetadata:
    return OAuthClientMetadata(client_name=name, redirect_uris=[REDIRECT_URI],
                               grant_types=["authorization_code", "refresh_token"],
                               response_types=["code"], token_endpoint_auth_method="none",
                               scope=scope)


@asynccontextmanager
async def mcp_session(url: str, flow: Flow, storage: Storage, *,
                      metadata: OAuthClientMetadata | None = None,
                      client_metadata_url: str | None = None) -> AsyncIterator[ClientSession]:
    """The SDK's client over Streamable HTTP, signing in with OAuth as it does."""
    provider = OAuthClientProvider(
        server_url=f"{url}/mcp", client_metadata=metadata or client_metadata(),
        storage=storage, redirect_handler=flow.redirect_handler,
        callback_handler=flow.callback_handler, client_metadata_url=client_metadata_url)
    async with httpx2.AsyncClient(auth=provider, timeout=60) as http, \
            streamable_http_client(f"{url}/mcp", http_client=http) as (read, write, *_), \
            ClientSession(read, write) as session:
        await session.initialize()
        yield session
