"""What every request and response passes through: security headers with a CSP the
pages work under, a clear 400 for input PostgreSQL cannot store, /healthz per component."""

from __future__ import annotations

import json
import re

import pytest
from sqlalchemy import func, select

from dashboard import create_app
from dashboard.auth.models import User
from dashboard.plans.models import Plan
from dashboard.security import TOO_DEEP, UNREADABLE
from tests.conftest import csrf_from, make_test_config
from tests.factories import PASSWORD, make_plan, make_user

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


def test_json_nested_past_the_parser_is_a_400_on_any_endpoint(client):
    response = client.post("/auth/signin", data="[" * 100_000,
                           content_type="application/json")
    assert response.status_code == 400
    assert TOO_DEEP in response.get_data(as_text=True)


def test_healthz_reports_each_component(client):
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.get_json() == {"status": "ok",
                                   "components": {"postgres": "ok", "redis": "ok"}}


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
    assert body["components"][broken].startswith("unavailable")
    assert "nobody" not in response.get_data(as_text=True)  # never the URL


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
