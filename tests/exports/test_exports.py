"""Download everything about me: every canary exactly where the schema says, none of
another user's, the JSON valid against the shipped schema, the pages (owner only, POST
download, 24 h), the rate limit, the upkeep, and a real worker making one."""

from __future__ import annotations

import io
import json
import re
import uuid
import zipfile
from datetime import UTC, datetime, timedelta
from pathlib import Path

import jsonschema
import pytest
from sqlalchemy import func, select

from dashboard import saved_memories as memories
from dashboard.audit.models import AuditEvent
from dashboard.audit.services import Actor
from dashboard.blinks.services import update_blink
from dashboard.exports import (
    JSON_NAME,
    REPORT_NAME,
    SCHEMA_NAME,
    DataExport,
    DataExportPart,
    build_export,
    export_schema,
    request_export,
    tend_exports,
)
from dashboard.exports.services import export_call
from dashboard.holds import place_hold
from dashboard.orbitpilot.models import ProfileFact
from dashboard.plans.sentences import state_sentence
from dashboard.plans.services import get_plan_for_user, resolve_sources
from dashboard.refusals import TooSoon
from tests.conftest import csrf_from
from tests.factories import (
    build,
    make_blink,
    make_conversation,
    make_key,
    make_memory,
    make_plan,
    make_user,
)
from tests.workers import run_worker

SHIPPED_SCHEMA = Path(__file__).resolve().parents[2] / "dashboard/exports/schema.json"


def stuff(session, user, canary: str) -> dict[str, str]:
    """A canary in every kind of content the user has; by kind, the canary used."""
    marks = {kind: f"{canary}-{kind}" for kind in (
        "profile", "blink", "memory", "version", "message", "document", "key", "reason",
        "held")}
    session.add(ProfileFact(user_id=user.id, key="city", value=marks["profile"]))
    # Edited under a legal hold: the text it replaced is kept while the hold holds.
    blink = make_blink(session, user, marks["held"])
    place_hold(session, user.id, reason="matter", ends_at=None, actor=Actor("system"))
    update_blink(session, blink, title="t", content=marks["blink"])
    memory = make_memory(session, user, marks["version"], metadata={"tag": marks["memory"]})
    memories.update_memory(session, memory, content=marks["memory"], actor=Actor.of(user))
    forgotten = make_memory(session, user, "to forget")
    memories.forget_memory(session, user.id, forgotten.id, mode="soft_delete",
                           actor=Actor.of(user), reason=marks["reason"])
    make_conversation(session, user, [(marks["message"], "an answer")])
    from dashboard.documents.models import Document

    session.add(Document(user_id=user.id, title="Notes", content=marks["document"]))
    make_key(session, user, name=marks["key"])
    session.flush()
    build(session, user, "full")
    return marks


def zip_of(session, export_id: int) -> zipfile.ZipFile:
    data = b"".join(session.scalars(select(DataExportPart.data).where(
        DataExportPart.export_id == export_id).order_by(DataExportPart.seq)))
    return zipfile.ZipFile(io.BytesIO(data))


def made(session, user) -> DataExport:
    export, _ = request_export(session, user, interval=600)
    assert build_export(session, export.id) == "ready"
    session.refresh(export)
    return export


def test_every_canary_is_exactly_where_the_schema_says_and_nobody_elses_is_there(db_session):
    plan = make_plan(db_session, cap=5)
    me, other = make_user(db_session, plan=plan), make_user(db_session, plan=plan)
    mine = stuff(db_session, me, f"canary-{uuid.uuid4().hex}")
    theirs = stuff(db_session, other, f"alien-{uuid.uuid4().hex}")
    export = made(db_session, me)
    assert (export.status, export.progress) == ("ready", 100)
    assert export.expires_at - export.finished_at == timedelta(hours=24)
    archive = zip_of(db_session, export.id)
    assert set(archive.namelist()) == {JSON_NAME, SCHEMA_NAME, REPORT_NAME}
    document = json.loads(archive.read(JSON_NAME))
    schema = json.loads(archive.read(SCHEMA_NAME))
    assert schema == json.loads(SHIPPED_SCHEMA.read_text())
    jsonschema.validate(document, schema)

    def places(canary: str) -> set[str]:
        """Every section.field whose value holds ``canary`` (nested values included)."""
        found = set()
        for section, rows in document.items():
            for row in rows if isinstance(rows, list) else [rows]:
                if not isinstance(row, dict):
                    continue
                for field, value in row.items():
                    if canary in json.dumps(value, ensure_ascii=False):
                        found.add(f"{section}.{field}")
        return found

    expected = {
        "profile": {"profile.value", "chunks.content"},
        "blink": {"blinks.content", "chunks.content"},
        # The first version kept its metadata: the tag was set when it was saved.
        "memory": {"memories.content", "memories.metadata", "memory_versions.metadata",
                   "chunks.content"},
        "version": {"memory_versions.content"},
        "message": {"messages.content", "chunks.content"},
        "document": {"documents.content"},  # documents are not remembered on this plan
        "key": {"api_keys.name"},
        "reason": {"erasure_receipts.reason"},
        "held": {"held_versions.content"},
    }
    assert {kind: places(mine[kind]) for kind in expected} == expected
    assert document["user"]["email"] == me.email
    assert {row["source_key"] for row in document["memory_status"]} >= {"xmemo.saved"}
    flags = {row["content"]: row["not_remembered"] for row in document["messages"]}
    assert flags[mine["message"]] is False
    report = archive.read(REPORT_NAME).decode()
    for kind, canary in mine.items():
        assert canary in report, kind
    everything = b"".join(archive.read(name) for name in archive.namelist())
    for canary in theirs.values():
        assert canary.encode() not in everything
    # The audit events of the export hold no content.
    events = db_session.scalars(select(AuditEvent).where(
        AuditEvent.action.like("export.%"), AuditEvent.owner_id == me.id)).all()
    assert {e.action for e in events} == {"export.request", "export.ready"}
    assert all(c not in json.dumps(e.details) for e in events for c in mine.values())


