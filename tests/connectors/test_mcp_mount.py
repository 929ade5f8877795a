"""The ``/mcp`` mount before the SDK: one MCP server per process whatever Host a request
names (an unauthenticated client cannot make it keep anything per host), a token only
for the origin it was issued for (RFC 8707), the 401 naming the metadata of the origin
asked (or PUBLIC_URL's), and the Origin check (DNS rebinding): a foreign one is a 403
before any work, the app's own or a configured one passes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import anyio
import httpx2
import pytest
from sqlalchemy import select

from dashboard.connectors import mcp as mcp_tools
from dashboard.connectors.models import OAuthGrant
from dashboard.extensions import db
from tests.connectors.helpers import live_app
from tests.connectors.test_mcp_refusals import INITIALIZE, bearer, connect_directly

pytestmark = pytest.mark.processes  # a served app

HEADERS = {"Accept": "application/json, text/event-stream"}


def metadata_challenge(origin: str) -> str:
    return f'resource_metadata="{origin}/.well-known/oauth-protected-resource/mcp"'


def post(url: str, *, token: str | None = None, **headers: str) -> httpx2.Response:
    if token:
        headers["Authorization"] = f"Bearer {token}"
    return httpx2.post(f"{url}/mcp", json=INITIALIZE, headers={**HEADERS, **headers},
                       timeout=30)


def localhost(live) -> str:
    """The same server under another origin: localhost instead of 127.0.0.1."""
    return live.url.replace("127.0.0.1", "localhost")


def calls_of(live, grant_id: int) -> int:
    with live.app.app_context():
        calls = db.session.scalar(select(OAuthGrant.calls).where(OAuthGrant.id == grant_id))
        db.session.remove()
    return calls


async def tool_names(url: str, token: str) -> set[str]:
    async with bearer(url, token) as session:
        return {tool.name for tool in (await session.list_tools()).tools}


def sdk_loaded_after(code: str) -> str:
    """In a fresh process, ``code`` run, then which of the MCP SDK's packages it loaded
    (and whatever ``code`` printed last on the line)."""
    code += ("; import sys; print(sorted({m.partition('.')[0] for m in sys.modules} "
             "& {'mcp', 'a2wsgi'}), end=' '); print(*extra)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=Path(__file__).parents[2], timeout=120)
    return out.stdout.strip().splitlines()[-1]


def test_an_app_that_serves_no_mcp_call_never_imports_the_sdk():
    """A command: the app made, a page served, and no MCP SDK loaded (it costs each
    process start half a second); web workers load it before they serve."""
    assert sdk_loaded_after("from dashboard import create_app; app = create_app(); "
                            "app.test_client().get('/auth/signin'); extra = ()") == "[]"


def test_a_thousand_host_headers_leave_one_server_in_the_mount(app, monkeypatch):
    built, build_server = [], mcp_tools.build_server

    def counting_build_server(*args, **kwargs):  # the real one, counted
        built.append(build_server(*args, **kwargs))
        return built[-1]

    monkeypatch.setattr(mcp_tools, "build_server", counting_build_server)
    with live_app() as live:
        mount = live.app.extensions["orbitpilot.mcp"]
        pages = live.app.test_client()
        for i in range(500):  # before any authenticated call: nothing is built at all
            answer = pages.post("/mcp", json=INITIALIZE, headers={"Host": f"h{i}.example"})
            assert answer.status_code == 401
        assert (built, mount.server) == ([], None)

        token, _ = connect_directly(live, ["memory:read"])
        assert "search_memory" in anyio.run(tool_names, live.url, token)
        for i in range(1000):
            host = f"host-{i}.example"
            answer = pages.post("/mcp", json=INITIALIZE, headers={"Host": host})
            assert answer.status_code == 401
            assert metadata_challenge(f"http://{host}") in answer.headers["WWW-Authenticate"]
        other, _ = connect_directly(live, ["memory:read"], resource=f"{localhost(live)}/mcp",
                                    name="Second app")
        assert "search_memory" in anyio.run(tool_names, localhost(live), other)

        assert len(built) == 1 and mount.server is built[0]
        assert not any(isinstance(value, dict | list | set) and len(value) > 1
                       for value in vars(mount).values())  # nothing kept per host


def test_a_token_issued_for_one_origin_is_refused_at_another(app):
    with live_app() as live:
        token, grant_id = connect_directly(live, ["memory:read"])
        refused = post(localhost(live), token=token)
        assert refused.status_code == 401
        assert metadata_challenge(localhost(live)) in refused.headers["WWW-Authenticate"]
        assert calls_of(live, grant_id) == 0  # not counted as a call of the connection
        assert post(live.url, token=token).status_code == 200  # where it was issued for


def test_the_401_names_the_metadata_of_the_origin_asked(app):
    with live_app() as live:
        for origin in (live.url, localhost(live)):
            answer = post(origin)
            assert answer.status_code == 401
            challenge = answer.headers["WWW-Authenticate"]
            assert challenge.startswith('Bearer error="invalid_token"')
            assert metadata_challenge(origin) in challenge
            assert answer.json()["error"] == "invalid_token"


def test_with_public_url_the_401_names_its_metadata_whatever_the_host(app):
    with live_app(PUBLIC_URL="https://memory.example.com/") as live:
        answer = live.app.test_client().post("/mcp", json=INITIALIZE,
                                             headers={"Host": "elsewhere.example"})
        assert answer.status_code == 401
        assert metadata_challenge("https://memory.example.com") in \
            answer.headers["WWW-Authenticate"]


@pytest.mark.parametrize("origin", ["https://evil.example", "null", "http://127.0.0.1",
                                    "http://localhost:1"])
def test_a_foreign_origin_is_403_before_the_token_is_even_checked(app, origin):
    with live_app() as live:
        token, grant_id = connect_directly(live, ["memory:read"])
        answer = post(live.url, token=token, Origin=origin)
        assert answer.status_code == 403
        assert answer.headers["Content-Type"] == "application/json"
        body = answer.json()
        assert (body["jsonrpc"], body["id"], body["error"]["code"]) == ("2.0", None, -32600)
        assert "MCP_ALLOWED_ORIGINS" in body["error"]["message"]
        assert calls_of(live, grant_id) == 0  # refused before any work


def test_the_apps_own_origin_passes(app):
    with live_app() as live:
        token, grant_id = connect_directly(live, ["memory:read"])
        assert post(live.url, token=token, Origin=live.url).status_code == 200
        assert calls_of(live, grant_id) == 1


def test_an_origin_listed_in_mcp_allowed_origins_passes(app):
    with live_app(MCP_ALLOWED_ORIGINS=["https://inspector.example/",
                                       "http://tools.example:8080"]) as live:
        token, _ = connect_directly(live, ["memory:read"])
        for origin in ("https://inspector.example", "https://inspector.example:443",
                       "http://tools.example:8080"):
            assert post(live.url, token=token, Origin=origin).status_code == 200
        assert post(live.url, token=token, Origin="http://tools.example").status_code == 403


def test_with_public_url_only_its_origin_is_the_apps_own(app):
    with live_app(PUBLIC_URL="https://memory.example.com") as live:
        pages = live.app.test_client()
        own = pages.post("/mcp", json=INITIALIZE, headers={
            "Host": "memory.example.com", "Origin": "https://memory.example.com"})
        assert own.status_code == 401  # past the Origin check, to the token's
        rebound = pages.post("/mcp", json=INITIALIZE, headers={
            "Host": "rebound.example", "Origin": "http://rebound.example"})
        assert rebound.status_code == 403


def test_a_malformed_allowed_origin_stops_the_app_at_start(app):
    with pytest.raises(ValueError, match="MCP_ALLOWED_ORIGINS"), \
            live_app(MCP_ALLOWED_ORIGINS=["inspector.example"]):
        pass


def test_a_build_worker_imports_every_module_but_the_mcp_tools():
    """A worker imports the whole app before it forks (fork safety), all but what only
    web workers and ``flask mcp stdio`` run: no MCP SDK in a build worker."""
    assert sdk_loaded_after(
        "import sys; from jobs.worker import import_everything; import_everything(); "
        "extra = ('dashboard.evidence.checks' in sys.modules,)") == "[] True"
