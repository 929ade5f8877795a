"""What the browser tests share: headless Chromium (Debian's ``chromium`` and
``chromium-driver``, through Selenium), the app as a real HTTP server in a thread on the
test database, and ``Page``, the browser at that server — it signs in through the form,
and reads the console after every page and click for what the Content-Security-Policy
refused (or a script error). Its screenshots go to a folder of pytest's temporary directory,
or to ``$ORBITPILOT_SCREENSHOTS`` (``scripts/screenshots`` refreshes the docs' pictures).

Without Selenium or Chromium the ``browser`` fixture skips, which fails in CI.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from dashboard import create_app
from dashboard.extensions import db
from tests.browser.axe import axe_source
from tests.conftest import IN_CI, make_test_config
from tests.factories import PASSWORD
from tests.live import serving

try:
    from selenium import webdriver
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support import expected_conditions as EC
    from selenium.webdriver.support.ui import WebDriverWait
except ImportError:  # the dev extra is not installed: the browser fixture skips
    webdriver = None

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--window-size=1280,1000")
WAIT_SECONDS = 10
POLL_SECONDS = 0.05  # Selenium's own default (0.5 s) adds up to seconds over a test
# How Chromium words what the policy blocked ("Executing inline event handler violates the
# following Content Security Policy directive ...", "Running the JavaScript URL violates
# ...", "Refused to load ..."), and a script that broke.
PROBLEM_MARKERS = ("Content Security Policy", "Refused to", "Uncaught")
# Where screenshots go when asked for (scripts/screenshots sets it to a temporary folder
# and copies the docs' pictures into docs/screenshots afterwards).
SCREENSHOTS_VARIABLE = "ORBITPILOT_SCREENSHOTS"


# -- the browser and the server -------------------------------------------------------------

@contextmanager
def chromium(*, javascript: bool = True) -> Iterator:
    """A headless Chromium of its own (a fresh profile), quit and removed afterwards."""
    if webdriver is None:
        pytest.skip("needs selenium: install the dev extra (pip install -e '.[dev]')")
    missing = [str(path) for path in (CHROMIUM, CHROMEDRIVER) if not path.exists()]
    if missing:
        pytest.skip(f"needs Chromium and its driver ({', '.join(missing)} missing): "
                    "apt-get install chromium chromium-driver")
    profile = tempfile.mkdtemp(prefix="orbitpilot-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={profile}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    if not javascript:
        options.add_experimental_option(
            "prefs", {"profile.managed_default_content_settings.javascript": 2})
    driver = webdriver.Chrome(options=options,
                              service=Service(executable_path=str(CHROMEDRIVER)))
    driver.set_page_load_timeout(30)
    # As a person who asked for less motion: menus unfold at once (Bootstrap honours it),
    # so no test waits out an animation.
    driver.execute_cdp_cmd("Emulation.setEmulatedMedia", {
        "features": [{"name": "prefers-reduced-motion", "value": "reduce"}]})
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture(scope="module")
def browser() -> Iterator:
    with chromium() as driver:
        yield driver


@pytest.fixture(scope="module")
def live_app(app):
    """A second app on the same test database (``app`` has migrated it), with no fixed
    SERVER_NAME so that url_for matches the address the browser uses, and a build queue
    of its own."""
    from dashboard.queues import build_queue

    live = create_app(make_test_config(SERVER_NAME=None,
                                       BUILD_QUEUE=f"builds-browser-{os.getpid()}"))
    yield live
    queue = build_queue(live).rq()
    queue.empty()
    queue.delete(delete_jobs=True)
    with live.app_context():
        db.engine.dispose()  # no connection of this app outlives the module


@pytest.fixture(scope="module")
def base_url(live_app) -> Iterator[str]:
    with serving(live_app) as url:
        yield url


class Page:
    """The browser at ``base_url``. The console is read after every page and click; what it
    says about the policy (or a script error) is kept with the step that caused it, so a
    test goes on to check that things work and fails at its end (``assert_no_violations``)
    with everything Chromium printed."""

    def __init__(self, driver, base_url: str, screenshots: Path) -> None:
        self.driver = driver
        self.base_url = base_url
        self.screenshots = screenshots
        self.problems: list[str] = []

    def wait(self) -> WebDriverWait:
        """A wait that polls on while the page is being replaced under it."""
        return WebDriverWait(self.driver, WAIT_SECONDS, poll_frequency=POLL_SECONDS,
                             ignored_exceptions=(NoSuchElementException,
                                                 StaleElementReferenceException))

    def open(self, path: str) -> None:
        self.driver.get(self.base_url + path)
        self.settle()

    def settle(self) -> None:
        self.wait().until(
            lambda d: d.execute_script("return document.readyState") == "complete")
        self.check_console()

    def check_console(self, step: str = "") -> None:
        step = step or f"loading {self.driver.current_url}"
        for entry in self.driver.get_log("browser"):
            if any(marker in entry["message"] for marker in PROBLEM_MARKERS):
                self.problems.append(f"{step}: [{entry['level']}] {entry['message']}")

    def assert_no_violations(self) -> None:
        self.check_console()
        assert not self.problems, ("the browser reported Content-Security-Policy violations "
                                   "or script errors:\n" + "\n".join(self.problems))

    def find(self, css: str):
        return self.wait().until(EC.visibility_of_element_located((By.CSS_SELECTOR, css)))

    def click(self, css: str, text: str | None = None) -> None:
        """Click the element ``css`` matches (the one showing ``text``, if given)."""
        self.check_console()

        def clickable(driver):
            for element in driver.find_elements(By.CSS_SELECTOR, css):
                if (text is None or element.text.strip() == text) and element.is_displayed() \
                        and element.is_enabled():
                    return element
            return None

        self.wait().until(clickable).click()
        if not EC.alert_is_present()(self.driver):  # no log to read under a dialog
            self.check_console(f"clicking {text or css!r}, then on {self.driver.current_url}")

    def alert(self):
        """The dialog the last click opened (waited for)."""
        return WebDriverWait(self.driver, WAIT_SECONDS, poll_frequency=POLL_SECONDS).until(
            EC.alert_is_present())

    def wait_for_text(self, text: str) -> None:
        self.wait().until(lambda d: text in self.text)
        self.settle()

    @property
    def text(self) -> str:
        return self.driver.find_element(By.TAG_NAME, "body").text

    def sign_in(self, email: str) -> None:
        self.driver.delete_all_cookies()
        self.open("/auth/signin")
        self.find("input[name=email]").send_keys(email)
        self.find("input[name=password]").send_keys(PASSWORD)
        self.click("form button[type=submit]")
        # The navbar of the page it lands on (folded away on a phone: in the DOM, not shown).
        self.wait().until(lambda driver: "/auth/signin" not in driver.current_url
                          and email in driver.page_source)

    def screenshot(self, name: str) -> Path | None:
        """Save what the browser shows as ``<name>`` in ``self.screenshots``. A folder that
        cannot be written is a warning, not a failure: the pictures are documentation."""
        png = self.driver.get_screenshot_as_png()
        target = self.screenshots / name
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(png)
        except OSError as exc:
            warnings.warn(f"screenshot {name} not saved: {exc}", stacklevel=2)
            return None
        return target


def focus_and_enter(page: Page, css: str) -> None:
    """Tab from the focused field to ``css`` and press Enter: the keyboard alone."""
    target = page.find(css)
    for _ in range(10):
        if page.driver.switch_to.active_element == target:
            break
        page.driver.switch_to.active_element.send_keys(Keys.TAB)
    assert page.driver.switch_to.active_element == target
    target.send_keys(Keys.ENTER)
    page.settle()


@pytest.fixture
def second(base_url, tmp_path_factory) -> Iterator[Page]:
    """A second browser, a session of its own (a second person beside ``page``)."""
    with chromium() as driver:
        yield Page(driver, base_url, screenshots_folder(tmp_path_factory))


@pytest.fixture(scope="module")
def axe() -> str:
    """axe-core's script: without npm (and no ``$AXE_CORE_JS``) the tests that check pages
    with it skip, which fails in CI."""
    try:
        return axe_source()
    except FileNotFoundError:
        if IN_CI:
            pytest.fail("npm is needed to fetch axe-core (apt-get install npm)")
        pytest.skip("npm is needed to fetch axe-core (apt-get install npm)")


def screenshots_folder(tmp_path_factory) -> Path:
    """``$ORBITPILOT_SCREENSHOTS``, or ``screenshots`` in this run's temporary directory."""
    chosen = os.environ.get(SCREENSHOTS_VARIABLE)
    return Path(chosen) if chosen else tmp_path_factory.getbasetemp() / "screenshots"


