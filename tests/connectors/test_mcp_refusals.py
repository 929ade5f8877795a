"""What ``/mcp`` refuses, each exactly: no token, a token for another resource, an
expired or revoked one (401 with the resource metadata); a tool whose scope was not
granted, and another user's memory id — indistinguishable from an unknown one (tool
errors in a sentence). Disconnecting on the connections page stops the very next call;
the connections page lists exactly what the app was handed."""

from __future__ import annotations

import json
import uuid
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta

import anyio
import httpx2
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from sqlalchemy import update

from dashboard import saved_memories as memories
from dashboard.audit.services import Actor
from dashboard.auth.models import User
from dashboard.connectors import services
from dashboard.connectors.models import OAuthToken
from dashboard.extensions import db
from tests.connectors.helpers import CSRF, REDIRECT_URI, Person, live_app
from tests.factories import make_user

pytestmark = pytest.mark.processes  # a served app

INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {},
    "clientInfo": {"name": "probe", "version": "1"}}}


def connect_directly(live, scopes: list[str], *, resource: str | None = None,
                     name: str = "Test app") -> tuple[str, int]:
    """A connection made as the consent page makes one, and an access token for it."""
    with live.app.app_context():
        client, _ = services.register_client(db.session, {
            "client_name": name, "redirect_uris": [REDIRECT_URI],
            "token_endpoint_auth_method": "none"})
        user = db.session.get(User, live.user_id)
        grant = services.consent(db.session, user=user, client=client, scopes=scopes,
                                 resource=resource or f"{live.url}/mcp", allowed=True)
        access = services.new_secret(services.ACCESS_PREFIX)
        services.store_tokens(db.session, grant, access=access, refresh=None, scopes=scopes,
                              lifetimes=services.Lifetimes())
        db.session.commit()
        grant_id = grant.id
        db.session.remove()
    return access, grant_id


@asynccontextmanager
async def bearer(url: str, token: str):
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"},
                                  timeout=60) as http, \
            streamable_http_client(f"{url}/mcp", http_client=http) as (read, write, *_), \
            ClientSession(read, write) as session:
        await session.initialize()
        yield session


