"""The pages under the real Content-Security-Policy, in a real browser (headless Chromium).

The app runs as a real HTTP server in a thread; Chromium signs in through the sign-in form,
visits the staff pages and uses Flask-Admin's menus ("With selected", "Add Filter"). Each
test reads the browser's console after every page and click, and fails on any entry about
the policy (or a script error) with what Chromium printed. Nothing is injected into the
pages. Each action must also really work: a handler the policy refused fails silently.

Needs Debian's ``chromium`` and ``chromium-driver`` (``.ci/run`` installs them) and the dev
extra (selenium); without them the tests skip, which fails in CI.
"""

from __future__ import annotations

import pytest
from sqlalchemy import select

from dashboard.memory import MemoryBuild
from dashboard.plans.models import Plan

pytestmark = pytest.mark.processes  # real processes or servers: slow

# The browser, the live server and ``page`` (sign-in, console checks): conftest.py.


@pytest.fixture
def staff(committed):
    """An admin and two plain users, really committed, on a plan of their own."""
    plan = committed.plan(cap=3)
    admin = committed.user(role="admin", plan=plan)
    users = [committed.user(plan=plan) for _ in range(2)]
    committed.session.commit()
    return plan, admin, users


# -- the tests ------------------------------------------------------------------------------

def test_every_page_renders_under_the_policy(page, staff):
    plan, admin, users = staff
    page.sign_in(admin.email)

    page.open("/")
    assert f"Hello, {admin.display_name}" in page.text
    page.open("/admin/")
    assert f"Signed in as {admin.email} (admin)" in page.text
    page.open("/admin/plan/")
    assert plan.name in page.text
    page.open("/admin/user/")
    assert all(u.email in page.text for u in (admin, *users))
    page.open("/admin/builds/")
    assert "Trigger" in page.find("table.model-list thead").text
    page.open(f"/admin/plan/edit/?id={plan.id}")
    assert page.find("input[name=name]").get_attribute("value") == plan.name
    page.open(f"/admin/user/details/?id={users[0].id}")
    assert users[0].email in page.text

    # The stylesheets get through the policy: Bootstrap gives the navbar its background.
    background = page.driver.execute_script(
        "return getComputedStyle(document.querySelector('nav.navbar')).backgroundColor")
    assert background not in ("rgba(0, 0, 0, 0)", "transparent"), background
    page.assert_no_violations()


def test_with_selected_action_requests_a_build(page, staff, committed):
    _, admin, (target, bystander) = staff
    page.sign_in(admin.email)
    page.open(f"/admin/user/?search={target.email}")

    page.click(f"input.action-checkbox[value='{target.id}']")
    page.click("a.dropdown-toggle", "With selected")
    page.click(".dropdown-menu a.dropdown-item", "Quick memory update")
    alert = page.alert()
    assert alert.text == "Request a quick build for these users?"
    alert.accept()
    page.wait_for_text("build requested")
    assert "Quick build requested for 1 user(s)." in page.text

    committed.session.rollback()
    built = committed.session.scalars(select(MemoryBuild).where(
        MemoryBuild.user_id.in_([target.id, bystander.id]))).all()
    assert [(b.user_id, b.mode, b.trigger, b.requested_by_id) for b in built] == [
        (target.id, "quick", "admin", admin.id)]
    page.assert_no_violations()


def test_add_filter_menu_filters_the_list(page, staff):
    _, admin, users = staff
    page.sign_in(admin.email)
    page.open("/admin/user/")
    assert all(u.email in page.text for u in users)

    page.click("a.dropdown-toggle", "Add Filter")
    page.click(".field-filters a.filter", "Role")
    assert "Role" in page.find("table.filters tr").text
    page.find("table.filters input.filter-val").send_keys("admin")
    page.click("#filter_form button[type=submit]")
    page.settle()

    assert "flt" in page.driver.current_url
    assert admin.email in page.text
    assert not any(u.email in page.text for u in users)
    page.assert_no_violations()


def test_plan_edit_form_saves(page, staff, committed):
    plan, admin, _ = staff
    renamed = f"{plan.name} renamed"
    page.sign_in(admin.email)
    page.open(f"/admin/plan/edit/?id={plan.id}")

    name = page.find("input[name=name]")
    name.clear()
    name.send_keys(renamed)
    page.click("form.admin-form input[type=submit][value='Save']")
    page.wait_for_text("Record was successfully saved.")

    committed.session.rollback()
    assert committed.session.get(Plan, plan.id).name == renamed
    page.assert_no_violations()