@pytest.fixture
def page(browser, base_url, tmp_path_factory) -> Page:
    browser.get_log("browser")  # what an earlier test left is not this test's
    return Page(browser, base_url, screenshots_folder(tmp_path_factory))


# -- a world of every page type ------------------------------------------------------------

@pytest.fixture(scope="module")
def world(app):
    """One of each thing a page can show, committed (the live server reads it): its ids
    and the emails of a user, a support person and an admin."""
    from sqlalchemy import delete

    from dashboard.audit.services import Actor
    from dashboard.auth.models import User
    from dashboard.documents.models import Document
    from dashboard.exports import DataExport
    from dashboard.memory.embedders import HashingEmbedder
    from dashboard.memory.pipeline import run_memory_build
    from dashboard.plans.models import Plan
    from dashboard.saved_memories import forget_memory
    from dashboard.saved_memories.keys import create_key
    from tests.factories import make_blink, make_conversation, make_memory, make_plan, make_user

    with app.app_context():
        session = db.session
        plan = make_plan(session, name="Voyager", cap=5)
        user = make_user(session, plan=plan, email="axe-user@example.test")
        support = make_user(session, role="support", email="axe-support@example.test")
        admin = make_user(session, role="admin", email="axe-admin@example.test")
        conversation, _ = make_conversation(session, user, [
            ("Plan a day in Lisbon", "Trams, then pastéis."), ("And Porto?", "Port wine.")],
            flagged={1})
        blink = make_blink(session, user, "Trams in Lisbon", title="Lisbon")
        for n in range(12):  # enough that the list runs past the bottom of the screen
            make_blink(session, user, f"Blink number {n}", title=f"Blink {n}")
        memory = make_memory(session, user, "Prefers aisle seats on long flights.")
        forgotten = make_memory(session, user, "An old note")
        document = Document(user_id=user.id, title="Notes", filename="notes.md",
                            content="# Notes\n\nLisbon trams.")
        session.add(document)
        create_key(session, owner=user, name="Laptop", scopes=["memory:read"],
                   actor=Actor.of(user))
        session.flush()
        forget_memory(session, user.id, forgotten.id, mode="soft_delete",
                      actor=Actor.of(user), reason="")
        run_memory_build(user, "full", session=session, embedder=HashingEmbedder())
        export = DataExport(user_id=user.id, status="running", progress=40, stage="messages")
        session.add(export)
        session.commit()
        ids = {"user": user.id, "conversation": conversation.id, "blink": blink.id,
               "memory": memory.id, "document": document.id, "plan": plan.id,
               "export": export.id}
        emails = {"user": user.email, "support": support.email, "admin": admin.email}
        yield ids, emails
        session.rollback()
        session.execute(delete(User).where(User.id.in_([user.id, support.id, admin.id])))
        session.execute(delete(Plan).where(Plan.id == plan.id))
        session.commit()
        session.remove()


