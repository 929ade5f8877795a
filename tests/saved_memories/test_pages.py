"""/memories: a signed-in user's saved memories — the list (own only, who saved each one,
escaped, the status sentence, a constant number of queries), forget, redact and restore
behind confirmation pages that work without JS, and the erasure receipts they leave.

Someone else's memory or receipt answers exactly as an unknown one; a malformed id too."""

from __future__ import annotations

import re
import uuid
from datetime import timedelta

import pytest
from markupsafe import escape
from sqlalchemy import func, select

from dashboard import saved_memories as memories
from dashboard.audit.models import AuditEvent
from dashboard.audit.services import Actor
from dashboard.memory import MemoryBuild, MemoryChunk
from dashboard.memory.embedders import HashingEmbedder
from dashboard.memory.pipeline import run_memory_build
from dashboard.plans.sentences import source_sentence
from dashboard.plans.services import get_plan_for_user, resolve_sources
from dashboard.saved_memories.models import MEMORY_SOURCES, ForgetMarker, Memory, MemoryVersion
from dashboard.sources import SAVED
from tests.conftest import csrf_from
from tests.factories import make_plan, make_user, settle
from tests.orbitpilot.dom import parse

INDEX = "/memories/"
HARD_DELETE_LINE = "Permanent deletion is done through the memory API"
NONCE = re.compile(r'nonce="[^"]*"')
TOKEN = re.compile(r'name="csrf_token"([^>]*)value="[^"]*"')


@pytest.fixture
def owner(db_session, auth, queue):
    user = make_user(db_session, email="memories-owner@example.test")
    assert auth.login("memories-owner@example.test").status_code == 302
    return user


def remember(db_session, user, content="I like tea", *, source="chatgpt",
             status="active") -> Memory:
    memory = Memory(owner_id=user.id, content=content, source=source, status=status,
                    metadata_={"note": "x"})
    db_session.add(memory)
    db_session.flush()
    return memory


def settled(db_session) -> None:
    """Committed (a savepoint released): a request that rolls back keeps these rows."""
    db_session.commit()


def forget(client, memory, mode="soft_delete", **fields):
    path = f"/memories/{memory.id}/forget"
    token = csrf_from(client, f"{path}?mode={mode}")
    return client.post(path, data={"csrf_token": token, "mode": mode, **fields})


def restore(client, memory, **fields):
    path = f"/memories/{memory.id}/restore"
    token = csrf_from(client, INDEX)
    return client.post(path, data={"csrf_token": token, **fields})


def audit_head(db_session) -> int:
    return db_session.scalar(select(func.coalesce(func.max(AuditEvent.seq), 0)))


def markers(db_session, memory) -> list[ForgetMarker]:
    return list(db_session.scalars(select(ForgetMarker).where(
        ForgetMarker.memory_id == memory.id).order_by(ForgetMarker.id)))


def normalised(response) -> str:
    """A page without what differs per request (the CSP nonce, the signed CSRF token)."""
    return TOKEN.sub(r'name="csrf_token"\1value=""',
                     NONCE.sub('nonce=""', response.get_data(as_text=True)))


# -- access -----------------------------------------------------------------------------

# A memory id nobody has, fixed: test ids are the same in every process (pytest-xdist).
NO_SUCH_MEMORY = "5b0e8c3a-2f4d-4e6b-9a1c-7d3f0e2b4a68"


@pytest.mark.parametrize("path", [
    INDEX, f"/memories/{NO_SUCH_MEMORY}", f"/memories/{NO_SUCH_MEMORY}/forget?mode=redact",
    f"/memories/{NO_SUCH_MEMORY}/restore", "/memories/receipts/1",
])
def test_guests_are_sent_to_sign_in(client, path):
    response = client.get(path)
    assert response.status_code == 302
    assert "/auth/signin" in response.headers["Location"]


