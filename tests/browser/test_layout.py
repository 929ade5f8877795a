"""The user pages on a phone (390×844) and a desktop (1280×900), in headless Chromium: the
menu folds under a button on a phone and every entry is reachable; the chat dock never
covers a page's last control (Selenium's own click, which fails on a covered element);
on a phone the open dock takes the screen; the export's report reads on a phone."""

from __future__ import annotations

import re
import zipfile
from io import BytesIO

import pytest

from dashboard.exports.models import DataExport
from dashboard.exports.sections import MEMORY_STATUS_TITLE, REPORT_NAME, SECTIONS
from dashboard.exports.services import build_export, export_parts
from dashboard.plans.sentences import state_sentence
from dashboard.plans.services import get_plan_for_user, resolve_sources
from tests.browser.conftest import pages_of
from tests.factories import make_blink, make_memory

pytest.importorskip("selenium", reason="needs selenium: install the dev extra")
from selenium.webdriver.common.by import By  # noqa: E402

pytestmark = pytest.mark.processes  # real processes or servers: slow

PHONE, DESKTOP = (390, 844), (1280, 900)
MENU = ["Chat", "Memory status", "Blinks", "Saved memories", "Teams", "Profile", "Documents",
        "API keys", "Connected apps"]


@pytest.fixture
def sized(page):
    def size(width_height: tuple[int, int]) -> None:
        page.driver.set_window_size(*width_height)

    yield size
    page.driver.set_window_size(1280, 1000)  # the browser's own, for the next test
    page.driver.execute_script("window.localStorage.clear()")  # the dock's remembered state


@pytest.fixture
def reader(committed):
    """A user with enough Blinks that the list runs past the bottom of the screen."""
    user = committed.user(plan=committed.plan(cap=4))
    for n in range(12):
        make_blink(committed.session, user, f"Blink number {n}", title=f"Blink {n}")
    committed.session.commit()
    return user


def set_dock(page, open_: bool) -> None:
    """Open or close the dock (it remembers its state between pages and tests)."""
    dock = page.find(".op-dock")
    if (dock.get_attribute("open") is not None) != open_:
        page.find(".op-dock > summary").click()
    page.wait().until(lambda d: (d.find_element(By.CSS_SELECTOR, ".op-dock").get_attribute(
        "open") is not None) == open_)


def visible_links(page, scope: str = "[data-op-nav]") -> list[str]:
    """The menu's links a person sees (one round trip: the browser's own visibility)."""
    return page.driver.execute_script(
        "return [...document.querySelectorAll(arguments[0] + ' a.nav-link')]"
        ".filter(a => a.checkVisibility({visibilityProperty: true}))"
        ".map(a => a.innerText.trim());", scope)


def open_menu(page, toggle: str, scope: str) -> None:
    """On a phone the menu is folded under its button: unfold it (by its own click)."""
    button = page.driver.find_element(By.CSS_SELECTOR, toggle)
    if button.is_displayed() and button.get_attribute("aria-expanded") != "true":
        button.click()
        page.wait().until(lambda d: d.find_element(By.CSS_SELECTOR, toggle).get_attribute(
            "aria-expanded") == "true" and visible_links(page, scope))


MENUS = {
    # who: (the menu's button, the menu, its entries)
    "user": ("[data-op-nav-toggle]", "[data-op-nav]", MENU),
    "admin": (".navbar-toggler", ".navbar-collapse",
              ["Home", "Plans", "Users", "Assignments", "API keys", "Connected apps",
               "Builds", "Audit log", "Erasure markers", "Retention", "Support",
               "Back to OrbitPilot"]),
}


@pytest.mark.parametrize("who, window", [(w, s) for w in MENUS for s in ("desktop", "phone")],
                         ids=[f"{w}-{s}" for w in MENUS for s in ("desktop", "phone")])
