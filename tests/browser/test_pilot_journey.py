"""The whole pilot journey, in real headless Chromium, with the MCP SDK's own client, a real
worker and MiniLM: the lead creates a team and invites A and B; A accepts, saves on the
page, and A's MCP client (the real OAuth flow, the team ticked in A's browser) saves to the
team; the lead sees "saved by A via <the app>" (its own name a claim) and asks for the
export; B recalls the memory by meaning through MCP, the API and the chat, each labelled
with the team and A; the lead downloads the export (valid against the shipped schema) and
erases the memory, its receipt naming B's reply and the export; support finds the team,
and no page or audit row holds a canary. Every team page passes axe-core, labels every
control, fits 1280 px, and has no CSP violation (the phone's width: test_teams.py)."""

from __future__ import annotations

import io
import json
import os
import threading
import uuid
import zipfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import anyio
import httpx2
import jsonschema
import pytest
from mcp.client.auth import AuthorizationCodeResult
from sqlalchemy import delete, select, text

from dashboard import create_app
from dashboard.audit.models import AuditEvent
from dashboard.auth.models import User
from dashboard.connectors.models import OAuthClient
from dashboard.exports import TEAM_JSON_NAME
from dashboard.extensions import db
from dashboard.memory.embedders import get_embedder, minilm_available
from dashboard.teams.models import Team
from tests.browser.axe import checked
from tests.browser.conftest import Page, focus_and_enter
from tests.conftest import IN_CI, make_test_config
from tests.connectors.helpers import REDIRECT_URI, Storage, client_metadata, mcp_session
from tests.workers import run_worker

pytest.importorskip("selenium", reason="needs selenium: install the dev extra")
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402
from selenium.webdriver.support.ui import Select  # noqa: E402

pytestmark = [
    pytest.mark.processes,  # Chromium, a served app, a real worker
    pytest.mark.skipif(not minilm_available() and not IN_CI,
                       reason="the ml extra (all-MiniLM-L6-v2) is not installed"),
]

SCHEMA = Path(__file__).resolve().parents[2] / "dashboard/exports/team_schema.json"
APP_NAME = "Claude (pilot)"  # what the MCP client calls itself: a claim
TEAM, SLUG = "Pilot journey", "pilot-journey"
# Saved by A's MCP client; recalled by a question sharing none of its words.
MEMORY = "Heron is the codename of the billing rewrite."
QUESTION = "What is the project name for the invoicing changes?"
SAVED_ON_PAGE = "The release train leaves every second Tuesday."


@pytest.fixture(scope="module")
def live_app(app):
    """The served app as the product runs by default: MiniLM recalls by meaning. As a web
    worker of the run command does (gunicorn_hooks), it loads the model in the background
    as it starts, so the first search does not wait for it."""
    from dashboard.queues import build_queue

    live = create_app(make_test_config(SERVER_NAME=None, EMBEDDER="minilm",
                                       BUILD_QUEUE=f"builds-journey-{os.getpid()}"))
    warm = threading.Thread(target=lambda: get_embedder("minilm").embed(["warm up"]),
                            name="embedder-warm-up", daemon=True)
    warm.start()
    yield live
    warm.join(timeout=120)
    queue = build_queue(live).rq()
    queue.empty()
    queue.delete(delete_jobs=True)
    with live.app_context():
        db.engine.dispose()


@dataclass
class People:
    lead: User
    a: User
    b: User
    support: User
    clients: list[Storage] = field(default_factory=list)  # each MCP client's registration


@pytest.fixture
def people(committed):
    """The lead, members A and B, and a support person, committed for the live server; the
    team the lead makes (its account a users row) and the apps registered go with them."""
    names = {"lead": "Lena Lead", "a": "Ada Able", "b": "Ben Baker"}
    made = {who: committed.user(email=f"journey-{who}@example.test") for who in names}
    for who, name in names.items():
        made[who].display_name = name
    made["support"] = committed.user(email="journey-support@example.test", role="support")
    committed.session.commit()
    people = People(**made)
    yield people
    session = committed.session
    session.rollback()
    accounts = session.scalars(select(Team.id).where(
        Team.created_by_id == people.lead.id)).all()
    if accounts:
        session.execute(delete(User).where(User.id.in_(accounts)))
    registered = [storage.client.client_id for storage in people.clients if storage.client]
    if registered:
        session.execute(delete(OAuthClient).where(OAuthClient.client_id.in_(registered)))
    session.commit()