def test_a_guests_post_is_sent_to_sign_in_too(client, db_session):
    memory = remember(db_session, make_user(db_session))
    settled(db_session)
    token = csrf_from(client, "/auth/signin")
    response = client.post(f"/memories/{memory.id}/forget",
                           data={"csrf_token": token, "mode": "soft_delete"})
    assert response.status_code == 302
    assert "/auth/signin" in response.headers["Location"]
    db_session.expire_all()
    assert db_session.get(Memory, memory.id).status == "active"


def test_the_nav_links_to_saved_memories(client, owner):
    html = client.get("/blinks/").get_data(as_text=True)
    link = html.index('href="/memories/"')
    assert html.index('href="/blinks/"') < link < html.index('href="/profile/"')
    assert "bi-bookmark" in html[link:link + 120]


# -- the list ---------------------------------------------------------------------------

def test_the_list_shows_own_memories_with_attribution_escaped(client, db_session, owner):
    mine = [remember(db_session, owner, f"mine from {source}", source=source)
            for source in MEMORY_SOURCES]
    script = remember(db_session, owner, "<script>alert('owned')</script>", source="api")
    # One transaction gives every row the same now(): make the order the test's own.
    script.created_at = mine[0].created_at + timedelta(seconds=1)
    remember(db_session, make_user(db_session), "their secret memory", source="codex")
    response = client.get(INDEX)
    assert response.status_code == 200
    html = response.get_data(as_text=True)
    for memory in mine:
        assert memory.content in html
        assert f'id="memory-{memory.id}"' in html
    for label in ("ChatGPT", "Codex", "Copilot", "API", "OrbitPilot"):
        assert re.search(rf'class="badge badge-info uc-source"[^>]*>{label}</span>', html), label
    assert "their secret memory" not in html
    assert "<script>alert(" not in html
    assert str(escape(script.content)) in html
    assert HARD_DELETE_LINE in html
    # Newest first.
    assert html.index(f"memory-{script.id}") < html.index(f"memory-{mine[0].id}")


def test_each_state_offers_only_its_actions(client, db_session, owner):
    active = remember(db_session, owner, "active one")
    deleted = remember(db_session, owner, "deleted one", status="deleted")
    redacted = remember(db_session, owner, "[REDACTED]", status="redacted")
    html = client.get(INDEX).get_data(as_text=True)

    def card(memory) -> str:
        start = html.index(f'id="memory-{memory.id}"')
        return html[start:html.index("</article>", start)]

    assert 'data-action="forget"' in card(active) and 'data-action="redact"' in card(active)
    assert 'data-action="restore"' not in card(active)
    assert 'data-action="restore"' in card(deleted) and 'data-action="redact"' in card(deleted)
    assert 'data-action="forget"' not in card(deleted)
    assert "data-action=" not in card(redacted)
    assert "Redacted — cannot be restored" in card(redacted)
    assert "[REDACTED]" in card(redacted)


def test_the_status_filter_and_its_refusal(client, db_session, owner):
    active = remember(db_session, owner, "still here")
    deleted = remember(db_session, owner, "gone quiet", status="deleted")
    response = client.get(f"{INDEX}?status=deleted")
    assert response.status_code == 200
    html = response.get_data(as_text=True)
    assert deleted.content in html and active.content not in html
    bad = client.get(f"{INDEX}?status=everything")
    assert bad.status_code == 400
    assert "Show all, active, deleted or redacted memories" in bad.get_data(as_text=True)


