"""Erasure receipts that prove it: each forget records a post-delete probe (an exact count
of the owner's chunks of that memory, after the delete, in the same transaction) and
says where copies may still be (the backup horizon)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from dashboard.audit.services import Actor
from dashboard.saved_memories import editing, forget_memory, restore_memory
from tests.factories import build, make_memory, make_user


@pytest.fixture
def remembered(db_session):
    owner = make_user(db_session)
    memory = make_memory(db_session, owner, "The gate code is 4412")
    build(db_session, owner)
    return owner, memory


@pytest.mark.parametrize("mode", ["soft_delete", "redact", "hard_delete"])
def test_every_forget_probes_after_the_delete_and_finds_nothing(db_session, remembered, mode):
    owner, memory = remembered
    receipt = forget_memory(db_session, owner.id, memory.id, mode=mode, actor=Actor.of(owner),
                            scopes=["memory:delete", "memory:redact", "memory:hard_delete"])
    assert receipt.removed_chunks >= 1  # there was something to remove
    assert receipt.probe_rows == 0 and receipt.probed_at is not None
    # A soft delete keeps the content (restorable): only the chunks are searched. An
    # erasure also searches the copies the product made (dashboard.copies).
    searched = ["chunks"] if mode == "soft_delete" else \
        ["chunks", "replies", "drew_on", "exports", "export_parts"]
    assert receipt.to_dict()["probe"] == {"at": receipt.probed_at.isoformat(), "rows": 0,
                                          "searched": searched,
                                          "found": dict.fromkeys(searched, 0)}


def test_the_probe_counts_what_a_faulty_delete_left(db_session, remembered, monkeypatch):
    owner, memory = remembered
    monkeypatch.setattr(editing, "forget_chunks", lambda *args, **kwargs: 0)
    receipt = forget_memory(db_session, owner.id, memory.id, mode="soft_delete",
                            actor=Actor.of(owner))
    assert receipt.probe_rows == 1  # the chunk the stubbed delete left behind


def test_a_restore_has_no_probe(db_session, remembered):
    owner, memory = remembered
    forget_memory(db_session, owner.id, memory.id, mode="soft_delete", actor=Actor.of(owner))
    receipt = restore_memory(db_session, owner.id, memory.id, actor=Actor.of(owner))
    assert (receipt.probe_rows, receipt.probed_at) == (None, None)


def test_the_receipt_page_shows_the_probe_and_the_backup_horizon(
        app, client, auth, db_session, remembered, monkeypatch):
    owner, memory = remembered
    receipt = forget_memory(db_session, owner.id, memory.id, mode="redact",
                            actor=Actor.of(owner))
    auth.login(owner.email)
    path = f"/memories/receipts/{receipt.marker_id}"
    page = client.get(path).get_data(as_text=True)
    assert 'data-probe-rows="0"' in page and 'data-found="0"' in page
    assert "found nothing:" in page
    assert "0 chunks of it in your memory" in page
    binding = app.extensions.get("orbitpilot.embedded")
    expected = "No backups: the embedded database keeps no copies." \
        if binding is not None and binding.postgres else "Not stated: this server"
    assert expected in page

    monkeypatch.setitem(app.config, "BACKUP_RETENTION_DAYS", 35)
    expires = (receipt.created_at + timedelta(days=35)).strftime("%Y-%m-%d")
    page = client.get(path).get_data(as_text=True)
    assert f"Copies in backups expire by {expires} (backups are kept 35 days)." in page