def pages_of(identity: str, ids: dict) -> list[str]:
    if identity == "guest":
        return ["/", "/auth/signin", "/auth/signup", "/orbitpilot/", "/no-such-page"]
    if identity == "user":
        return [
            "/", "/orbitpilot/", f"/orbitpilot/c/{ids['conversation']}", "/memory/status",
            "/blinks/", f"/blinks/edit/?id={ids['blink']}", f"/blinks/delete/?id={ids['blink']}",
            "/memories/", f"/memories/{ids['memory']}",
            f"/memories/{ids['memory']}/forget?mode=soft_delete", "/profile/",
            "/documents/", f"/documents/view/?id={ids['document']}", "/settings/keys/",
            "/settings/connections", f"/memory/export/{ids['export']}", "/admin/",
            "/no-such-page",
        ]
    staff = ["/admin/", "/support/", f"/support/users/{ids['user']}", "/support/plans",
             "/admin/builds/", "/admin/audit/", "/admin/markers/", "/admin/retention/"]
    if identity == "support":
        return staff
    return staff + ["/admin/assignments/", "/admin/plan/", f"/admin/plan/details/?id={ids['plan']}",
                    "/admin/user/", f"/admin/user/details/?id={ids['user']}",
                    "/admin/api_keys/", "/admin/connections/"]
