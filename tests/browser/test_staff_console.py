"""The staff console's assignment change, end to end in headless Chromium: an admin signs in,
opens Assignments from the menu, switches chat history off for "Free", reads the impact
preview, confirms, sees the new row and finds the change in the audit log — every page
under the real Content-Security-Policy, the console read after each step. Screenshots go
to pytest's temporary directory (or ``$ORBITPILOT_SCREENSHOTS``). What the test sets up is
committed and removed afterwards, except the append-only audit events (the assertions
look only at events newer than a ``seq`` read before the change)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from sqlalchemy import delete, func, or_, select

from dashboard.audit.models import AuditEvent
from dashboard.auth.models import User
from dashboard.memory import fan_out_plan_builds
from dashboard.plans.models import Plan, SourceAssignment
from dashboard.sources import CHAT_HISTORY, SAVED
from tests.factories import default_plan

pytestmark = pytest.mark.processes  # real processes or servers: slow

MATRIX_PATH = "/admin/assignments/"
AUDIT_PATH = "/admin/audit/"


@dataclass(frozen=True)
class FreeSetup:
    free: Plan
    admin: User
    free_users: list[User]


@pytest.fixture
def free_with_chat_included(committed):
    """The default plan "Free" with a committed row switching saved memories off, so that
    chat history (rank 4) is inside the cap of 3; some users on Free (two without a plan,
    one on it by name, one inactive who must not count) and an admin on a plan of their own.

    Afterwards Free's rows for the two sources are put back as they were."""
    session = committed.session
    free = default_plan(session)
    keys = (SAVED, CHAT_HISTORY)
    original = {row.source_key: row.enabled for row in free.assignments if row.source_key in keys}
    session.execute(delete(SourceAssignment).where(SourceAssignment.plan_id == free.id,
                                                   SourceAssignment.source_key.in_(keys)))
    session.add(SourceAssignment(plan_id=free.id, source_key=SAVED, enabled=False))

    admin = committed.user(role="admin", plan=committed.plan(cap=3))
    free_users = [committed.user(), committed.user(), committed.user(plan=free)]
    inactive = committed.user()
    inactive.active = False
    session.commit()
    try:
        yield FreeSetup(free, admin, free_users)
    finally:
        session.rollback()
        session.execute(delete(SourceAssignment).where(SourceAssignment.plan_id == free.id,
                                                       SourceAssignment.source_key.in_(keys)))
        for key, enabled in original.items():
            session.add(SourceAssignment(plan_id=free.id, source_key=key, enabled=enabled))
        session.commit()
        # What a worker would have done with the fan-outs these changes asked for: Free
        # is left with no change waiting (the sweeper's tests count the plans that are).
        fan_out_plan_builds(session, free.id, batch_size=500)


def active_users_of_default_plan(session, plan_id: int) -> int:
    """Counted here, not through the app's helper: an active user whose plan is Free or
    who has no plan at all."""
    session.rollback()  # a fresh snapshot: the live server commits on its own connections
    return session.scalar(select(func.count()).select_from(User).where(
        User.active, or_(User.plan_id.is_(None), User.plan_id == plan_id)))


def newest_seq(session) -> int:
    session.rollback()
    return session.scalar(select(func.max(AuditEvent.seq))) or 0


def chat_cell(page, plan_id: int):
    return page.find(f"tr#plan-{plan_id} td[data-source='{CHAT_HISTORY}']")


def audit_rows(page) -> list[dict[str, str]]:
    """The audit list's rows on the page: seq, action, target, and the details' lines."""
    page.find("table.model-list tbody tr")
    rows = []
    for tr in page.driver.find_elements("css selector", "table.model-list tbody tr"):
        cells = {name: tr.find_elements("css selector", f"td.col-{name}")
                 for name in ("seq", "action", "target", "details")}
        if not all(cells.values()):
            continue  # the "no records" row
        rows.append({name: found[0].text.strip() for name, found in cells.items()})
    return rows


