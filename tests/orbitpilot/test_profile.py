"""The profile-facts editor (/profile/): add, edit, delete; keys validated and unique per
user (a duplicate is a form error, even when a concurrent request made it); owner-only;
escaped; every change requests a build."""

from __future__ import annotations

import threading
import time

import pytest
from sqlalchemy import func, select, text
from sqlalchemy.orm import Session

from dashboard.extensions import db
from dashboard.orbitpilot import profile_services as services
from dashboard.orbitpilot.models import ProfileFact
from dashboard.plans.sentences import state_sentence
from dashboard.plans.services import get_plan_for_user, resolve_sources
from dashboard.sources import PROFILE
from tests.conftest import csrf_from
from tests.factories import make_plan, make_user, queued_triggers, settle

INDEX, EDIT, DELETE = "/profile/", "/profile/edit/", "/profile/delete/"
SCRIPT = "<script>alert('fact')</script>"
ESCAPED = "&lt;script&gt;alert(&#39;fact&#39;)&lt;/script&gt;"


def fact_of(db_session, user, key="city", value="Lyon") -> ProfileFact:
    fact = ProfileFact(user_id=user.id, key=key, value=value)
    db_session.add(fact)
    db_session.flush()
    return fact


def facts(db_session, user) -> dict[str, str]:
    db_session.expire_all()
    return dict(db_session.execute(select(ProfileFact.key, ProfileFact.value)
                                   .where(ProfileFact.user_id == user.id)).all())


def add(client, **form):
    return client.post(INDEX, data={"csrf_token": csrf_from(client, INDEX), **form})


def test_guests_are_sent_to_sign_in(client):
    response = client.get(INDEX)
    assert response.status_code == 302
    assert response.headers["Location"].startswith("/auth/signin")


def test_the_page_lists_the_users_facts_and_the_profile_sentence(client, db_session, user):
    fact_of(db_session, user, "city", "Lyon")
    fact_of(db_session, user, "preferred language", "French")
    fact_of(db_session, make_user(db_session), "city", "Elsewhere-on-earth")
    response = client.get(INDEX)
    assert response.status_code == 200
    html = response.get_data(as_text=True)
    assert "Lyon" in html and "French" in html and "Elsewhere-on-earth" not in html
    assert html.index("city") < html.index("preferred language")
    resolution = resolve_sources(get_plan_for_user(user, db_session))
    assert state_sentence(resolution.get(PROFILE), resolution) in html


def test_a_plan_without_the_profile_says_so(client, db_session, auth):
    user = make_user(db_session, plan=make_plan(db_session, assignments={PROFILE: False}))
    auth.login(user.email)
    resolution = resolve_sources(get_plan_for_user(user, db_session))
    sentence = state_sentence(resolution.get(PROFILE), resolution)
    assert sentence.startswith("Not remembered")
    assert sentence in client.get(INDEX).get_data(as_text=True)


def test_adding_a_fact_normalises_its_key_and_requests_a_build(client, db_session, user):
    settle(db_session)
    response = add(client, key="  Preferred   Language ", value=" French \n please ")
    assert response.status_code == 302
    assert response.headers["Location"] == "/profile/"
    assert facts(db_session, user) == {"preferred language": "French please"}
    assert queued_triggers(db_session, user) == ["content_change"]


@pytest.mark.parametrize("form, error", [
    ({"key": "", "value": "x"}, "Name the fact"),
    ({"key": "city", "value": "  "}, "Write the value of the fact."),
    ({"key": "k" * 65, "value": "x"}, "Use at most 64 characters for the key."),
    ({"key": "city", "value": "v" * 1001}, "Use at most 1,000 characters for the value."),
    ({"key": "<b>", "value": "x"}, "Start the key with a letter or digit"),
    ({"key": "_hidden", "value": "x"}, "Start the key with a letter or digit"),
    ({"key": "a:b", "value": "x"}, "Start the key with a letter or digit"),
])
def test_bad_facts_are_form_errors(client, db_session, user, form, error):
    settle(db_session)
    response = add(client, **form)
    assert response.status_code == 400
    assert error in response.get_data(as_text=True)
    assert facts(db_session, user) == {}
    assert queued_triggers(db_session, user) == []


def test_a_duplicate_key_is_a_form_error_not_a_500(client, db_session, user):
    fact_of(db_session, user, "city", "Lyon")
    settle(db_session)
    response = add(client, key="City", value="Paris")
    assert response.status_code == 400
    assert "You already have a fact called “city”." in response.get_data(as_text=True)
    assert facts(db_session, user) == {"city": "Lyon"}
    assert queued_triggers(db_session, user) == []
    # The request's transaction is still usable: the next add works.
    assert add(client, key="country", value="France").status_code == 302
    assert facts(db_session, user) == {"city": "Lyon", "country": "France"}


def test_the_same_key_for_another_user_is_fine(client, db_session, user):
    fact_of(db_session, make_user(db_session), "city", "Oslo")
    assert add(client, key="city", value="Lyon").status_code == 302
    assert facts(db_session, user) == {"city": "Lyon"}


def test_a_profile_is_bounded(client, db_session, user, monkeypatch):
    monkeypatch.setattr(services, "MAX_FACTS", 2)
    fact_of(db_session, user, "a", "1")
    fact_of(db_session, user, "b", "2")
    response = add(client, key="c", value="3")
    assert response.status_code == 400
    assert "A profile holds at most 2 facts" in response.get_data(as_text=True)


