"""The keyboard alone, in headless Chromium: sign in, chat, the eye on a message, Memory
Status and "update my memory now"; then, as an admin, a cap change through its impact
preview. Every step is Tab (or Shift+Tab) to a control, which must show that it has the
focus, and Enter or Space on it: no mouse, no script clicks."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from dashboard.orbitpilot.models import Message
from dashboard.plans.models import Plan
from tests.factories import PASSWORD

pytest.importorskip("selenium", reason="needs selenium: install the dev extra")
from selenium.webdriver.common.action_chains import ActionChains  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402

pytestmark = pytest.mark.processes  # real processes or servers: slow

MAX_TABS = 120
# The focus is shown: an outline or a focus ring (box-shadow) on the focused control.
FOCUS_SHOWN = """
const e = document.activeElement, s = getComputedStyle(e);
return (s.outlineStyle !== 'none' && parseFloat(s.outlineWidth) > 0) ||
       (s.boxShadow && s.boxShadow !== 'none');"""


def press(page, *keys: str) -> None:
    ActionChains(page.driver).send_keys(*keys).perform()


def tab_to(page, css: str, *, back: bool = False) -> None:
    """Tab (Shift+Tab with ``back``) until the focus is on what ``css`` matches."""
    key = (Keys.SHIFT, Keys.TAB) if back else (Keys.TAB,)
    for _ in range(MAX_TABS):
        chain = ActionChains(page.driver)
        if back:
            chain.key_down(Keys.SHIFT).send_keys(Keys.TAB).key_up(Keys.SHIFT)
        else:
            chain.send_keys(*key)
        chain.perform()
        if page.driver.execute_script(
                "return document.activeElement.matches(arguments[0])", css):
            assert page.driver.execute_script(FOCUS_SHOWN), f"{css}: focus not shown"
            return
    raise AssertionError(f"{MAX_TABS} presses of Tab never reached {css}")


@pytest.fixture
def keyboard_user(committed):
    """A user whose plan remembers chat history, and an admin; committed."""
    user = committed.user(plan=committed.plan(cap=4), email="keys@example.test")
    admin = committed.user(role="admin", email="keys-admin@example.test")
    target = committed.plan(cap=3)
    committed.session.commit()
    return user, admin, target


def test_chat_the_eye_memory_status_and_a_cap_preview_by_keyboard_alone(
        page, committed, keyboard_user):
    user, admin, target = keyboard_user
    session = committed.session
    page.driver.delete_all_cookies()
    page.open("/auth/signin")
    tab_to(page, "input[name=email]")
    press(page, user.email)
    tab_to(page, "input[name=password]")
    press(page, PASSWORD, Keys.ENTER)
    page.wait().until(lambda d: "/auth/signin" not in d.current_url)

    # The chat, from the menu.
    tab_to(page, "[data-op-nav] a.nav-link[href='/orbitpilot/']")
    press(page, Keys.ENTER)
    page.wait().until(lambda d: d.current_url.endswith("/orbitpilot/"))
    page.settle()
    tab_to(page, ".op-main [data-op-composer] textarea")
    press(page, "Plan a day in Lisbon for me")
    tab_to(page, ".op-main [data-op-composer] button[type=submit]")
    press(page, Keys.ENTER)
    page.wait().until(lambda d: d.find_elements("css selector", ".op-main .op-msg-assistant"))

    # The eye on my message: Space on the focused button.
    eye = ".op-main .op-msg-user [data-op-action=remember] button"
    tab_to(page, eye, back=True)
    press(page, Keys.SPACE)
    page.wait().until(lambda d: d.find_element(
        "css selector", ".op-main .op-msg-user").get_attribute("data-not-remembered") == "true")
    session.rollback()
    (asked,) = session.scalars(select(Message).where(Message.user_id == user.id,
                                                     Message.role == "user")).all()
    assert asked.not_remembered is True

    # Memory Status, from the menu; it counts the mark; "update my memory now".
    tab_to(page, "[data-op-nav] a.nav-link[href='/memory/status']", back=True)
    press(page, Keys.ENTER)
    page.wait().until(lambda d: d.current_url.endswith("/memory/status"))
    page.settle()
    assert page.find("#not-remembered").get_attribute("data-count") == "1"
    tab_to(page, "form[action$='/memory/update'] button")
    press(page, Keys.ENTER)
    # The eye's change asked for the build already: this request joins it.
    page.wait_for_text("An update was already waiting for a worker; your request joined it.")

    # An admin: the cap of a plan, through the impact preview, confirmed.
    page.sign_in(admin.email)
    page.open("/admin/assignments/")
    tab_to(page, f"#cap-{target.id}")
    press(page, Keys.CONTROL, "a")
    press(page, "4")
    tab_to(page, f"#plan-{target.id} form button[type=submit]")
    press(page, Keys.ENTER)
    page.wait().until(lambda d: d.find_elements("css selector", "#confirm"))
    page.settle()
    tab_to(page, "#confirm")
    press(page, Keys.ENTER)
    page.wait().until(lambda d: not d.find_elements("css selector", "#confirm"))
    session.rollback()
    assert session.get(Plan, target.id).included_sources == 4
    page.assert_no_violations()
