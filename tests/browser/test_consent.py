"""The consent page in a real browser (headless Chromium): a person signs in, reads what
the app asks for in words, allows — and the app gets a code it can exchange; denies — and
the app gets access_denied. The page is keyboard-reachable and carries no CSP violation."""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

import httpx2
import pytest

from dashboard.connectors.services import SCOPE_WORDS
from tests.browser.conftest import Page
from tests.connectors.oauth_flow import REDIRECT_URI, authorize_url, pkce

pytest.importorskip("selenium", reason="needs selenium: install the dev extra")
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
    page.open(authorize_url(client_id, challenge, resource=f"{base_url}/mcp",
                            scope="memory:read memory:write memory:delete"))


def test_allow_gives_the_app_a_code_it_can_exchange(page, base_url, person):
    client_id = register(base_url)
    verifier, challenge = pkce()
    page.sign_in(person.email)
    open_consent(page, base_url, client_id, challenge)
    assert "Connect Claude (browser test) to your memory?" in page.text
    assert "Unverified app" in page.text
    for scope in ("memory:read", "memory:write", "memory:delete"):
        assert SCOPE_WORDS[scope] in page.text
    page.screenshot("consent.png")
    page.assert_no_violations()
    # The keyboard alone: Tab to Allow, Enter.
    allow = page.find("#consent button[value=allow]")
    for _ in range(60):
        if page.driver.switch_to.active_element == allow:
            break
        page.driver.switch_to.active_element.send_keys(Keys.TAB)
    assert page.driver.switch_to.active_element == allow
    allow.send_keys(Keys.ENTER)
    params = returned(page)
    assert params["state"] == "s1" and params["code"].startswith("opac_")
    answer = httpx2.post(f"{base_url}/oauth/token", data={
        "grant_type": "authorization_code", "code": params["code"], "code_verifier": verifier,
        "redirect_uri": REDIRECT_URI, "client_id": client_id})
    assert answer.status_code == 200, answer.text
    assert answer.json()["scope"] == "memory:read memory:write memory:delete"


def test_deny_sends_access_denied_back_to_the_app(page, base_url, person):
    client_id = register(base_url)
    _, challenge = pkce()
    page.sign_in(person.email)
    open_consent(page, base_url, client_id, challenge)
    page.click("#consent button[value=deny]")
    params = returned(page)
    assert params["error"] == "access_denied" and "code" not in params