@dataclass
class Consent:
    """The SDK client's redirect and callback, answered by a person in a real browser:
    the authorize URL opened in ``page``, the team ticked, Allow clicked, and the code read
    from the address Chromium was sent back to (nothing listens there)."""

    page: Page
    acts_for: str = ""
    callback: dict[str, list[str]] = field(default_factory=dict)

    def answer(self, authorization_url: str) -> None:
        page = self.page
        page.driver.get(authorization_url)
        page.settle()
        page.click("#teams label.form-check-label")  # the only team: this one
        page.wait().until(lambda d: "save to" in page.find("#acts-for").text)
        self.acts_for = page.find("#acts-for").text
        page.click("#consent button[value=allow]")
        page.wait().until(lambda d: d.current_url.startswith(REDIRECT_URI))
        self.callback = parse_qs(urlsplit(page.driver.current_url).query)

    async def redirect_handler(self, authorization_url: str) -> None:
        await anyio.to_thread.run_sync(self.answer, authorization_url)

    async def callback_handler(self) -> AuthorizationCodeResult:
        return AuthorizationCodeResult(code=self.callback["code"][0],
                                       state=self.callback.get("state", [None])[0])


def result(call) -> dict:
    assert not call.is_error, call.content
    return call.structured_content


def invite(page: Page, email: str) -> str:
    """Invite ``email`` as a member from the team's page; the link the page shows once."""
    page.open(f"/teams/{SLUG}/")
    page.find("#email").send_keys(email)
    Select(page.find("select#role")).select_by_value("member")
    page.click("#invitations form button[type=submit]")
    return urlsplit(page.find("#invitation-link").get_attribute("value")).path


def accept(page: Page, email: str, link: str, found: dict | None = None) -> None:
    """Sign in as the invited address, open the link and accept (the page checked, if
    ``found`` keeps what is wrong)."""
    page.sign_in(email)
    page.open(link)
    assert f"Join {TEAM}?" in page.text
    if found is not None:
        checked(page.driver, found, "join")
    page.click("#join form button[type=submit]")
    page.wait().until(lambda d: d.current_url.endswith(f"/teams/{SLUG}/"))
    page.settle()
    assert f"Welcome to {TEAM}" in page.text


def send(page: Page, words: str) -> None:
    """Ask the chat, and wait for the reply to show what it drew on."""
    page.find(".op-main form[data-op-composer] textarea[name=message]").send_keys(words)
    page.click(".op-main form[data-op-composer] button[type=submit]")
    page.wait().until(lambda d: d.find_elements(By.CSS_SELECTOR, "[data-op-drew-on-item]"))


def downloaded(page: Page, folder: Path) -> zipfile.ZipFile:
    """Click "Download the zip" with Chromium saving downloads to ``folder``; the zip, once
    Chromium has written all of it."""
    page.driver.execute_cdp_cmd("Browser.setDownloadBehavior", {
        "behavior": "allow", "downloadPath": str(folder)})
    page.click("#download")
    page.wait().until(lambda d: [p for p in folder.iterdir() if p.suffix == ".zip"])
    (path,) = folder.glob("*.zip")
    assert path.name.startswith(f"orbitpilot-team-{SLUG}-export-")
    return zipfile.ZipFile(io.BytesIO(path.read_bytes()))


