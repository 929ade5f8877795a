"""MCP through the teams a connection acts for, with the SDK's own client against a really
running server: a person consents with a team ticked (a real OAuth flow), then saves to the
team as a member — attributed to the registered app, its own name marked as its claim —
searches and lists both their memory and the team's (each labelled, filtered by team,
author and app), reads the team's Memory Status, is refused what their role does not
allow and, once removed, reaches nothing of the team on the very next call. A team that
lists its apps is not reached until an admin approves this one. Over stdio a key named
"codex-cli" whose agent claims to be ChatGPT is shown as the key it is."""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import anyio
import pytest
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.types import Implementation
from sqlalchemy import delete, select

from dashboard.access import reach_of
from dashboard.audit.services import Actor
from dashboard.auth.models import User
from dashboard.connectors.models import OAuthClient, OAuthGrant
from dashboard.extensions import db
from dashboard.saved_memories import reach as reached
from dashboard.saved_memories.models import Memory
from dashboard.sources import SAVED
from dashboard.teams import services as teams
from dashboard.teams.models import Team, TeamMember
from tests.connectors.helpers import Flow, Person, Storage, live_app, mcp_session
from tests.factories import make_key, make_team, make_user
from tests.workers import ROOT, run_worker

pytestmark = pytest.mark.processes  # a served app, a real worker

NO_SUCH_TEAM = reached.NO_SUCH_TEAM
CLAIM = Implementation(name="ChatGPT", version="1.0")  # what an agent may say it is


@dataclass
class Crew:
    team_id: int
    slug: str
    lead_id: int
    lead_memory: str  # a team memory the lead saved on OrbitPilot's pages


@contextmanager
def crew(live, *, role: str = "member", **policies) -> Iterator[Crew]:
    """A team "crew" led by someone else, the live person in it as ``role``, with one
    memory the lead saved; all removed afterwards."""
    with live.app.app_context():
        session = db.session
        lead = make_user(session)
        person = session.get(User, live.user_id)
        team = make_team(session, lead, slug="crew", name="Crew", members={person: role},
                         **policies)
        memory = reached.save_for(session, reach_of(session, lead.id), team="crew",
                                  content="Heron budget is approved.",
                                  actor=Actor.of(lead)).memory
        session.commit()
        made = Crew(team.id, team.slug, lead.id, str(memory.id))
        session.remove()
    try:
        yield made
    finally:
        with live.app.app_context():
            db.session.rollback()
            db.session.execute(delete(User).where(User.id.in_([made.team_id,
                                                               made.lead_id])))
            db.session.commit()
            db.session.remove()


def result(call) -> dict:
    assert not call.is_error, call.content
    return call.structured_content


def error(call) -> str:
    """A tool error's sentence (the SDK says which tool first)."""
    assert call.is_error
    return call.content[0].text.removeprefix("Error executing tool ").partition(": ")[2]


def saved_chunks(status: dict) -> int:
    return next(s["chunks"] for s in status["sources"] if s["key"] == SAVED)


