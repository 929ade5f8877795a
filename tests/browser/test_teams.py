"""Teams in a real browser (headless Chromium), at a phone's width: the pilot lead creates
a team and invites a member; in a second browser session the member, signed in as the
invited address, accepts; the member saves a memory on the team memories page (by the
keyboard); the lead sees it, saying who saved it. Every team page passes axe-core's WCAG
2.1 AA rules, labels every form control, fits the screen, and carries no
Content-Security-Policy violation. A desktop's width is the whole pilot journey's
(test_pilot_journey.py), which checks the same pages on the way."""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest
from sqlalchemy import delete, select

from dashboard.auth.models import User
from dashboard.teams.models import Team
from tests.browser.axe import checked
from tests.browser.conftest import focus_and_enter

pytest.importorskip("selenium", reason="needs selenium: install the dev extra")
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402
from selenium.webdriver.support.ui import Select  # noqa: E402

pytestmark = pytest.mark.processes  # real processes or servers: slow

PHONE = (390, 844)


@pytest.fixture
def people(committed):
    """The lead and the person they invite, committed for the live server; the team the
    test makes (its account a users row) is deleted with them."""
    lead = committed.user(email="pilot-lead@example.test")
    lead.display_name = "Lena Lead"
    member = committed.user(email="pilot-member@example.test")
    member.display_name = "Mo Member"
    committed.session.commit()
    yield lead, member
    session = committed.session
    session.rollback()
    accounts = session.scalars(select(Team.id).where(Team.created_by_id == lead.id)).all()
    if accounts:
        session.execute(delete(User).where(User.id.in_(accounts)))
        session.commit()


def test_on_a_phone_a_lead_invites_a_member_who_saves_to_the_team(page, second, axe, people):
    lead, member = people
    slug = "pilot-phone"
    found: dict = {}
    for browser in (page, second):
        browser.driver.set_window_size(*PHONE)
        browser.driver.set_script_timeout(60)
    try:
        # The lead makes the team: typed, and sent with Enter.
        page.sign_in(lead.email)
        page.open("/teams/")
        checked(page.driver, found, "teams")
        page.find("#name").send_keys("Pilot team")
        page.find("#slug").send_keys(slug, Keys.ENTER)
        page.wait().until(lambda d: d.current_url.endswith(f"/teams/{slug}/"))
        page.settle()
        assert "Team Pilot team created" in page.text
        checked(page.driver, found, "home")
        # An invitation, its link shown once.
        page.find("#email").send_keys(member.email)
        Select(page.find("select#role")).select_by_value("member")
        page.click("#invitations form button[type=submit]")
        link = page.find("#invitation-link").get_attribute("value")
        assert "/teams/join/opti_" in link
        checked(page.driver, found, "invited")
        # The member, in a browser of their own, signed in as the invited address.
        second.sign_in(member.email)
        second.open(urlsplit(link).path)
        assert "Join Pilot team?" in second.text
        checked(second.driver, found, "join")
        second.click("#join form button[type=submit]")
        second.wait().until(lambda d: d.current_url.endswith(f"/teams/{slug}/"))
        second.settle()
        assert "Welcome to Pilot team" in second.text
        # The member saves to the team: typed, then Tab to "Save to …" and Enter.
        second.open(f"/teams/{slug}/memories/")
        checked(second.driver, found, "memories (empty)")
        second.find("#content").send_keys("The release train leaves every second Tuesday.")
        focus_and_enter(second, "#save-to-team")
        second.wait_for_text("Saved to Pilot team.")
        # The lead sees it, and who saved it with what.
        page.open(f"/teams/{slug}/memories/")
        card = page.find("article.uc-memory")
        assert "The release train leaves every second Tuesday." in card.text
        assert "Saved by Mo Member via OrbitPilot" in card.text
        assert card.find_element(By.LINK_TEXT, "Who can see this?").get_attribute(
            "href").endswith(f"/teams/{slug}/access")
        checked(page.driver, found, "memories")
        for path in ("", "status", "access", "settings", "audit",
                     f"members/remove?user_id={member.id}", "leave", "memories/receipts/"):
            page.open(f"/teams/{slug}/{path}")
            checked(page.driver, found, path or "home with a member")
        page.screenshot("phone-team-memories.png")
        assert found == {}
        page.assert_no_violations()
        second.assert_no_violations()
    finally:
        page.driver.set_window_size(1280, 1000)
