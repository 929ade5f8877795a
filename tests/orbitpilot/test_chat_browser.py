"""The chat's script in a real browser (headless Chromium) under the real CSP: the eye
toggles without a reload, sending and Catch work by fetch, the dock sends from any page.
Uses the browser fixtures of tests/browser, imported by this folder's conftest (they skip
without Chromium, which fails in CI)."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from dashboard.blinks.models import Blink
from dashboard.memory.embedders import HashingEmbedder
from dashboard.memory.pipeline import run_memory_build
from dashboard.orbitpilot.models import Message
from tests.factories import make_conversation

pytest.importorskip("selenium", reason="needs selenium: install the dev extra")
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402

pytestmark = pytest.mark.processes  # real processes or servers: slow


@pytest.fixture
def chatter(committed):
    plan = committed.plan(cap=4)
    user = committed.user(plan=plan)
    conversation, messages = make_conversation(
        committed.session, user, [("Plan a day in Lisbon", "Trams, then pastéis."),
                                  ("<script>alert(1)</script>", "That is code.")],
        title="Lisbon")
    committed.session.commit()
    return user, conversation, messages


def message_flag(committed, message_id: int) -> bool:
    committed.session.expire_all()
    return committed.session.scalars(
        select(Message.not_remembered).where(Message.id == message_id)).one()


def test_the_eye_send_and_catch_work_without_a_reload(page, chatter, committed):
    user, conversation, messages = chatter
    page.sign_in(user.email)
    page.open(f"/orbitpilot/c/{conversation.id}")
    assert "<script>alert(1)</script>" in page.text  # shown as text
    page.driver.execute_script("window.opMarker = 'same page';")
    question = messages[0]

    page.click(f'[data-message-id="{question.id}"] [data-op-action=remember] button')
    page.wait().until(lambda d: d.find_element(
        By.CSS_SELECTOR, f'[data-message-id="{question.id}"] [data-op-flag]').is_displayed())
    icon = page.find(f'[data-message-id="{question.id}"] [data-op-action=remember] i')
    assert "bi-eye-slash" in icon.get_attribute("class").split()
    flag = page.find(f'[data-message-id="{question.id}"] [data-op-flag]')
    assert flag.text == "Not remembered"
    assert message_flag(committed, question.id) is True
    page.screenshot("chat-flagged.png")

    page.click(f'[data-message-id="{question.id}"] [data-op-action=remember] button')
    page.wait().until(lambda d: not d.find_element(
        By.CSS_SELECTOR, f'[data-message-id="{question.id}"] [data-op-flag]').is_displayed())
    assert message_flag(committed, question.id) is False

    box = page.find("[data-op-composer] textarea")
    box.send_keys("What about Porto?")
    box.send_keys(Keys.ENTER)
    page.wait().until(lambda d: len(d.find_elements(By.CSS_SELECTOR, ".op-msg")) == 6)
    assert "What about Porto?" in page.text

    reply = page.driver.find_elements(By.CSS_SELECTOR, ".op-msg-assistant")[-1]
    reply.find_element(By.CSS_SELECTOR, "[data-op-action=catch] button").click()
    page.wait().until(lambda d: "Saved as a Blink" in page.text)
    committed.session.expire_all()
    blink = committed.session.scalars(select(Blink).where(Blink.user_id == user.id)).one()
    caught = reply.find_element(By.CSS_SELECTOR, "[data-op-caught] a")
    assert caught.get_attribute("href").endswith(f"/blinks/edit/?id={blink.id}")

    assert page.driver.execute_script("return window.opMarker") == "same page"
    page.screenshot("chat-caught.png")  # not docs/screenshots/chat.png: another page
    page.assert_no_violations()


def test_the_dock_sends_from_any_page(page, chatter):
    user, conversation, _ = chatter
    page.sign_in(user.email)
    page.open("/")
    page.driver.execute_script("window.opMarker = 'same page';")
    page.click("details[data-op-dock] > summary")
    box = page.find("details[data-op-dock] textarea")
    box.send_keys("Hello from the dock")
    page.click("details[data-op-dock] [data-op-composer] button[type=submit]")
    page.wait().until(lambda d: "Hello from the dock" in d.find_element(
        By.CSS_SELECTOR, "details[data-op-dock] [data-op-thread]").text)
    assert page.driver.execute_script("return window.opMarker") == "same page"
    page.screenshot("dock.png")
    page.assert_no_violations()


def test_a_guest_chats_in_the_browser(page):
    page.driver.delete_all_cookies()
    page.open("/orbitpilot/")
    box = page.find("[data-op-composer] textarea")
    box.send_keys("Hello as a guest")
    box.send_keys(Keys.ENTER)
    page.wait().until(lambda d: len(d.find_elements(By.CSS_SELECTOR, ".op-msg")) == 2)
    assert page.driver.find_elements(By.CSS_SELECTOR, "[data-op-action]") == []
    page.screenshot("chat-guest.png")
    page.assert_no_violations()


def test_a_reply_shows_what_it_drew_on_and_not_relevant_takes_it_off(page, chatter,
                                                                     committed):
    user, conversation, _ = chatter
    run_memory_build(user, "full", session=committed.session, embedder=HashingEmbedder())
    committed.session.commit()
    page.driver.set_window_size(390, 844)  # a phone
    page.sign_in(user.email)
    page.open(f"/orbitpilot/c/{conversation.id}")
    box = page.find("[data-op-composer] textarea")
    box.send_keys("Lisbon trams again?")
    box.send_keys(Keys.ENTER)
    page.wait().until(lambda d: d.find_elements(By.CSS_SELECTOR, "[data-op-drew-on-item]"))
    item = page.find("[data-op-drew-on-item]")
    link = item.find_element(By.TAG_NAME, "a")
    assert link.text.startswith("an earlier conversation")
    assert link.get_attribute("href").endswith(f"/orbitpilot/c/{conversation.id}#m"
                                               + str(_first_turn(committed, conversation)))
    # The list and its actions fit the phone's width (wrapping, not overflowing).
    wide = page.driver.execute_script(
        "return [...document.querySelectorAll('[data-op-drew-on] *')].filter(e => "
        "e.getBoundingClientRect().right > window.innerWidth).map(e => e.tagName)")
    assert wide == []
    page.screenshot("chat-drew-on.png")
    listed = [e.get_attribute("data-item-id") for e in
              page.driver.find_elements(By.CSS_SELECTOR, "[data-op-drew-on-item]")]
    item.find_element(By.XPATH, ".//button[starts-with(normalize-space(.), 'Not relevant')]"
                      ).click()
    page.wait().until(lambda d: "Marked not relevant" in page.text)
    assert [e.get_attribute("data-item-id") for e in page.driver.find_elements(
        By.CSS_SELECTOR, "[data-op-drew-on-item]")] == listed[1:]
    page.assert_no_violations()


def _first_turn(committed, conversation) -> int:
    return committed.session.scalars(select(Message.id).where(
        Message.conversation_id == conversation.id, Message.role == "user")
        .order_by(Message.position)).first()
