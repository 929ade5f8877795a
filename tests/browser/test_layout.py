"""The user pages on a phone (390×844) and a desktop (1280×900), in headless Chromium: the
menu folds under a button on a phone and every entry is reachable; the chat dock never
covers a page's last control (Selenium's own click, which fails on a covered element);
on a phone the open dock takes the screen."""

from __future__ import annotations

import pytest

from tests.factories import make_blink

pytest.importorskip("selenium", reason="needs selenium: install the dev extra")
from selenium.webdriver.common.by import By  # noqa: E402

pytestmark = pytest.mark.processes  # real processes or servers: slow

PHONE, DESKTOP = (390, 844), (1280, 900)
MENU = ["Chat", "Memory status", "Blinks", "Saved memories", "Profile", "Documents",
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


def visible_links(page) -> list[str]:
    return [a.text.strip() for a in page.driver.find_elements(
        By.CSS_SELECTOR, "[data-op-nav] .nav-link") if a.is_displayed()]


def test_on_a_phone_the_menu_folds_and_every_entry_is_reachable(page, sized, reader):
    sized(PHONE)
    page.sign_in(reader.email)
    page.open("/blinks/")
    toggle = page.driver.find_element(By.CSS_SELECTOR, "[data-op-nav-toggle]")
    assert toggle.is_displayed() and toggle.get_attribute("aria-expanded") == "false"
    assert visible_links(page) == []
    for entry in MENU:
        page.open("/blinks/")
        page.find("[data-op-nav-toggle]").click()
        assert page.find("[data-op-nav-toggle]").get_attribute("aria-expanded") == "true"
        assert visible_links(page) == MENU
        link = next(a for a in page.driver.find_elements(By.CSS_SELECTOR, "[data-op-nav] .nav-link")
                    if a.text.strip() == entry)
        target = link.get_attribute("href")
        link.click()  # Selenium's click: it fails on anything covered or off-screen
        page.wait().until(lambda d, target=target: d.current_url.split("#")[0] == target)
    assert page.driver.execute_script(
        "return document.documentElement.scrollWidth <= window.innerWidth")
    page.assert_no_violations()


def test_on_a_desktop_the_menu_is_open_without_a_button(page, sized, reader):
    sized(DESKTOP)
    page.sign_in(reader.email)
    page.open("/blinks/")
    assert not page.driver.find_element(By.CSS_SELECTOR, "[data-op-nav-toggle]").is_displayed()
    assert visible_links(page) == MENU


@pytest.mark.parametrize("window, dock", [(DESKTOP, "closed"), (PHONE, "closed"),
                                          (DESKTOP, "open")],
                         ids=["desktop", "phone", "desktop-dock-open"])
def test_the_dock_covers_no_control_of_the_page(page, sized, reader, window, dock):
    """(On a phone the open dock is the whole screen, on purpose.)"""
    sized(window)
    page.sign_in(reader.email)
    page.open("/blinks/")
    set_dock(page, dock == "open")
    controls = [e for e in page.driver.find_elements(
        By.CSS_SELECTOR, "main a, main button, main input, main textarea, main select")
        if e.is_displayed()]
    last = controls[-1]
    page.driver.execute_script("window.scrollTo(0, document.body.scrollHeight)")
    covered = page.driver.execute_script(
        "const r = arguments[0].getBoundingClientRect();"
        "const hit = document.elementFromPoint(r.left + r.width / 2, r.top + r.height / 2);"
        "return !(hit === arguments[0] || arguments[0].contains(hit));", last)
    where = page.driver.execute_script(
        "const r = arguments[0].getBoundingClientRect();"
        "const d = document.querySelector('.op-dock').getBoundingClientRect();"
        "return {control: [r.top, r.bottom, r.right], dock: [d.top, d.left]};", last)
    assert covered is False, repr(where)
    last.click()  # Selenium's own click: refused if anything lies over it


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