def test_without_the_csrf_token_nothing_changes(client, db_session, user):
    fact = fact_of(db_session, user)
    assert client.post(INDEX, data={"key": "k", "value": "v"}).status_code == 400
    assert client.post(f"{EDIT}?id={fact.id}", data={"key": "k", "value": "v"}).status_code \
        == 400
    assert client.post(f"{DELETE}?id={fact.id}").status_code == 400
    assert facts(db_session, user) == {"city": "Lyon"}


def test_editing_a_fact_saves_it_and_requests_a_build(client, db_session, user):
    fact = fact_of(db_session, user)
    page = client.get(f"{EDIT}?id={fact.id}")
    assert page.status_code == 200
    assert 'value="Lyon"' in page.get_data(as_text=True)
    settle(db_session)
    response = client.post(f"{EDIT}?id={fact.id}", data={
        "csrf_token": csrf_from(client, INDEX), "key": "home town", "value": "Paris"})
    assert response.status_code == 302
    assert facts(db_session, user) == {"home town": "Paris"}
    assert queued_triggers(db_session, user) == ["content_change"]


def test_renaming_onto_an_existing_key_is_a_form_error(client, db_session, user):
    fact_of(db_session, user, "city", "Lyon")
    other = fact_of(db_session, user, "country", "France")
    response = client.post(f"{EDIT}?id={other.id}", data={
        "csrf_token": csrf_from(client, INDEX), "key": "CITY", "value": "Paris"})
    assert response.status_code == 400
    html = response.get_data(as_text=True)
    assert "You already have a fact called “city”." in html
    assert 'value="Paris"' in html  # what was typed is kept
    assert facts(db_session, user) == {"city": "Lyon", "country": "France"}


def test_deleting_a_fact_requests_a_build(client, db_session, user):
    fact = fact_of(db_session, user)
    settle(db_session)
    response = client.post(f"{DELETE}?id={fact.id}", data={"csrf_token": csrf_from(client, INDEX)})
    assert response.status_code == 303
    assert facts(db_session, user) == {}
    assert queued_triggers(db_session, user) == ["content_change"]


def test_another_users_fact_is_404(client, db_session, user):
    fact = fact_of(db_session, make_user(db_session), "city", "Oslo")
    token = csrf_from(client, INDEX)
    assert client.get(f"{EDIT}?id={fact.id}").status_code == 404
    assert client.post(f"{EDIT}?id={fact.id}", data={
        "csrf_token": token, "key": "city", "value": "Mine now"}).status_code == 404
    assert client.post(f"{DELETE}?id={fact.id}", data={"csrf_token": token}).status_code == 404
    db_session.expire_all()
    assert db_session.get(ProfileFact, fact.id).value == "Oslo"


@pytest.mark.parametrize("raw", ["abc", "-1", "0", "", str(2**31), str(2**64), "%201"])
def test_a_malformed_id_is_404(client, user, raw):
    assert client.get(f"{EDIT}?id={raw}").status_code == 404
    assert client.post(f"{DELETE}?id={raw}",
                       data={"csrf_token": csrf_from(client, INDEX)}).status_code == 404


def test_markup_in_a_fact_is_shown_as_text(client, db_session, user):
    fact = fact_of(db_session, user, "motto", SCRIPT)
    for path in (INDEX, f"{EDIT}?id={fact.id}"):
        html = client.get(path).get_data(as_text=True)
        assert ESCAPED in html, path
        assert SCRIPT not in html, path


def test_the_page_costs_the_same_queries_for_1_or_20_facts(client, db_session, user,
                                                          count_queries):
    fact_of(db_session, user, "fact 0", "v")
    client.get(INDEX)
    with count_queries() as one:
        assert client.get(INDEX).status_code == 200
    for n in range(1, 20):
        fact_of(db_session, user, f"fact {n}", "v")
    with count_queries() as twenty:
        html = client.get(INDEX).get_data(as_text=True)
    assert html.count('data-fact-id="') == 20
    assert twenty.count == one.count
    print(f"profile page: {one.count} queries for 1 and for 20 facts")


def _wait_until_blocked(engine, thread: threading.Thread) -> None:
    """Until some session of this database waits on a lock (or the thread is done)."""
    with engine.connect() as probe:
        for _ in range(400):
            waiting = probe.execute(text(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE datname = current_database() AND wait_event_type = 'Lock'")).scalar()
            probe.rollback()
            if waiting or not thread.is_alive():
                return
            time.sleep(0.025)


def test_a_duplicate_from_a_concurrent_request_is_a_form_error(app, committed, queue):
    """Two requests add the same key at once: the second waits on the first's row in the
    unique index and, when the first commits, gets a form error (not an IntegrityError)."""
    user = committed.user()
    committed.session.commit()
    with app.app_context():
        first, second = Session(db.engine), Session(db.engine)
        outcome: dict[str, object] = {}

        def racer() -> None:
            with app.app_context():
                try:
                    services.add_fact(second, user_id=user.id, key="City", value="Paris")
                except services.ProfileError as exc:
                    outcome["error"] = exc
                except Exception as exc:  # reported by the assertion below
                    outcome["unexpected"] = exc
                else:
                    outcome["added"] = True

        try:
            services.add_fact(first, user_id=user.id, key="city", value="Lyon")
            thread = threading.Thread(target=racer)
            thread.start()
            _wait_until_blocked(db.engine, thread)
            first.commit()
            thread.join(timeout=30)
            assert not thread.is_alive()
            assert set(outcome) == {"error"}, outcome
            assert outcome["error"].field == "key"
            assert "You already have a fact called “city”." in str(outcome["error"])
            # The second transaction is still usable after the form error.
            assert second.scalar(select(func.count()).select_from(ProfileFact)
                                 .where(ProfileFact.user_id == user.id)) == 1
        finally:
            second.rollback()
            second.close()
            first.rollback()
            first.close()