def test_the_report_reads_like_a_statement_with_headings_words_and_dates_in_words(
        db_session):
    """report.html: sized for a phone (a viewport), a contents list and a heading per
    section, the Memory Status sentences, columns in words, yes and no, and every
    stored moment as a date in words (its exact value kept in ``datetime``)."""
    from dashboard.exports.sections import (
        MEMORY_STATUS_TITLE,
        SECTIONS,
        column_words,
        date_in_words,
    )
    from tests.orbitpilot.dom import parse

    user = make_user(db_session)
    blink = make_blink(db_session, user, "A note for the report", title="Report")
    report = parse(zip_of(db_session, made(db_session, user).id).read(REPORT_NAME).decode())
    assert report.find("meta", name="viewport").attrs["content"] == \
        "width=device-width, initial-scale=1"
    titles = [MEMORY_STATUS_TITLE, *(s.title for s in SECTIONS)]
    assert [a.text for a in report.find("nav").find_all("a")] == titles
    assert [h.text for h in report.find_all("h2")] == ["Contents", *titles]
    resolution = resolve_sources(get_plan_for_user(user, db_session))
    assert [li.text for li in report.find("section", id="memory_status").find_all("li")] == [
        f"{s.label}: {state_sentence(s, resolution)}" for s in resolution.sources]
    blinks = report.find("section", id="blinks")
    headings = [th.text for th in blinks.find_all("th")]
    assert headings == ["Id", "Title", "Content", "Excluded from memory", "Created",
                        "Updated"]
    cells = {td.attrs["data-label"]: td for td in blinks.find("tbody").find_all("td")}
    assert cells["Excluded from memory"].text == "No"
    created = cells["Created"].find("time")
    assert created.text == date_in_words(blink.created_at)
    assert created.attrs["datetime"] == blink.created_at.astimezone(UTC).isoformat()
    assert re.fullmatch(r"\d{1,2} [A-Z][a-z]+ \d{4} at \d\d:\d\d UTC", created.text)
    assert column_words("last_used_at") == "Last used"
    assert column_words("reply_to_id") == "Reply to id"


def test_the_shipped_schema_is_the_one_the_code_writes():
    assert export_schema() == json.loads(SHIPPED_SCHEMA.read_text())


def test_a_request_joins_the_one_in_the_making_and_is_limited_after_it(db_session):
    user = make_user(db_session)
    first, new = request_export(db_session, user, interval=600)
    again, new_again = request_export(db_session, user, interval=600)
    assert new and not new_again and again.id == first.id
    build_export(db_session, first.id)
    with pytest.raises(TooSoon):
        request_export(db_session, user, interval=600)
    later = datetime.now(UTC) + timedelta(seconds=601)
    third, new_third = request_export(db_session, user, interval=600, now=later)
    assert new_third and third.id != first.id
    # The job carries the export's id and nothing else.
    assert export_call(third.id).args == (third.id,)


def test_the_upkeep_repushes_lost_jobs_fails_stopped_ones_and_expires_old_links(db_session):
    user, stopped, old = (make_user(db_session) for _ in range(3))
    lost, _ = request_export(db_session, user, interval=0)
    lost.created_at = datetime.now(UTC) - timedelta(minutes=5)
    running, _ = request_export(db_session, stopped, interval=0)
    running.status, running.heartbeat_at = "running", datetime.now(UTC) - timedelta(hours=1)
    ready = made(db_session, old)
    ready.expires_at = datetime.now(UTC) - timedelta(seconds=1)
    db_session.flush()
    pushed = []
    result = tend_exports(db_session, lost=lambda jobs: list(jobs.values()),
                          push=lambda calls: pushed.extend(calls) or len(calls))
    assert result == {"pushed": 1, "failed": 1, "expired": 1}
    assert [c.args for c in pushed] == [(lost.id,)]
    db_session.refresh(running)
    db_session.refresh(ready)
    assert (running.status, ready.status) == ("failed", "expired")
    assert not db_session.scalar(select(func.count()).select_from(DataExportPart).where(
        DataExportPart.export_id == ready.id))


