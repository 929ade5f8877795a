"""Error pages in our words, in the context they happen in, with a way on."""

from __future__ import annotations

from tests.factories import make_user
from tests.orbitpilot.dom import parse


def _page(response):
    page = parse(response.get_data(as_text=True))
    card = page.find(data_error=True)
    assert card is not None
    return page, card


def test_a_missing_page_says_so_in_our_words_with_a_way_home(client):
    response = client.get("/no-such-page")
    assert response.status_code == 404
    page, card = _page(response)
    assert card.find("h1").normalized_text == "Page not found (404)"
    assert "requested URL" not in card.normalized_text  # werkzeug's stock sentence
    assert card.find(data_way_back=True).find("a").attrs["href"] == "/"


def test_a_sentence_of_our_own_is_kept(client, auth, db_session):
    make_user(db_session, role="support", email="errors-support@example.test")
    auth.login("errors-support@example.test")
    response = client.get("/support/users/2147483000")
    assert response.status_code == 404
    _, card = _page(response)
    assert "There is no such user." in card.normalized_text


def test_in_the_staff_console_the_way_back_is_the_staff_home_and_no_dock(client, auth,
                                                                         db_session):
    make_user(db_session, role="support", email="errors-staff@example.test")
    auth.login("errors-staff@example.test")
    response = client.get("/admin/assignments/")  # admins only
    assert response.status_code == 403
    page, card = _page(response)
    assert card.find("h1").normalized_text == "Not for this account (403)"
    assert card.find(data_way_back=True).find("a").attrs["href"] == "/admin/"
    assert page.find("details", cls="op-dock") is None
    elsewhere = parse(client.get("/no-such-page").get_data(as_text=True))
    assert elsewhere.find("details", cls="op-dock") is not None  # the user side keeps it


def test_a_request_of_the_wrong_kind_says_so(client):
    response = client.get("/orbitpilot/message/remember/")  # POST only
    assert response.status_code == 405
    _, card = _page(response)
    assert card.find("h1").normalized_text == "Not this way (405)"


def _fails_in_the_database(*args, **kwargs):
    """A page's work that fails the transaction half way (as a race's IntegrityError
    does): the statement errors, the transaction is aborted."""
    from sqlalchemy import text

    from dashboard.extensions import db
    db.session.execute(text("SELECT * FROM no_such_table_for_the_error_page"))


def test_an_error_that_aborted_the_transaction_gets_our_page_and_headers(
        client, user, app, monkeypatch):
    monkeypatch.setattr("dashboard.views.resolution_of", _fails_in_the_database)
    monkeypatch.setitem(app.config, "PROPAGATE_TEST_ERRORS", False)
    response = client.get("/")
    assert response.status_code == 500
    page, card = _page(response)  # the whole page: it read the database after a rollback
    assert card.find("h1").normalized_text == "Something went wrong (500)"
    assert page.find("details", cls="op-dock") is not None
    assert "no_such_table" not in response.get_data(as_text=True)
    assert "frame-ancestors 'none'" in response.headers["Content-Security-Policy"]
    assert response.headers["X-Content-Type-Options"] == "nosniff"


def test_an_error_page_that_fails_too_is_sent_bare_with_the_headers(
        client, user, app, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("the template could not render")

    monkeypatch.setattr("dashboard.views.resolution_of", _fails_in_the_database)
    monkeypatch.setattr("dashboard.errors.render_template", broken)
    monkeypatch.setitem(app.config, "PROPAGATE_TEST_ERRORS", False)
    response = client.get("/")
    assert response.status_code == 500
    assert response.mimetype == "text/plain"
    assert response.get_data(as_text=True).startswith("Something went wrong")
    assert "could not render" not in response.get_data(as_text=True)
    assert "frame-ancestors 'none'" in response.headers["Content-Security-Policy"]