def test_switching_chat_history_off_for_free_shows_impact_and_is_audited(
        page, free_with_chat_included, committed):
    free = free_with_chat_included.free
    admin = free_with_chat_included.admin
    expected_users = active_users_of_default_plan(committed.session, free.id)
    assert expected_users >= len(free_with_chat_included.free_users)

    page.sign_in(admin.email)
    page.open("/admin/")
    page.click("nav a.nav-link", "Assignments")
    page.settle()
    assert page.driver.current_url == page.base_url + MATRIX_PATH

    # The matrix: Free's users, and chat history included by default (saved memories off).
    free_row = page.find(f"tr#plan-{free.id}")
    assert free_row.find_element("css selector", "th").text.startswith("Free")
    assert free_row.find_elements("css selector", "td")[0].text == str(expected_users)
    cell = chat_cell(page, free.id)
    assert cell.get_attribute("data-row") == "default"
    assert cell.get_attribute("data-state") == "included"
    page.screenshot("staff-assignments.png")

    # The cell's button: a plain form posting the change to the preview.
    page.click(f"tr#plan-{free.id} td[data-source='{CHAT_HISTORY}'] button[name=toggle]",
               "Switch off")
    page.wait_for_text("Impact preview")
    assert page.find("h1").text == "Impact preview"
    assert page.find("#change").text == "Switch Chat history off for Free?"
    impact = page.find("#impact")
    assert [li.text for li in impact.find_elements("css selector", "li")] == [
        f"{expected_users} user(s) lose Chat history"]
    assert (f"Confirming removes Chat history from the memory of the {expected_users} active "
            "user(s) of Free in the background") in impact.text
    page.screenshot("staff-impact-preview.png")

    before_seq = newest_seq(committed.session)
    page.click("#confirm")
    success = page.find(".alert-success")
    page.settle()
    assert page.driver.current_url == page.base_url + MATRIX_PATH
    assert (f"Switch Chat history off for Free: done. {expected_users} user(s) lose Chat "
            "history. It is being applied to their memory, without rebuilds.") in success.text
    cell = chat_cell(page, free.id)
    assert cell.get_attribute("data-row") == "off"
    assert cell.get_attribute("data-state") == "not_assigned_by_admin"

    committed.session.rollback()
    row = committed.session.scalars(select(SourceAssignment).where(
        SourceAssignment.plan_id == free.id,
        SourceAssignment.source_key == CHAT_HISTORY)).one()
    assert (row.enabled, row.updated_by_id) == (False, admin.id)

    # The audit log, newest first: the change is there, for Free, default -> off.
    page.click("nav a.nav-link", "Audit log")
    page.settle()
    assert page.driver.current_url == page.base_url + AUDIT_PATH
    shown = [r for r in audit_rows(page) if int(r["seq"]) > before_seq
             and r["action"].splitlines() == ["Source assignment changed", "assignment.set"]
             and r["target"] == f"plan:{free.id}"]
    assert len(shown) == 1, audit_rows(page)
    details = shown[0]["details"].splitlines()
    assert f'source_key: "{CHAT_HISTORY}"' in details
    assert 'row: "default" → "off"' in details
    page.screenshot("staff-audit-log.png")

    event = committed.session.scalars(
        select(AuditEvent).where(AuditEvent.seq > before_seq,
                                 AuditEvent.action == "assignment.set")
        .order_by(AuditEvent.seq.desc())).first()
    assert event is not None
    assert (event.seq, event.target_type, event.target_id, event.actor_id) == (
        int(shown[0]["seq"]), "plan", str(free.id), str(admin.id))
    assert (event.details["before"], event.details["after"]) == (
        {"row": "default"}, {"row": "off"})
    assert event.details["impact"] == {"users": expected_users, "gain": [],
                                       "lose": [CHAT_HISTORY]}
    page.assert_no_violations()
