"""The staff console's retention page (preview, confirm, a stale confirm, bad input, roles)
and legal holds (place, release, what support sees), and what the user is told: Memory
Status, the receipt, the API."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select

from dashboard import saved_memories as memories
from dashboard.audit.models import AuditEvent
from dashboard.audit.services import Actor
from dashboard.holds import LegalHold, place_hold
from dashboard.memory import MemoryChunk
from dashboard.retention import retention_fingerprint
from dashboard.saved_memories.models import Memory
from dashboard.sources import CHAT_HISTORY
from tests.conftest import csrf_from
from tests.factories import build, make_conversation, make_key, make_memory, make_plan, make_user

PAGE = "/admin/retention/"


@pytest.fixture
def plan(db_session):
    return make_plan(db_session, cap=4)


def sign_in(db_session, auth, role: str, plan=None):
    email = f"{role}-{uuid.uuid4().hex[:6]}@example.test"
    user = make_user(db_session, role=role, email=email, plan=plan)
    auth.login(email)
    return user


def post(client, path: str, data: dict):
    return client.post(path, data={"csrf_token": csrf_from(client, PAGE), **data})


def test_an_admin_previews_then_confirms_and_the_change_is_audited(client, db_session, auth,
                                                                   plan):
    sign_in(db_session, auth, "admin")
    member = make_user(db_session, plan=plan)
    _, messages = make_conversation(db_session, member, [("old", "a"), ("new", "b")])
    messages[0].created_at = datetime.now(UTC) - timedelta(days=50)
    build(db_session, member, "full")
    page = client.get(PAGE)
    assert page.status_code == 200 and b'id="retention-table"' in page.data
    form = {"plan_id": plan.id, f"keep:{CHAT_HISTORY}": "30", "restore_window_days": "14"}
    preview = post(client, PAGE + "preview", form)
    assert preview.status_code == 200
    html = preview.get_data(as_text=True)
    assert f'data-source="{CHAT_HISTORY}" data-items="1" data-users="1"' in html
    assert plan.retention == {}  # a preview changes nothing
    done = post(client, PAGE + "apply", {**form, "expected": retention_fingerprint(plan)})
    assert done.status_code == 303
    db_session.refresh(plan)
    assert (plan.retention, plan.restore_window_days) == ({CHAT_HISTORY: 30}, 14)
    assert db_session.scalars(select(AuditEvent.action).where(
        AuditEvent.target_type == "plan", AuditEvent.target_id == str(plan.id))).all() \
        == ["plan.retention"]


def test_a_confirm_against_a_stale_preview_shows_the_impact_again(client, db_session, auth,
                                                                  plan):
    sign_in(db_session, auth, "admin")
    seen = retention_fingerprint(plan)
    plan.restore_window_days = 60  # another admin's change, committed meanwhile
    db_session.commit()
    answer = post(client, PAGE + "apply", {"plan_id": plan.id, "restore_window_days": "7",
                                           "expected": seen})
    assert answer.status_code == 409
    assert b"changed while you were looking" in answer.data
    assert plan.restore_window_days == 60


@pytest.mark.parametrize("value", ["0", "-3", "abc", "9999999", "1.5"])
def test_a_bad_number_of_days_is_a_form_error(client, db_session, auth, plan, value):
    sign_in(db_session, auth, "admin")
    answer = post(client, PAGE + "preview", {"plan_id": plan.id,
                                             f"keep:{CHAT_HISTORY}": value,
                                             "restore_window_days": "30"})
    assert answer.status_code == 400
    assert b"Give a whole number of days" in answer.data
    assert f'data-field="keep:{CHAT_HISTORY}"'.encode() in answer.data


def test_support_reads_retention_and_holds_but_cannot_change_them(client, db_session, auth,
                                                                  plan):
    held = make_user(db_session)
    place_hold(db_session, held.id, reason="matter 12", ends_at=None,
               actor=Actor.of(make_user(db_session, role="admin")))
    sign_in(db_session, auth, "support")
    page = client.get(PAGE)
    assert page.status_code == 200
    assert 'data-hold="' in page.get_data(as_text=True) and b"<input form=" not in page.data
    for path, data in ((PAGE + "preview", {"plan_id": plan.id, "restore_window_days": "3"}),
                       (PAGE + "holds", {"email": held.email, "reason": "r"})):
        assert post(client, path, data).status_code == 403


def test_a_user_cannot_open_the_page(client, db_session, auth):
    sign_in(db_session, auth, "user")
    assert client.get(PAGE).status_code == 403


def test_an_admin_places_and_releases_a_hold_and_its_reason_stays_out_of_the_log(
        client, db_session, auth):
    sign_in(db_session, auth, "admin")
    person = make_user(db_session)
    memory = make_memory(db_session, person)
    canary = f"canary-{uuid.uuid4().hex}"
    placed = post(client, PAGE + "holds", {"email": person.email.upper(), "reason": canary,
                                           "ends_at": ""})
    assert placed.status_code == 303
    hold = db_session.scalars(select(LegalHold).where(LegalHold.user_id == person.id)).one()
    receipt = memories.forget_memory(db_session, person.id, memory.id, mode="redact",
                                     actor=Actor.of(person))
    assert receipt.pending == "legal_hold"
    released = post(client, PAGE + "holds/release", {"hold_id": hold.id})
    assert released.status_code == 303
    assert db_session.get(Memory, memory.id).status == "redacted"
    events = db_session.scalars(select(AuditEvent).where(
        AuditEvent.owner_id == person.id)).all()
    assert {"legal_hold.place", "legal_hold.release"} <= {e.action for e in events}
    assert all(canary not in str(e.details) for e in events)
    assert post(client, PAGE + "holds/release", {"hold_id": hold.id}).status_code == 409


@pytest.mark.parametrize("form, field", [
    ({"email": "nobody@example.test", "reason": "r"}, "email"),
    ({"reason": ""}, "reason"),
    ({"reason": "r", "ends_at": "not a date"}, "ends_at"),
    ({"reason": "r", "ends_at": "2001-01-01"}, "ends_at"),
])
def test_a_bad_hold_is_a_form_error(client, db_session, auth, form, field):
    sign_in(db_session, auth, "admin")
    person = make_user(db_session)
    answer = post(client, PAGE + "holds", {"email": person.email, **form})
    assert answer.status_code == 400
    assert f'data-field="{field}"'.encode() in answer.data
    assert not db_session.scalars(select(LegalHold).where(LegalHold.user_id == person.id)
                                  ).all()


def test_memory_status_tells_the_window_what_ages_out_soon_and_the_hold(client, db_session,
                                                                       auth, plan):
    plan.retention = {CHAT_HISTORY: 30}
    user = sign_in(db_session, auth, "user", plan=plan)
    _, messages = make_conversation(db_session, user, [("q0", "a0"), ("q1", "a1")])
    messages[0].created_at = datetime.now(UTC) - timedelta(days=27)  # out in 3 days
    build(db_session, user, "full")
    doomed = make_memory(db_session, user, "soon purged")
    memories.forget_memory(db_session, user.id, doomed.id, mode="soft_delete",
                           actor=Actor.of(user))
    doomed.deleted_at = datetime.now(UTC) - timedelta(days=25)  # restorable 30 days
    db_session.flush()
    html = client.get("/memory/status").get_data(as_text=True)
    assert f"Remembered: your {plan.name} plan keeps the last 30 days of chat history." in html
    assert f'<li data-source="{CHAT_HISTORY}" data-count="1">' in html
    assert 'id="purge-soon" data-count="1"' in html
    assert 'id="legal-hold"' not in html
    place_hold(db_session, user.id, reason="r", ends_at=None,
               actor=Actor.of(make_user(db_session, role="admin")))
    held = client.get("/memory/status").get_data(as_text=True)
    assert 'id="legal-hold"' in held and "Your account is under a legal hold" in held
    assert "the text it replaces is kept (it is in your export)" in held
    assert 'id="purge-soon"' not in held  # nothing is purged while it holds


def test_the_receipt_page_and_the_api_say_pending_legal_hold(client, db_session, auth, queue):
    user = sign_in(db_session, auth, "user")
    _, secret = make_key(db_session, user, scopes=["memory:read", "memory:write",
                                                   "memory:delete", "memory:hard_delete"])
    memory = make_memory(db_session, user)
    build(db_session, user, "full")
    place_hold(db_session, user.id, reason="r", ends_at=None,
               actor=Actor.of(make_user(db_session, role="admin")))
    db_session.commit()
    answer = client.delete(f"/v1/memories/{memory.id}?mode=hard_delete",
                           headers={"X-API-Key": secret})
    assert answer.status_code == 200
    receipt = answer.get_json()["receipt"]
    assert (receipt["pending"], receipt["to_status"]) == ("legal_hold", "deleted")
    assert not db_session.scalars(select(MemoryChunk.id).where(
        MemoryChunk.source_id == str(memory.id))).all()
    page = client.get(f"/memories/receipts/{receipt['marker_id']}")
    assert page.status_code == 200
    assert b'data-pending="legal_hold"' in page.data and b"Pending: legal hold." in page.data
    assert client.post(f"/v1/memories/{memory.id}/restore", json={},
                       headers={"X-API-Key": secret}).status_code == 409


@pytest.mark.parametrize("kind", ["blink", "document", "fact"])
def test_under_a_hold_a_blink_a_document_or_a_fact_is_not_deleted(client, db_session, auth,
                                                                   kind):
    from dashboard.blinks.models import Blink
    from dashboard.documents.models import Document
    from dashboard.orbitpilot.models import ProfileFact
    from tests.factories import make_blink

    user = sign_in(db_session, auth, "user")
    if kind == "blink":
        row, path, back = make_blink(db_session, user), "/blinks/delete/", "/blinks/"
    elif kind == "document":
        row = Document(user_id=user.id, title="Notes", content="text")
        path, back = "/documents/delete/", "/documents/"
    else:
        row = ProfileFact(user_id=user.id, key="city", value="Lyon")
        path, back = "/profile/delete/", "/profile/"
    db_session.add(row)
    db_session.flush()
    place_hold(db_session, user.id, reason="r", ends_at=None,
               actor=Actor.of(make_user(db_session, role="admin")))
    answer = client.post(f"{path}?id={row.id}",
                         data={"csrf_token": csrf_from(client, back)}, follow_redirects=True)
    assert answer.status_code == 200
    assert b"under a legal hold" in answer.data
    model = {"blink": Blink, "document": Document, "fact": ProfileFact}[kind]
    assert db_session.get(model, row.id) is not None
