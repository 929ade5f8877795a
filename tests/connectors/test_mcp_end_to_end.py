"""The acceptance run: the MCP SDK's own client over Streamable HTTP against a really
running server meets the 401, discovers the metadata, registers (by dynamic
registration; by a client ID metadata document), signs in with PKCE — the consent
approved by a signed-in person's POST — lists the tools with their annotations, saves a
memory, a real worker builds it, search finds it, forget removes it at once."""

from __future__ import annotations

import json
import os
import sys
from urllib.parse import parse_qs, urlsplit

import anyio
import httpx2
import pytest
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from sqlalchemy import select

from dashboard.auth.models import User
from dashboard.connectors.models import ConnectorAccess, OAuthClient, OAuthGrant
from dashboard.extensions import db
from tests.connectors.helpers import (
    Flow,
    Person,
    Storage,
    client_metadata,
    live_app,
    mcp_session,
)
from tests.connectors.metadata_server import serving_client_document
from tests.factories import make_key
from tests.workers import ROOT, run_worker

pytestmark = pytest.mark.processes  # a served app, a real worker

FACT = "Prefers aisle seats on long flights."
ANNOTATIONS = {  # tool: (readOnlyHint, destructiveHint, idempotentHint)
    "save_memory": (False, False, False), "search_memory": (True, False, True),
    "list_memories": (True, False, True), "get_memory": (True, False, True),
    "update_memory": (False, False, True), "forget_memory": (False, True, False),
    "restore_memory": (False, False, False), "memory_status": (True, False, True),
}


def result(call) -> dict:
    assert not call.is_error, call.content
    return call.structured_content


async def save_build_search_forget(live, flow, storage, **connect) -> dict:
    async with mcp_session(live.url, flow, storage, **connect) as session:
        tools = {tool.name: tool for tool in (await session.list_tools()).tools}
        saved = result(await session.call_tool("save_memory", {"content": FACT}))
        await anyio.to_thread.run_sync(run_worker, live.app)  # a real worker builds it
        found = result(await session.call_tool("search_memory",
                                               {"query": "aisle seats", "k": 3}))
        receipt = result(await session.call_tool(
            "forget_memory", {"memory_id": saved["memory"]["id"], "mode": "soft_delete"}))
        after = result(await session.call_tool("search_memory",
                                               {"query": "aisle seats", "k": 3}))
        status = result(await session.call_tool("memory_status", {}))
    return {"tools": tools, "saved": saved, "found": found, "receipt": receipt,
            "after": after, "status": status}


def check_run(run: dict, live, attribution: str, client_name: str) -> None:
    assert set(run["tools"]) == set(ANNOTATIONS)
    for name, (read_only, destructive, idempotent) in ANNOTATIONS.items():
        hints = run["tools"][name].annotations
        assert (hints.read_only_hint, hints.destructive_hint, hints.idempotent_hint) == \
            (read_only, destructive, idempotent), name
        assert run["tools"][name].description, name
    memory = run["saved"]["memory"]
    assert (memory["content"], memory["source"], memory["client_name"]) == \
        (FACT, attribution, client_name)
    hits = [hit for hit in run["found"]["results"] if hit["memory_id"] == memory["id"]]
    assert hits and hits[0]["content"] == FACT and hits[0]["source"] == attribution
    assert run["receipt"]["receipt"]["mode"] == "soft_delete"
    # Forgotten: not found again, and no build ran in between.
    assert memory["id"] not in [hit["memory_id"] for hit in run["after"]["results"]]
    assert any(s["sentence"].startswith("Remembered") for s in run["status"]["sources"])
    with live.app.app_context():
        (grant,) = db.session.scalars(select(OAuthGrant).where(
            OAuthGrant.user_id == live.user_id)).all()
        handed = db.session.scalars(select(ConnectorAccess).where(
            ConnectorAccess.grant_id == grant.id).order_by(ConnectorAccess.id)).all()
        # Exactly what the searches returned, by id: the first search's hits.
        assert [(a.tool, a.source_key, a.source_id) for a in handed] == \
            [("search_memory", hit["source_key"], hit["source_id"])
             for hit in run["found"]["results"] + run["after"]["results"]]
        assert grant.calls >= 7 and grant.last_used_at is not None
        db.session.remove()


def test_the_first_call_meets_a_401_naming_the_resource_metadata(app):
    with live_app() as live:
        answer = httpx2.post(f"{live.url}/mcp", json={"jsonrpc": "2.0", "id": 1,
                                                     "method": "tools/list"})
        assert answer.status_code == 401
        challenge = answer.headers["www-authenticate"]
        assert challenge.startswith("Bearer ")
        assert f'resource_metadata="{live.url}/.well-known/oauth-protected-resource/mcp"' \
            in challenge
        metadata = httpx2.get(f"{live.url}/.well-known/oauth-protected-resource/mcp").json()
        assert metadata["resource"] == f"{live.url}/mcp"
        assert metadata["authorization_servers"] == [live.url]
        server = httpx2.get(f"{live.url}/.well-known/oauth-authorization-server").json()
        assert server["issuer"] == live.url
        assert server["code_challenge_methods_supported"] == ["S256"]
        assert server["client_id_metadata_document_supported"] is True
        assert server["registration_endpoint"] == f"{live.url}/oauth/register"


