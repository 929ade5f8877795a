"""WCAG 2.1 AA, proven in the browser: axe-core (tests/browser/axe.py) over every page type,
as a guest, a user, support and an admin, at a desktop's width and a phone's."""

from __future__ import annotations

import pytest

from tests.browser.axe import axe_source, violations
from tests.browser.conftest import pages_of
from tests.conftest import IN_CI

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
               "/support/plans", "/support/", "/admin/retention/"]
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
