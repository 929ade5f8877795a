"""What every request and response passes through: security headers with a CSP the
pages work under, a clear 400 for input PostgreSQL cannot store, /healthz per component."""

from __future__ import annotations

import html
import http.client
import json
import logging
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy import func, select

from dashboard import create_app
from dashboard.auth.models import User
from dashboard.blinks.models import Blink
from dashboard.extensions import db
from dashboard.memory import embedders, get_embedder
from dashboard.orbitpilot.models import ProfileFact
from dashboard.plans.models import Plan
from dashboard.security import (
    BODY_UNREADABLE,
    HOST_INVALID,
    HOST_NOT_SERVED,
    TOO_DEEP,
    UNREADABLE,
)
from tests.conftest import CSRF_RE, csrf_from, make_test_config
from tests.embedded.procs import wait_until
from tests.factories import PASSWORD, make_plan, make_user

PROJECT_ROOT = Path(__file__).resolve().parent.parent
REQUIRED = {
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
}


@pytest.mark.parametrize("path", ["/", "/auth/signin", "/healthz", "/no/such/page",
                                  "/admin/", "/static/admin-csp.js", "/memory/update"])
def test_every_response_carries_the_security_headers(client, path):
    response = client.get(path)
    for header, value in REQUIRED.items():
        assert response.headers[header] == value, (path, header)
    csp = response.headers["Content-Security-Policy"]
    assert "frame-ancestors 'none'" in csp and "object-src 'none'" in csp
    assert "'unsafe-inline'" not in csp and "'unsafe-eval'" not in csp


def test_the_csp_nonce_is_fresh_per_response_and_matches_the_page(client, db_session, auth):
    make_user(db_session, role="admin", email="root@example.test")
    auth.login("root@example.test")
    nonces = []
    for path in ("/", "/admin/plan/"):
        response = client.get(path)
        nonce = re.search(r"'nonce-([^']+)'", response.headers["Content-Security-Policy"])[1]
        assert f'nonce="{nonce}"' in response.get_data(as_text=True)
        nonces.append(nonce)
    assert nonces[0] != nonces[1]


def count(db_session, model) -> int:
    return db_session.scalar(select(func.count()).select_from(model))


def test_a_nul_byte_at_sign_in_or_sign_up_is_a_clear_400(client, db_session):
    for path, data in [
        ("/auth/signin", {"email": "a\x00b@example.test", "password": "x" * 12}),
        ("/auth/signup", {"email": "new@example.test", "display_name": "Nul\x00Name",
                          "password": "a-long-enough-passphrase",
                          "confirm": "a-long-enough-passphrase"}),
    ]:
        before = count(db_session, User)
        response = client.post(path, data={**data, "csrf_token": csrf_from(client, path)})
        assert response.status_code == 400, path
        assert UNREADABLE in response.get_data(as_text=True)
        assert count(db_session, User) == before


def test_a_nul_byte_in_a_plan_name_is_a_clear_400_and_changes_nothing(client, db_session,
                                                                      auth):
    make_user(db_session, role="admin", email="root@example.test")
    plan = make_plan(db_session, name="Steady")
    auth.login("root@example.test")
    token = csrf_from(client, f"/admin/plan/edit/?id={plan.id}")
    response = client.post(f"/admin/plan/edit/?id={plan.id}", data={
        "name": "Bad\x00Name", "slug": plan.slug, "included_sources": "3",
        "monthly_price_cents": "0", "csrf_token": token})
    assert response.status_code == 400
    db_session.expire_all()
    assert db_session.get(Plan, plan.id).name == "Steady"


@pytest.mark.parametrize("query", ["q=%00", "q=%FF%FE", "%00=1", "next=%C3%28"])
def test_unreadable_query_strings_are_a_clear_400(client, query):
    response = client.get(f"/auth/signin?{query}")
    assert response.status_code == 400
    assert UNREADABLE in response.get_data(as_text=True)


def test_a_nul_in_json_is_refused_before_any_view_sees_it(client):
    response = client.post("/auth/signin", data=json.dumps({"email": "a\u0000b"}),
                           content_type="application/json")
    assert response.status_code == 400


# A lone surrogate is valid JSON (an escape) and a valid Python string, but no UTF-8 can
# hold it: PostgreSQL, and the page that would show it again, cannot take it.
SURROGATE_BODIES = {
    "/blinks/": '{"title": "\\ud800", "content": "half \\udc00 a pair"}',
    "/profile/": '{"key": "city", "value": "\\ud800"}',
    "/settings/keys/": '{"name": "\\ud800", "scopes": ["memory:read"]}',
    "/documents/": '{"title": "\\ud800"}',
    "/v1/memories": '{"content": "fine", "metadata": {"\\ud800": 1}}',
}


