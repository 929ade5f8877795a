"""No staff page, audit event, log record or job argument ever holds a team's content.

A team's memories (content, metadata, an earlier version), the key name they were saved
with, the reasons given for forgetting them and a member's question about them carry one
unique canary; the team's name and slug do not (staff pages name teams). A member chats
about them (the reply quotes them), the lead exports the team and downloads it, a member
erases what they saved to teams, a memory is hard-deleted. Then every staff page is
crawled as support and as admin, from the team's trace, the users list, the audit log,
the markers and builds of the team: none holds the canary, nor does any audit event, log
record or queued job."""

from __future__ import annotations

import json
import logging
import uuid

import pytest
from sqlalchemy import select

from dashboard import saved_memories as memories
from dashboard.access import reach_of
from dashboard.audit.models import AuditEvent
from dashboard.audit.services import Actor
from dashboard.exports import DataExport, build_export
from dashboard.memory import MemoryBuild
from dashboard.saved_memories import reach as reached
from tests.admin.test_canary import crawl
from tests.conftest import csrf_from
from tests.factories import build, make_key, make_plan, make_team, make_user
from tests.orbitpilot.conftest import send

ALL_SCOPES = list(memories.SCOPE_FOR_OPERATION.values())


@pytest.fixture
def team_world(client, auth, db_session, queue, caplog):
    caplog.set_level(logging.DEBUG)
    canary = f"canary-{uuid.uuid4().hex}"
    plan = make_plan(db_session, name="Team", cap=5)
    lead = make_user(db_session, plan=plan, email="canary-lead@example.test")
    member = make_user(db_session, plan=plan, email="canary-member@example.test")
    team = make_team(db_session, lead, slug="pilot", name="Pilot",
                     members={member: "member"})
    key, _ = make_key(db_session, member, name=f"{canary} key name")
    saved = [reached.save_for(
        db_session, reach_of(db_session, member.id), team="pilot",
        content=f"{canary} Heron {n} is the billing rewrite.", metadata={"note": canary},
        actor=Actor("api_key", str(key.id)), api_key_id=key.id).memory for n in range(3)]
    memories.update_memory(db_session, saved[0], content=f"{canary} Heron, edited.",
                           actor=Actor.of(member))
    memories.forget_memory(db_session, team.id, saved[1].id, mode="soft_delete",
                           actor=Actor.of(member), reason=f"{canary} reason")
    build(db_session, team.account, "full")
    make_user(db_session, role="support", email="canary-support@example.test")
    make_user(db_session, role="admin", email="canary-admin@example.test")
    db_session.commit()

    # A member's chat quotes the team's memory.
    auth.login(member.email)
    reply = send(client, f"{canary} Heron billing rewrite").get_json()
    assert canary in reply["reply"]["content"]
    auth.logout()
    # The lead exports the team and downloads it.
    auth.login(lead.email)
    token = csrf_from(client, "/teams/pilot/export")
    assert client.post("/teams/pilot/export", data={"csrf_token": token}).status_code == 303
    export = db_session.scalars(select(DataExport).where(DataExport.user_id == team.id)).one()
    assert build_export(db_session, export.id) == "ready"
    assert client.post(f"/teams/pilot/export/{export.id}/download",
                       data={"csrf_token": token}).status_code == 200
    auth.logout()
    # A hard delete with a reason, and the member's erasure of the rest.
    memories.forget_memory(db_session, team.id, saved[2].id, mode="hard_delete",
                           actor=Actor.of(lead), reason=f"{canary} reason",
                           scopes=ALL_SCOPES)
    db_session.commit()
    auth.login(member.email)
    token = csrf_from(client, "/memory/teams/erase")
    assert client.post("/memory/teams/erase", data={"csrf_token": token}).status_code == 303
    auth.logout()
    return canary, team, lead, member


@pytest.mark.parametrize("role", ["support", "admin"])
def test_no_staff_page_audit_event_log_or_job_holds_a_teams_content(
        client, auth, db_session, team_world, queue, caplog, role):
    canary, team, lead, member = team_world
    auth.login(f"canary-{role}@example.test")
    build_ids = db_session.scalars(select(MemoryBuild.id).where(
        MemoryBuild.user_id == team.id)).all()
    starts = [
        "/support/", "/support/?q=pilot", f"/support/?q={member.email}",
        f"/support/teams/{team.id}", f"/support/users/{member.id}",
        f"/support/users/{lead.id}",
        "/admin/user/?search=pilot", f"/admin/user/details/?id={team.id}",
        "/admin/user/?flt0_kind_equals=team",
        *(f"/admin/builds/details/?id={build_id}" for build_id in build_ids),
        f"/admin/builds/?flt0_user_id_equals={team.id}",
        "/admin/audit/", f"/admin/audit/?flt0_owner_id_equals={team.id}",
        "/admin/audit/export/csv/", "/admin/api_keys/", "/admin/markers/",
        f"/admin/markers/?flt0_owner_id_equals={team.id}",
    ]
    pages = crawl(client, starts)
    leaking = [path for path, body in pages.items() if canary in body]
    assert leaking == []
    # The crawl reached the team's pages, not refusals.
    trace = pages[f"/support/teams/{team.id}"]
    assert "Pilot" in trace and member.email in trace
    assert any("/admin/audit/details/?id=" in path for path in pages)
    assert any("/admin/markers/details/?id=" in path for path in pages)

    events = db_session.scalars(select(AuditEvent)).all()
    team_actions = {e.action for e in events if e.owner_id == team.id}
    assert {"team.create", "memory.create", "memory.update", "memory.soft_delete",
            "memory.hard_delete", "export.request", "export.ready",
            "export.download"} <= team_actions
    for event in events:
        values = [getattr(event, column.key) for column in AuditEvent.__table__.columns]
        assert canary not in repr(values), event.action
    assert [r.getMessage() for r in caplog.records if canary in r.getMessage()] == []
    jobs = queue.jobs
    assert any(job.func_name == "jobs.exports.run_export" for job in jobs)
    for job in jobs:
        assert canary not in json.dumps(
            [job.func_name, job.args, job.kwargs, job.description, job.meta], default=str)
