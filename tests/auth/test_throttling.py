"""Sign-in is throttled per account and per client on the app's Redis: 429, Retry-After
and a sentence a person can act on. Only failed attempts count."""

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