def test_pages_walk_older_with_the_cursor(client, db_session, owner):
    made = [remember(db_session, owner, f"memory number {n:02d}") for n in range(25)]
    first = client.get(INDEX).get_data(as_text=True)
    cursor = re.search(r'rel="next" href="/memories/\?cursor=([^"]+)"', first)
    assert cursor is not None
    second = client.get(f"{INDEX}?cursor={cursor.group(1)}")
    assert second.status_code == 200
    older = second.get_data(as_text=True)
    shown = [m for m in made if f"memory-{m.id}" in first]
    rest = [m for m in made if f"memory-{m.id}" in older]
    assert (len(shown), len(rest)) == (20, 5)
    assert {m.id for m in shown} | {m.id for m in rest} == {m.id for m in made}
    assert 'rel="next" href="#"' in older
    for bad in ("nope", "W10", "WyIyMDI0LTAxLTAxVDAwOjAwOjAwKzAwOjAwIiwgNV0"):
        response = client.get(f"{INDEX}?cursor={bad}")
        assert response.status_code == 400, bad
        assert "Start again from your newest memories" in response.get_data(as_text=True)


@pytest.mark.parametrize("cap, state", [(3, "included"), (1, "evicted_by_cap")])
def test_the_plan_sentence_is_the_one_every_surface_uses(client, db_session, auth, cap,
                                                         state):
    plan = make_plan(db_session, cap=cap)
    user = make_user(db_session, plan=plan)
    assert auth.login(user.email).status_code == 302
    source, sentence = source_sentence(resolve_sources(get_plan_for_user(user, db_session)), SAVED)
    assert source.state.value == state
    html = client.get(INDEX).get_data(as_text=True)
    assert f'data-state="{state}"' in html
    assert str(escape(sentence)) in html
    assert 'href="/memory/status"' in html


def test_the_list_costs_the_same_queries_for_3_and_30_memories(client, db_session, owner,
                                                               count_queries):
    def cost() -> int:
        db_session.expire_all()  # as a fresh request finds it: nothing loaded yet
        with count_queries() as counted:
            assert client.get(INDEX).status_code == 200
        return counted.count

    for n in range(3):
        remember(db_session, owner, f"few {n}", status=("active", "deleted", "redacted")[n])
    settled(db_session)
    client.get(INDEX)  # warm: the first request of a test may load more than the next
    few = cost()
    for n in range(27):
        remember(db_session, owner, f"many {n}", source=MEMORY_SOURCES[n % 5],
                 status=("active", "deleted", "redacted")[n % 3])
    settled(db_session)
    many = cost()
    assert many == few


# -- forget (soft delete) ---------------------------------------------------------------

def test_forget_asks_then_soft_deletes_and_shows_the_receipt(client, db_session, owner):
    memory = remember(db_session, owner, "I take my coffee black")
    settled(db_session)
    head = audit_head(db_session)
    confirm = client.get(f"/memories/{memory.id}/forget?mode=soft_delete")
    assert confirm.status_code == 200
    page = confirm.get_data(as_text=True)
    assert "Forget this memory?" in page and "can restore it later" in page
    assert f'action="/memories/{memory.id}/forget"' in page
    assert memory.status == "active"

    response = forget(client, memory, reason="changed my mind")
    assert response.status_code == 302
    (marker,) = markers(db_session, memory)
    assert response.headers["Location"].endswith(f"/memories/receipts/{marker.id}")
    db_session.expire_all()
    memory = db_session.get(Memory, memory.id)
    assert (memory.status, memory.version) == ("deleted", 2)
    assert memory.content == "I take my coffee black"  # kept: restorable
    assert (marker.mode, marker.from_status, marker.to_status, marker.version) == \
        ("soft_delete", "active", "deleted", 2)
    assert (marker.actor_type, marker.actor_id, marker.reason) == \
        ("user", str(owner.id), "changed my mind")
    (event,) = db_session.scalars(select(AuditEvent).where(
        AuditEvent.seq > head, AuditEvent.target_id == str(memory.id)))
    assert (event.action, event.mode, event.actor_id) == \
        ("memory.soft_delete", "soft_delete", str(owner.id))
    assert event.id == marker.audit_event_id

    receipt = client.get(response.headers["Location"])
    assert receipt.status_code == 200
    html = receipt.get_data(as_text=True)
    assert "Memory forgotten: it is no longer recalled." in html
    assert event.hash in html
    assert 'data-vacuum="not-needed"' in html
    assert "I take my coffee black" not in html

    again = forget(client, memory)
    assert again.status_code == 409
    assert "Only an active memory can be deleted" in again.get_data(as_text=True)
    assert len(markers(db_session, memory)) == 1


