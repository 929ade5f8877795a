"""Sign up, sign in, sign out, CSRF, role checks."""

import pytest
from sqlalchemy import func, select

from dashboard.auth.models import User
from dashboard.plans.services import get_plan_for_user
from tests.conftest import csrf_from
from tests.factories import PASSWORD, make_user


def signup(client, **overrides):
    data = {
        "email": "new.person@example.test",
        "display_name": "New Person",
        "password": "a-long-enough-passphrase",
        "confirm": "a-long-enough-passphrase",
        "csrf_token": csrf_from(client, "/auth/signup"),
    }
    data.update(overrides)
    return client.post("/auth/signup", data=data)


def users_count(db_session) -> int:
    return db_session.scalar(select(func.count()).select_from(User))


def test_signup_lands_on_the_default_free_plan_and_signs_in(client, db_session):
    response = signup(client, email="  New.Person@Example.TEST ")
    assert response.status_code == 302
    user = db_session.scalars(select(User).where(User.email == "new.person@example.test")).one()
    assert user.role == "user"
    assert user.plan_id is None
    assert get_plan_for_user(user, db_session).name == "Free"
    assert user.password_hash != "a-long-enough-passphrase"
    home = client.get("/").get_data(as_text=True)
    assert "new.person@example.test" in home
    assert "your plan includes 3 sources, and your profile, your Blinks and saved memories" \
        " come first" in home


def test_signup_with_a_taken_email_is_a_form_error(client, db_session):
    make_user(db_session, email="taken@example.test")
    before = users_count(db_session)
    response = signup(client, email="TAKEN@example.test")
    assert response.status_code == 400
    assert "An account with that email already exists." in response.get_data(as_text=True)
    assert users_count(db_session) == before


def test_signup_with_a_weak_password_is_a_form_error(client, db_session):
    before = users_count(db_session)
    for weak, reason in [
        ("short", "Use at least 10 characters."),
        ("password123", "among the most common"),
        ("aaaaaaaaaaaaaa", "not one or two repeated"),
    ]:
        response = signup(client, password=weak, confirm=weak)
        assert response.status_code == 400
        assert reason in response.get_data(as_text=True)
    assert users_count(db_session) == before


def test_signup_with_mismatched_confirmation(client, db_session):
    response = signup(client, confirm="something-else-entirely")
    assert response.status_code == 400
    assert "The passwords differ." in response.get_data(as_text=True)


def test_signup_without_csrf_token_is_refused_and_writes_nothing(client, db_session):
    before = users_count(db_session)
    response = client.post("/auth/signup", data={
        "email": "nocsrf@example.test", "password": "a-long-enough-passphrase",
        "confirm": "a-long-enough-passphrase",
    })
    assert response.status_code == 400
    assert "security token" in response.get_data(as_text=True)
    assert users_count(db_session) == before


def test_signup_with_a_malformed_email(client, db_session):
    response = signup(client, email="not-an-email")
    assert response.status_code == 400
    assert "valid email" in response.get_data(as_text=True)


def test_signin_and_signout(client, db_session, auth):
    make_user(db_session, email="someone@example.test")
    response = auth.login("someone@example.test", PASSWORD)
    assert response.status_code == 302
    assert "someone@example.test" in client.get("/").get_data(as_text=True)
    response = auth.logout()
    assert response.status_code == 302
    assert "Create a free account" in client.get("/").get_data(as_text=True)


def test_signin_with_a_wrong_password_says_so_without_saying_which(client, db_session, auth):
    make_user(db_session, email="someone@example.test")
    wrong = auth.login("someone@example.test", "not-the-password")
    unknown = auth.login("nobody@example.test", "not-the-password")
    for response in (wrong, unknown):
        assert response.status_code == 400
        assert "match an account" in response.get_data(as_text=True)


def test_signout_requires_post_with_csrf(client, db_session, auth):
    make_user(db_session, email="someone@example.test")
    auth.login("someone@example.test")
    assert client.get("/auth/signout").status_code == 405
    assert client.post("/auth/signout").status_code == 400
    assert "someone@example.test" in client.get("/").get_data(as_text=True)


@pytest.mark.parametrize("target", ["https://evil.example/x", "//evil.example/x",
                                    "/\\evil.example", "/\r\nX-Injected: 1"])
def test_signin_refuses_an_offsite_next(client, db_session, target):
    from urllib.parse import quote

    make_user(db_session, email="someone@example.test")
    token = csrf_from(client, "/auth/signin")
    response = client.post(f"/auth/signin?next={quote(target, safe='')}", data={
        "email": "someone@example.test", "password": PASSWORD, "csrf_token": token})
    assert response.status_code == 302
    assert response.headers["Location"] == "/"


def test_deactivated_account_cannot_sign_in(client, db_session, auth):
    user = make_user(db_session, email="gone@example.test")
    user.active = False
    db_session.flush()
    assert auth.login("gone@example.test").status_code == 400


def test_staff_pages_need_the_role(client, db_session, auth):
    assert client.get("/admin/").status_code == 302  # guest: to sign-in
    make_user(db_session, email="plain@example.test")
    auth.login("plain@example.test")
    assert client.get("/admin/").status_code == 403
    assert client.get("/admin/plan/").status_code == 403
    auth.logout()
    make_user(db_session, email="support@example.test", role="support")
    auth.login("support@example.test")
    assert client.get("/admin/").status_code == 200
    assert client.get("/admin/builds/").status_code == 200
    assert client.get("/admin/plan/").status_code == 403  # plans are the admin's
    auth.logout()
    make_user(db_session, email="admin@example.test", role="admin")
    auth.login("admin@example.test")
    assert client.get("/admin/plan/").status_code == 200
    assert client.get("/admin/user/").status_code == 200


@pytest.mark.parametrize("typed", ["/signin", "/login"])
def test_the_addresses_people_type_redirect_to_the_sign_in_page(client, typed):
    answer = client.get(typed)
    assert answer.status_code == 302
    assert answer.headers["Location"] == "/auth/signin"


@pytest.mark.parametrize("typed", ["/signin", "/login"])
def test_a_typed_sign_in_address_keeps_a_local_next(client, typed):
    from urllib.parse import parse_qs, urlsplit

    answer = client.get(f"{typed}?next=/memory/status%3Ftab%3D1")
    assert answer.status_code == 302
    location = urlsplit(answer.headers["Location"])
    assert location.path == "/auth/signin"
    assert parse_qs(location.query) == {"next": ["/memory/status?tab=1"]}


@pytest.mark.parametrize("target", ["https://evil.example/x", "//evil.example/x",
                                    "/\\evil.example"])
def test_a_typed_sign_in_address_drops_an_offsite_next(client, target):
    from urllib.parse import quote

    answer = client.get(f"/signin?next={quote(target, safe='')}")
    assert answer.status_code == 302
    assert answer.headers["Location"] == "/auth/signin"
