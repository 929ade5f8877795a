"""Teams in exports: a person's export holds what they saved to teams and their
memberships; a team's export (for its owners and admins only) holds its memories with
versions and who saved each, members and roles, policies, receipts and its audit events,
valid against its shipped schema; "erase what I saved to teams", with its receipts."""

from __future__ import annotations

import io
import json
import uuid
import zipfile
from pathlib import Path

import jsonschema
import pytest
from sqlalchemy import func, select

from dashboard import saved_memories as memories
from dashboard.access import reach_of
from dashboard.audit.models import AuditEvent
from dashboard.audit.services import Actor
from dashboard.auth.models import User
from dashboard.exports import (
    REPORT_NAME,
    TEAM_JSON_NAME,
    TEAM_SCHEMA_NAME,
    DataExport,
    build_export,
    erase_team_contributions,
    export_schema,
    request_team_export,
    team_contributions,
    team_export_schema,
)
from dashboard.exports.sections import JSON_NAME
from dashboard.holds import place_hold
from dashboard.saved_memories import reach as reached
from dashboard.saved_memories.models import ForgetMarker, Memory
from dashboard.teams import services as teams
from tests.conftest import csrf_from
from tests.exports.test_exports import made, zip_of
from tests.factories import make_connection, make_key, make_memory, make_plan, make_team, make_user

HERE = Path(__file__).resolve().parents[2] / "dashboard/exports"
SHIPPED_TEAM_SCHEMA = HERE / "team_schema.json"
ALL_SCOPES = list(memories.SCOPE_FOR_OPERATION.values())


def authored_in_teams(session, author_id: int) -> list[Memory]:
    """What a person saved to teams (every status), read straight from the tables."""
    return list(session.scalars(
        select(Memory).join(User, User.id == Memory.owner_id)
        .where(Memory.author_id == author_id, User.kind == "team")))


def places(document: dict, canary: str) -> set[str]:
    """Every section.field whose value holds ``canary``."""
    found = set()
    for section, rows in document.items():
        for row in rows if isinstance(rows, list) else [rows]:
            if isinstance(row, dict):
                found |= {f"{section}.{field}" for field, value in row.items()
                          if canary in json.dumps(value, ensure_ascii=False)}
    return found


def pilot(session, canary: str):
    """The team Pilot: a lead, a member and a reader; memories saved by the lead with the
    API key "codex-cli", by the member through the app "Claude", and by the lead on the
    page (then edited, so it has a version); one soft-deleted (a receipt)."""
    plan = make_plan(session, cap=5)
    lead, member, reader = (make_user(session, plan=plan) for _ in range(3))
    team = make_team(session, lead, slug="pilot", name="Pilot",
                     members={member: "member", reader: "reader"})
    key, _ = make_key(session, lead, name=f"codex-cli {canary}-keyname")
    grant, _ = make_connection(session, member, name="Claude")
    by_key = reached.save_for(session, reach_of(session, lead.id), team="pilot",
                              content=f"{canary}-key The release train leaves on Tuesdays.",
                              actor=Actor("api_key", str(key.id)), api_key_id=key.id).memory
    by_app = reached.save_for(session, reach_of(session, member.id), team="pilot",
                              content=f"{canary}-app Heron is the billing rewrite.",
                              actor=Actor.of(member), oauth_client_pk=grant.client_pk,
                              client_name="Claude").memory
    on_page = reached.save_for(session, reach_of(session, lead.id), team="pilot",
                               content=f"{canary}-old Standup at 9:00.",
                               actor=Actor.of(lead)).memory
    memories.update_memory(session, on_page, content=f"{canary}-page Standup at 9:30.",
                           actor=Actor.of(lead))
    forgotten = reached.save_for(session, reach_of(session, member.id), team="pilot",
                                 content=f"{canary}-gone A plan we dropped.",
                                 actor=Actor.of(member)).memory
    memories.forget_memory(session, team.id, forgotten.id, mode="soft_delete",
                           actor=Actor.of(member), reason=f"{canary}-reason")
    return team, lead, member, reader, key, grant, (by_key, by_app, on_page, forgotten)