@pytest.mark.parametrize("path", SURROGATE_BODIES)
def test_a_lone_surrogate_in_json_is_a_clear_400_and_changes_nothing(client, user, path,
                                                                     db_session, caplog):
    token = csrf_from(client, "/")
    before = count(db_session, Blink), count(db_session, ProfileFact)
    response = client.post(path, data=SURROGATE_BODIES[path], content_type="application/json",
                           headers={"X-CSRFToken": token})
    assert response.status_code == 400
    assert UNREADABLE in html.unescape(response.get_data(as_text=True))
    assert (count(db_session, Blink), count(db_session, ProfileFact)) == before
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_json_nested_past_the_parser_is_a_400_on_any_endpoint(client):
    response = client.post("/auth/signin", data="[" * 100_000,
                           content_type="application/json")
    assert response.status_code == 400
    assert TOO_DEEP in response.get_data(as_text=True)


def test_healthz_reports_each_component(client, app):
    get_embedder(app.config["EMBEDDER"])  # as a web worker of the run command has
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.get_json() == {"status": "ok", "components": {
        "postgres": "ok", "redis": "ok", "embedder": "ok"}}


def test_healthz_says_warming_until_this_process_holds_the_model(client, app, monkeypatch):
    monkeypatch.setattr(embedders, "_EMBEDDERS", {})
    monkeypatch.setattr(embedders, "_LOADS", {})
    response = client.get("/healthz")
    assert response.status_code == 503
    assert response.get_json() == {"status": "warming", "components": {
        "postgres": "ok", "redis": "ok", "embedder": "warming"}}
    # It asked for the load, in the background: the next check finds it done.
    assert wait_until(lambda: embedders.embedder_loaded(app.config["EMBEDDER"]), timeout=30)
    assert client.get("/healthz").status_code == 200
    assert embedders.embedder_loads(app.config["EMBEDDER"]) == 1


@pytest.mark.parametrize("broken, setting, url", [
    ("postgres", "SQLALCHEMY_DATABASE_URI", "postgresql+psycopg://nobody@127.0.0.1:1/nothing"),
    ("redis", "REDIS_URL", "unix:///nonexistent/redis.sock"),
])
def test_healthz_is_503_naming_the_component_that_is_down(app, broken, setting, url):
    with app.app_context():
        working = {"SQLALCHEMY_DATABASE_URI": app.config["SQLALCHEMY_DATABASE_URI"],
                   "REDIS_URL": app.config["REDIS_URL"]}
    outage = create_app(make_test_config(**{**working, setting: url}))
    response = outage.test_client().get("/healthz")
    assert response.status_code == 503
    body = response.get_json()
    assert body["status"] == "unavailable" and body["unavailable"] == [broken]
    working = ({"postgres", "redis"} - {broken}).pop()
    assert {k: body["components"][k] for k in ("postgres", "redis")} == \
        {broken: "unavailable", working: "ok"}
    text = response.get_data(as_text=True)
    assert "nobody" not in text  # never the URL
    assert not re.search(r"Error|Exception|Timeout|\(", text)  # nor the exception's class


def test_every_405_says_which_methods_are_allowed(app, client):
    """Each rule's URL with a method no route has: a 405 naming what the URL takes."""
    by_path: dict[str, set[str]] = {}
    for rule in app.url_map.iter_rules():
        path = re.sub(r"<[^>]+>", "1", rule.rule)
        by_path.setdefault(path, set()).update(rule.methods)
    for path, methods in sorted(by_path.items()):
        response = client.put(path)
        assert response.status_code == 405, path
        allowed = {m.strip() for m in response.headers.get("Allow", "").split(",")}
        assert methods <= allowed, (path, response.headers.get("Allow"))
        if path.startswith("/v1/"):
            assert response.mimetype == "application/problem+json", path
    answer = client.get("/auth/signout")
    assert answer.status_code == 405 and "POST" in answer.headers["Allow"]
    assert "GET" not in answer.headers["Allow"]


def test_form_bytes_that_are_not_utf8_are_a_clear_400_not_silently_replaced(client, db_session):
    before = count(db_session, User)
    response = client.post("/auth/signup", data=b"email=x%FF%40example.test&password=p",
                           content_type="application/x-www-form-urlencoded")
    assert response.status_code == 400
    assert UNREADABLE in response.get_data(as_text=True)
    assert count(db_session, User) == before