def test_a_connection_with_a_team_ticked_saves_there_reads_both_and_names_the_app(app):
    with live_app() as live, crew(live) as team:
        person = Person(live.url, live.email)
        flow = Flow(person, tick=("memory:delete",), teams=(team.team_id,))
        storage = Storage()

        async def scenario() -> dict:
            async with mcp_session(live.url, flow, storage) as session:
                out = {"team": result(await session.call_tool(
                    "save_memory", {"content": "Heron ships in May.", "team": "crew"})),
                    "own": result(await session.call_tool(
                        "save_memory", {"content": "Heron demo on Friday."}))}
                await anyio.to_thread.run_sync(run_worker, live.app)
                call = session.call_tool
                out["found"] = result(await call("search_memory", {"query": "Heron", "k": 10}))
                out["personal"] = result(await call("search_memory", {
                    "query": "Heron", "k": 10, "team": "personal"}))
                out["listed"] = result(await call("list_memories", {"team": "crew"}))
                out["by_lead"] = result(await call("list_memories", {"author": team.lead_id}))
                out["by_app"] = result(await call("list_memories", {
                    "app": storage.client.client_id}))
                out["team_status"] = result(await call("memory_status", {"team": "crew"}))
                out["own_status"] = result(await call("memory_status", {}))
                out["lead_s"] = result(await call("get_memory", {"memory_id": team.lead_memory}))
                out["unknown"] = error(await call("save_memory", {"content": "x",
                                                                  "team": "nowhere"}))
                out["status_unknown"] = error(await call("memory_status", {"team": "nowhere"}))
                out["not_theirs"] = error(await call("forget_memory", {
                    "memory_id": team.lead_memory}))
                out["forgot_own"] = result(await call("forget_memory", {
                    "memory_id": out["team"]["memory"]["id"]}))
                with live.app.app_context():  # removed from the team between two calls
                    db.session.execute(delete(TeamMember).where(
                        TeamMember.team_id == team.team_id,
                        TeamMember.user_id == live.user_id))
                    db.session.commit()
                    db.session.remove()
                out["after"] = result(await call("search_memory", {"query": "Heron", "k": 10}))
                out["gone"] = error(await call("get_memory", {"memory_id": team.lead_memory}))
                return out

        out = anyio.run(scenario)
        person.close()
        # The consent page offered the team, unticked, and said it acts for them alone.
        assert f'name="teams" value="{team.team_id}"' in person.last_page
        assert f'value="{team.team_id}" id="team-1" data-words="Crew (as member)" ' \
               f'data-writes="1">' in person.last_page
        assert "It acts for you alone." in person.last_page
        client_id = storage.client.client_id
        memory = out["team"]["memory"]
        assert memory["owner"] == "crew"
        assert memory["attribution"]["app"] == {"client_id": client_id,
                                                "claimed_name": "Claude (test)"}
        assert memory["attribution"]["via"] == \
            f"app {client_id} (it calls itself \u201cClaude (test)\u201d)"
        assert (memory["attribution"]["author"], memory["attribution"]["key"]) == ("you", None)
        assert out["own"]["memory"]["owner"] == "personal"
        with live.app.app_context():
            grant = db.session.scalars(select(OAuthGrant).where(
                OAuthGrant.user_id == live.user_id)).one()
            assert grant.team_ids == [team.team_id]
            row = db.session.get(Memory, uuid.UUID(memory["id"]))
            client = db.session.scalars(select(OAuthClient).where(
                OAuthClient.client_id == client_id)).one()
            assert (row.owner_id, row.author_id, row.oauth_client_pk, row.client_name,
                    row.api_key_id) == (team.team_id, live.user_id, client.id,
                                        "Claude (test)", None)
            db.session.remove()
        # One search over both, each labelled; the filters narrow it.
        found = {hit["memory_id"]: hit["owner"] for hit in out["found"]["results"]}
        assert found == {memory["id"]: "crew", out["own"]["memory"]["id"]: "personal",
                         team.lead_memory: "crew"}
        assert [hit["memory_id"] for hit in out["personal"]["results"]] == [
            out["own"]["memory"]["id"]]
        assert {item["id"] for item in out["listed"]["items"]} == {memory["id"],
                                                                   team.lead_memory}
        assert [item["id"] for item in out["by_lead"]["items"]] == [team.lead_memory]
        assert out["lead_s"]["attribution"]["via"] == "OrbitPilot"
        assert {item["id"] for item in out["by_app"]["items"]} == {
            memory["id"], out["own"]["memory"]["id"]}
        # The team's Memory Status is the team's: its two saved memories, not the person's one.
        assert (saved_chunks(out["team_status"]), saved_chunks(out["own_status"])) == (2, 1)
        assert out["unknown"] == out["status_unknown"] == NO_SUCH_TEAM
        assert out["not_theirs"] == ("Your role in Crew (member) does not let you delete or "
                                     "restore this memory.")
        assert out["forgot_own"]["receipt"]["mode"] == "soft_delete"
        # Removed: the very next call reaches nothing of the team.
        assert [hit["owner"] for hit in out["after"]["results"]] == ["personal"]
        assert out["gone"] == "There is no memory with this id among yours."


def test_a_reader_connection_reads_the_team_but_saves_nothing_to_it(app):
    with live_app() as live, crew(live, role="reader") as team:
        person = Person(live.url, live.email)
        flow, storage = Flow(person, teams=(team.team_id,)), Storage()

        async def scenario() -> tuple[str, dict]:
            async with mcp_session(live.url, flow, storage) as session:
                refused = error(await session.call_tool("save_memory", {
                    "content": "No.", "team": "crew"}))
                listed = result(await session.call_tool("list_memories", {}))
                return refused, listed

        refused, listed = anyio.run(scenario)
        person.close()
        assert 'data-words="Crew (as reader)" data-writes="0"' in person.last_page
        assert refused == "Your role in Crew (reader) does not let you save to it."
        assert [(item["id"], item["owner"]) for item in listed["items"]] == [
            (team.lead_memory, "crew")]


