"""Sign-in is throttled per account and per client on the app's Redis: 429, Retry-After
and a sentence a person can act on. Only refused credentials count: not an outage's
503, nor a form refused before the password was checked."""

from __future__ import annotations

import itertools

import pytest

from tests.conftest import csrf_from
from tests.factories import PASSWORD, make_user

_clients = itertools.count(1)


@pytest.fixture
def limits(app, monkeypatch):
    monkeypatch.setitem(app.config, "SIGNIN_LIMIT_PER_ACCOUNT", "3/minute")
    monkeypatch.setitem(app.config, "SIGNIN_LIMIT_PER_CLIENT", "5/minute")


def attempt(client, email: str, password: str, address: str):
    token = csrf_from(client, "/auth/signin")
    return client.post("/auth/signin", data={"email": email, "password": password,
                                             "csrf_token": token},
                       environ_base={"REMOTE_ADDR": address})


def address() -> str:
    return f"10.77.{next(_clients) // 250}.{next(_clients) % 250 + 1}"


def test_an_account_is_throttled_whichever_client_guesses(client, db_session, limits):
    make_user(db_session, email="target@example.test")
    for _ in range(3):
        assert attempt(client, "target@example.test", "wrong-guess-123", address()) \
            .status_code == 400
    refused = attempt(client, "Target@Example.test", "wrong-guess-123", address())
    assert refused.status_code == 429
    assert 0 < int(refused.headers["Retry-After"]) <= 60
    text = refused.get_data(as_text=True)
    assert "Too many attempts. Please wait" in text and "try again" in text
    # Even the right password waits: the account is what is being protected.
    assert attempt(client, "target@example.test", PASSWORD, address()).status_code == 429
    # Another account is not affected.
    make_user(db_session, email="bystander@example.test")
    assert attempt(client, "bystander@example.test", PASSWORD, address()).status_code == 302


def test_a_client_is_throttled_whichever_accounts_it_tries(client, db_session, limits):
    guesser = address()
    for n in range(5):
        assert attempt(client, f"guess{n}@example.test", "wrong-guess-123", guesser) \
            .status_code == 400
    refused = attempt(client, "guess9@example.test", "wrong-guess-123", guesser)
    assert refused.status_code == 429 and "Retry-After" in refused.headers
    make_user(db_session, email="someone@example.test")
    assert attempt(client, "someone@example.test", PASSWORD, address()).status_code == 302


def test_the_counts_live_in_the_apps_redis(app, client, db_session, limits):
    from dashboard.queues import redis_client

    prefix = app.config["RATELIMIT_STORAGE_OPTIONS"]["key_prefix"]
    redis = redis_client(app)
    before = set(redis.scan_iter(f"{prefix}*"))
    attempt(client, "counted@example.test", "wrong-guess-123", address())
    added = {key.decode() for key in set(redis.scan_iter(f"{prefix}*")) - before}
    assert any("counted@example.test" in key for key in added), added


def test_successful_sign_ins_do_not_count(client, db_session, limits, auth):
    make_user(db_session, email="regular@example.test")
    here = address()
    for _ in range(6):
        assert attempt(client, "regular@example.test", PASSWORD, here).status_code == 302
        auth.logout()
    assert attempt(client, "regular@example.test", PASSWORD, here).status_code == 302


def test_the_429_is_json_for_json_clients(client, db_session, limits):
    for _ in range(3):
        attempt(client, "api@example.test", "wrong-guess-123", "10.99.0.1")
    token = csrf_from(client, "/auth/signin")
    refused = client.post("/auth/signin", data={"email": "api@example.test",
                                                "password": "x", "csrf_token": token},
                          headers={"Accept": "application/json"},
                          environ_base={"REMOTE_ADDR": "10.99.0.2"})
    assert refused.status_code == 429
    assert refused.mimetype == "application/problem+json"
    assert refused.get_json()["status"] == 429


def test_sign_ins_answered_503_in_an_outage_do_not_count(app, committed, limits):
    """After a database outage everyone can sign in at once, not after the window."""
    from dashboard import create_app
    from dashboard.security import get_limiter
    from tests.conftest import make_test_config

    # Committed data and no db_session: the outage app must use its own (broken) engine.
    user = committed.user()
    committed.session.commit()
    get_limiter(app).reset()
    outage = create_app(make_test_config(
        SQLALCHEMY_DATABASE_URI="postgresql+psycopg://nobody@127.0.0.1:1/nothing",
        REDIS_URL=app.config["REDIS_URL"], SECRET_KEY=app.config["SECRET_KEY"],
        SIGNIN_LIMIT_PER_ACCOUNT=app.config["SIGNIN_LIMIT_PER_ACCOUNT"],
        SIGNIN_LIMIT_PER_CLIENT=app.config["SIGNIN_LIMIT_PER_CLIENT"]))
    visitor, here = outage.test_client(), address()
    statuses = [attempt(visitor, user.email, PASSWORD, here).status_code for _ in range(6)]
    assert statuses == [503] * 6
    # Back up: the same account from the same address signs in at once.
    assert attempt(app.test_client(), user.email, PASSWORD, here).status_code == 302


@pytest.mark.parametrize("refused", ["no csrf token", "no password", "unreadable"])
def test_sign_ins_refused_before_the_password_is_checked_do_not_count(client, db_session,
                                                                     limits, refused):
    make_user(db_session, email="careful@example.test")
    here = address()
    data = {"email": "careful@example.test", "password": "wrong-guess-123",
            "csrf_token": csrf_from(client, "/auth/signin")}
    if refused == "no csrf token":
        del data["csrf_token"]
    elif refused == "no password":
        data["password"] = ""
    else:
        data["password"] = "nul\x00"
    for _ in range(6):
        response = client.post("/auth/signin", data=data, environ_base={"REMOTE_ADDR": here})
        assert response.status_code == 400
    assert attempt(client, "careful@example.test", PASSWORD, here).status_code == 302


def test_only_a_refused_email_and_password_count(client, db_session, limits):
    make_user(db_session, email="counted@example.test")
    here = address()
    for _ in range(3):
        assert attempt(client, "counted@example.test", "wrong-guess-123", here) \
            .status_code == 400
    assert attempt(client, "counted@example.test", PASSWORD, here).status_code == 429
