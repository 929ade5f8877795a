"""A user's whole journey in a real browser (headless Chromium), with a real worker:
chat, the eye on one message (no reload; it persists), Catch, Memory Status showing that
pair among the next build's removals, "update my memory now", the worker's build, its
result on the page. Then the same toggle with JavaScript switched off, through the form.
Screenshots of the chat, Memory Status and Blinks pages (those of docs/screenshots/) go to
pytest's temporary directory, or to $ORBITPILOT_SCREENSHOTS (conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import select

from dashboard.blinks.models import Blink
from dashboard.memory import MemoryBuild
from dashboard.orbitpilot.models import Message
from tests.browser.conftest import Page, chromium, screenshots_folder
from tests.factories import builds_of
from tests.workers import run_worker

pytest.importorskip("selenium", reason="needs selenium: install the dev extra")
from selenium.webdriver.common.by import By  # noqa: E402

pytestmark = pytest.mark.processes  # real processes or servers: slow

CHAT = "orbitpilot.chat_history"


def fresh_builds_of(session, user_id: int) -> list[MemoryBuild]:
    session.rollback()  # a fresh snapshot: the server and the worker commit on their own
    return builds_of(session, user_id)


@pytest.fixture
def traveller(committed):
    """A user whose plan remembers chat history (cap 4), committed for the live server."""
    user = committed.user(plan=committed.plan(cap=4), email="traveller@example.test")
    committed.session.commit()
    return user


def send(page: Page, text: str) -> None:
    before = len(page.driver.find_elements(By.CSS_SELECTOR, ".op-main .op-msg-assistant"))
    page.find(".op-main form[data-op-composer] textarea[name=message]").send_keys(text)
    page.click(".op-main form[data-op-composer] button[type=submit]")
    page.wait().until(lambda d: len(d.find_elements(
        By.CSS_SELECTOR, ".op-main .op-msg-assistant")) > before)


def test_chat_eye_catch_memory_status_update_and_the_worker(page, live_app, committed,
                                                            traveller):
    session = committed.session
    page.sign_in(traveller.email)
    page.open("/orbitpilot/")
    page.driver.execute_script("window.__sameDocument = true;")
    end = ".op-main form[data-op-end]"
    assert not page.driver.find_element(By.CSS_SELECTOR, end).is_displayed()  # none yet
    send(page, "Plan a day in Lisbon for me")
    # The first send made the conversation: its End button is there at once.
    page.wait().until(lambda d: d.find_element(By.CSS_SELECTOR, end).is_displayed())
    send(page, "Also remind me that I prefer window seats")
    assert page.driver.execute_script("return window.__sameDocument === true;")
    session.rollback()
    (conversation_id,) = session.scalars(select(Message.conversation_id).where(
        Message.user_id == traveller.id).distinct()).all()
    page.screenshot("chat.png")

    # End the conversation, without a reload since the first send: its build is
    # requested; a real worker runs it.
    page.click(f"{end} button[type=submit]")
    page.settle()
    assert page.driver.current_url == f"{page.base_url}/orbitpilot/c/{conversation_id}"
    run_worker(live_app)
    (first,) = fresh_builds_of(session, traveller.id)
    assert (first.status, first.trigger, first.added) == ("succeeded", "conversation_end", 2)

    # The eye on the first message: label appears, icon flips, and the page is not
    # reloaded (a marker set on this document survives).
    (asked,) = session.scalars(select(Message).where(
        Message.user_id == traveller.id, Message.role == "user",
        Message.position == 0)).all()
    page.open(f"/orbitpilot/c/{asked.conversation_id}")
    page.driver.execute_script("window.__sameDocument = true;")
    mine = f"#m{asked.id}"
    its_reply = f'.op-main .op-msg[data-answers="{asked.id}"] [data-op-covered]'
    assert page.find(f"{mine} .op-actions i.bi").get_attribute("class").split()[-1] == "bi-eye"
    assert not page.driver.find_element(By.CSS_SELECTOR, its_reply).is_displayed()
    page.click(f"{mine} form[data-op-action=remember] button")
    page.wait().until(lambda d: "bi-eye-slash" in d.find_element(
        By.CSS_SELECTOR, f"{mine} .op-actions i.bi").get_attribute("class"))
    assert page.find(f"{mine} [data-op-flag]").text == "Not remembered"
    # The reply it answered is marked with it, in place.
    assert page.find(its_reply).text == "Not remembered: it answers a message you marked"
    assert page.driver.execute_script("return window.__sameDocument === true;")
    # It persists.
    page.open(f"/orbitpilot/c/{asked.conversation_id}")
    assert "bi-eye-slash" in page.find(f"{mine} .op-actions i.bi").get_attribute("class")
    assert page.find(f"{mine} [data-op-flag]").text == "Not remembered"
    assert page.find(its_reply).is_displayed()

    # Catch the second reply into a Blink.
    reply = session.scalars(select(Message).where(
        Message.conversation_id == asked.conversation_id, Message.role == "assistant")
        .order_by(Message.position.desc())).first()
    page.click(f"#m{reply.id} form[data-op-action=catch] button")
    page.wait().until(lambda d: d.find_element(
        By.CSS_SELECTOR, f"#m{reply.id} [data-op-caught]").is_displayed())
    session.rollback()
    assert session.scalar(select(Blink.id).where(Blink.user_id == traveller.id)) is not None
    page.open("/blinks/")
    page.screenshot("blinks.png")

    # Memory Status: that pair is among the next build's removals, the Blink an addition.
    page.open("/memory/status")
    preview = f"tr[data-source='{CHAT}'][data-remove]"
    assert page.find(preview).get_attribute("data-remove") == "1"
    assert page.find("tr[data-source='blink.blinks'][data-add]").get_attribute(
        "data-add") == "1"
    page.screenshot("memory-status.png")
    page.click("form[action$='/memory/update'] button[type=submit]")
    page.settle()
    run_worker(live_app)
    last = fresh_builds_of(session, traveller.id)[-1]
    assert (last.status, last.removed, last.added) == ("succeeded", 1, 1)
    page.open("/memory/status")
    assert page.find("#next-build-nothing").is_displayed()  # nothing left to change
    shown = page.find("#last-build dl[data-build]")
    assert (shown.get_attribute("data-build"), shown.get_attribute("data-status")) == (
        str(last.id), "succeeded")
    assert page.find("#last-build-counts [data-count=removed]").text == "1 removed"
    page.assert_no_violations()


@pytest.fixture
def browser_without_js() -> Iterator:
    with chromium(javascript=False) as driver:
        yield driver


def test_the_eye_works_without_javascript(browser_without_js, base_url, committed,
                                          traveller, tmp_path_factory):
    from tests.factories import make_conversation

    _, messages = make_conversation(committed.session, traveller,
                                    [("A question", "An answer")])
    committed.session.commit()
    page = Page(browser_without_js, base_url, screenshots_folder(tmp_path_factory))
    page.sign_in(traveller.email)
    asked = messages[0]
    page.open(f"/orbitpilot/c/{asked.conversation_id}")
    page.click(f"#m{asked.id} form[data-op-action=remember] button")
    page.settle()  # a real form POST, then the redirect back with a flash message
    assert page.find(".alert").text  # only the form path flashes (the script's does not)
    assert "bi-eye-slash" in page.find(f"#m{asked.id} .op-actions i.bi").get_attribute("class")
    assert "Not remembered" in page.find(f"#m{asked.id} [data-op-flag]").text
    committed.session.rollback()
    assert committed.session.get(Message, asked.id).not_remembered is True
