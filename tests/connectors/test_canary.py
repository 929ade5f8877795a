"""A canary typed through MCP — a memory's text and labels, an update, a forget's reason,
a search query — reaches no audit event, no access-log row, no Redis key or value, no
log line and no staff page; the access log holds ids, never the query."""

from __future__ import annotations

import contextlib
import logging
import uuid
import zlib

import anyio
import pytest
from sqlalchemy import select

from dashboard.audit.models import AuditEvent
from dashboard.connectors.models import ConnectorAccess, OAuthClient, OAuthGrant
from dashboard.extensions import db
from dashboard.queues import redis_client
from tests.admin.test_canary import crawl
from tests.conftest import csrf_from
from tests.connectors.helpers import live_app
from tests.connectors.test_mcp_refusals import bearer, connect_directly
from tests.factories import PASSWORD, make_user

pytestmark = pytest.mark.processes  # a served app

CLIENT_LOGGERS = ("mcp.client", "httpx2", "httpcore2")


def redis_texts(client) -> list[bytes]:
    """Every key of the app's Redis and every value in it (compressed ones opened)."""
    found: list[bytes] = []
    for key in client.scan_iter(count=500):
        found.append(key)
        kind = client.type(key)
        if kind == b"string":
            values = [client.get(key)]
        elif kind == b"hash":
            values = [v for pair in client.hgetall(key).items() for v in pair]
        elif kind == b"list":
            values = client.lrange(key, 0, -1)
        elif kind in (b"set", b"zset"):
            values = list(client.smembers(key)) if kind == b"set" else \
                client.zrange(key, 0, -1)
        else:
            values = []
        for value in values:
            if value is None:
                continue
            found.append(value)
            with contextlib.suppress(zlib.error):
                found.append(zlib.decompress(value))
    return found


def test_a_canary_through_mcp_reaches_no_audit_event_log_redis_key_or_staff_page(
        app, caplog):
    canary = f"canary-{uuid.uuid4().hex}"
    with live_app() as live:
        token, grant_id = connect_directly(
            live, ["memory:read", "memory:write", "memory:delete", "memory:redact"])

        async def scenario():
            async with bearer(live.url, token) as session:
                saved = await session.call_tool("save_memory", {
                    "content": f"{canary} prefers window seats",
                    "metadata": {"note": f"{canary} label"}})
                memory_id = saved.structured_content["memory"]["id"]
                await session.call_tool("update_memory", {
                    "memory_id": memory_id, "content": f"{canary} prefers aisle seats"})
                await session.call_tool("search_memory", {"query": f"{canary} seats"})
                await session.call_tool("list_memories", {})
                await session.call_tool("forget_memory", {
                    "memory_id": memory_id, "mode": "redact", "reason": f"{canary} reason"})
                await session.call_tool("get_memory", {"memory_id": f"{canary}"})
                refused = await session.call_tool("search_memory", {"query": "x", "k": canary})
                assert refused.is_error  # not a number: refused, the value not logged
                return memory_id

        with caplog.at_level(logging.DEBUG):
            memory_id = anyio.run(scenario)
        # The server's log lines (not those of the test's own MCP client, which runs here).
        server_lines = [record.getMessage() for record in caplog.records
                        if not record.name.startswith(CLIENT_LOGGERS)]
        assert len(server_lines) > 10 and not any(canary in line for line in server_lines)
        with live.app.app_context():
            events = db.session.scalars(select(AuditEvent).where(
                AuditEvent.owner_id == live.user_id)).all()
            assert {"memory.create", "memory.update", "memory.redact"} <= \
                {event.action for event in events}
            for event in events:
                values = [getattr(event, c.key) for c in AuditEvent.__table__.columns]
                assert canary not in repr(values), event.action
            handed = db.session.scalars(select(ConnectorAccess).where(
                ConnectorAccess.grant_id == grant_id)).all()
            assert handed and all(canary not in repr(vars(row)) for row in handed)
            assert {str(row.memory_id) for row in handed} == {memory_id}
            assert not any(canary.encode() in text for text in redis_texts(
                redis_client(live.app)))
            admin = make_user(db.session, role="admin")
            db.session.commit()
            admin_email, owner_id = admin.email, live.user_id
            db.session.remove()
        staff = live.app.test_client()
        assert staff.post("/auth/signin", data={
            "email": admin_email, "password": PASSWORD,
            "csrf_token": csrf_from(staff, "/auth/signin")}).status_code == 302
        pages = crawl(staff, ["/admin/", "/admin/connections/",
                              f"/admin/connections/details/?id={grant_id}",
                              f"/admin/audit/?flt0_owner_id_equals={owner_id}",
                              "/admin/audit/export/csv/", f"/support/users/{owner_id}"])
        assert [path for path, body in pages.items() if canary in body] == []
        assert "Test app" in pages["/admin/connections/"]  # the page shows the connection
        with live.app.app_context():
            db.session.execute(db.delete(OAuthGrant).where(OAuthGrant.id == grant_id))
            db.session.execute(db.delete(OAuthClient))
            from dashboard.auth.models import User

            db.session.execute(db.delete(User).where(User.email == admin_email))
            db.session.commit()
            db.session.remove()
