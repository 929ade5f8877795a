"""Client ID metadata documents are fetched only for a signed-in person at the consent
page, never for whoever calls the token or revocation endpoint; a fetch has one deadline
for all of it, connects to the address it checked, runs on a small pool (sharing a
fetch of the same URL, refusing at once when full), and storing a new client counts
against the registration limit. The acceptance run: gunicorn as in production, 32
token calls naming a document that trickles one byte a second, and /healthz answers."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from urllib.parse import urlencode

import httpx2
import pytest
from sqlalchemy import select, update

from dashboard.connectors import oauth, services
from dashboard.connectors.documents import DocumentRefused, Fetcher, FetchesBusy, FetchPool
from dashboard.connectors.models import OAuthClient
from tests.connectors.metadata_server import TEST_HOST, serving_client_document
from tests.connectors.oauth_flow import (
    REDIRECT_URI,
    answer_consent,
    authorize_url,
    callback,
    exchange,
    pkce,
    register,
)
from tests.embedded.procs import wait_until
from tests.workers import ROOT

FORM = "application/x-www-form-urlencoded"


def token_call(client_id: str) -> dict:
    return {"grant_type": "authorization_code", "code": "opac_nothing",
            "code_verifier": "v" * 50, "client_id": client_id, "redirect_uri": REDIRECT_URI}


def stored(db_session, url: str) -> OAuthClient | None:
    return db_session.scalars(select(OAuthClient).where(OAuthClient.client_id == url)).first()


# -- the client endpoints never fetch -------------------------------------------------------

def test_the_token_and_revocation_endpoints_never_fetch_a_document(client, document,
                                                                     db_session):
    answer = client.post("/oauth/token", data=token_call(document.url))
    assert (answer.status_code, answer.get_json()["error"]) == (400, "invalid_client")
    answer = client.post("/oauth/revoke", data={"token": "opat_x", "client_id": document.url})
    assert (answer.status_code, answer.get_json()["error"]) == (400, "invalid_client")
    assert document.fetches == 0
    assert stored(db_session, document.url) is None


def test_a_stored_document_client_is_used_at_the_token_endpoint_whatever_its_age(
        client, signed_in, document, db_session):
    verifier, challenge = pkce()
    params = callback(answer_consent(client, authorize_url(document.url, challenge)))
    fetched = document.fetches  # the consent page, then the answer
    assert fetched == 2
    db_session.execute(update(OAuthClient).values(
        fetched_at=datetime.now(UTC) - timedelta(days=30)))
    answer = exchange(client, document.url, params["code"], verifier)
    assert answer.status_code == 200, answer.get_json()
    assert document.fetches == fetched  # not read again


# -- one deadline, one address --------------------------------------------------------------

def test_a_trickling_document_is_abandoned_at_the_whole_deadline(
        app, client, signed_in, document, monkeypatch, db_session):
    # One byte every 0.2 s never trips a per-read timeout of a second: only a deadline for
    # the whole fetch ends it.
    monkeypatch.setitem(app.config, "OAUTH_CLIENT_METADATA_TIMEOUT", 1)
    document.trickle = 0.2
    _, challenge = pkce()
    answer = client.get(authorize_url(document.url, challenge))
    assert answer.status_code == 400 and "Location" not in answer.headers
    assert "did not arrive in time" in answer.get_data(as_text=True)
    assert document.fetches == 1
    assert document.wait_abandoned(1)  # the server saw us hang up
    assert stored(db_session, document.url) is None


def test_the_fetcher_connects_to_the_address_it_checked(document):
    asked: list[str] = []

    def resolve(host: str, port: int) -> list[str]:
        # A rebinding name server: the checked answer first, another one after.
        asked.append(host)
        return ["127.0.0.1"] if len(asked) == 1 else ["192.0.2.1"]

    url = document.url_on(TEST_HOST)
    document.body["client_id"] = url
    fetcher = Fetcher(ca_file=str(document.ca_file), allow_private=True, timeout=10,
                      resolve=resolve)
    assert fetcher.fetch(url)["client_id"] == url  # TLS verified against the name
    assert asked == [TEST_HOST]
    assert document.fetches == 1


@pytest.mark.parametrize("addresses", [["10.0.0.7"], ["127.0.0.1"], ["169.254.169.254"],
                                       ["93.184.216.34", "192.168.1.1"], ["::1"],
                                       ["fd00::1"], ["fe80::1%eth0"]])
def test_a_name_that_resolves_to_a_private_address_is_refused_unconnected(
        document, addresses):
    asked: list[str] = []

    def resolve(host: str, port: int) -> list[str]:
        asked.append(host)
        return addresses

    fetcher = Fetcher(ca_file=str(document.ca_file), resolve=resolve)
    with pytest.raises(DocumentRefused, match="private network"):
        fetcher.fetch(document.url_on(TEST_HOST))
    assert (asked, document.fetches) == ([TEST_HOST], 0)


def test_a_private_address_in_the_url_itself_is_refused_unresolved(document):
    def resolve(host: str, port: int) -> list[str]:
        raise AssertionError("an address is not looked up")

    with pytest.raises(DocumentRefused, match="private network"):
        Fetcher(ca_file=str(document.ca_file), resolve=resolve).fetch(document.url)
    assert document.fetches == 0


def test_a_document_over_64_kib_is_refused(document):
    document.body["padding"] = "x" * (64 * 1024)
    fetcher = Fetcher(ca_file=str(document.ca_file), allow_private=True)
    with pytest.raises(DocumentRefused, match="too large"):
        fetcher.fetch(document.url)


# -- the pool -------------------------------------------------------------------------------

class HeldFetcher:
    """Stands in for the network: each fetch waits for ``release``, and is counted."""

    timeout = 30.0

    def __init__(self) -> None:
        self.release = threading.Event()
        self.fetched: list[str] = []

    def fetch(self, url: str) -> dict:
        self.fetched.append(url)
        assert self.release.wait(30)
        return {"url": url}


def in_thread(call) -> tuple[threading.Thread, list]:
    box: list = []
    thread = threading.Thread(target=lambda: box.append(call()), daemon=True)
    thread.start()
    return thread, box


def test_concurrent_requests_for_the_same_url_share_one_fetch():
    pool, held = FetchPool(2), HeldFetcher()
    first, got_first = in_thread(lambda: pool.fetch(held, "https://a.example/c.json"))
    assert wait_until(lambda: pool.waiting == 1, timeout=10)
    second, got_second = in_thread(lambda: pool.fetch(held, "https://a.example/c.json"))
    assert wait_until(lambda: pool.waiting == 2, timeout=10)
    held.release.set()
    first.join(10)
    second.join(10)
    assert got_first == got_second == [{"url": "https://a.example/c.json"}]
    assert (pool.started, held.fetched) == (1, ["https://a.example/c.json"])


def test_a_full_pool_refuses_at_once_and_starts_nothing():
    pool, held = FetchPool(2), HeldFetcher()
    threads = [in_thread(lambda u=u: pool.fetch(held, u))[0]
               for u in ("https://a.example/c.json", "https://b.example/c.json")]
    assert wait_until(lambda: pool.waiting == 2, timeout=10)
    with pytest.raises(FetchesBusy):
        pool.fetch(held, "https://c.example/c.json")
    with pytest.raises(FetchesBusy):  # nor may more requests wait on a running one
        pool.fetch(held, "https://a.example/c.json")
    held.release.set()
    for thread in threads:
        thread.join(10)
    assert pool.started == 2 and pool.waiting == 0


def test_a_name_server_that_never_answers_frees_the_fetch_slot_at_the_deadline():
    """The system's resolver takes no timeout: the lookup is left behind at the fetch's
    deadline, and the pool's one slot serves the next fetch at once (not "busy")."""
    pool, stuck = FetchPool(1), threading.Event()

    def never_answers(host: str, port: int) -> list[str]:
        stuck.wait(30)
        return ["93.184.216.34"]

    try:
        with pytest.raises(DocumentRefused, match="did not resolve in time"):
            pool.fetch(Fetcher(timeout=0.5, resolve=never_answers), "https://hung.example/c.json")
        private = Fetcher(resolve=lambda host, port: ["10.0.0.7"])  # refused, unconnected
        with pytest.raises(DocumentRefused, match="private network"):
            pool.fetch(private, "https://next.example/c.json")
        assert (pool.started, pool.waiting) == (2, 0)
    finally:
        stuck.set()