def test_a_persons_export_holds_what_they_saved_to_teams_and_their_teams(db_session):
    canary = f"canary-{uuid.uuid4().hex}"
    team, lead, member, _reader, _key, grant, saved = pilot(db_session, canary)
    # A team the member has left: what they saved there is still theirs to see.
    gone = make_team(db_session, lead, slug="old-crew", name="Old crew",
                     members={member: "member"})
    left = reached.save_for(db_session, reach_of(db_session, member.id), team="old-crew",
                            content=f"{canary}-left Old crew notes.",
                            actor=Actor.of(member)).memory
    teams.remove_member(db_session, gone, teams.membership(db_session, gone.id, lead.id),
                        member.id, actor=Actor.of(lead))
    own = make_memory(db_session, lead, f"{canary}-leads-own A note of the lead's own.")

    export = made(db_session, member)
    archive = zip_of(db_session, export.id)
    document = json.loads(archive.read(JSON_NAME))
    jsonschema.validate(document, export_schema())
    contributed = {row["id"]: row for row in document["team_contributions"]}
    assert set(contributed) == {str(m.id) for m in authored_in_teams(db_session, member.id)}
    assert set(contributed) == {str(saved[1].id), str(saved[3].id), str(left.id)}
    by_app = contributed[str(saved[1].id)]
    assert (by_app["team"], by_app["team_name"], by_app["status"]) == ("pilot", "Pilot",
                                                                       "active")
    assert by_app["via"] == f"app {grant.client.client_id}"
    assert by_app["app_claimed_name"] == "Claude"
    assert contributed[str(saved[3].id)]["status"] == "deleted"
    assert contributed[str(left.id)]["team"] == "old-crew"
    assert [(row["team"], row["role"]) for row in document["team_memberships"]] == [
        ("pilot", "member")]
    assert document["team_memberships"][0]["joined_at"]
    assert places(document, f"{canary}-app") == {"team_contributions.content"}
    # Nothing the member did not write: the lead's team memories and their own memory.
    everything = b"".join(archive.read(name) for name in archive.namelist())
    for other in ("-key", "-page", "-leads-own", "-keyname"):
        assert f"{canary}{other}".encode() not in everything, other
    assert f"{canary}-app".encode() in archive.read(REPORT_NAME)
    assert own.owner_id == lead.id


