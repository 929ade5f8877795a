"""No staff page and no audit event ever holds content.

A user's messages, Blinks, saved memories, documents, profile facts, memory chunks, display
name and API key name all carry one unique canary string, and a reply drew on them;
audited actions touch that user (plan switch, builds, key creation, grant and revocation,
assignment and cap changes of their plan). Then every staff page is crawled as admin and
as support (every link reachable from the staff home, the record pages, filtered lists,
CSV exports, the support pages) and none contains the canary; neither does any audit
event, in any column.
"""

from __future__ import annotations

import re
import uuid
from collections import deque
from urllib.parse import urljoin, urlsplit

import pytest
from sqlalchemy import select

from dashboard.audit.models import AuditEvent
from dashboard.audit.services import SYSTEM, Actor
from dashboard.blinks.models import Blink
from dashboard.documents.models import Document
from dashboard.memory import MemoryBuild, MemoryChunk, request_builds_by_staff
from dashboard.memory.embedders import HashingEmbedder
from dashboard.memory.pipeline import run_memory_build
from dashboard.orbitpilot.models import ProfileFact, ReplyRecall
from dashboard.orbitpilot.replies import send_message
from dashboard.orbitpilot.responder import BuiltinResponder
from dashboard.plans.editing import set_assignment, set_cap
from dashboard.saved_memories import forget_memory
from dashboard.saved_memories.keys import create_key, grant_hard_delete, revoke_key
from dashboard.saved_memories.models import Memory
from dashboard.sources import CHAT_HISTORY, SAVED
from tests.conftest import csrf_from
from tests.factories import make_conversation, make_plan, make_user

MAX_PAGES = 400
HREF = re.compile(r'href="([^"#]+)')
# Links that leave the staff console or change something.
SKIP = ("/auth/", "/static/", "/admin/static/", "/memory/", "delete", "/new/", "/edit/")


@pytest.fixture
def canary_world(db_session):
    canary = f"canary-{uuid.uuid4().hex}"
    plan = make_plan(db_session, name="Canary plan", cap=5)
    owner = make_user(db_session, plan=plan, email="canary-owner@example.test")
    owner.display_name = f"{canary} display name"
    make_conversation(db_session, owner, [(f"{canary} question", f"{canary} answer"),
                                          (f"{canary} private", f"{canary} reply")],
                      flagged={1}, title=f"{canary} conversation")
    # Created and granted through the services, as the key pages and the console do: the
    # audit events those write are scanned too.
    key, _ = create_key(db_session, owner=owner, name=f"{canary} key name",
                        scopes=["memory:read", "memory:write"], actor=Actor.of(owner))
    db_session.add_all([
        Blink(user_id=owner.id, title=f"{canary} blink title", content=f"{canary} blink"),
        ProfileFact(user_id=owner.id, key="city", value=f"{canary} city"),
        Memory(owner_id=owner.id, content=f"{canary} saved memory",
               metadata_={"note": f"{canary} metadata"}, source="chatgpt"),
        Document(user_id=owner.id, title="notes", filename="notes.md",
                 content=f"{canary} document text"),
    ])
    db_session.flush()
    # A real build: the chunks carry the canary, the build record its counts.
    build = MemoryBuild(user_id=owner.id, mode="full", trigger="admin", status="running")
    db_session.add(build)
    db_session.flush()
    run_memory_build(owner, "full", session=db_session, embedder=HashingEmbedder(),
                     build_id=build.id)
    assert db_session.scalar(select(MemoryChunk.id).where(
        MemoryChunk.user_id == owner.id, MemoryChunk.content.contains(canary)).limit(1))
    # A reply that drew on those chunks (its "Drew on" rows name them).
    send_message(db_session, user_id=owner.id, text=f"{canary} saved memory blink city",
                 responder=BuiltinResponder(), embedder=HashingEmbedder())
    assert db_session.scalar(select(ReplyRecall.id).where(ReplyRecall.user_id == owner.id)
                             .limit(1))
    # Audited actions about this user and their plan.
    request_builds_by_staff(db_session, [owner.id], mode="quick", actor=SYSTEM)
    set_assignment(db_session, plan, SAVED, "off", actor=SYSTEM)
    set_cap(db_session, plan, 4, actor=SYSTEM)
    make_user(db_session, role="support", email="canary-support@example.test")
    admin = make_user(db_session, role="admin", email="canary-admin@example.test")
    grant_hard_delete(db_session, key, actor=Actor.of(admin))
    revoke_key(db_session, key, actor=SYSTEM)
    # Erasures whose reason and replacement text carry the canary: the markers pages
    # show neither.
    forgotten = Memory(owner_id=owner.id, content=f"{canary} to forget", source="codex")
    db_session.add(forgotten)
    db_session.flush()
    forget_memory(db_session, owner.id, forgotten.id, mode="soft_delete", actor=SYSTEM,
                  reason=f"{canary} reason")
    forget_memory(db_session, owner.id, forgotten.id, mode="redact", actor=SYSTEM,
                  reason=f"{canary} reason", replacement_content=f"{canary} replacement")
    db_session.commit()
    return canary, owner, plan