def test_a_forget_that_lost_a_race_is_a_conflict(client, db_session, owner):
    """The page read the memory active; another transaction deleted it before the POST
    took the lock: the service must judge the locked row, not the page's copy."""
    memory = remember(db_session, owner, "raced")
    settled(db_session)
    token = csrf_from(client, f"/memories/{memory.id}/forget")
    assert memory.status == "active"  # loaded into the session the requests share
    connection = db_session.connection()
    # What a concurrent soft delete leaves, written past the ORM's identity map.
    connection.exec_driver_sql(
        "INSERT INTO memory_versions (memory_id, version, content, status) "
        "VALUES (%(id)s, 1, 'raced', 'active')", {"id": memory.id})
    connection.exec_driver_sql(
        "UPDATE memories SET status = 'deleted', version = 2 WHERE id = %(id)s",
        {"id": memory.id})
    response = client.post(f"/memories/{memory.id}/forget",
                           data={"csrf_token": token, "mode": "soft_delete"})
    assert response.status_code == 409
    assert markers(db_session, memory) == []


# -- redact -----------------------------------------------------------------------------

def test_redact_replaces_content_and_purges_every_version(client, db_session, owner):
    canary = f"canary-{uuid.uuid4().hex}"
    memory = remember(db_session, owner, f"{canary} first words")
    memories.update_memory(db_session, memory, content=f"{canary} second words",
                           actor=Actor.of(owner))
    run_memory_build(owner, "full", session=db_session, embedder=HashingEmbedder())
    assert db_session.scalar(select(func.count()).select_from(MemoryChunk).where(
        MemoryChunk.source_id == str(memory.id))) >= 1
    settled(db_session)
    head = audit_head(db_session)

    confirm = client.get(f"/memories/{memory.id}/forget?mode=redact")
    assert confirm.status_code == 200
    page = confirm.get_data(as_text=True)
    assert "Redact this memory?" in page and "cannot be undone" in page
    assert 'name="replacement_content"' in page

    response = forget(client, memory, "redact", replacement_content="(a preference)",
                      reason="too personal")
    assert response.status_code == 302
    db_session.expire_all()
    memory = db_session.get(Memory, memory.id)
    assert (memory.status, memory.content, memory.metadata_) == \
        ("redacted", "(a preference)", {})
    versions = list(db_session.scalars(select(MemoryVersion).where(
        MemoryVersion.memory_id == memory.id)))
    assert len(versions) == 2
    assert all(v.content is None and v.metadata_ is None for v in versions)
    assert db_session.scalar(select(func.count()).select_from(MemoryChunk).where(
        MemoryChunk.source_id == str(memory.id))) == 0
    (marker,) = markers(db_session, memory)
    assert (marker.mode, marker.to_status, marker.removed_versions) == ("redact", "redacted", 2)
    assert marker.removed_chunks >= 1 and marker.vacuum_due and marker.vacuumed_at is None
    (event,) = db_session.scalars(select(AuditEvent).where(
        AuditEvent.seq > head, AuditEvent.target_id == str(memory.id)))
    assert event.action == "memory.redact"

    receipt = client.get(response.headers["Location"])
    assert receipt.status_code == 200
    html = receipt.get_data(as_text=True)
    assert event.hash in html
    assert 'data-vacuum="pending"' in html and "pending" in html
    assert f"{marker.removed_chunks} memory chunk" in html
    assert canary not in html and "(a preference)" not in html
    listing = client.get(INDEX).get_data(as_text=True)
    assert canary not in listing and "(a preference)" in listing