def test_the_pilot_journey(page, second, people, live_app, base_url, axe, committed,
                           tmp_path):
    lead, a, b = people.lead, people.a, people.b
    canary = f"canary{uuid.uuid4().hex[:16]}"
    found: dict = {}  # accessibility problems, by page
    for browser in (page, second):
        browser.driver.set_window_size(1280, 900)
        browser.driver.set_script_timeout(60)

    # -- The lead makes the team and invites A and B, copying each link from the page.
    page.sign_in(lead.email)
    page.open("/teams/")
    checked(page.driver, found, "teams")
    page.find("#name").send_keys(TEAM)
    page.find("#slug").send_keys(SLUG, Keys.ENTER)
    page.wait().until(lambda d: d.current_url.endswith(f"/teams/{SLUG}/"))
    page.settle()
    assert f"Team {TEAM} created" in page.text
    checked(page.driver, found, "home")
    link_a = invite(page, a.email)
    checked(page.driver, found, "invited")
    link_b = invite(page, b.email)
    assert link_a.startswith("/teams/join/opti_") and link_b.startswith("/teams/join/opti_")
    assert link_a != link_b

    # -- A accepts in a browser of their own, and saves to the team on its page by the
    # keyboard (with a canary: the words people type go nowhere staff read).
    accept(second, a.email, link_a, found)
    second.open(f"/teams/{SLUG}/memories/")
    checked(second.driver, found, "memories (empty)")
    second.find("#content").send_keys(f"{SAVED_ON_PAGE} {canary}")
    focus_and_enter(second, "#save-to-team")
    second.wait_for_text(f"Saved to {TEAM}.")

    # -- A's MCP client signs in through the real OAuth flow, A consenting in the
    # browser with the team ticked, and saves to the team by its slug.
    a_consent, a_storage = Consent(second), Storage()
    people.clients.append(a_storage)

    async def a_saves() -> dict:
        async with mcp_session(base_url, a_consent, a_storage,
                               metadata=client_metadata(APP_NAME)) as session:
            return result(await session.call_tool("save_memory", {
                "content": f"{MEMORY} {canary}", "team": SLUG}))

    saved = anyio.run(a_saves)["memory"]
    app_id = a_storage.client.client_id
    assert a_consent.acts_for == f"It may save to: {TEAM} (as member)."
    assert a_consent.callback["code"][0].startswith("opac_")
    claim = f"app {app_id} (it calls itself \u201c{APP_NAME}\u201d)"
    assert (saved["owner"], saved["attribution"]["via"]) == (SLUG, claim)

    # -- The lead asks for the team's export. A real worker builds the team's memory
    # (asked for by the saves) and makes the export, while people go on: the lead sees
    # both memories, each saying who saved it with what, and looks over the team's pages.
    page.open(f"/teams/{SLUG}/export")
    page.click("#ask")
    page.wait().until(lambda d: page.find("#export").get_attribute("data-status") == "queued")
    with ThreadPoolExecutor(1) as pool:
        worker = pool.submit(run_worker, live_app)
        page.open(f"/teams/{SLUG}/memories/")
        card = page.find(f"#memory-{saved['id']}")
        assert f"{MEMORY} {canary}" in card.text
        assert f"Saved by Ada Able via {claim}" in card.text
        assert card.find_element(By.CSS_SELECTOR, ".op-attribution").get_attribute(
            "data-via") == app_id
        (on_page,) = [c for c in page.driver.find_elements(By.CSS_SELECTOR, "article.uc-memory")
                      if c.get_attribute("id") != f"memory-{saved['id']}"]
        assert SAVED_ON_PAGE in on_page.text and "Saved by Ada Able via OrbitPilot" in on_page.text
        assert on_page.find_element(By.LINK_TEXT, "Who can see this?").get_attribute(
            "href").endswith(f"/teams/{SLUG}/access")
        checked(page.driver, found, "memories")
        for path in ("", "status", "access", "settings", "audit",
                     f"members/remove?user_id={a.id}", "leave", "memories/receipts/"):
            page.open(f"/teams/{SLUG}/{path}")
            checked(page.driver, found, path or "home with members")

        # -- B accepts (A's browser, its cookies cleared, signed in as B) and makes an API
        # key naming the team.
        second.open("/")  # back from the OAuth client's address, where nothing listens
        accept(second, b.email, link_b)
        second.open("/settings/keys/")
        second.find("#name").send_keys(f"notes {canary}")
        second.click("#key-teams label", TEAM)
        second.click("form[action$='/settings/keys/'] button[type=submit]")
        key = second.find("#api-key-secret").get_attribute("value")
        assert f"It may act for: {TEAM}." in second.text

        # -- B recalls it by meaning, each answer labelled with the team and its author:
        # first through MCP, B's own client, B consenting in the browser with the team
        # ticked (while the worker may still be at work) ...
        b_consent, b_storage = Consent(second), Storage()
        people.clients.append(b_storage)

        async def b_recalls() -> dict:
            async with mcp_session(base_url, b_consent, b_storage,
                                   metadata=client_metadata(APP_NAME)) as session:
                await anyio.to_thread.run_sync(worker.result)  # it ran all queued
                return result(await session.call_tool("search_memory", {
                    "query": QUESTION, "k": 3}))

        recalled = anyio.run(b_recalls)

    def labelled(hit: dict) -> tuple:
        said = hit["attribution"]
        return hit["memory_id"], hit["owner"], said["owner_name"], said["author"], said["via"]

    expected = (saved["id"], SLUG, TEAM, "Ada Able", claim)
    assert b_consent.acts_for == f"It may save to: {TEAM} (as member)."
    assert labelled(recalled["results"][0]) == expected
    # ... then through the API, with B's key ...
    answer = httpx2.post(f"{base_url}/v1/memories/search", headers={"X-API-Key": key},
                         json={"query": QUESTION, "k": 3}, timeout=60)
    assert answer.status_code == 200, answer.text
    assert labelled(answer.json()["results"][0]) == expected

    # ... and in the chat: the reply names the team; what it drew on, whose and who.
    second.open("/orbitpilot/")
    send(second, QUESTION)
    item = second.find(f"[data-op-drew-on-item][data-item-id='{saved['id']}']")
    assert item.get_attribute("data-owner") == SLUG
    assert item.find_element(By.CSS_SELECTOR, "[data-op-owner]").text == f"Team {TEAM}"
    assert item.find_element(By.CSS_SELECTOR, "[data-op-saved-by]").text == \
        f"Saved by Ada Able via {claim}"
    reply = second.driver.find_elements(By.CSS_SELECTOR, ".op-main .op-msg-assistant")[-1]
    assert f"the team {TEAM}'s" in reply.text

    # -- The lead downloads the export, valid against the shipped schema, holding the
    # memory as saved by A through the app.
    page.open(f"/teams/{SLUG}/export")
    assert page.find("#export").get_attribute("data-status") == "ready"
    archive = downloaded(page, tmp_path)
    document = json.loads(archive.read(TEAM_JSON_NAME))
    jsonschema.validate(document, json.loads(SCHEMA.read_text()))
    (row,) = [m for m in document["memories"] if m["id"] == saved["id"]]
    assert (row["content"], row["author_id"], row["saved_by"]) == (
        f"{MEMORY} {canary}", a.id, f"Saved by Ada Able via {claim}")
    assert row["app"] == {"client_id": app_id, "claimed_name": APP_NAME}

    # -- The lead erases it for good from the page (a reason typed), with a receipt.
    page.open(f"/teams/{SLUG}/memories/")
    page.find(f"#memory-{saved['id']} a[data-action=erase]").click()
    page.settle()
    assert f"Erase this memory of {TEAM} for good?" in page.text
    page.find("#reason").send_keys(f"asked {canary}")
    page.click("#confirm form button[type=submit]", "Erase for good")
    receipt = page.find("#receipt")
    page.settle()
    assert receipt.get_attribute("data-mode") == "hard_delete"
    assert saved["id"] in receipt.text
    # It reached the copies: B's reply that quoted it, its "Drew on" record, the export.
    copies = {e.get_attribute("data-copy"): e.get_attribute("data-removed")
              for e in receipt.find_elements(By.CSS_SELECTOR, "[data-copy]")}
    assert (copies["replies"], copies["drew_on"], copies["exports"]) == ("1", "1", "1")
    page.open(f"/teams/{SLUG}/memories/")
    assert page.driver.find_elements(By.ID, f"memory-{saved['id']}") == []

    # -- Support finds the team by its name; nothing anyone typed is on its pages (the
    # memory saved on the page is still there), nor anywhere in the audit log.
    page.sign_in(people.support.email)
    page.open("/support/")
    page.find("#support-q").send_keys(TEAM, Keys.ENTER)
    page.wait().until(lambda d: "/support/teams/" in d.current_url)  # the one match
    page.settle()
    assert TEAM in page.text
    assert a.email in page.text and b.email in page.text
    assert canary not in page.driver.page_source
    session = committed.session
    session.rollback()
    team_id = session.scalar(select(Team.id).where(Team.slug == SLUG))
    assert {"memory.create", "memory.hard_delete", "export.request"} <= set(session.scalars(
        select(AuditEvent.action).where(AuditEvent.owner_id == team_id)))
    assert session.scalar(text("SELECT count(*) FROM audit_events e WHERE e::text LIKE :c"),
                          {"c": f"%{canary}%"}) == 0

    assert found == {}
    page.assert_no_violations()
    second.assert_no_violations()