def test_every_menu_entry_is_reachable_and_clickable(page, sized, world, who, window):
    """On a phone the menu folds under a button; each entry is then one press away, and
    Selenium's own click (refused on anything covered or off-screen) follows it. Sign out
    comes last."""
    _, emails = world
    sized(PHONE if window == "phone" else DESKTOP)
    page.sign_in(emails[who])
    toggle, scope, entries = MENUS[who]
    page.open("/blinks/" if who == "user" else "/admin/")
    button = page.driver.find_element(By.CSS_SELECTOR, toggle)
    if window == "phone":
        assert button.is_displayed() and button.get_attribute("aria-expanded") == "false"
        assert visible_links(page, scope) == []
    else:
        assert not button.is_displayed()
        # One line: no entry wraps under another.
        assert page.driver.execute_script(
            "return document.querySelector('nav.navbar').getBoundingClientRect().height") < 70
    for n, entry in enumerate(entries):
        open_menu(page, toggle, scope)
        assert visible_links(page, scope) == entries
        if n == 0 and window == "phone":
            page.screenshot(f"phone-menu-{who}.png")
        link = next(a for a in page.driver.find_elements(By.CSS_SELECTOR, f"{scope} a.nav-link")
                    if a.text.strip() == entry)
        target = link.get_attribute("href")
        link.click()
        page.wait().until(lambda d, target=target: d.current_url.split("#")[0] == target)
        page.settle()
        assert page.driver.execute_script(
            "return document.documentElement.scrollWidth <= window.innerWidth"), entry
    open_menu(page, toggle, scope)
    page.click(f"{scope} form[action$='/auth/signout'] button")
    page.wait().until(lambda d: "Sign in" in page.text and emails[who] not in d.page_source)
    page.assert_no_violations()


# The page's controls (the dock's are its own), as a person meets them: shown, enabled.
LAST_CONTROL = """
const scope = document.querySelector(arguments[0]) || document.querySelector('main');
const controls = [...scope.querySelectorAll(
    'a[href], button, input:not([type=hidden]), select, textarea, summary')]
  .filter(e => !e.disabled && e.getClientRects().length > 0 &&
               getComputedStyle(e).visibility !== 'hidden' &&
               getComputedStyle(e).pointerEvents !== 'none' &&  // a disabled pager link
               (arguments[0] !== 'body' || !e.closest('.op-dock')));
return controls[controls.length - 1] || null;"""
# Each click is caught before it acts (a delete button deletes nothing): what it hit.
CATCH_CLICKS = """
window.__hit = null;
document.addEventListener('click', e => { window.__hit = e.target; e.preventDefault();
                                          e.stopPropagation(); }, true);"""
HIT = """return !!window.__hit &&
  (window.__hit === arguments[0] || arguments[0].contains(window.__hit));"""


def last_control_answers(page, scope: str) -> str | None:
    """Click the last control in ``scope`` with Selenium's own click, which is refused
    when anything lies over it; None when the click reached it, else what went wrong."""
    from selenium.common.exceptions import ElementClickInterceptedException

    page.driver.execute_script(CATCH_CLICKS)
    # Where a person finds a page's last control: at its end.
    page.driver.execute_script("window.scrollTo(0, document.documentElement.scrollHeight)")
    last = page.driver.execute_script(LAST_CONTROL, scope)
    if last is None:
        return "no control"
    try:
        last.click()
    except ElementClickInterceptedException as exc:
        return exc.msg.splitlines()[0]
    return None if page.driver.execute_script(HIT, last) else "the click reached something else"


USER_WINDOWS = [("desktop", "closed"), ("desktop", "open"), ("phone", "closed"),
                ("phone", "open")]


@pytest.mark.parametrize("window, dock", USER_WINDOWS,
                         ids=[f"{w}-dock-{d}" for w, d in USER_WINDOWS])
