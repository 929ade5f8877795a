"""Edits under a legal hold keep the held version: a Blink's text or a profile fact's value
edited on its page while a hold holds is changed, and the text it replaced is kept — in
the owner's export, audited without content — until the hold ends (released by hand, or
reaching its end, seen by the retention run). Saved memories keep versions of their own:
a redaction under a hold waits, versions and all, and erases them when the hold ends."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select

from dashboard.audit.models import AuditEvent
from dashboard.audit.services import Actor
from dashboard.blinks.models import Blink
from dashboard.exports import build_export, request_export
from dashboard.holds import HeldVersion, LegalHold, held_versions_of, place_hold, release_hold
from dashboard.orbitpilot.models import ProfileFact
from dashboard.retention import apply_retention, complete_released
from dashboard.saved_memories import forget_memory, update_memory
from tests.conftest import csrf_from
from tests.exports.test_exports import zip_of
from tests.factories import make_blink, make_memory, make_user
from tests.saved_memories.helpers import versions_of

ADMIN = Actor("system")


def canary() -> str:
    return f"HELD-{uuid.uuid4().hex}"


def edit_on_the_page(client, db_session, user, kind: str, old: str, new: str):
    """A Blink or a fact holding ``old``, edited to ``new`` through its page; the row."""
    if kind == "blink":
        row = make_blink(db_session, user, old, title="Note")
        path, data = f"/blinks/edit/?id={row.id}", {"title": "Note", "content": new}
    else:
        row = ProfileFact(user_id=user.id, key="locker", value=old)
        db_session.add(row)
        db_session.flush()
        path, data = f"/profile/edit/?id={row.id}", {"key": "locker", "value": new}
    answer = client.post(path, data={**data, "csrf_token": csrf_from(client, path)})
    assert answer.status_code == 302
    db_session.refresh(row)
    assert (row.content if kind == "blink" else row.value) == new
    return row


def kept(db_session, user) -> list[tuple[str, str, str]]:
    return [(v.kind, v.title, v.content) for v in db_session.scalars(
        select(HeldVersion).where(HeldVersion.user_id == user.id).order_by(HeldVersion.id))]


def events(db_session, user, action: str) -> list[AuditEvent]:
    return list(db_session.scalars(select(AuditEvent).where(
        AuditEvent.owner_id == user.id, AuditEvent.action == action).order_by(AuditEvent.seq)))


@pytest.mark.parametrize("kind", ["blink", "profile_fact"])
def test_an_edit_under_a_hold_keeps_the_replaced_text_until_the_hold_is_released(
        client, db_session, user, kind):
    hold = place_hold(db_session, user.id, reason="matter 12", ends_at=None, actor=ADMIN)
    old, new = canary(), canary()
    row = edit_on_the_page(client, db_session, user, kind, old, new)
    title = "Note" if kind == "blink" else "locker"
    assert kept(db_session, user) == [(kind, title, old)]
    assert [v.content for v in held_versions_of(db_session, user.id, kind, row.id)] == [old]
    # Audited with ids only: which item, which hold, which kept version.
    (event,) = events(db_session, user, "legal_hold.keep_version")
    assert (event.target_type, event.target_id) == (kind, str(row.id))
    assert event.details["legal_hold"] == hold.id
    assert old not in json.dumps(event.details) and new not in json.dumps(event.details)
    # The owner's export lists it.
    export, _ = request_export(db_session, user, interval=0)
    assert build_export(db_session, export.id) == "ready"
    document = json.loads(zip_of(db_session, export.id).read("orbitpilot-export.json"))
    assert [(r["kind"], r["item_id"], r["content"]) for r in document["held_versions"]] == \
        [(kind, row.id, old)]

    release_hold(db_session, hold, actor=ADMIN)
    assert kept(db_session, user) == []
    (released,) = events(db_session, user, "legal_hold.release")
    assert released.details == {"held_versions": 1}


def test_without_a_hold_an_edit_keeps_nothing(client, db_session, user):
    edit_on_the_page(client, db_session, user, "blink", canary(), canary())
    edit_on_the_page(client, db_session, user, "profile_fact", canary(), canary())
    assert kept(db_session, user) == []
    assert events(db_session, user, "legal_hold.keep_version") == []


def test_each_edit_under_a_hold_keeps_the_text_it_replaced(db_session):
    from dashboard.blinks.services import update_blink

    user = make_user(db_session)
    place_hold(db_session, user.id, reason="r", ends_at=None, actor=ADMIN)
    first, second, third = canary(), canary(), canary()
    blink = make_blink(db_session, user, first)
    update_blink(db_session, blink, title="t", content=second)
    update_blink(db_session, blink, title="t", content=second)  # no change: nothing kept
    update_blink(db_session, blink, title="t", content=third)
    assert [c for _, _, c in kept(db_session, user)] == [first, second]
    assert db_session.get(Blink, blink.id).content == third


def test_a_hold_that_reached_its_end_lets_the_run_delete_what_it_kept(db_session):
    from dashboard.blinks.services import update_blink

    user = make_user(db_session)
    now = datetime.now(UTC)
    place_hold(db_session, user.id, reason="r", ends_at=now + timedelta(days=1), actor=ADMIN,
               now=now)
    blink = make_blink(db_session, user, canary())
    update_blink(db_session, blink, title="t", content=canary())
    assert len(kept(db_session, user)) == 1
    assert apply_retention(db_session, now=now + timedelta(hours=1)).versions_released == 0
    assert len(kept(db_session, user)) == 1  # it still holds
    run = apply_retention(db_session, now=now + timedelta(days=2))
    assert run.versions_released == 1 and run.summary()["versions_released"] == 1
    assert kept(db_session, user) == []
    (event,) = events(db_session, user, "legal_hold.versions_released")
    assert event.details == {"held_versions": 1}


def test_a_new_hold_over_one_that_ended_keeps_what_the_old_one_kept(db_session):
    from dashboard.blinks.services import update_blink

    user = make_user(db_session)
    now = datetime.now(UTC)
    old = place_hold(db_session, user.id, reason="r", ends_at=now + timedelta(days=1),
                     actor=ADMIN, now=now)
    blink = make_blink(db_session, user, (text := canary()))
    update_blink(db_session, blink, title="t", content=canary())
    later = now + timedelta(days=2)
    new = place_hold(db_session, user.id, reason="again", ends_at=None, actor=ADMIN, now=later)
    assert db_session.get(LegalHold, old.id).released_at is not None
    assert db_session.scalars(select(HeldVersion.hold_id).where(
        HeldVersion.user_id == user.id)).all() == [new.id]
    assert apply_retention(db_session, now=later + timedelta(hours=1)).versions_released == 0
    assert [c for _, _, c in kept(db_session, user)] == [text]


def test_under_a_hold_a_memory_keeps_its_versions_and_a_redaction_erases_them_at_its_end(
        db_session):
    """compliance.md: saved memories keep versions on PATCH; a redaction under a hold only
    soft-deletes (versions kept, pending) and erases them when the hold ends."""
    user = make_user(db_session)
    hold = place_hold(db_session, user.id, reason="r", ends_at=None, actor=ADMIN)
    first, second = canary(), canary()
    memory = make_memory(db_session, user, first)
    update_memory(db_session, memory, content=second, actor=Actor.of(user))
    assert [v[1] for v in versions_of(db_session, memory.id)] == [first]
    pending = forget_memory(db_session, user.id, memory.id, mode="redact", actor=Actor.of(user))
    assert pending.pending == "legal_hold"
    assert [v[1] for v in versions_of(db_session, memory.id)] == [first, second]
    release_hold(db_session, hold, actor=ADMIN)
    assert complete_released(db_session, user_id=user.id) == 1
    assert {v[1] for v in versions_of(db_session, memory.id)} == {None}