def crawl(client, starts: list[str]) -> dict[str, str]:
    """GET every staff page reachable from ``starts``; returns path → body."""
    seen: dict[str, str] = {}
    queue = deque(starts)
    while queue and len(seen) < MAX_PAGES:
        path = queue.popleft()
        if path in seen:
            continue
        response = client.get(path)
        assert response.status_code < 500, (path, response.status_code)
        body = response.get_data(as_text=True)
        seen[path] = body
        if response.status_code != 200 or response.mimetype != "text/html":
            continue
        for href in HREF.findall(body):
            href = href.replace("&amp;", "&")
            url = urlsplit(urljoin(f"http://localhost{path}", href))
            if url.netloc not in ("", "localhost"):
                continue
            target = url.path + (f"?{url.query}" if url.query else "")
            if url.path.startswith(("/admin", "/support")) and not any(
                    s in url.path for s in SKIP) and target not in seen:
                queue.append(target)
    return seen


@pytest.mark.parametrize("role", ["support", "admin"])
def test_no_staff_page_and_no_audit_event_holds_content(client, auth, db_session,
                                                        canary_world, role):
    canary, owner, plan = canary_world
    auth.login(f"canary-{role}@example.test")
    build_ids = db_session.scalars(select(MemoryBuild.id).where(
        MemoryBuild.user_id == owner.id)).all()
    starts = [
        "/admin/", "/support/", "/support/plans", f"/support/users/{owner.id}",
        f"/support/?q={owner.email}",
        *(f"/admin/builds/details/?id={build_id}" for build_id in build_ids),
        f"/admin/builds/?flt0_user_id_equals={owner.id}",
        "/admin/audit/", f"/admin/audit/?flt0_owner_id_equals={owner.id}",
        "/admin/audit/export/csv/",
        f"/admin/user/details/?id={owner.id}", f"/admin/user/?search={owner.email}",
        f"/admin/plan/details/?id={plan.id}", "/admin/api_keys/",
        "/admin/assignments/", "/admin/markers/",
        f"/admin/markers/?flt0_owner_id_equals={owner.id}",
    ]
    pages = crawl(client, starts)
    if role == "admin":
        token = csrf_from(client, "/admin/assignments/")
        preview = client.post("/admin/assignments/preview", data={
            "csrf_token": token, "plan_id": plan.id, "kind": "assignment",
            "source_key": CHAT_HISTORY, "value": "off"})
        assert preview.status_code == 200
        pages["preview"] = preview.get_data(as_text=True)
    leaking = [path for path, body in pages.items() if canary in body]
    assert leaking == []
    # The crawl really reached the pages about this user (not just refusals).
    assert len(pages) > 30
    assert owner.email in pages[f"/support/users/{owner.id}"]
    assert any("/admin/audit/details/?id=" in path for path in pages)
    assert any("/admin/builds/details/?id=" in path for path in pages)
    assert any("/admin/markers/details/?id=" in path for path in pages)

    events = db_session.scalars(select(AuditEvent)).all()
    assert {"build.request", "assignment.set", "plan.cap", "api_key.create", "api_key.grant",
            "api_key.revoke"} <= {
        e.action for e in events if e.owner_id == owner.id or e.target_id == str(plan.id)}
    for event in events:
        values = [getattr(event, column.key) for column in AuditEvent.__table__.columns]
        assert canary not in repr(values), event.id
