"""WCAG 2.1 AA, proven in the browser: axe-core (tests/browser/axe.py) over every page type,
as a guest, a user, support and an admin, at a desktop's width and a phone's."""

from __future__ import annotations

import pytest

from tests.browser.axe import violations
from tests.browser.checks import NAVBAR_OVERFLOW, STAFF_LIST_PROBLEMS, UNLABELLED
from tests.browser.conftest import pages_of

pytest.importorskip("selenium", reason="needs selenium: install the dev extra")

pytestmark = pytest.mark.processes  # real processes or servers: slow


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
            problems = [(v["id"], v["impact"], v["nodes"]) for v in violations(page.driver)]
            # Named by a label or aria-label, not by a placeholder alone (axe takes a
            # placeholder for a name); and the navbar within the screen.
            unlabelled = page.driver.execute_script(UNLABELLED)
            if unlabelled:
                problems.append(("unlabelled", unlabelled))
            navbar = page.driver.execute_script(NAVBAR_OVERFLOW)
            if navbar:
                problems.append(("navbar", navbar))
            if problems:
                found[path] = problems
        assert found == {}
    finally:
        page.driver.set_window_size(1280, 1000)


STAFF_LISTS = ["/admin/audit/", "/admin/builds/", "/admin/markers/", "/admin/api_keys/",
               "/admin/user/", "/admin/plan/", "/admin/connections/", "/admin/assignments/",
               "/support/plans", "/support/", "/admin/retention/"]


@pytest.fixture
def staff_rows(committed):
    """Rows with the longest values a staff list shows: audit events whose actor, owner
    and target are a person with a long email, and builds of theirs."""
    from dashboard.audit.services import Actor, record_event
    from tests.factories import make_build_record

    people = [committed.user(email=f"a-rather-long-address-{n}@subdomain.example.test")
              for n in range(3)]
    for person in people:
        for n in range(4):
            record_event(committed.session, action="assignment.set", actor=Actor.of(person),
                         owner_id=person.id, target_type="plan", target_id=str(person.id),
                         details={"before": {"row": "default"}, "after": {"row": "off"},
                                  "source_key": "orbitpilot.chat_history", "n": n})
        committed.session.add(make_build_record(person, mode="full", trigger="admin"))
    committed.session.commit()
    return people


@pytest.mark.parametrize("size", ["desktop", "phone"])
def test_every_staff_list_fits_its_box_and_breaks_no_word(page, world, staff_rows, size):
    """At 1280 px every list is as wide as its box at most, and every word of every cell
    is on one line inside its cell (a long email or id is cut short with the whole of it
    on hover). On a phone a list's rows are cards; a matrix (assignments, retention, the
    plan report) scrolls in its own labelled region, its cells still whole words."""
    _, emails = world
    page.driver.set_window_size(*WINDOWS[size])
    try:
        page.sign_in(emails["admin"])
        found = {}
        for path in STAFF_LISTS:
            page.open(path)
            problems = page.driver.execute_script(STAFF_LIST_PROBLEMS, "table")
            if not page.driver.execute_script(
                    "return document.documentElement.scrollWidth <= window.innerWidth"):
                problems.append("the page scrolls sideways")
            if problems:
                found[path] = problems
        assert found == {}
    finally:
        page.driver.set_window_size(1280, 1000)


IDENTITY_PAGES = {"guest": ["/"], "user": ["/memory/status"],
                  "support": ["/memory/status", "/admin/"],
                  "admin": ["/memory/status", "/admin/"]}


# A desktop's and a phone's, and the narrowest at which the menu is unfolded (1200 px:
# Bootstrap's xl), where a line of links is tightest.
NAVBAR_WIDTHS = {**WINDOWS, "narrowest-unfolded": (1200, 900)}
# The text as this machine's fonts draw it, and a browser's "Large" text (20 px for 16):
# fonts elsewhere run wider than the test machine's, so a navbar that fits here by a few
# pixels does not fit there ("Sign out" pushed off the screen). Only the larger text
# proved that: at the default size the line fit with 16 px to spare, wrapping rule or not.
TEXT_SIZES = {"default": "", "large": "125%"}


def test_the_navbar_fits_for_every_identity_at_every_width(page, world):
    """Staff have one link more on a user page: the navbar still fits, "Sign out" shown
    whole, at a desktop's width, a phone's and the narrowest with the menu unfolded (the
    page resized, not reloaded), with the default text and a larger one."""
    _, emails = world
    found = {}
    try:
        for identity, paths in IDENTITY_PAGES.items():
            if identity == "guest":
                page.driver.delete_all_cookies()
            else:
                page.sign_in(emails[identity])
            for path in paths:
                page.open(path)
                for size in NAVBAR_WIDTHS:
                    page.driver.set_window_size(*NAVBAR_WIDTHS[size])
                    for text, font_size in TEXT_SIZES.items():
                        page.driver.execute_script(
                            "document.documentElement.style.fontSize = arguments[0]", font_size)
                        problems = page.driver.execute_script(NAVBAR_OVERFLOW)
                        if problems:
                            found[(identity, path, size, text)] = problems
    finally:
        page.driver.set_window_size(1280, 1000)
    assert found == {}