def test_the_consent_page_says_try_again_when_the_pool_is_full(app, client, signed_in,
                                                               document):
    pool, held = oauth.fetch_pool(app), HeldFetcher()
    threads = [in_thread(lambda n=n: pool.fetch(held, f"https://{n}.example/c.json"))[0]
               for n in range(pool.size)]
    try:
        assert wait_until(lambda: pool.waiting == pool.size, timeout=10)
        _, challenge = pkce()
        answer = client.get(authorize_url(document.url, challenge))
    finally:
        held.release.set()
        for thread in threads:
            thread.join(10)
    assert answer.status_code == 503 and "Location" not in answer.headers
    assert int(answer.headers["Retry-After"]) > 0
    assert "Try again in a moment" in answer.get_data(as_text=True)
    assert document.fetches == 0


# -- new clients count as registrations -----------------------------------------------------

def test_storing_a_new_document_client_counts_as_a_registration(app, client, signed_in,
                                                                 document, monkeypatch,
                                                                 db_session):
    monkeypatch.setitem(app.config, "OAUTH_REGISTER_LIMIT", "2 per hour")
    register(client)
    _, challenge = pkce()
    answer_consent(client, authorize_url(document.url, challenge))
    assert stored(db_session, document.url) is not None
    answer = client.post("/oauth/register", json={"redirect_uris": [REDIRECT_URI]})
    assert answer.status_code == 429