def test_the_pages_ask_show_and_download_for_the_owner_alone(client, db_session, auth):
    user = make_user(db_session, email="exporter@example.test")
    make_memory(db_session, user, "A thing to export.")
    auth.login("exporter@example.test")
    token = csrf_from(client, "/memory/status")
    asked = client.post("/memory/export", data={"csrf_token": token})
    assert asked.status_code == 303
    export = db_session.scalars(select(DataExport).where(DataExport.user_id == user.id)).one()
    assert asked.headers["Location"].endswith(f"/memory/export/{export.id}")
    page = client.get(f"/memory/export/{export.id}")
    assert page.status_code == 200 and b'data-status="queued"' in page.data
    assert client.get(f"/memory/export/{export.id}?format=json").get_json()["status"] == \
        "queued"
    assert client.post(f"/memory/export/{export.id}/download",
                       data={"csrf_token": token}).status_code == 404  # not ready
    build_export(db_session, export.id)
    assert client.get(f"/memory/export/{export.id}/download").status_code == 405
    answer = client.post(f"/memory/export/{export.id}/download", data={"csrf_token": token})
    assert answer.status_code == 200 and answer.mimetype == "application/zip"
    archive = zipfile.ZipFile(io.BytesIO(answer.data))
    assert "A thing to export." in archive.read(JSON_NAME).decode()
    assert db_session.scalar(select(func.count()).select_from(AuditEvent).where(
        AuditEvent.action == "export.download", AuditEvent.owner_id == user.id)) == 1
    # Someone else: the same 404 as for no export at all.
    auth.logout()
    make_user(db_session, email="snoop@example.test")
    auth.login("snoop@example.test")
    snoop = csrf_from(client, "/memory/status")
    assert client.get(f"/memory/export/{export.id}").status_code == 404
    assert client.post(f"/memory/export/{export.id}/download",
                       data={"csrf_token": snoop}).status_code == 404
    assert client.get("/memory/export/99999999999999999999").status_code == 404


def test_an_expired_link_is_gone(client, db_session, auth):
    user = make_user(db_session, email="late@example.test")
    export = made(db_session, user)
    export.expires_at = datetime.now(UTC) - timedelta(minutes=1)
    db_session.flush()
    auth.login("late@example.test")
    token = csrf_from(client, "/memory/status")
    assert client.post(f"/memory/export/{export.id}/download",
                       data={"csrf_token": token}).status_code == 410
    assert b'data-status="expired"' in client.get(f"/memory/export/{export.id}").data


def test_asking_again_too_soon_leads_to_the_ready_export_and_says_when_in_words(
        client, db_session, auth):
    user = make_user(db_session, email="eager@example.test")
    ready = made(db_session, user)
    auth.login("eager@example.test")
    token = csrf_from(client, "/memory/status")
    answer = client.post("/memory/export", data={"csrf_token": token})
    assert answer.status_code == 303
    assert answer.headers["Location"] == f"/memory/export/{ready.id}"
    page = client.get(answer.headers["Location"]).get_data(as_text=True)
    assert ("Your last export is ready: download it below. You asked for an export less "
            "than a minute ago; you can ask for a new one in 10 minutes.") in page
    assert f'action="/memory/export/{ready.id}/download"' in page  # the download, at hand
    assert "minute(s)" not in page and not re.search(r"\b0 minute", page)


@pytest.mark.parametrize("waited, left, said", [
    (0, 600, "less than a minute ago; you can ask for a new one in 10 minutes"),
    (59, 541, "less than a minute ago; you can ask for a new one in 10 minutes"),
    (61, 539, "1 minute ago; you can ask for a new one in 9 minutes"),
    (590, 10, "9 minutes ago; you can ask for a new one in 1 minute"),
])
def test_the_wait_is_said_in_words_that_make_sense(db_session, waited, left, said):
    user = make_user(db_session)
    first = made(db_session, user)
    with pytest.raises(TooSoon) as refused:
        request_export(db_session, user, interval=600,
                       now=first.created_at + timedelta(seconds=waited))
    assert refused.value.sentence == f"You asked for an export {said}."
    assert refused.value.latest_id == first.id


@pytest.mark.processes
def test_a_real_worker_makes_the_export_the_page_asked_for(app, committed):
    from dashboard.extensions import db

    user = committed.user()
    export, _ = request_export(db.session, user, interval=0)
    db.session.commit()  # the job is pushed after this commit
    run_worker(app)
    db.session.expire_all()
    done = db.session.get(DataExport, export.id)
    assert (done.status, done.progress) == ("ready", 100)
    assert JSON_NAME in zip_of(db.session, export.id).namelist()