def test_the_team_export_holds_the_team_valid_against_its_shipped_schema(db_session):
    canary = f"canary-{uuid.uuid4().hex}"
    team, lead, member, reader, key, grant, saved = pilot(db_session, canary)
    personal = make_memory(db_session, member, f"{canary}-personal My own note.")
    _, export, new = request_team_export(db_session, lead, "pilot", interval=600)
    assert new and export.user_id == team.id
    assert build_export(db_session, export.id) == "ready"
    archive = zip_of(db_session, export.id)
    assert set(archive.namelist()) == {TEAM_JSON_NAME, TEAM_SCHEMA_NAME, REPORT_NAME}
    schema = json.loads(archive.read(TEAM_SCHEMA_NAME))
    assert schema == json.loads(SHIPPED_TEAM_SCHEMA.read_text())
    document = json.loads(archive.read(TEAM_JSON_NAME))
    jsonschema.validate(document, schema)

    assert (document["team"]["slug"], document["team"]["name"]) == ("pilot", "Pilot")
    assert document["policies"]["leaver_policy"] == "keep"
    assert {(m["user_id"], m["email"], m["role"]) for m in document["members"]} == {
        (lead.id, lead.email, "owner"), (member.id, member.email, "member"),
        (reader.id, reader.email, "reader")}
    rows = {row["id"]: row for row in document["memories"]}
    by_key, by_app, on_page, forgotten = (rows[str(m.id)] for m in saved)
    assert by_key["saved_by"] == (f"Saved by {lead.display_name} via API key "
                                  f"\u201c{key.name}\u201d ({key.prefix}\u2026)")
    assert by_key["key"] == {"id": key.id, "name": key.name, "prefix": key.prefix}
    assert by_app["app"] == {"client_id": grant.client.client_id, "claimed_name": "Claude"}
    assert (by_app["author_id"], by_app["author"]) == (member.id, member.display_name)
    assert on_page["via"] == "OrbitPilot" and on_page["version"] == 2
    assert forgotten["status"] == "deleted"
    assert places(document, f"{canary}-old") == {"memory_versions.content"}
    assert places(document, f"{canary}-reason") == {"erasure_receipts.reason"}
    assert {row["memory_id"] for row in document["erasure_receipts"]} == {str(saved[3].id)}
    # The team's audit events, as they are: about the team, none with content.
    actions = {row["action"] for row in document["audit_events"]}
    assert {"team.create", "memory.create", "memory.soft_delete",
            "export.request"} <= actions
    for row in document["audit_events"]:
        assert canary not in json.dumps(row)
    # Nobody's own memory is in the team's export.
    everything = b"".join(archive.read(name) for name in archive.namelist())
    assert f"{canary}-personal".encode() not in everything and personal.owner_id == member.id
    # The request was the lead's, about the team; the audit holds no content.
    asked = db_session.scalars(select(AuditEvent).where(
        AuditEvent.action == "export.request", AuditEvent.owner_id == team.id)).one()
    assert (asked.actor_type, asked.actor_id) == ("user", str(lead.id))

    # An erasure of a team memory withdraws the team's export that holds it.
    memories.forget_memory(db_session, team.id, saved[0].id, mode="hard_delete",
                           actor=Actor.of(lead), scopes=ALL_SCOPES)
    assert db_session.get(DataExport, export.id).status == "withdrawn"


def test_the_shipped_team_schema_is_the_one_the_code_writes():
    assert team_export_schema() == json.loads(SHIPPED_TEAM_SCHEMA.read_text())


def test_only_the_teams_owners_and_admins_ask_for_and_download_its_export(
        client, db_session, auth):
    lead, admin, member, stranger = (make_user(db_session) for _ in range(4))
    team = make_team(db_session, lead, slug="pilot", name="Pilot",
                     members={admin: "admin", member: "member"})
    make_team(db_session, stranger, slug="elsewhere")
    db_session.commit()

    auth.login(member.email)
    token = csrf_from(client, "/memory/status")
    assert client.get("/teams/pilot/export").status_code == 403
    assert client.post("/teams/pilot/export", data={"csrf_token": token}).status_code == 403
    auth.logout()
    auth.login(stranger.email)
    token = csrf_from(client, "/memory/status")
    assert client.get("/teams/pilot/export").status_code == 404
    assert client.get("/teams/no-such-team/export").status_code == 404
    assert client.post("/teams/pilot/export", data={"csrf_token": token}).status_code == 404
    auth.logout()

    auth.login(admin.email)
    page = client.get("/teams/pilot/export")
    assert page.status_code == 200 and b'data-status="none"' in page.data
    assert db_session.scalar(select(func.count()).select_from(DataExport).where(
        DataExport.user_id == team.id)) == 0  # a GET asks for nothing
    token = csrf_from(client, "/teams/pilot/export")
    asked = client.post("/teams/pilot/export", data={"csrf_token": token})
    assert asked.status_code == 303 and asked.headers["Location"].endswith(
        "/teams/pilot/export")
    export = db_session.scalars(select(DataExport).where(DataExport.user_id == team.id)).one()
    assert b'data-status="queued"' in client.get("/teams/pilot/export").data
    assert client.get("/teams/pilot/export?format=json").get_json()["status"] == "queued"
    build_export(db_session, export.id)
    download = f"/teams/pilot/export/{export.id}/download"
    assert client.get(download).status_code == 405
    answer = client.post(download, data={"csrf_token": token})
    assert answer.status_code == 200 and answer.mimetype == "application/zip"
    assert TEAM_JSON_NAME in zipfile.ZipFile(io.BytesIO(answer.data)).namelist()
    auth.logout()

    auth.login(member.email)
    token = csrf_from(client, "/memory/status")
    assert client.post(download, data={"csrf_token": token}).status_code == 403
    # The team's export is not the member's: their own export page does not know it.
    assert client.get(f"/memory/export/{export.id}").status_code == 404
    downloads = db_session.scalars(select(AuditEvent).where(
        AuditEvent.action == "export.download", AuditEvent.owner_id == team.id)).all()
    assert [(e.actor_type, e.actor_id) for e in downloads] == [("user", str(admin.id))]