def probe(live, token: str | None) -> httpx2.Response:
    headers = {"Accept": "application/json, text/event-stream"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    return httpx2.post(f"{live.url}/mcp", json=INITIALIZE, headers=headers, timeout=30)


def assert_refused(answer: httpx2.Response, live) -> None:
    assert answer.status_code == 401, answer.text
    assert f'resource_metadata="{live.url}/.well-known/oauth-protected-resource/mcp"' in \
        answer.headers["www-authenticate"]


def test_no_token_a_token_for_another_resource_an_expired_or_revoked_one_are_401(app):
    with live_app() as live:
        assert_refused(probe(live, None), live)
        assert_refused(probe(live, "opat_" + "x" * 43), live)
        elsewhere, _ = connect_directly(live, ["memory:read"],
                                        resource="https://elsewhere.example/mcp")
        assert_refused(probe(live, elsewhere), live)
        good, grant_id = connect_directly(live, ["memory:read"], name="Second app")
        assert probe(live, good).status_code == 200  # the same probe, a good token
        with live.app.app_context():
            db.session.execute(update(OAuthToken).where(OAuthToken.grant_id == grant_id)
                               .values(access_expires_at=datetime.now(UTC)
                                       - timedelta(seconds=1)))
            db.session.commit()
            db.session.remove()
        assert_refused(probe(live, good), live)
        revoked, grant_id = connect_directly(live, ["memory:read"], name="Third app")
        with live.app.app_context():
            token = services.find_token(db.session, revoked)
            services.revoke_token(db.session, token)
            db.session.commit()
            db.session.remove()
        assert_refused(probe(live, revoked), live)


def test_a_tool_whose_scope_was_not_granted_is_a_tool_error_naming_it(app):
    with live_app() as live:
        token, _ = connect_directly(live, ["memory:read"])

        async def scenario():
            async with bearer(live.url, token) as session:
                saved = await session.call_tool("save_memory", {"content": "A new fact."})
                forgot = await session.call_tool("forget_memory", {
                    "memory_id": str(uuid.uuid4()), "mode": "redact"})
                return saved, forgot

        saved, forgot = anyio.run(scenario)
        assert saved.is_error
        assert saved.content[0].text == (
            "Error executing tool save_memory: This connection may not do that: it needs the "
            "memory:write scope. Connect again and allow it.")  # the SDK names the tool
        assert forgot.is_error and "memory:redact" in forgot.content[0].text


def test_another_users_memory_id_reads_exactly_as_an_unknown_one(app):
    with live_app() as live:
        with live.app.app_context():
            other = make_user(db.session)
            theirs = memories.save_memory(db.session, owner=other, content="Not yours.",
                                          actor=Actor.of(other)).memory
            db.session.commit()
            their_id, other_id = str(theirs.id), other.id
            db.session.remove()
        token, _ = connect_directly(live, ["memory:read", "memory:write", "memory:delete"])

        async def scenario():
            answers = {}
            async with bearer(live.url, token) as session:
                for memory_id in (their_id, str(uuid.uuid4())):
                    answers[memory_id] = [
                        (await session.call_tool(tool, {"memory_id": memory_id}))
                        for tool in ("get_memory", "forget_memory", "restore_memory")]
            return answers

        try:
            answers = anyio.run(scenario)
        finally:
            with live.app.app_context():
                db.session.execute(db.delete(User).where(User.id == other_id))
                db.session.commit()
                db.session.remove()
        theirs_answers, unknown = answers.values()
        for a, b in zip(theirs_answers, unknown, strict=True):
            assert a.is_error and b.is_error
            assert a.content[0].text == b.content[0].text


def test_disconnecting_on_the_connections_page_stops_the_very_next_call(app):
    with live_app() as live:
        token, grant_id = connect_directly(live, ["memory:read", "memory:write"])
        person = Person(live.url, live.email)

        async def scenario():
            async with bearer(live.url, token) as session:
                saved = await session.call_tool("save_memory", {"content": "Likes tea."})
                listed = await session.call_tool("list_memories", {})
                got = await session.call_tool("get_memory", {
                    "memory_id": saved.structured_content["memory"]["id"]})
                return saved.structured_content, listed.structured_content, got

        saved, listed, _ = anyio.run(scenario)
        memory_id = saved["memory"]["id"]
        page = person.http.get(f"/settings/connections/{grant_id}").text
        # Handed: the list's item and the get, by id — and nothing the save returned.
        assert page.count(f'data-memory="{memory_id}"') == 2
        assert [item["id"] for item in listed["items"]] == [memory_id]
        revoke = person.http.get(f"/settings/connections/{grant_id}/revoke").text
        token_field = CSRF.search(revoke).group(1)
        answer = person.http.post(f"/settings/connections/{grant_id}/revoke",
                                  data={"csrf_token": token_field})
        assert answer.status_code == 302
        assert_refused(probe(live, token), live)
        listing = person.http.get("/settings/connections/").text
        assert f'id="connection-{grant_id}"' in listing and "disconnected" in listing
        person.close()


@pytest.mark.parametrize("method", ["GET", "HEAD", "OPTIONS", "DELETE", "PUT"])
def test_mcp_takes_only_post_and_never_holds_a_stream_open(app, method):
    with live_app() as live:
        token, _ = connect_directly(live, ["memory:read"])
        for headers in ({}, {"Authorization": f"Bearer {token}",
                             "Accept": "text/event-stream, application/json"}):
            answer = httpx2.request(method, f"{live.url}/mcp", headers=headers, timeout=10)
            assert answer.status_code == 405
            assert answer.headers["allow"] == "POST"


def test_a_connection_that_may_only_write_is_shown_no_content(app):
    """Through the SDK's client: an app allowed memory:write alone saves and updates, and
    its answers name the memory without its content or labels (a canary)."""
    canary = uuid.uuid4().hex
    with live_app() as live:
        token, _ = connect_directly(live, ["memory:write"])

        async def scenario():
            async with bearer(live.url, token) as session:
                saved = await session.call_tool("save_memory", {
                    "content": f"Door code {canary}.", "metadata": {"note": canary}})
                memory_id = saved.structured_content["memory"]["id"]
                updated = await session.call_tool("update_memory", {
                    "memory_id": memory_id, "metadata": {"kept": canary}})
                return saved, updated

        saved, updated = anyio.run(scenario)
    for answer, shown in ((saved, saved.structured_content["memory"]),
                          (updated, updated.structured_content)):
        assert not answer.is_error
        assert canary not in json.dumps(answer.structured_content)
        assert all(canary not in getattr(block, "text", "") for block in answer.content)
        assert (shown["content"], shown["metadata"], shown["status"]) == (None, None, "active")
