"""Evidence in a real browser: the pilot lead opens the team's evidence page, runs the
deletion/export drill and asks for a report; a real worker runs both jobs; the lead
downloads the printable report, which names the team's members, their roles and its
policies, shows the drill passed, and holds no memory content (a canary saved to the
team). The page passes axe-core's rules and carries no CSP violation."""

from __future__ import annotations

import pytest
from sqlalchemy import delete

from dashboard.auth.models import User
from dashboard.evidence.drill import SANDBOX_EMAIL
from tests.browser.axe import checked
from tests.factories import make_memory, make_team
from tests.workers import run_worker

pytest.importorskip("selenium", reason="needs selenium: install the dev extra")

pytestmark = pytest.mark.processes  # Chromium, a served app, a real worker

SLUG = "evidence-pilot"
CANARY = "canary-7d2e evidence never shows this"


@pytest.fixture
def pilot(committed):
    lead = committed.user(email="evidence-lead@example.test")
    lead.display_name = "Lena Lead"
    member = committed.user(email="evidence-member@example.test")
    member.display_name = "Mo Member"
    team = make_team(committed.session, lead, slug=SLUG, name="Evidence pilot",
                     members={member: "member"}, max_key_days=14, app_policy="allow_list")
    make_memory(committed.session, team.account, CANARY)
    committed.users.append(team.id)  # the team's account: its rows cascade with it
    committed.session.commit()
    email = lead.email
    # No transaction of this process may stay open: its snapshot would hold the drill's
    # VACUUM back (the drill then fails, rightly: open transactions could still read).
    committed.session.rollback()
    yield email
    committed.session.rollback()
    committed.session.execute(delete(User).where(User.email == SANDBOX_EMAIL))
    committed.session.commit()


def test_the_lead_runs_the_drill_and_downloads_the_report(page, pilot, live_app, axe,
                                                          tmp_path):
    found: dict = {}
    page.sign_in(pilot)
    page.open(f"/teams/{SLUG}/evidence")
    checked(page.driver, found, "evidence (empty)")
    page.click("#run-drill")
    page.wait_for_text("The drill is running on the sandbox account")
    page.click("#ask")
    page.wait().until(lambda d: page.find("#export").get_attribute("data-status") == "queued")
    output = run_worker(live_app)  # the drill, then the report (and the save's build)
    assert "evidence-drill-" in output and "evidence-report-" in output
    page.open(f"/teams/{SLUG}/evidence")
    assert page.find("#export").get_attribute("data-status") == "ready"
    assert page.find("#drill-result").text == "passed"
    checked(page.driver, found, "evidence (ready)")
    page.driver.execute_cdp_cmd("Browser.setDownloadBehavior", {
        "behavior": "allow", "downloadPath": str(tmp_path)})
    page.click("#download-html")
    page.wait().until(lambda d: [p for p in tmp_path.iterdir() if p.suffix == ".html"])
    (path,) = tmp_path.glob("*.html")
    html = path.read_text()
    assert "Lena Lead" in html and "Mo Member" in html
    assert "<td>owner</td>" in html and "<td>member</td>" in html
    assert "key lifetime: 14 days" in html and "apps: allow_list" in html
    assert 'id="check-team.drill" data-status="pass"' in html
    assert "canary-7d2e" not in html
    assert found == {}
    page.assert_no_violations()