def test_a_new_document_client_past_the_registration_limit_is_not_fetched(
        app, client, signed_in, document, monkeypatch, db_session):
    monkeypatch.setitem(app.config, "OAUTH_REGISTER_LIMIT", "1 per hour")
    register(client)
    _, challenge = pkce()
    answer = client.get(authorize_url(document.url, challenge))
    assert answer.status_code == 429 and "Location" not in answer.headers
    assert document.fetches == 0 and stored(db_session, document.url) is None


def test_the_consent_page_shows_a_new_document_client_without_storing_it(
        client, signed_in, document, db_session):
    _, challenge = pkce()
    answer = client.get(authorize_url(document.url, challenge))
    assert answer.status_code == 200
    assert "ChatGPT (test)" in answer.get_data(as_text=True)
    assert stored(db_session, document.url) is None  # a GET writes nothing


# -- the acceptance run ---------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.processes
def test_32_token_calls_naming_a_trickling_document_leave_healthz_answering(app, tmp_path):
    with serving_client_document(tmp_path, client_name="Slow app") as document:
        document.trickle = 1.0  # a byte a second, for as long as anyone listens
        port = free_port()
        env = {**os.environ, "DATABASE_URL": app.config["SQLALCHEMY_DATABASE_URI"],
               "REDIS_URL": app.config["REDIS_URL"], "EMBEDDER": "hashing",
               "BUILD_QUEUE": f"builds-gunicorn-{port}", "OAUTH_RATE_LIMIT": "1000 per minute",
               "OAUTH_CLIENT_METADATA_CA": str(document.ca_file),
               "OAUTH_CLIENT_METADATA_ALLOW_PRIVATE": "true"}
        log = (tmp_path / "gunicorn.log").open("w")
        # As the run command serves: gunicorn, one worker of four request threads.
        server = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "--bind", f"127.0.0.1:{port}", "--workers", "1",
             "--threads", "4", "--graceful-timeout", "2", "--no-control-socket",
             "--config", "python:dashboard.gunicorn_hooks", "wsgi:app"],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        base = f"http://127.0.0.1:{port}"
        try:
            def healthz() -> int | None:
                try:
                    return httpx2.get(f"{base}/healthz", timeout=5).status_code
                except httpx2.HTTPError:
                    return None

            assert wait_until(lambda: healthz() == 200 or server.poll() is not None,
                              timeout=120, every=0.2), (tmp_path / "gunicorn.log").read_text()
            assert server.poll() is None, (tmp_path / "gunicorn.log").read_text()
            body = urlencode(token_call(document.url))
            started = threading.Barrier(33)

            def token() -> httpx2.Response:
                started.wait()
                return httpx2.post(f"{base}/oauth/token", content=body, timeout=120,
                                   headers={"Content-Type": FORM})

            def health() -> httpx2.Response:
                started.wait()
                # Generous, yet far below the stall: 32 fetches at a byte a second would
                # hold all four threads for minutes.
                return httpx2.get(f"{base}/healthz", timeout=20)

            with ThreadPoolExecutor(33) as workers:
                calls = [workers.submit(token) for _ in range(32)]
                answer = workers.submit(health).result()
                answers = [call.result() for call in calls]
            assert (answer.status_code, answer.json()["status"]) == (200, "ok")
            assert [(a.status_code, a.json()["error"]) for a in answers] == \
                [(400, "invalid_client")] * 32
            assert all(a.headers["cache-control"] == "no-store" for a in answers)
            assert document.fetches == 0
        finally:
            server.terminate()
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait(timeout=30)
            log.close()


def test_save_document_client_keeps_one_row_per_client_id(db_session, document):
    first = services.save_document_client(db_session, document.url, document.body)
    document.body["client_name"] = "Renamed"
    again = services.save_document_client(db_session, document.url, document.body)
    assert (again.id, again.name) == (first.id, "Renamed")
