"""Every MCP tool needs exactly the scope the product spec gives its REST twin, called
with the SDK's own client over Streamable HTTP against a really running server: a
connection holding every scope but that one is refused with a tool error naming it, and
a connection holding only that one is served. The table below is written from the spec,
not read from the code: lowering an entry of the services' table fails here."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import anyio
import pytest
from sqlalchemy import delete

from dashboard import saved_memories as memories
from dashboard.audit.services import Actor
from dashboard.auth.models import User
from dashboard.connectors import services
from dashboard.extensions import db
from tests.connectors.helpers import REDIRECT_URI, live_app
from tests.connectors.test_mcp_refusals import bearer
from tests.factories import ALL_SCOPES, make_user

pytestmark = pytest.mark.processes  # a served app

HARD_DELETE = "memory:hard_delete"


@dataclass(frozen=True)
class ToolCase:
    tool: str
    scope: str  # what the spec says it needs
    target: str | None  # the memory it acts on: "active", "deleted" or none
    arguments: Callable[[str | None], dict[str, Any]]

    def __str__(self) -> str:
        mode = self.arguments("x").get("mode")
        return f"{self.tool}{f' {mode}' if mode else ''}"


CASES = [
    ToolCase("save_memory", "memory:write", None, lambda _: {"content": "Likes tea."}),
    ToolCase("search_memory", "memory:read", None, lambda _: {"query": "tea"}),
    ToolCase("list_memories", "memory:read", None, lambda _: {}),
    ToolCase("get_memory", "memory:read", "active", lambda id_: {"memory_id": id_}),
    ToolCase("update_memory", "memory:write", "active",
             lambda id_: {"memory_id": id_, "content": "Likes green tea."}),
    ToolCase("forget_memory", "memory:delete", "active", lambda id_: {"memory_id": id_}),
    ToolCase("forget_memory", "memory:delete", "active",
             lambda id_: {"memory_id": id_, "mode": "soft_delete"}),
    ToolCase("forget_memory", "memory:redact", "active",
             lambda id_: {"memory_id": id_, "mode": "redact"}),
    ToolCase("forget_memory", HARD_DELETE, "active",
             lambda id_: {"memory_id": id_, "mode": "hard_delete"}),
    ToolCase("restore_memory", "memory:delete", "deleted", lambda id_: {"memory_id": id_}),
    ToolCase("memory_status", "memory:read", None, lambda _: {}),
]


@pytest.fixture(scope="module")
def live(app):
    with live_app() as served:
        with served.app.app_context():
            admin = make_user(db.session, role="admin")
            db.session.commit()
            served.admin_id = admin.id
            db.session.remove()
        try:
            yield served
        finally:
            with served.app.app_context():
                db.session.execute(delete(User).where(User.id == served.admin_id))
                db.session.commit()
                db.session.remove()


def connection(live, scopes: list[str]) -> str:
    """An access token that may do exactly ``scopes``: what it asked for, within its
    connection (memory:hard_delete given by an admin, as only an admin may; a person
    ticks at least one scope of their own, so a token for hard_delete alone asks for
    just that of a connection that also reads)."""
    with live.app.app_context():
        session = db.session
        client, _ = services.register_client(session, {
            "client_name": "Scoped app", "redirect_uris": [REDIRECT_URI],
            "token_endpoint_auth_method": "none"})
        ticked = [s for s in scopes if s != HARD_DELETE] or ["memory:read"]
        grant = services.consent(session, user=session.get(User, live.user_id), client=client,
                                 scopes=ticked, resource=f"{live.url}/mcp", allowed=True)
        if HARD_DELETE in scopes:
            assert services.grant_hard_delete(
                session, grant, actor=Actor.of(session.get(User, live.admin_id)))
        access = services.new_secret(services.ACCESS_PREFIX)
        services.store_tokens(session, grant, access=access, refresh=None, scopes=scopes,
                              lifetimes=services.Lifetimes())
        assert services.allowed_scopes(scopes, grant) == scopes
        session.commit()
        session.remove()
    return access


def target(live, state: str | None) -> str | None:
    if state is None:
        return None
    with live.app.app_context():
        user = db.session.get(User, live.user_id)
        memory = memories.save_memory(db.session, owner=user, content="Likes black tea.",
                                      actor=Actor.of(user)).memory
        if state == "deleted":
            memories.forget_memory(db.session, user.id, memory.id, mode="soft_delete",
                                   actor=Actor.of(user))
        db.session.commit()
        memory_id = str(memory.id)
        db.session.remove()
    return memory_id


async def call(url: str, token: str, tool: str, arguments: dict[str, Any]):
    async with bearer(url, token) as session:
        return await session.call_tool(tool, arguments)


def test_every_tool_has_a_case(live):
    async def listed() -> set[str]:
        async with bearer(live.url, connection(live, ["memory:read"])) as session:
            return {tool.name for tool in (await session.list_tools()).tools}

    assert anyio.run(listed) == {case.tool for case in CASES}


@pytest.mark.parametrize("case", CASES, ids=str)
def test_each_tool_needs_exactly_its_scope(live, case):
    memory_id = target(live, case.target)
    arguments = case.arguments(memory_id)
    without = connection(live, [s for s in ALL_SCOPES if s != case.scope])
    refused = anyio.run(call, live.url, without, case.tool, arguments)
    assert refused.is_error
    assert f"it needs the {case.scope} scope" in refused.content[0].text

    only = connection(live, [case.scope])
    served = anyio.run(call, live.url, only, case.tool, arguments)
    assert not served.is_error, served.content[0].text