def test_a_database_outage_is_a_503_page_even_for_a_signed_in_user(app, committed):
    # Committed data and no db_session: the outage app must use its own (broken) engine.
    user = committed.user()
    committed.session.commit()
    working = app.test_client()
    token = csrf_from(working, "/auth/signin")
    assert working.post("/auth/signin", data={"email": user.email, "password": PASSWORD,
                                              "csrf_token": token}).status_code == 302
    cookie = working.get_cookie("session")
    outage = create_app(make_test_config(
        SQLALCHEMY_DATABASE_URI="postgresql+psycopg://nobody@127.0.0.1:1/nothing",
        REDIS_URL=app.config["REDIS_URL"], SECRET_KEY=app.config["SECRET_KEY"]))
    visitor = outage.test_client()
    visitor.set_cookie("session", cookie.value, domain=cookie.domain)
    response = visitor.get("/")
    assert response.status_code == 503
    page = response.get_data(as_text=True)
    assert "cannot reach its database" in page and "nobody" not in page


# -- the Host header -------------------------------------------------------------------------

BAD_HOSTS = ["a" * 64 + ".example", "a" * 64, "www." + "b" * 70 + ".test:5000", "a..example",
             ".example", "-" * 80, "two words.example", "example.test:99999",
             "example.test:port", "[::1", ("a" * 60 + ".") * 5 + "test"]
GOOD_HOSTS = ["localhost", "127.0.0.1:5000", "[::1]:8080", "example.test.",
              "orbitpilot.example.test", "web_1:8000", "a" * 63 + ".example"]


@pytest.fixture(scope="module")
def unnamed_app(app):
    """The app as production runs it, with no SERVER_NAME: the Host header is what the
    URLs are bound to (the test config's fixed one would hide it)."""
    live = create_app(make_test_config(SERVER_NAME=None))
    yield live
    with live.app_context():
        db.engine.dispose()


def get_paths(flask_app) -> list[str]:
    """One URL per GET rule of the app, every argument "1"."""
    return sorted({re.sub(r"<[^>]+>", "1", rule.rule) for rule in flask_app.url_map.iter_rules()
                   if "GET" in rule.methods})


def test_a_host_with_a_label_over_63_characters_is_a_clear_400_on_every_route(
        unnamed_app, db_session, caplog):
    client = unnamed_app.test_client()
    paths = get_paths(unnamed_app)
    assert "/healthz" in paths and "/v1/memories" in paths and len(paths) > 30
    for path in paths:
        response = client.get(path, headers={"Host": "a" * 64 + ".example"})
        assert response.status_code == 400, path
        assert HOST_INVALID in response.get_data(as_text=True), path
        if path.startswith("/v1/"):
            assert response.mimetype == "application/problem+json", path
        for header, value in REQUIRED.items():
            assert response.headers[header] == value, (path, header)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


@pytest.mark.parametrize("proxies", [0, 1])
def test_every_malformed_host_is_refused_and_every_good_one_served(app, proxies):
    behind = create_app(make_test_config(SERVER_NAME=None, TRUSTED_PROXIES=proxies))
    client = behind.test_client()
    forwarded = {"X-Forwarded-For": "203.0.113.9", "X-Forwarded-Proto": "https"}
    for host in BAD_HOSTS:
        for path in ("/auth/signin", "/healthz"):
            response = client.get(path, headers={"Host": host, **forwarded})
            assert response.status_code == 400, (host, path)
            assert HOST_INVALID in response.get_data(as_text=True)
            assert host not in response.get_data(as_text=True)  # never echoed
    for host in GOOD_HOSTS:
        response = client.get("/auth/signin", headers={"Host": host, **forwarded})
        assert response.status_code == 200, host
    with behind.app_context():
        db.engine.dispose()


def test_with_trusted_hosts_only_those_are_served(app):
    served = create_app(make_test_config(SERVER_NAME=None,
                                         TRUSTED_HOSTS=["dashboard.example", ".corp.example"]))
    client = served.test_client()
    for host in ("dashboard.example", "dashboard.example:8443", "eu.corp.example"):
        assert client.get("/auth/signin", headers={"Host": host}).status_code == 200, host
    for host in ("evil.example", "dashboard.example.evil.example", "127.0.0.1"):
        for path in ("/auth/signin", "/healthz", "/v1/openapi.json"):
            response = client.get(path, headers={"Host": host})
            assert response.status_code == 400, (host, path)
            assert HOST_NOT_SERVED in response.get_data(as_text=True)
            assert host not in response.get_data(as_text=True)
    with served.app_context():
        db.engine.dispose()


# -- what only a real HTTP server hands the app ---------------------------------------------

BROKEN_CHUNKS = b"ZZ\r\nxx"  # "ZZ" is no chunk size: the body cannot be read at all


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    text: str