def test_the_last_control_of_every_user_page_is_clickable(page, sized, world, window, dock):
    """With the dock closed it covers nothing of a page; open on a desktop it sits beside
    the page's last control, and open on a phone it is the screen (its own last control
    is then the one to reach)."""
    ids, emails = world
    sized(PHONE if window == "phone" else DESKTOP)
    page.sign_in(emails["user"])
    page.open("/blinks/")
    set_dock(page, dock == "open")
    scope = ".op-dock" if (window, dock) == ("phone", "open") else "main"
    # The open dock on a phone is the same screen over every page: two pages say it (the
    # chat page has no dock, so its own last control counts).
    paths = ["/blinks/", "/orbitpilot/"] if scope == ".op-dock" else pages_of("user", ids)
    refused = {}
    for path in paths:
        page.open(path)
        if (window, dock, path) == ("phone", "closed", "/memory/status"):
            page.screenshot("phone-memory-status.png")
        problem = last_control_answers(page, scope)
        if problem:
            refused[path] = problem
    page.open("/blinks/")  # a page whose clicks are not caught
    set_dock(page, False)
    assert refused == {}


@pytest.mark.parametrize("window", ["desktop", "phone"])
def test_the_last_control_of_every_staff_page_is_clickable(page, sized, world, window):
    """As an admin, who has every staff page (support's are the same pages, fewer)."""
    ids, emails = world
    sized(PHONE if window == "phone" else DESKTOP)
    page.sign_in(emails["admin"])
    refused = {}
    for path in pages_of("admin", ids):
        page.open(path)
        problem = last_control_answers(page, "body")
        if problem:
            refused[path] = problem
    assert refused == {}


def test_on_a_phone_the_open_dock_takes_the_screen(page, sized, reader):
    sized(PHONE)
    page.sign_in(reader.email)
    page.open("/blinks/")
    set_dock(page, True)
    box = page.driver.execute_script(
        "const r = document.querySelector('.op-dock').getBoundingClientRect();"
        "const v = document.documentElement;"
        "return [r.left, r.top, r.width, r.height, v.clientWidth, v.clientHeight];")
    left, top, width, height, inner_width, inner_height = box
    assert (left, top) == (0, 0) and (width, height) == (inner_width, inner_height)
    page.screenshot("phone-dock.png")
    composer = page.find(".op-dock [data-op-composer] textarea")
    composer.click()  # reachable, not under anything
    assert page.driver.switch_to.active_element == composer
    set_dock(page, False)  # as the next test expects to find it
    page.assert_no_violations()


CONTRAST_OF = """
const out = [];
for (const el of document.querySelectorAll(arguments[0])) {
  if (!el.offsetParent || !el.textContent.trim()) continue;
  let bg = el, color = getComputedStyle(el).backgroundColor;
  while (bg && (color === 'rgba(0, 0, 0, 0)' || color === 'transparent')) {
    bg = bg.parentElement;
    color = bg ? getComputedStyle(bg).backgroundColor : 'rgb(255, 255, 255)';
  }
  out.push([getComputedStyle(el).color, color, el.textContent.trim().slice(0, 30)]);
}
return out;"""


def _rgb(css: str) -> tuple[float, ...]:
    parts = [float(p) for p in css[css.index("(") + 1:-1].split(",")]
    return tuple(parts) if len(parts) == 4 else (*parts, 1.0)


def contrast(foreground: str, background: str) -> float:
    """WCAG contrast of a colour (alpha blended onto its background) and the background."""
    *fg, alpha = _rgb(foreground)
    bg = _rgb(background)[:3]
    mixed = [alpha * f + (1 - alpha) * b for f, b in zip(fg, bg, strict=True)]

    def luminance(rgb) -> float:
        c = [x / 255 for x in rgb]
        c = [x / 12.92 if x <= 0.03928 else ((x + 0.055) / 1.055) ** 2.4 for x in c]
        return 0.2126 * c[0] + 0.7152 * c[1] + 0.0722 * c[2]

    high, low = sorted([luminance(mixed), luminance(bg)], reverse=True)
    return (high + 0.05) / (low + 0.05)