# The SDK asks for what the protected-resource metadata advertises (reading and saving);
# forgetting needs memory:delete, which the person ticks on the consent page.
TICK = ("memory:delete",)


def test_dynamic_registration_then_save_build_search_forget(app):
    with live_app() as live:
        person = Person(live.url, live.email)
        flow, storage = Flow(person, tick=TICK), Storage()
        run = anyio.run(save_build_search_forget, live, flow, storage)
        person.close()
        assert len(flow.authorize_urls) == 1  # one consent, then the token carried it
        asked = parse_qs(urlsplit(flow.authorize_urls[0]).query)["scope"]
        assert asked == ["memory:read memory:write"]  # what the metadata advertises
        assert storage.tokens.scope == "memory:read memory:write memory:delete"  # ticked
        assert storage.client.client_id.startswith("opc_")  # registered by DCR
        check_run(run, live, "claude", "Claude (test)")


def test_a_client_id_metadata_document_then_save_build_search_forget(app, tmp_path):
    with serving_client_document(tmp_path, client_name="ChatGPT (test)") as document, \
            live_app(OAUTH_CLIENT_METADATA_CA=str(document.ca_file),
                     OAUTH_CLIENT_METADATA_ALLOW_PRIVATE=True) as live:
        person = Person(live.url, live.email)
        flow, storage = Flow(person, tick=TICK), Storage()
        run = anyio.run(lambda: save_build_search_forget(
            live, flow, storage, metadata=client_metadata("ChatGPT (test)"),
            client_metadata_url=document.url))
        person.close()
        assert document.fetches >= 1  # the server read the document
        assert "Unverified app" not in person.last_page
        assert storage.client is None or storage.client.client_id == document.url
        with live.app.app_context():
            client = db.session.scalars(select(OAuthClient).where(
                OAuthClient.client_id == document.url)).one()
            assert (client.kind, client.name) == ("document", "ChatGPT (test)")
            db.session.remove()
        check_run(run, live, "chatgpt", "ChatGPT (test)")
        assert json.loads(json.dumps(run["status"]))["plan"]


def test_stdio_with_an_api_key_saves_builds_finds_and_forgets(app, tmp_path):
    """The same tools through ``flask mcp stdio``, as a local agent starts it."""
    with live_app() as live:
        with live.app.app_context():
            user = db.session.get(User, live.user_id)
            _, raw = make_key(db.session, user, scopes=("memory:read", "memory:write",
                                                        "memory:delete"))
            db.session.commit()
            db.session.remove()
        config = live.app.config
        parameters = StdioServerParameters(
            command=sys.executable, args=["-m", "flask", "mcp", "stdio", "--source", "codex"],
            cwd=str(ROOT), env={
                **os.environ, "FLASK_APP": "wsgi.py", "ORBITPILOT_API_KEY": raw,
                "DATABASE_URL": config["SQLALCHEMY_DATABASE_URI"],
                "REDIS_URL": config["REDIS_URL"], "BUILD_QUEUE": config["BUILD_QUEUE"],
                "EMBEDDER": config["EMBEDDER"]})
        errors = tmp_path / "stderr.txt"

        async def scenario() -> dict:
            with errors.open("w") as errlog:
                async with stdio_client(parameters, errlog=errlog) as (read, write), \
                        ClientSession(read, write) as session:
                    await session.initialize()
                    names = {tool.name for tool in (await session.list_tools()).tools}
                    saved = result(await session.call_tool("save_memory", {"content": FACT}))
                    await anyio.to_thread.run_sync(run_worker, live.app)
                    found = result(await session.call_tool("search_memory",
                                                           {"query": "aisle seats"}))
                    memory_id = saved["memory"]["id"]
                    await session.call_tool("forget_memory", {"memory_id": memory_id})
                    after = result(await session.call_tool("search_memory",
                                                           {"query": "aisle seats"}))
                    return {"names": names, "saved": saved, "found": found, "after": after}

        run = anyio.run(scenario)
        assert run["names"] == set(ANNOTATIONS)
        memory = run["saved"]["memory"]
        assert (memory["source"], memory["client_name"]) == ("codex", None)
        assert memory["id"] in [hit["memory_id"] for hit in run["found"]["results"]]
        assert memory["id"] not in [hit["memory_id"] for hit in run["after"]["results"]]
        assert raw not in errors.read_text()  # the key is never printed
