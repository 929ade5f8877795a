"""The evidence pages: a team's owner asks for the report (a job), downloads it (a POST,
audited without content); other roles and other teams are refused; staff admins have the
deployment's; and no memory content reaches the report or the audit log (a canary)."""

from __future__ import annotations

import json

from sqlalchemy import select

from dashboard.audit.models import AuditEvent
from dashboard.evidence.models import EvidenceReport
from dashboard.evidence.report import make_report, request_report
from dashboard.evidence.web import inputs_for
from tests.conftest import csrf_from
from tests.factories import make_memory, make_team, make_user

CANARY = "canary-4f1c9e evidence must never hold this"


def _made(app, db_session, report_id: int) -> EvidenceReport:
    with app.app_context():
        return make_report(db_session, report_id, inputs_for(app), commit=db_session.flush)


def _pilot(db_session):
    lead = make_user(db_session)
    lead.display_name = "Ada Lead"
    member = make_user(db_session)
    member.display_name = "Grace Member"
    admin = make_user(db_session)
    team = make_team(db_session, lead, slug="pilot", name="Pilot",
                     members={member: "member", admin: "admin"}, max_key_days=30)
    make_memory(db_session, team.account, CANARY)
    return lead, member, admin, team


def test_the_owner_asks_for_the_report_and_downloads_it(app, client, auth, db_session,
                                                        queue):
    lead, _, _, team = _pilot(db_session)
    auth.login(lead.email)
    page = "/teams/pilot/evidence"
    assert client.get(page).status_code == 200
    response = client.post(page, data={"csrf_token": csrf_from(client, page)})
    assert response.status_code == 303
    report = db_session.scalars(select(EvidenceReport).where(
        EvidenceReport.team_id == team.id)).one()
    assert report.status == "queued"
    report = _made(app, db_session, report.id)
    assert report.status == "ready"
    html = client.get(page).get_data(as_text=True)
    assert f'data-report="{report.id}"' in html
    url = f"/teams/pilot/evidence/{report.id}/json"
    assert client.get(url).status_code == 405
    download = client.post(url, data={"csrf_token": csrf_from(client, page)})
    assert download.status_code == 200
    assert download.data == report.body
    assert download.headers["Content-Disposition"] == \
        f'attachment; filename="orbitpilot-evidence-{report.id}-report.json"'
    event = db_session.scalars(select(AuditEvent).where(
        AuditEvent.action == "evidence.download")).one()
    assert (event.owner_id, event.target_id, event.details) == (
        team.id, str(report.id), {"format": "json", "bytes": len(report.body)})


def test_the_team_report_names_members_roles_policies_and_holds_no_content(
        app, db_session, caplog):
    import logging

    caplog.set_level(logging.DEBUG)
    lead, _, _, team = _pilot(db_session)
    report, _ = request_report(db_session, lead, team=team)
    # Its job carries the report's id, nothing else.
    (job,) = [call for _, (kind, call) in db_session.info["orbitpilot.pending_jobs"]
              if kind == "call" and call.function == "jobs.evidence.run_report"]
    assert job.args == (report.id,)
    report = _made(app, db_session, report.id)
    document = json.loads(report.body)
    assert {(m["name"], m["role"]) for m in document["team"]["members"]} >= {
        ("Ada Lead", "owner"), ("Grace Member", "member")}
    assert document["team"]["policies"]["max_key_days"] == 30
    # The team's part and the deployment's non-secret checks only.
    ids = {c["id"] for c in document["checks"]}
    assert {"team.members", "team.policies", "team.apps", "team.data_location",
            "team.drill", "app.headers"} <= ids
    assert not ids & {"access.staff", "access.api_keys", "data.db_role",
                      "data.audit_chain", "access.passwords"}
    from dashboard.evidence.report import rendering
    from dashboard.evidence.web import signing_key

    html = rendering(report, "html", signing_key(app)).decode()
    assert "Grace Member" in html and "Ada Lead" in html and "writes by members" in html
    events = db_session.scalars(select(AuditEvent).where(
        AuditEvent.action.like("evidence.%"), AuditEvent.owner_id == team.id)).all()
    assert {e.action for e in events} == {"evidence.request", "evidence.ready"}
    for blob in (report.body.decode(), html, rendering(report, "oscal.json",
                                                      signing_key(app)).decode(),
                 json.dumps([e.details for e in events]), caplog.text):
        assert "canary-4f1c9e" not in blob


def test_only_the_teams_owners_reach_its_evidence(client, auth, db_session):
    lead, member, admin, team = _pilot(db_session)
    stranger = make_user(db_session)
    for person, status in ((admin, 403), (member, 403), (stranger, 404)):
        auth.login(person.email)
        assert client.get("/teams/pilot/evidence").status_code == status, person.email
        auth.logout()


def test_another_teams_report_is_not_found_through_ones_own_team(app, client, auth,
                                                                  db_session):
    lead, _, _, team = _pilot(db_session)
    other = make_team(db_session, make_user(db_session), slug="other")
    theirs, _ = request_report(db_session, other.account, team=other)
    theirs = _made(app, db_session, theirs.id)
    auth.login(lead.email)
    page = "/teams/pilot/evidence"
    response = client.post(f"/teams/pilot/evidence/{theirs.id}/json",
                           data={"csrf_token": csrf_from(client, page)})
    assert response.status_code == 404


def test_a_second_ask_joins_the_report_in_the_making(db_session):
    lead, _, _, team = _pilot(db_session)
    first, new = request_report(db_session, lead, team=team)
    second, again = request_report(db_session, lead, team=team)
    assert (new, again, second.id) == (True, False, first.id)


def test_staff_admins_have_the_deployments_report(app, client, auth, db_session):
    support = make_user(db_session, role="support")
    auth.login(support.email)
    assert client.get("/admin/evidence/").status_code == 403
    auth.logout()
    admin = make_user(db_session, role="admin")
    auth.login(admin.email)
    assert client.get("/admin/evidence/").status_code == 200
    response = client.post("/admin/evidence/report",
                           data={"csrf_token": csrf_from(client, "/admin/evidence/")})
    assert response.status_code == 303
    report = db_session.scalars(select(EvidenceReport)).one()
    assert report.team_id is None
    report = _made(app, db_session, report.id)
    ids = {c["id"] for c in json.loads(report.body)["checks"]}
    assert {"access.staff", "data.db_role", "data.audit_chain"} <= ids
    assert not any(i.startswith("team.") for i in ids)
    html = client.post(f"/admin/evidence/{report.id}/html",
                       data={"csrf_token": csrf_from(client, "/admin/evidence/")})
    assert html.status_code == 200 and b'id="verdict"' in html.data


def test_a_report_whose_job_died_does_not_block_a_new_one(db_session):
    from datetime import UTC, datetime, timedelta

    lead, _, _, team = _pilot(db_session)
    stuck, _ = request_report(db_session, lead, team=team)
    stuck.status, stuck.created_at = "running", datetime.now(UTC) - timedelta(hours=1)
    db_session.flush()
    fresh, new = request_report(db_session, lead, team=team)
    assert (new, fresh.id != stuck.id, stuck.status, stuck.stage) == (
        True, True, "failed", "abandoned")