def test_erasing_what_i_saved_to_teams_honours_a_hold_and_lists_receipts(
        client, db_session, auth):
    canary = f"canary-{uuid.uuid4().hex}"
    plan = make_plan(db_session, cap=5)
    lead, person = make_user(db_session, plan=plan), make_user(db_session, plan=plan)
    free = make_team(db_session, lead, slug="pilot", name="Pilot", members={person: "member"})
    held = make_team(db_session, lead, slug="held", name="Held", members={person: "member"})
    mine = [reached.save_for(db_session, reach_of(db_session, person.id), team=slug,
                             content=f"{canary} {slug} {n}", actor=Actor.of(person)).memory
            for slug in ("pilot", "held") for n in range(2)]
    theirs = reached.save_for(db_session, reach_of(db_session, lead.id), team="pilot",
                              content="The lead's own team memory.", actor=Actor.of(lead))
    own = make_memory(db_session, person, "The person's own memory stays.")
    place_hold(db_session, held.id, reason="matter", ends_at=None, actor=Actor("system"))
    db_session.commit()
    assert [(c.slug, c.memories, c.held) for c in team_contributions(db_session, person.id)] \
        == [("held", 2, True), ("pilot", 2, False)]

    auth.login(person.email)
    page = client.get("/memory/teams/erase")
    assert page.status_code == 200 and b'data-team="pilot"' in page.data
    token = csrf_from(client, "/memory/teams/erase")
    assert db_session.scalar(select(func.count()).select_from(ForgetMarker).where(
        ForgetMarker.owner_id.in_((free.id, held.id)))) == 0  # the GET changed nothing
    answer = client.post("/memory/teams/erase", data={"csrf_token": token})
    assert answer.status_code == 303
    db_session.expire_all()
    assert [db_session.get(Memory, m.id) for m in mine[:2]] == [None, None]
    assert [db_session.get(Memory, m.id).status for m in mine[2:]] == ["deleted", "deleted"]
    assert db_session.get(Memory, theirs.memory.id).status == "active"
    assert db_session.get(Memory, own.id).status == "active"
    markers = db_session.scalars(select(ForgetMarker).where(
        ForgetMarker.memory_id.in_([m.id for m in mine]))).all()
    assert sorted((m.mode, m.pending_hold) for m in markers) == [
        ("hard_delete", False), ("hard_delete", False), ("hard_delete", True),
        ("hard_delete", True)]
    listed = client.get("/memory/teams/erase").get_data(as_text=True)
    assert listed.count("data-receipt=") == 4
    assert listed.count("<strong>pending: legal hold</strong>") == 2
    assert 'id="nothing-to-erase"' in listed
    # A second request (a double click) erases nothing more and shows the same receipts.
    again = client.post("/memory/teams/erase", data={"csrf_token": token})
    assert again.status_code == 303
    assert client.get("/memory/teams/erase").get_data(as_text=True).count(
        "data-receipt=") == 4
    assert erase_team_contributions(db_session, person) == []
    for event in db_session.scalars(select(AuditEvent).where(
            AuditEvent.owner_id.in_((free.id, held.id)))):
        assert canary not in json.dumps(event.details)


@pytest.mark.parametrize("role", ["member", "reader"])
def test_a_member_or_reader_is_refused_the_team_export_by_the_service(db_session, role):
    lead, person = make_user(db_session), make_user(db_session)
    make_team(db_session, lead, slug="pilot", members={person: role})
    with pytest.raises(teams.RoleTooLow):
        request_team_export(db_session, person, "pilot", interval=0)
