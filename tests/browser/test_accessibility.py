"""WCAG 2.1 AA, proven in the browser: axe-core (tests/browser/axe.py) over every page type,
as a guest, a user, support and an admin, at a desktop's width and a phone's."""

from __future__ import annotations

import pytest

from dashboard.audit.services import Actor
from dashboard.documents.models import Document
from dashboard.memories.keys import create_key
from dashboard.memories.services import forget_memory
from dashboard.memory.embedders import HashingEmbedder
from dashboard.memory.pipeline import run_memory_build
from tests.browser.axe import axe_source, violations
from tests.conftest import IN_CI
from tests.factories import make_blink, make_conversation, make_memory

pytest.importorskip("selenium", reason="needs selenium: install the dev extra")

pytestmark = pytest.mark.processes  # real processes or servers: slow


@pytest.fixture(scope="module")
def axe() -> str:
    """axe-core's script: without npm (and no ``$AXE_CORE_JS``) these tests skip, which
    fails in CI."""
    try:
        return axe_source()
    except FileNotFoundError:
        if IN_CI:
            pytest.fail("npm is needed to fetch axe-core (apt-get install npm)")
        pytest.skip("npm is needed to fetch axe-core (apt-get install npm)")


@pytest.fixture(scope="module")
def world(app):
    """One of each thing a page can show, committed (the live server reads it)."""
    from sqlalchemy import delete

    from dashboard.auth.models import User
    from dashboard.extensions import db
    from dashboard.plans.models import Plan
    from tests.factories import make_plan, make_user

    with app.app_context():
        session = db.session
        plan = make_plan(session, name="Axe plan", cap=5)
        user = make_user(session, plan=plan, email="axe-user@example.test")
        support = make_user(session, role="support", email="axe-support@example.test")
        admin = make_user(session, role="admin", email="axe-admin@example.test")
        conversation, _ = make_conversation(session, user, [
            ("Plan a day in Lisbon", "Trams, then pastéis."), ("And Porto?", "Port wine.")],
            flagged={1})
        blink = make_blink(session, user, "Trams in Lisbon", title="Lisbon")
        memory = make_memory(session, user, "Prefers aisle seats on long flights.")
        forgotten = make_memory(session, user, "An old note")
        document = Document(user_id=user.id, title="Notes", filename="notes.md",
                            content="# Notes\n\nLisbon trams.")
        session.add(document)
        create_key(session, owner=user, name="Laptop", scopes=["memory:read"],
                   actor=Actor.of(user))
        session.flush()
        forget_memory(session, user.id, forgotten.id, mode="soft_delete",
                      actor=Actor.of(user), reason="")
        run_memory_build(user, "full", session=session, embedder=HashingEmbedder())
        session.commit()
        ids = {"user": user.id, "conversation": conversation.id, "blink": blink.id,
               "memory": memory.id, "document": document.id, "plan": plan.id}
        emails = {"user": user.email, "support": support.email, "admin": admin.email}
        yield ids, emails
        session.rollback()
        session.execute(delete(User).where(User.id.in_([user.id, support.id, admin.id])))
        session.execute(delete(Plan).where(Plan.id == plan.id))
        session.commit()
        session.remove()


def pages_of(identity: str, ids: dict) -> list[str]:
    if identity == "guest":
        return ["/", "/auth/signin", "/auth/signup", "/orbitpilot/", "/no-such-page"]
    if identity == "user":
        return [
            "/", "/orbitpilot/", f"/orbitpilot/c/{ids['conversation']}", "/memory/status",
            "/blinks/", f"/blinks/edit/?id={ids['blink']}", f"/blinks/delete/?id={ids['blink']}",
            "/memories/", f"/memories/{ids['memory']}",
            f"/memories/{ids['memory']}/forget?mode=soft_delete", "/profile/",
            "/documents/", f"/documents/view/?id={ids['document']}", "/settings/keys/",
            "/settings/connections", "/admin/", "/no-such-page",
        ]
    staff = ["/admin/", "/support/", f"/support/users/{ids['user']}", "/support/plans",
             "/admin/builds/", "/admin/audit/", "/admin/markers/"]
    if identity == "support":
        return staff
    return staff + ["/admin/assignments/", "/admin/plan/", f"/admin/plan/details/?id={ids['plan']}",
                    "/admin/user/", f"/admin/user/details/?id={ids['user']}",
                    "/admin/api_keys/", "/admin/connections/"]


# Every identity at a desktop's width; the people who use a phone (guests and users) at a
# phone's too (the staff console's pages are the same markup narrower).
SIZES = [(identity, size) for identity in ("guest", "user", "support", "admin")
         for size in ("desktop", "phone") if size == "desktop" or identity in ("guest", "user")]
WINDOWS = {"desktop": (1280, 900), "phone": (390, 844)}


@pytest.mark.parametrize("identity, size", SIZES, ids=[f"{i}-{s}" for i, s in SIZES])
def test_no_page_has_a_wcag_aa_violation(page, axe, world, identity, size):
    ids, emails = world
    page.driver.set_window_size(*WINDOWS[size])
    page.driver.set_script_timeout(60)
    try:
        if identity == "guest":
            page.driver.delete_all_cookies()
        else:
            page.sign_in(emails[identity])
        found = {}
        for path in pages_of(identity, ids):
            page.open(path)
            problems = violations(page.driver)
            if problems:
                found[path] = [(v["id"], v["impact"], v["nodes"]) for v in problems]
        assert found == {}
    finally:
        page.driver.set_window_size(1280, 1000)


STAFF_LISTS = ["/admin/audit/", "/admin/builds/", "/admin/markers/", "/admin/api_keys/",
               "/admin/user/", "/admin/plan/", "/admin/connections/", "/admin/assignments/",
               "/support/plans", "/support/"]
WIDEST = """
const out = [];
for (const table of document.querySelectorAll('table')) {
  const box = table.parentElement.getBoundingClientRect();
  out.push([Math.round(table.scrollWidth), Math.round(box.width)]);
}
return [document.documentElement.scrollWidth, document.documentElement.clientWidth, out];"""


def test_every_staff_list_fits_a_1280_pixel_screen(page, world):
    _, emails = world
    page.driver.set_window_size(1280, 900)
    try:
        page.sign_in(emails["admin"])
        wide = {}
        for path in STAFF_LISTS:
            page.open(path)
            page_width, screen, tables = page.driver.execute_script(WIDEST)
            if page_width > screen or any(table > box + 1 for table, box in tables):
                wide[path] = (page_width, screen, tables)
        assert wide == {}
    finally:
        page.driver.set_window_size(1280, 1000)
