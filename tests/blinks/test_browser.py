"""The eye on a Blink in a real browser (headless Chromium, under the real CSP): one click
flips icon and label in place, without a page load, and the next click flips it back.
The browser, the live server and ``page``: tests/browser/conftest.py."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from dashboard.blinks.models import Blink
from dashboard.blinks.services import EXCLUDED_LABEL, READS_LABEL
from tests.browser.conftest import base_url, browser, live_app, page  # noqa: F401

pytestmark = pytest.mark.processes  # real processes or servers: slow

EYE = "form[data-memory-toggle] button"


@pytest.fixture
def blink_owner(committed):
    user = committed.user()
    blink = Blink(user_id=user.id, title="Browser Blink", content="read me, or don't")
    committed.session.add(blink)
    committed.session.commit()
    return user, blink.id


def stored_flag(committed, blink_id: int) -> bool:
    committed.session.rollback()
    return committed.session.scalar(
        select(Blink.excluded_from_memory).where(Blink.id == blink_id))


def test_the_eye_flips_in_place_without_a_reload(page, blink_owner, committed):  # noqa: F811
    user, blink_id = blink_owner
    page.sign_in(user.email)
    page.open("/blinks/")
    assert READS_LABEL in page.find(EYE).text
    # A page load would forget this mark.
    page.driver.execute_script("window.__noReload = true;")

    page.click(EYE)
    page.wait().until(lambda d: EXCLUDED_LABEL in page.find(EYE).text)
    icon = page.find(f"{EYE} i")
    assert "bi-eye-slash" in icon.get_attribute("class")
    assert page.driver.execute_script("return window.__noReload === true;")
    assert stored_flag(committed, blink_id) is True

    page.click(EYE)
    page.wait().until(lambda d: READS_LABEL in page.find(EYE).text)
    assert "bi-eye-slash" not in page.find(f"{EYE} i").get_attribute("class")
    assert page.driver.execute_script("return window.__noReload === true;")
    assert stored_flag(committed, blink_id) is False
    page.assert_no_violations()


def test_the_blink_pages_render_under_the_policy(page, blink_owner):  # noqa: F811
    user, blink_id = blink_owner
    page.sign_in(user.email)
    for path in ("/blinks/", f"/blinks/edit/?id={blink_id}", f"/blinks/delete/?id={blink_id}",
                 "/profile/", "/documents/"):
        page.open(path)
    page.assert_no_violations()