def test_small_grey_text_and_the_menu_meet_wcag_aa_contrast(page, sized, reader):
    sized(DESKTOP)
    page.sign_in(reader.email)
    seen = []
    for path in ("/blinks/", "/orbitpilot/"):
        page.open(path)
        for selector in (".op-notice", "[data-op-nav] .nav-link", ".text-muted", ".op-who"):
            for color, background, text in page.driver.execute_script(CONTRAST_OF, selector):
                seen.append(selector)
                assert contrast(color, background) >= 4.5, (path, selector, text, color,
                                                            background)
    assert {".op-notice", "[data-op-nav] .nav-link"} <= set(seen)


def test_a_new_keys_copy_button_copies_it(page, sized, reader):
    sized(DESKTOP)
    page.driver.execute_cdp_cmd("Browser.grantPermissions", {
        "permissions": ["clipboardReadWrite", "clipboardSanitizedWrite"]})
    page.sign_in(reader.email)
    page.open("/settings/keys/")
    page.find("input[name=name]").send_keys("Copy test")
    page.click("main form button[type=submit]", "Create key")
    secret = page.find("#api-key-secret").get_attribute("value")
    page.click("[data-op-copy]")
    page.wait().until(lambda d: "Copied" in page.find("[data-op-copied]").text)
    copied = page.driver.execute_async_script(
        "const done = arguments[0]; navigator.clipboard.readText().then(done, e => done(''));")
    assert copied == secret and secret.startswith("op_")
    page.assert_no_violations()


# A date as the report words it: "4 December 2026 at 11:40 UTC".
DATE_IN_WORDS = r"^\d{1,2} [A-Z][a-z]+ \d{4} at \d\d:\d\d UTC$"
REPORT_SHAPE = """
const cells = [...document.querySelectorAll('td')];
return {
  fits: document.documentElement.scrollWidth <= window.innerWidth,
  headings: [...document.querySelectorAll('h2')].map(h => h.textContent.trim()),
  dates: [...document.querySelectorAll('time')].map(t => t.textContent.trim()),
  outside: cells.filter(td => td.getBoundingClientRect().right > window.innerWidth + 1)
                .map(td => td.textContent.slice(0, 40)),
  labelled: cells.every(td => td.dataset.label || td.closest('#policies')),
  status: [...document.querySelectorAll('#memory_status li')].map(li => li.textContent),
};"""


def test_the_exports_report_reads_on_a_phone(page, sized, reader, committed, tmp_path):
    """The report in the zip, opened as a person would (a file) at 390 px: no sideways
    scroll, a heading for every section, the Memory Status sentences, each row a card
    whose cells say their column, and dates in words."""
    session = committed.session
    make_memory(session, reader, "A long unbroken address: https://example.test/"
                + "a-very-long-path-segment" * 8)
    export = DataExport(user_id=reader.id, status="queued")
    session.add(export)
    session.commit()
    assert build_export(session, export.id) == "ready"
    archive = zipfile.ZipFile(BytesIO(b"".join(export_parts(lambda: session, export.id))))
    report = tmp_path / REPORT_NAME
    report.write_bytes(archive.read(REPORT_NAME))

    sized(PHONE)
    page.driver.get(report.as_uri())
    shape = page.driver.execute_script(REPORT_SHAPE)
    page.screenshot("phone-export-report.png")
    assert shape["fits"] and shape["outside"] == []
    assert shape["headings"] == ["Contents", MEMORY_STATUS_TITLE,
                                 *(section.title for section in SECTIONS)]
    resolution = resolve_sources(get_plan_for_user(reader, session))
    assert shape["status"] == [f"{s.label}: {state_sentence(s, resolution)}"
                               for s in resolution.sources]
    assert shape["labelled"]
    assert shape["dates"] and all(re.match(DATE_IN_WORDS, d) for d in shape["dates"]), \
        shape["dates"]
