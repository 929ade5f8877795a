"""The pages under the real Content-Security-Policy, in a real browser (headless Chromium).

The app runs as a real HTTP server in a thread; Chromium signs in through the sign-in form,
visits the staff pages and uses Flask-Admin's menus ("With selected", "Add Filter"). Each
test reads the browser's console after every page and click, and fails on any entry about
the policy (or a script error) with what Chromium printed. Nothing is injected into the
pages. Each action must also really work: a handler the policy refused fails silently.

Needs Debian's ``chromium`` and ``chromium-driver`` (``.ci/run`` installs them) and the dev
extra (selenium); without them the tests skip, which fails in CI.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select

from dashboard import create_app
from dashboard.extensions import db
from dashboard.memory.models import MemoryBuild
from dashboard.plans.models import Plan
from tests.conftest import make_test_config
from tests.factories import PASSWORD

try:
    from selenium import webdriver
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
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
# How Chromium words what the policy blocked ("Executing inline event handler violates the
# following Content Security Policy directive ...", "Running the JavaScript URL violates
# ...", "Refused to load ..."), and a script that broke.
PROBLEM_MARKERS = ("Content Security Policy", "Refused to", "Uncaught")


# -- the browser and the server -------------------------------------------------------------

@pytest.fixture(scope="module")
def browser() -> Iterator:
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
    driver = webdriver.Chrome(options=options,
                              service=Service(executable_path=str(CHROMEDRIVER)))
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture(scope="module")
def live_app(app):
    """A second app on the same test database (``app`` has migrated it), with no fixed
    SERVER_NAME so that url_for matches the address the browser uses, and a build queue
    of its own."""
    from dashboard.memory.queue import get_build_queue

    live = create_app(make_test_config(SERVER_NAME=None,
                                       BUILD_QUEUE=f"builds-browser-{os.getpid()}"))
    yield live
    queue = get_build_queue(live)
    queue.empty()
    queue.delete(delete_jobs=True)
    with live.app_context():
        db.engine.dispose()  # no connection of this app outlives the module


@pytest.fixture(scope="module")
def base_url(live_app) -> Iterator[str]:
    from werkzeug.serving import WSGIRequestHandler, make_server

    class QuietHandler(WSGIRequestHandler):
        def log_request(self, *args, **kwargs) -> None:
            pass

    server = make_server("127.0.0.1", 0, live_app, threaded=True,
                         request_handler=QuietHandler)
    thread = threading.Thread(target=server.serve_forever, name="browser-test-server",
                              daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        thread.join(timeout=10)
        server.server_close()


class Page:
    """The browser at ``base_url``. The console is read after every page and click; what it
    says about the policy (or a script error) is kept with the step that caused it, so a
    test goes on to check that things work and fails at its end (``assert_no_violations``)
    with everything Chromium printed."""

    def __init__(self, driver, base_url: str) -> None:
        self.driver = driver
        self.base_url = base_url
        self.problems: list[str] = []

    def wait(self) -> WebDriverWait:
        """A wait that polls on while the page is being replaced under it."""
        return WebDriverWait(self.driver, WAIT_SECONDS, ignored_exceptions=(
            NoSuchElementException, StaleElementReferenceException))

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
        self.wait_for_text(email)  # the navbar of the page it lands on


@pytest.fixture
def page(browser, base_url) -> Page:
    browser.get_log("browser")  # what an earlier test left is not this test's
    return Page(browser, base_url)


@pytest.fixture
def staff(committed):
    """An admin and two plain users, really committed, on a plan of their own."""
    plan = committed.plan(cap=3)
    admin = committed.user(role="admin", plan=plan)
    users = [committed.user(plan=plan) for _ in range(2)]
    committed.session.commit()
    return plan, admin, users


# -- the tests ------------------------------------------------------------------------------

def test_every_page_renders_under_the_policy(page, staff):
    plan, admin, users = staff
    page.sign_in(admin.email)

    page.open("/")
    assert f"Hello, {admin.display_name}" in page.text
    page.open("/admin/")
    assert f"Signed in as {admin.email} (admin)" in page.text
    page.open("/admin/plan/")
    assert plan.name in page.text
    page.open("/admin/user/")
    assert all(u.email in page.text for u in (admin, *users))
    page.open("/admin/builds/")
    assert "Trigger" in page.find("table.model-list thead").text
    page.open(f"/admin/plan/edit/?id={plan.id}")
    assert page.find("input[name=name]").get_attribute("value") == plan.name
    page.open(f"/admin/user/details/?id={users[0].id}")
    assert users[0].email in page.text

    # The stylesheets get through the policy: Bootstrap gives the navbar its background.
    background = page.driver.execute_script(
        "return getComputedStyle(document.querySelector('nav.navbar')).backgroundColor")
    assert background not in ("rgba(0, 0, 0, 0)", "transparent"), background
    page.assert_no_violations()


def test_with_selected_action_requests_a_build(page, staff, committed):
    _, admin, (target, bystander) = staff
    page.sign_in(admin.email)
    page.open(f"/admin/user/?search={target.email}")

    page.click(f"input.action-checkbox[value='{target.id}']")
    page.click("a.dropdown-toggle", "With selected")
    page.click(".dropdown-menu a.dropdown-item", "Quick memory update")
    alert = WebDriverWait(page.driver, WAIT_SECONDS).until(EC.alert_is_present())
    assert alert.text == "Request a quick build for these users?"
    alert.accept()
    page.wait_for_text("build requested")
    assert "Quick build requested for 1 user(s)." in page.text

    committed.session.rollback()
    built = committed.session.scalars(select(MemoryBuild).where(
        MemoryBuild.user_id.in_([target.id, bystander.id]))).all()
    assert [(b.user_id, b.mode, b.trigger, b.requested_by_id) for b in built] == [
        (target.id, "quick", "admin", admin.id)]
    page.assert_no_violations()


def test_add_filter_menu_filters_the_list(page, staff):
    _, admin, users = staff
    page.sign_in(admin.email)
    page.open("/admin/user/")
    assert all(u.email in page.text for u in users)

    page.click("a.dropdown-toggle", "Add Filter")
    page.click(".field-filters a.filter", "Role")
    assert "Role" in page.find("table.filters tr").text
    page.find("table.filters input.filter-val").send_keys("admin")
    page.click("#filter_form button[type=submit]")
    page.settle()

    assert "flt" in page.driver.current_url
    assert admin.email in page.text
    assert not any(u.email in page.text for u in users)
    page.assert_no_violations()


def test_plan_edit_form_saves(page, staff, committed):
    plan, admin, _ = staff
    renamed = f"{plan.name} renamed"
    page.sign_in(admin.email)
    page.open(f"/admin/plan/edit/?id={plan.id}")

    name = page.find("input[name=name]")
    name.clear()
    name.send_keys(renamed)
    page.click("form.admin-form input[type=submit][value='Save']")
    page.wait_for_text("Record was successfully saved.")

    committed.session.rollback()
    assert committed.session.get(Plan, plan.id).name == renamed
    page.assert_no_violations()