def test_a_team_that_lists_its_apps_is_reached_only_once_an_admin_approves_this_one(app):
    with live_app() as live, crew(live, app_policy="allow_list") as team:
        person = Person(live.url, live.email)
        flow, storage = Flow(person, teams=(team.team_id,)), Storage()

        def connections_page() -> str:
            return person.http.get("/settings/connections/").text

        def approve() -> None:
            with live.app.app_context():
                session = db.session
                client = session.scalars(select(OAuthClient).where(
                    OAuthClient.client_id == storage.client.client_id)).one()
                row = session.get(Team, team.team_id)
                lead = teams.membership(session, team.team_id, team.lead_id)
                assert teams.approve_app(session, row, lead, client.id,
                                         actor=Actor("user", str(team.lead_id)))
                session.commit()
                session.remove()

        async def scenario() -> dict:
            async with mcp_session(live.url, flow, storage) as session:
                out = {"before": error(await session.call_tool("save_memory", {
                    "content": "Heron ships in May.", "team": "crew"})),
                    "listed_before": result(await session.call_tool("list_memories", {})),
                    "page_before": await anyio.to_thread.run_sync(connections_page)}
                await anyio.to_thread.run_sync(approve)
                out["after"] = result(await session.call_tool("save_memory", {
                    "content": "Heron ships in May.", "team": "crew"}))
                out["page_after"] = await anyio.to_thread.run_sync(connections_page)
                return out

        out = anyio.run(scenario)
        person.close()
        assert f'data-needs-approval="{team.team_id}">It needs an admin of Crew to approve ' \
               'this app' in person.last_page
        # The grant names the team; the team does not let it in until approved.
        assert out["before"] == NO_SUCH_TEAM
        assert out["listed_before"]["items"] == []
        assert "Crew: needs an admin of Crew to approve this app" in out["page_before"]
        assert "It acts for you alone." in out["page_before"]
        assert out["after"]["memory"]["owner"] == "crew"
        assert "It may save to: Crew (as member)." in out["page_after"]
        assert "needs an admin" not in out["page_after"]


def test_stdio_with_a_codex_cli_key_claiming_chatgpt_is_shown_as_the_key(app, tmp_path):
    with live_app() as live, crew(live) as team:
        with live.app.app_context():
            user = db.session.get(User, live.user_id)
            key, raw = make_key(db.session, user, name="codex-cli",
                                scopes=("memory:read", "memory:write"),
                                team_ids=[team.team_id])
            db.session.commit()
            key_id, prefix = key.id, key.prefix
            db.session.remove()
        config = live.app.config
        parameters = StdioServerParameters(
            command=sys.executable, args=["-m", "flask", "mcp", "stdio", "--source", "chatgpt"],
            cwd=str(ROOT), env={
                **os.environ, "FLASK_APP": "wsgi.py", "ORBITPILOT_API_KEY": raw,
                "DATABASE_URL": config["SQLALCHEMY_DATABASE_URI"],
                "REDIS_URL": config["REDIS_URL"], "BUILD_QUEUE": config["BUILD_QUEUE"],
                "EMBEDDER": config["EMBEDDER"]})

        async def scenario() -> tuple[dict, dict]:
            with (tmp_path / "stderr.txt").open("w") as errlog:
                async with stdio_client(parameters, errlog=errlog) as (read, write), \
                        ClientSession(read, write, client_info=CLAIM) as session:
                    await session.initialize()
                    saved = result(await session.call_tool("save_memory", {
                        "content": "Heron uses Postgres.", "team": "crew"}))
                    listed = result(await session.call_tool("list_memories", {
                        "team": "crew", "app": f"key:{key_id}"}))
                    return saved, listed

        saved, listed = anyio.run(scenario)
        memory = saved["memory"]
        assert (memory["owner"], memory["source"]) == ("crew", "chatgpt")  # a claim, kept
        said = memory["attribution"]
        assert said["via"] == f"API key \u201ccodex-cli\u201d ({prefix}\u2026)"
        assert said["key"] == {"id": key_id, "name": "codex-cli", "prefix": prefix}
        assert said["app"] is None and "hatGPT" not in str(said)
        assert [item["id"] for item in listed["items"]] == [memory["id"]]