def test_redact_without_replacement_says_redacted(client, db_session, owner):
    memory = remember(db_session, owner, "something", status="deleted")
    settled(db_session)
    response = forget(client, memory, "redact", replacement_content="   ")
    assert response.status_code == 302
    db_session.expire_all()
    assert db_session.get(Memory, memory.id).content == memories.REDACTED


@pytest.mark.parametrize("mode, field, size, error", [
    ("soft_delete", "reason", 501, "reason must be at most 500 characters"),
    ("redact", "reason", 501, "reason must be at most 500 characters"),
    ("redact", "replacement_content", 20_001, "replacement_content is longer than 20,000"),
])
def test_too_long_input_is_a_form_error_and_keeps_the_text(client, db_session, owner, mode,
                                                          field, size, error):
    memory = remember(db_session, owner, "keep me")
    settled(db_session)
    typed = ("typed words " * (size // 12 + 1))[:size]
    response = forget(client, memory, mode, **{field: typed})
    assert response.status_code == 400
    html = response.get_data(as_text=True)
    assert error in html
    assert typed in html  # nothing lost: the text is back in its box
    db_session.expire_all()
    assert db_session.get(Memory, memory.id).status == "active"
    assert markers(db_session, memory) == []


def test_the_forget_page_refuses_other_modes(client, db_session, owner):
    memory = remember(db_session, owner)
    settled(db_session)
    hard = client.get(f"/memories/{memory.id}/forget?mode=hard_delete")
    assert hard.status_code == 403
    assert "done through the memory API" in hard.get_data(as_text=True)
    token = csrf_from(client, INDEX)
    posted = client.post(f"/memories/{memory.id}/forget",
                         data={"csrf_token": token, "mode": "hard_delete"})
    assert posted.status_code == 403
    assert client.get(f"/memories/{memory.id}/forget?mode=shred").status_code == 400
    db_session.expire_all()
    assert db_session.get(Memory, memory.id).status == "active"


# -- restore ----------------------------------------------------------------------------

def test_restore_asks_then_restores_and_requests_an_update(client, db_session, owner):
    memory = remember(db_session, owner, "bring me back")
    memories.forget_memory(db_session, owner.id, memory.id, mode="soft_delete",
                           actor=Actor.of(owner))
    settle(db_session)  # so the restore's own request is what the test finds queued
    settled(db_session)

    confirm = client.get(f"/memories/{memory.id}/restore")
    assert confirm.status_code == 200
    assert "Restore this memory?" in confirm.get_data(as_text=True)

    response = restore(client, memory, reason="I was wrong")
    assert response.status_code == 302
    assert response.headers["Location"].endswith(f"/memories/{memory.id}")
    db_session.expire_all()
    memory = db_session.get(Memory, memory.id)
    assert (memory.status, memory.version) == ("active", 3)
    restored = markers(db_session, memory)[-1]
    assert (restored.mode, restored.from_status, restored.to_status) == \
        ("restore", "deleted", "active")
    assert db_session.scalar(select(MemoryBuild.id).where(
        MemoryBuild.user_id == owner.id, MemoryBuild.status == "queued")) is not None
    detail = client.get(response.headers["Location"]).get_data(as_text=True)
    assert "it will be recalled again after your next memory update" in detail
    assert f'href="/memories/receipts/{restored.id}"' in detail


def test_a_redacted_memory_cannot_be_restored(client, db_session, owner):
    memory = remember(db_session, owner, "to erase")
    memories.forget_memory(db_session, owner.id, memory.id, mode="redact",
                           actor=Actor.of(owner))
    settled(db_session)
    for path in (INDEX, f"/memories/{memory.id}"):
        html = client.get(path).get_data(as_text=True)
        assert "Redacted — cannot be restored" in html
        assert f"/memories/{memory.id}/restore" not in html
    page = client.get(f"/memories/{memory.id}/restore")
    assert page.status_code == 200
    assert "<form method=\"post\" action=\"/memories/" not in page.get_data(as_text=True)
    forced = restore(client, memory)
    assert forced.status_code == 409
    assert "A redacted memory cannot be restored" in forced.get_data(as_text=True)
    also = forget(client, memory, "redact")
    assert also.status_code == 409
    db_session.expire_all()
    assert db_session.get(Memory, memory.id).status == "redacted"
    assert [m.mode for m in markers(db_session, memory)] == ["redact"]


def test_restoring_an_active_memory_is_a_conflict(client, db_session, owner):
    memory = remember(db_session, owner)
    settled(db_session)
    response = restore(client, memory)
    assert response.status_code == 409
    assert "Only a deleted memory can be restored" in response.get_data(as_text=True)


# -- ids, other owners, hard deletes, CSRF -----------------------------------------------

def _routes(memory_id: object) -> list[tuple[str, str, dict]]:
    return [
        ("GET", f"/memories/{memory_id}", {}),
        ("GET", f"/memories/{memory_id}/forget?mode=soft_delete", {}),
        ("GET", f"/memories/{memory_id}/forget?mode=redact", {}),
        ("GET", f"/memories/{memory_id}/restore", {}),
        ("POST", f"/memories/{memory_id}/forget", {"mode": "soft_delete"}),
        ("POST", f"/memories/{memory_id}/forget", {"mode": "redact"}),
        ("POST", f"/memories/{memory_id}/restore", {}),
        ("POST", "/memories/forget", {"memory_id": str(memory_id), "mode": "soft_delete"}),
        ("POST", "/memories/restore", {"memory_id": str(memory_id)}),
    ]


def test_someone_elses_memory_is_a_404_like_an_unknown_one(client, db_session, owner):
    stranger = make_user(db_session)
    theirs = remember(db_session, stranger, "their memory", status="deleted")
    their_marker = memories.forget_memory(db_session, stranger.id, theirs.id, mode="redact",
                                          actor=Actor.of(stranger)).marker_id
    settled(db_session)
    token = csrf_from(client, INDEX)
    unknown = uuid.uuid4()
    for (method, path, data), (_, unknown_path, unknown_data) in zip(
            _routes(theirs.id), _routes(unknown), strict=True):
        if method == "POST":
            data, unknown_data = ({"csrf_token": token, **d} for d in (data, unknown_data))
        response = client.open(path, method=method, data=data)
        assert response.status_code == 404, path
        assert "their memory" not in response.get_data(as_text=True)
        other = client.open(unknown_path, method=method, data=unknown_data)
        assert other.status_code == 404, unknown_path
        assert normalised(response) == normalised(other), path
    receipt = client.get(f"/memories/receipts/{their_marker}")
    assert receipt.status_code == 404
    assert normalised(receipt) == normalised(client.get("/memories/receipts/2147483000"))
    db_session.expire_all()
    assert db_session.get(Memory, theirs.id).status == "redacted"
    assert len(markers(db_session, theirs)) == 1


@pytest.mark.parametrize("raw", ["abc", "1", "-1", str(2**64), "00000000-0000",
                                 f"{NO_SUCH_MEMORY}x"])
def test_a_malformed_memory_id_is_a_404(client, owner, raw):
    token = csrf_from(client, INDEX)
    for method, path, data in _routes(raw):
        response = client.open(path, method=method,
                               data={"csrf_token": token, **data} if method == "POST" else None)
        assert response.status_code == 404, (method, path)
        assert "There is no memory with this id among yours." in response.get_data(as_text=True)


@pytest.mark.parametrize("raw", ["abc", "-1", "0", "1.5", "١", "1_0", str(2**31), str(2**63),
                                 str(2**64)])
def test_a_malformed_receipt_id_is_a_404(client, owner, raw):
    response = client.get(f"/memories/receipts/{raw}")
    assert response.status_code == 404
    assert "There is no such erasure receipt among yours." in response.get_data(as_text=True)


def test_a_hard_deleted_memory_is_gone_and_its_receipt_remains(client, db_session, owner):
    memory = remember(db_session, owner, "erase me for good")
    receipt = memories.forget_memory(db_session, owner.id, memory.id, mode="hard_delete",
                                     actor=Actor.of(owner), scopes=["memory:hard_delete"])
    settled(db_session)
    token = csrf_from(client, INDEX)
    for method, path, data in _routes(memory.id):
        response = client.open(path, method=method,
                               data={"csrf_token": token, **data} if method == "POST" else None)
        assert response.status_code == 410, (method, path)
        assert memories.GONE in response.get_data(as_text=True)
    page = client.get(f"/memories/receipts/{receipt.marker_id}")
    assert page.status_code == 200
    html = page.get_data(as_text=True)
    assert "hard_delete" in html and "erase me for good" not in html
    assert 'data-vacuum="pending"' in html
    assert f'href="/memories/{memory.id}"' not in html


def test_posts_without_the_csrf_token_are_refused(client, db_session, owner):
    active = remember(db_session, owner, "stay")
    deleted = remember(db_session, owner, "stay deleted", status="deleted")
    settled(db_session)
    for path, data in ((f"/memories/{active.id}/forget", {"mode": "soft_delete"}),
                       (f"/memories/{active.id}/forget", {"mode": "redact"}),
                       (f"/memories/{deleted.id}/restore", {})):
        response = client.post(path, data=data)
        assert response.status_code == 400, path
        assert "security token" in response.get_data(as_text=True)
    db_session.expire_all()
    assert db_session.get(Memory, active.id).status == "active"
    assert db_session.get(Memory, deleted.id).status == "deleted"
    assert markers(db_session, active) == markers(db_session, deleted) == []


# -- receipts ---------------------------------------------------------------------------

def test_the_receipt_page_lists_the_memorys_receipts_without_content(client, db_session,
                                                                     owner):
    canary = f"canary-{uuid.uuid4().hex}"
    memory = remember(db_session, owner, f"{canary} content")
    first = memories.forget_memory(db_session, owner.id, memory.id, mode="soft_delete",
                                   actor=Actor.of(owner))
    memories.restore_memory(db_session, owner.id, memory.id, actor=Actor.of(owner))
    last = memories.forget_memory(db_session, owner.id, memory.id, mode="redact",
                                  actor=Actor.of(owner), replacement_content=f"{canary} new")
    settled(db_session)
    response = client.get(f"/memories/receipts/{first.marker_id}")
    assert response.status_code == 200
    html = response.get_data(as_text=True)
    assert canary not in html
    assert first.audit_hash in html
    for marker in markers(db_session, memory):
        assert f'href="/memories/receipts/{marker.id}"' in html
    assert len(markers(db_session, memory)) == 3
    assert client.get(f"/memories/receipts/{last.marker_id}").status_code == 200


def test_a_soft_deletes_receipt_offers_restore_while_it_is_the_last_word(client, db_session,
                                                                        owner):
    memory = remember(db_session, owner, "I take my tea green")
    deleted = memories.forget_memory(db_session, owner.id, memory.id, mode="soft_delete",
                                     actor=Actor.of(owner))
    settled(db_session)
    page = parse(client.get(f"/memories/receipts/{deleted.marker_id}").get_data(as_text=True))
    restore = page.find("a", data_restore=True)
    assert restore is not None and restore.attrs["href"] == f"/memories/{memory.id}/restore"
    assert client.get(restore.attrs["href"]).status_code == 200  # it asks first
    memories.restore_memory(db_session, owner.id, memory.id, actor=Actor.of(owner))
    settled(db_session)
    page = parse(client.get(f"/memories/receipts/{deleted.marker_id}").get_data(as_text=True))
    assert page.find("a", data_restore=True) is None  # restored since: nothing to offer