def send_raw(port: int, method: str, path: str, headers: dict[str, str],
             body: bytes = b"") -> Answer:
    """One request written exactly as given (no Host or Content-Length added), and the
    answer, over a connection of its own."""
    head = "".join(f"{name}: {value}\r\n" for name, value in
                   {"Host": f"127.0.0.1:{port}", "Connection": "close", **headers}.items())
    with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
        sock.sendall(f"{method} {path} HTTP/1.1\r\n{head}\r\n".encode("latin-1") + body)
        response = http.client.HTTPResponse(sock)
        response.begin()
        return Answer(response.status, {k.lower(): v for k, v in response.getheaders()},
                      response.read().decode("utf-8", "replace"))


def guest_token(port: int) -> dict[str, str]:
    """A guest's session cookie and CSRF token, as the sign-in page hands them out."""
    page = send_raw(port, "GET", "/auth/signin", {})
    assert page.status == 200, page.text
    cookie = page.headers["set-cookie"].split(";", 1)[0]
    return {"Cookie": cookie, "X-CSRFToken": CSRF_RE.search(page.text).group(1)}


@pytest.fixture(scope="module")
def werkzeug_port(app) -> Iterator[int]:
    """The app behind werkzeug's own HTTP server, in a thread (no fixed SERVER_NAME, as
    in production); under TESTING an exception escapes as the server's bare 500."""
    from werkzeug.serving import make_server

    live = create_app(make_test_config(SERVER_NAME=None))
    server = make_server("127.0.0.1", 0, live, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_port
    finally:
        server.shutdown()
        thread.join(timeout=10)
        server.server_close()
        with live.app_context():
            db.engine.dispose()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Gunicorn:
    port: int
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")


@pytest.fixture(scope="module")
def gunicorn(app, tmp_path_factory) -> Iterator[Gunicorn]:
    """``wsgi:app`` under gunicorn as ``./scripts/run`` serves it (gthread workers, not
    under TESTING), on the test database and Redis."""
    instance = tmp_path_factory.mktemp("gunicorn-instance")
    server = Gunicorn(free_port(), instance / "gunicorn.log")
    env = {**os.environ, "DATABASE_URL": app.config["SQLALCHEMY_DATABASE_URI"],
           "REDIS_URL": app.config["REDIS_URL"], "SECRET_KEY": app.config["SECRET_KEY"],
           "ORBITPILOT_INSTANCE": str(instance)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "--bind", f"127.0.0.1:{server.port}",
         "--workers", "1", "--threads", "2", "--no-control-socket", "wsgi:app"],
        cwd=PROJECT_ROOT, env=env, stdout=server.log.open("w"), stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, server.output()
            try:
                if send_raw(server.port, "GET", "/healthz", {}).status == 200:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, server.output()
            time.sleep(0.2)
        yield server
    finally:
        proc.terminate()
        proc.wait(timeout=20)


# Every kind of body a POST is read as: the input guard reads the first three itself.
BODY_TYPES = ["application/x-www-form-urlencoded", "multipart/form-data; boundary=x",
              "application/json"]
CHUNKED_POSTS = ["/auth/signin", "/auth/signup", "/blinks/", "/v1/memories"]


def assert_unreadable_body_refused(answer: Answer, path: str) -> None:
    said = re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", answer.text)))[-300:]
    assert (answer.status, BODY_UNREADABLE in said) == (400, True), (path, answer.status, said)
    if path.startswith("/v1/"):
        assert answer.headers["content-type"] == "application/problem+json"


@pytest.mark.parametrize("content_type", BODY_TYPES)
def test_a_malformed_chunked_body_is_a_clear_400_behind_werkzeug(werkzeug_port,
                                                                 content_type):
    signin = {**guest_token(werkzeug_port), "Content-Type": content_type,
              "Transfer-Encoding": "chunked"}
    for path in CHUNKED_POSTS:
        answer = send_raw(werkzeug_port, "POST", path, signin, BROKEN_CHUNKS)
        assert_unreadable_body_refused(answer, path)


@pytest.mark.processes
@pytest.mark.parametrize("content_type", BODY_TYPES)
def test_a_malformed_chunked_body_is_a_clear_400_behind_gunicorn(gunicorn, content_type):
    signin = {**guest_token(gunicorn.port), "Content-Type": content_type,
              "Transfer-Encoding": "chunked"}
    for path in CHUNKED_POSTS:
        answer = send_raw(gunicorn.port, "POST", path, signin, BROKEN_CHUNKS)
        assert_unreadable_body_refused(answer, path)
    # Without a body type nothing reads the body: the form is refused as incomplete.
    answer = send_raw(gunicorn.port, "POST", "/auth/signin",
                      {**signin, "Content-Type": "text/plain"}, BROKEN_CHUNKS)
    assert answer.status == 400, answer.text[-500:]
    assert "Traceback" not in gunicorn.output() and "unhandled" not in gunicorn.output()
