"""The consent page in a real browser (headless Chromium): a person signs in, reads what
the app asks for in words, one labelled box per scope, ticks one more with the keyboard
alone, allows — and the app gets a code for what was ticked; denies — and the app gets
access_denied. Ticking a team says, then and there, that the app will save to it. The
page works at a phone's width (390 px) and carries no CSP violation."""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

import httpx2
import pytest
from sqlalchemy import select

from dashboard.connectors.models import OAuthGrant
from dashboard.connectors.services import SCOPE_WORDS
from tests.browser.conftest import Page
from tests.connectors.oauth_flow import REDIRECT_URI, authorize_url, pkce
from tests.factories import make_team

pytest.importorskip("selenium", reason="needs selenium: install the dev extra")
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402

pytestmark = pytest.mark.processes  # real processes or servers: slow


@pytest.fixture
def person(committed):
    user = committed.user(email="consenting@example.test")
    committed.session.commit()
    return user


def register(base_url: str) -> str:
    answer = httpx2.post(f"{base_url}/oauth/register", json={
        "client_name": "Claude (browser test)", "redirect_uris": [REDIRECT_URI],
        "grant_types": ["authorization_code", "refresh_token"],
        "token_endpoint_auth_method": "none"})
    assert answer.status_code == 201, answer.text
    return answer.json()["client_id"]


def returned(page: Page) -> dict[str, str]:
    """Where the browser was sent back to (nothing listens there: the address is all)."""
    page.wait().until(lambda d: d.current_url.startswith(REDIRECT_URI))
    return {k: v[0] for k, v in parse_qs(urlsplit(page.driver.current_url).query).items()}


def open_consent(page: Page, base_url: str, client_id: str, challenge: str) -> None:
    # What an MCP client asks for by default: the scopes the resource metadata advertises.
    page.open(authorize_url(client_id, challenge, resource=f"{base_url}/mcp",
                            scope="memory:read memory:write"))


def tab_to(page: Page, element) -> None:
    """Press Tab until ``element`` has the focus (the keyboard alone)."""
    for _ in range(60):
        if page.driver.switch_to.active_element == element:
            return
        page.driver.switch_to.active_element.send_keys(Keys.TAB)
    assert page.driver.switch_to.active_element == element


# Each box, its label's words, and whether it is ticked: what a screen reader announces.
BOXES = """return [...document.querySelectorAll('#consent input[type=checkbox]')].map(
    box => [box.value, box.labels.length === 1 ? box.labels[0].innerText.trim() : null,
            box.checked]);"""


def test_allow_gives_the_app_a_code_for_what_was_ticked(page, base_url, person):
    client_id = register(base_url)
    verifier, challenge = pkce()
    page.sign_in(person.email)
    open_consent(page, base_url, client_id, challenge)
    assert "Connect Claude (browser test) to your memory?" in page.text
    assert "Unverified app" in page.text
    assert [(scope, label.startswith(SCOPE_WORDS[scope]), ticked) for scope, label, ticked
            in page.driver.execute_script(BOXES)] == [
        ("memory:read", True, True), ("memory:write", True, True),
        ("memory:delete", True, False), ("memory:redact", True, False)]
    page.screenshot("consent.png")
    page.assert_no_violations()
    # The keyboard alone: Tab to "delete", Space ticks it, Tab to Allow, Enter.
    delete = page.find("#consent input[value='memory:delete']")
    tab_to(page, delete)
    delete.send_keys(Keys.SPACE)
    assert delete.is_selected()
    allow = page.find("#consent button[value=allow]")
    tab_to(page, allow)
    allow.send_keys(Keys.ENTER)
    params = returned(page)
    assert params["state"] == "s1" and params["code"].startswith("opac_")
    answer = httpx2.post(f"{base_url}/oauth/token", data={
        "grant_type": "authorization_code", "code": params["code"], "code_verifier": verifier,
        "redirect_uri": REDIRECT_URI, "client_id": client_id})
    assert answer.status_code == 200, answer.text
    assert answer.json()["scope"] == "memory:read memory:write memory:delete"


def test_on_a_phone_every_box_fits_and_a_label_ticks_its_box(page, base_url, person):
    client_id = register(base_url)
    verifier, challenge = pkce()
    page.driver.set_window_size(390, 844)
    try:
        page.sign_in(person.email)
        # The dock as a person left it closed on the pages before (it remembers).
        page.driver.execute_script("window.localStorage.setItem('orbitpilot.dock.open', '0')")
        open_consent(page, base_url, client_id, challenge)
        assert page.driver.execute_script(
            "return document.documentElement.scrollWidth <= window.innerWidth")
        for element in page.driver.find_elements(By.CSS_SELECTOR,
                                                 "#consent input, #consent label, "
                                                 "#consent button"):
            if element.get_attribute("type") == "hidden":
                continue
            box = element.rect
            assert box["x"] >= 0 and box["x"] + box["width"] <= 390, element.text
        page.screenshot("consent-phone.png")
        page.click("label[for=scope-2]")  # the words untick "save new memories"
        assert not page.find("#scope-2").is_selected()
        # No chat dock over the answer (closed or open, it is not on this page), and
        # nothing else over Allow: the point at its middle is Allow itself.
        assert page.driver.find_elements(By.CSS_SELECTOR, ".op-dock") == []
        allow = page.find("#consent button[value=allow]")
        page.driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", allow)
        assert page.driver.execute_script(
            "const r = arguments[0].getBoundingClientRect();"
            "const hit = document.elementFromPoint(r.left + r.width / 2, r.top + r.height / 2);"
            "return [r.bottom <= window.innerHeight, r.right <= window.innerWidth,"
            " hit === arguments[0] || arguments[0].contains(hit)];", allow) == [True] * 3
        page.click("#consent button[value=allow]")
        params = returned(page)
    finally:
        page.driver.set_window_size(1280, 1000)
    answer = httpx2.post(f"{base_url}/oauth/token", data={
        "grant_type": "authorization_code", "code": params["code"], "code_verifier": verifier,
        "redirect_uri": REDIRECT_URI, "client_id": client_id})
    assert answer.json()["scope"] == "memory:read"
    page.assert_no_violations()


def test_deny_sends_access_denied_back_to_the_app(page, base_url, person):
    client_id = register(base_url)
    _, challenge = pkce()
    page.sign_in(person.email)
    open_consent(page, base_url, client_id, challenge)
    page.click("#consent button[value=deny]")
    params = returned(page)
    assert params["error"] == "access_denied" and "code" not in params


def test_ticking_a_team_says_the_app_will_save_there_and_the_connection_holds_it(
        page, base_url, committed, person):
    team = make_team(committed.session, committed.user(), name="Pilot",
                     members={person: "member"})
    committed.users.append(team.id)  # the team's account, removed with the test's users
    committed.session.commit()
    client_id = register(base_url)
    _, challenge = pkce()
    page.sign_in(person.email)
    open_consent(page, base_url, client_id, challenge)
    assert page.find("#acts-for").text == "It acts for you alone."
    assert not page.find("#team-1").is_selected()  # none ticked for the person
    page.click("label[for=team-1]")
    assert page.find("#team-1").is_selected()
    page.wait().until(lambda d: d.find_element(By.ID, "acts-for").text ==
                      "It may save to: Pilot (as member).")
    page.screenshot("consent-team.png")
    page.assert_no_violations()
    page.click("#consent button[value=allow]")
    assert returned(page)["code"].startswith("opac_")
    grant = committed.session.scalars(select(OAuthGrant).where(
        OAuthGrant.user_id == person.id)).one()
    assert grant.team_ids == [team.id]
