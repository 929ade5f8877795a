"""Blinks: list, create, edit, delete, and the eye ("AI reads this" / "Excluded from AI
memory") as a plain form and as JSON; owner-only; escaped; every change requests a build."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from dashboard.blinks import services
from dashboard.blinks.models import Blink
from dashboard.blinks.services import EXCLUDED_LABEL, READS_LABEL
from dashboard.plans.sentences import state_sentence
from dashboard.plans.services import get_plan_for_user, resolve_sources
from dashboard.sources import BLINKS
from tests.conftest import csrf_from
from tests.factories import make_plan, make_user, queued_triggers, settle

INDEX, EDIT, DELETE, TOGGLE = "/blinks/", "/blinks/edit/", "/blinks/delete/", "/blinks/remember/"
SCRIPT = "<script>alert('blink')</script>"
ESCAPED = "&lt;script&gt;alert(&#39;blink&#39;)&lt;/script&gt;"
MALFORMED_IDS = ("abc", "-1", "0", "1.5", "", str(2**31), str(2**64), "%201", "١٢")


def blink_of(db_session, user, content="a note", title="", excluded=False) -> Blink:
    blink = Blink(user_id=user.id, title=title, content=content,
                  excluded_from_memory=excluded)
    db_session.add(blink)
    db_session.flush()
    return blink


def fresh(db_session, blink_id: int) -> Blink | None:
    db_session.expire_all()
    return db_session.get(Blink, blink_id)


def card(html: str, blink_id: int) -> str:
    """The Blink's card on the list page, and nothing else of the page."""
    start = html.index(f'id="blink-{blink_id}"')
    return html[start:html.index("</article>", start)]


def count_blinks(db_session, user) -> int:
    return db_session.scalar(select(func.count()).select_from(Blink)
                             .where(Blink.user_id == user.id))


# -- guests ---------------------------------------------------------------------------------

@pytest.mark.parametrize("path", [INDEX, f"{EDIT}?id=1", f"{DELETE}?id=1"])
def test_guests_are_sent_to_sign_in(client, path):
    response = client.get(path)
    assert response.status_code == 302
    assert response.headers["Location"].startswith("/auth/signin")


def test_a_guest_cannot_toggle_or_create(client, db_session):
    owner = make_user(db_session)
    blink = blink_of(db_session, owner)
    token = csrf_from(client, "/auth/signin")
    response = client.post(TOGGLE, data={"csrf_token": token, "blink_id": str(blink.id)})
    assert response.status_code == 302
    assert response.headers["Location"].startswith("/auth/signin")
    response = client.post(INDEX, data={"csrf_token": token, "content": "x"})
    assert response.status_code == 302
    assert fresh(db_session, blink.id).excluded_from_memory is False
    assert count_blinks(db_session, owner) == 1


# -- list -----------------------------------------------------------------------------------

def test_the_list_shows_the_users_blinks_newest_first_with_their_eyes(client, db_session, user):
    other = make_user(db_session)
    blink_of(db_session, other, content="someone else's secret")
    older = blink_of(db_session, user, content="first note", title="Older")
    newer = blink_of(db_session, user, content="second note", title="Newer", excluded=True)

    response = client.get(INDEX)
    assert response.status_code == 200
    html = response.get_data(as_text=True)
    assert "someone else" not in html
    assert html.index("second note") < html.index("first note")
    older_card, newer_card = card(html, older.id), card(html, newer.id)
    assert "bi-eye-slash" in newer_card and EXCLUDED_LABEL in newer_card
    assert 'class="bi bi-eye"' in older_card and READS_LABEL in older_card
    assert "bi-eye-slash" not in older_card


def test_the_page_states_whether_blinks_are_remembered_in_the_one_sentence(
        client, db_session, user):
    resolution = resolve_sources(get_plan_for_user(user, db_session))
    sentence = state_sentence(resolution.get(BLINKS), resolution)
    assert sentence.startswith("Remembered")
    assert sentence in client.get(INDEX).get_data(as_text=True)


def test_a_plan_with_blinks_switched_off_says_so(client, db_session, auth):
    plan = make_plan(db_session, assignments={BLINKS: False})
    user = make_user(db_session, plan=plan)
    auth.login(user.email)
    resolution = resolve_sources(get_plan_for_user(user, db_session))
    sentence = state_sentence(resolution.get(BLINKS), resolution)
    assert sentence.startswith("Not remembered")
    html = client.get(INDEX).get_data(as_text=True)
    assert sentence in html
    assert f'data-source="{BLINKS}" data-state="not_assigned_by_admin"' in html


def test_the_list_is_paged(client, db_session, user):
    for n in range(services.PAGE_SIZE + 1):
        blink_of(db_session, user, content=f"note number {n}")
    first = client.get(INDEX).get_data(as_text=True)
    assert first.count('data-blink-id="') == services.PAGE_SIZE
    assert "note number 0\n" not in first and f"note number {services.PAGE_SIZE}" in first
    assert 'href="/blinks/?page=2"' in first
    second = client.get(f"{INDEX}?page=2").get_data(as_text=True)
    assert second.count('data-blink-id="') == 1 and "note number 0<" in second
    # The eye on page 2 brings the person back to page 2.
    assert 'name="next" value="/blinks/?page=2"' in second


@pytest.mark.parametrize("page", ["abc", "-5", "0", str(2**64)])
def test_a_strange_page_number_is_still_a_page(client, user, page):
    assert client.get(f"{INDEX}?page={page}").status_code == 200


def test_the_list_costs_the_same_queries_for_1_or_20_blinks(client, db_session, user,
                                                           count_queries):
    blink_of(db_session, user)
    client.get(INDEX)  # warm: what a first request loads once
    with count_queries() as one:
        assert client.get(INDEX).status_code == 200
    for n in range(19):
        blink_of(db_session, user, content=f"note {n}", excluded=n % 2 == 0)
    with count_queries() as twenty:
        html = client.get(INDEX).get_data(as_text=True)
    assert html.count('data-blink-id="') == 20
    assert twenty.count == one.count
    print(f"blinks list: {one.count} queries for 1 and for 20 Blinks")


# -- create, edit, delete -------------------------------------------------------------------

def test_create_saves_a_blink_and_requests_a_build(client, db_session, user):
    settle(db_session)
    response = client.post(INDEX, data={"csrf_token": csrf_from(client, INDEX),
                                        "title": " Groceries ", "content": "milk\neggs"})
    assert response.status_code == 302
    assert response.headers["Location"] == "/blinks/"
    blink = db_session.scalars(select(Blink).where(Blink.user_id == user.id)).one()
    assert (blink.title, blink.content, blink.excluded_from_memory) == \
        ("Groceries", "milk\neggs", False)
    assert queued_triggers(db_session, user) == ["content_change"]
    assert "Blink saved." in client.get(INDEX).get_data(as_text=True)


@pytest.mark.parametrize("form, error", [
    ({"title": "t", "content": "   "}, "Write something in the Blink."),
    ({"title": "t"}, "Write something in the Blink."),
    ({"content": "x" * (services.MAX_CONTENT + 1)}, "Use at most 20,000 characters."),
    ({"title": "t" * (services.MAX_TITLE + 1), "content": "ok"}, "Use at most 200 characters."),
])
def test_create_refuses_bad_input_as_a_form_error(client, db_session, user, form, error):
    settle(db_session)
    response = client.post(INDEX, data={"csrf_token": csrf_from(client, INDEX), **form})
    assert response.status_code == 400
    html = response.get_data(as_text=True)
    assert error in html and "invalid-feedback" in html
    assert count_blinks(db_session, user) == 0
    assert queued_triggers(db_session, user) == []


def test_create_without_the_csrf_token_is_400(client, db_session, user):
    response = client.post(INDEX, data={"content": "sneaky"})
    assert response.status_code == 400
    assert count_blinks(db_session, user) == 0


def test_edit_shows_the_form_and_saves_changes(client, db_session, user):
    blink = blink_of(db_session, user, content="before", title="T")
    page = client.get(f"{EDIT}?id={blink.id}")
    assert page.status_code == 200
    assert "before" in page.get_data(as_text=True)
    settle(db_session)
    response = client.post(f"{EDIT}?id={blink.id}", data={
        "csrf_token": csrf_from(client, INDEX), "title": "T2", "content": "after"})
    assert response.status_code == 302
    assert response.headers["Location"] == "/blinks/"
    edited = fresh(db_session, blink.id)
    assert (edited.title, edited.content) == ("T2", "after")
    assert queued_triggers(db_session, user) == ["content_change"]


def test_edit_refuses_empty_content_and_keeps_the_blink(client, db_session, user):
    blink = blink_of(db_session, user, content="keep me")
    response = client.post(f"{EDIT}?id={blink.id}", data={
        "csrf_token": csrf_from(client, INDEX), "title": "", "content": ""})
    assert response.status_code == 400
    assert "Write something in the Blink." in response.get_data(as_text=True)
    assert fresh(db_session, blink.id).content == "keep me"


def test_delete_asks_first_then_deletes_and_requests_a_build(client, db_session, user):
    blink = blink_of(db_session, user, content="doomed note")
    confirm = client.get(f"{DELETE}?id={blink.id}")
    assert confirm.status_code == 200
    html = confirm.get_data(as_text=True)
    assert "Delete this Blink?" in html and "doomed note" in html
    assert f'action="/blinks/delete/?id={blink.id}"' in html
    assert fresh(db_session, blink.id) is not None  # asking deleted nothing

    settle(db_session)
    response = client.post(f"{DELETE}?id={blink.id}",
                           data={"csrf_token": csrf_from(client, INDEX)})
    assert response.status_code == 303
    assert fresh(db_session, blink.id) is None
    assert queued_triggers(db_session, user) == ["content_change"]


def test_delete_without_the_csrf_token_is_400(client, db_session, user):
    blink = blink_of(db_session, user)
    assert client.post(f"{DELETE}?id={blink.id}").status_code == 400
    assert fresh(db_session, blink.id) is not None


# -- the eye --------------------------------------------------------------------------------

def toggle(client, blink_id, **extra):
    data = {"csrf_token": csrf_from(client, INDEX), "blink_id": str(blink_id), **extra}
    return client.post(TOGGLE, data=data)


def test_the_eye_as_json_flips_and_answers_the_new_state(client, db_session, user):
    blink = blink_of(db_session, user)
    settle(db_session)
    response = toggle(client, blink.id, format="json")
    assert response.status_code == 200
    assert response.get_json() == {"blink_id": blink.id, "excluded_from_memory": True,
                                   "read": False, "label": EXCLUDED_LABEL}
    assert fresh(db_session, blink.id).excluded_from_memory is True
    assert queued_triggers(db_session, user) == ["content_change"]

    settle(db_session)
    response = toggle(client, blink.id, format="json")
    assert response.get_json() == {"blink_id": blink.id, "excluded_from_memory": False,
                                   "read": True, "label": READS_LABEL}
    assert queued_triggers(db_session, user) == ["content_change"]


def test_the_eye_as_fetch_sends_the_token_in_a_header(client, db_session, user):
    blink = blink_of(db_session, user)
    token = csrf_from(client, INDEX)
    response = client.post(TOGGLE, data={"blink_id": str(blink.id), "format": "json",
                                         "excluded": "1"},
                           headers={"X-CSRFToken": token, "Accept": "application/json"})
    assert response.status_code == 200
    assert response.get_json()["excluded_from_memory"] is True


def test_the_eye_as_a_plain_form_redirects_back_with_a_flash(client, db_session, user):
    blink = blink_of(db_session, user)
    response = toggle(client, blink.id, excluded="1", next="/blinks/?page=1")
    assert response.status_code == 302
    assert response.headers["Location"] == "/blinks/?page=1"
    assert fresh(db_session, blink.id).excluded_from_memory is True
    html = client.get(INDEX).get_data(as_text=True)
    assert f"{EXCLUDED_LABEL}: this takes effect at your next memory update." in html
    shown = card(html, blink.id)
    assert "bi-eye-slash" in shown
    assert 'name="excluded" value="0"' in shown  # the next click asks to read it again


def test_the_eye_asks_for_a_state_so_a_double_submit_lands_where_meant(client, db_session,
                                                                     user):
    blink = blink_of(db_session, user)
    for _ in range(2):
        response = toggle(client, blink.id, excluded="1", format="json")
        assert response.get_json()["excluded_from_memory"] is True
    settle(db_session)
    toggle(client, blink.id, excluded="1", format="json")
    assert queued_triggers(db_session, user) == []  # nothing changed, nothing to build


@pytest.mark.parametrize("target", ["//evil.example/", "https://evil.example/", "/\\evil",
                                    "javascript:alert(1)", "/\r\nX-Injected: 1",
                                    "/\t/evil.example"])
def test_the_eye_never_redirects_off_site(client, db_session, user, target):
    blink = blink_of(db_session, user)
    response = toggle(client, blink.id, next=target)
    assert response.status_code == 302
    assert response.headers["Location"] == "/blinks/"


def test_the_eye_refuses_an_unknown_state_with_a_plain_400(client, db_session, user):
    blink = blink_of(db_session, user)
    response = toggle(client, blink.id, excluded="maybe", format="json")
    assert response.status_code == 400
    assert response.mimetype == "application/problem+json"
    assert "must be 1" in response.get_json()["detail"]
    assert fresh(db_session, blink.id).excluded_from_memory is False


def test_the_eye_without_the_csrf_token_is_400(client, db_session, user):
    blink = blink_of(db_session, user)
    response = client.post(TOGGLE, data={"blink_id": str(blink.id), "format": "json"},
                           headers={"Accept": "application/json"})
    assert response.status_code == 400
    assert fresh(db_session, blink.id).excluded_from_memory is False


# -- owners ---------------------------------------------------------------------------------

def test_another_users_blink_is_404_everywhere(client, db_session, user):
    other = make_user(db_session)
    blink = blink_of(db_session, other, content="not yours", title="private")
    token = csrf_from(client, INDEX)
    assert client.get(f"{EDIT}?id={blink.id}").status_code == 404
    assert client.get(f"{DELETE}?id={blink.id}").status_code == 404
    assert client.post(f"{EDIT}?id={blink.id}", data={
        "csrf_token": token, "content": "hijacked"}).status_code == 404
    assert client.post(f"{DELETE}?id={blink.id}", data={"csrf_token": token}).status_code == 404
    assert toggle(client, blink.id).status_code == 404
    response = toggle(client, blink.id, format="json")
    assert response.status_code == 404
    assert response.mimetype == "application/problem+json"
    assert "not yours" not in response.get_data(as_text=True)
    kept = fresh(db_session, blink.id)
    assert (kept.content, kept.excluded_from_memory) == ("not yours", False)


@pytest.mark.parametrize("raw", MALFORMED_IDS)
def test_a_malformed_id_is_404(client, user, raw):
    token = csrf_from(client, INDEX)
    assert client.get(f"{EDIT}?id={raw}").status_code == 404
    assert client.get(f"{DELETE}?id={raw}").status_code == 404
    assert client.post(f"{DELETE}?id={raw}", data={"csrf_token": token}).status_code == 404
    assert client.post(TOGGLE, data={"csrf_token": token, "blink_id": raw,
                                     "format": "json"}).status_code == 404


def test_a_missing_id_is_404(client, user):
    assert client.get(EDIT).status_code == 404
    assert client.post(TOGGLE, data={"csrf_token": csrf_from(client, INDEX)}).status_code == 404


# -- escaping -------------------------------------------------------------------------------

def test_markup_in_a_blink_is_shown_as_text_everywhere(client, db_session, user):
    blink = blink_of(db_session, user, content=f"body {SCRIPT}", title=f"title {SCRIPT}")
    for path in (INDEX, f"{EDIT}?id={blink.id}", f"{DELETE}?id={blink.id}"):
        html = client.get(path).get_data(as_text=True)
        assert ESCAPED in html, path
        assert SCRIPT not in html, path


# -- the partial ----------------------------------------------------------------------------

def test_the_partial_renders_both_states(app, db_session):
    from flask import render_template
    from flask_login import login_user

    user = make_user(db_session)
    reads = blink_of(db_session, user)
    excluded = blink_of(db_session, user, excluded=True)
    with app.test_request_context("/blinks/"):
        login_user(user)  # the eye reads the person's plan (Free: Blinks remembered)
        shown = render_template("blink/_memory_status.html", blink=reads)
        hidden = render_template("blink/_memory_status.html", blink=excluded)
    assert 'class="bi bi-eye"' in shown and READS_LABEL in shown
    assert 'name="excluded" value="1"' in shown and 'name="csrf_token"' in shown
    assert 'class="bi bi-eye-slash"' in hidden and EXCLUDED_LABEL in hidden
    assert 'name="excluded" value="0"' in hidden
    for html in (shown, hidden):
        assert 'action="/blinks/remember/"' in html and "onclick" not in html


# -- the eye tells what the plan's resolution tells ---------------------------------------

PLAN_CASES = {
    # how the plan treats Blinks: (the plan, or None for the default Free; whether read)
    "free-includes-blinks": (None, True),
    "switched-off-by-an-admin": ({"assignments": {BLINKS: False}, "cap": 3}, False),
    "past-the-cap": ({"cap": 1}, False),
}


@pytest.mark.parametrize("case", list(PLAN_CASES))
def test_the_blink_eye_agrees_with_memory_status_for_the_plan(client, db_session, auth,
                                                              case):
    """The Team plan's kind of resolution (Blinks off) and a cap that leaves them out both
    say "not remembered" on the eye of a Blink its owner left in, with the bi-eye-slash
    icon and Memory Status's sentence; a plan that includes Blinks says "AI reads this"."""
    plan_args, read = PLAN_CASES[case]
    plan = make_plan(db_session, **plan_args) if plan_args else None
    user = make_user(db_session, plan=plan)
    blink = blink_of(db_session, user)
    auth.login(user.email)
    resolution = resolve_sources(get_plan_for_user(user, db_session))
    source = resolution.get(BLINKS)
    assert source.remembered is read  # the case is what its name says
    status = client.get("/memory/status").get_data(as_text=True)
    assert f'<tr data-source="{BLINKS}" data-state="{source.state.value}"' in status
    shown = card(client.get(INDEX).get_data(as_text=True), blink.id)
    assert f'data-read="{"true" if read else "false"}"' in shown
    if read:
        assert 'class="bi bi-eye"' in shown and READS_LABEL in shown
    else:
        assert 'class="bi bi-eye-slash"' in shown and READS_LABEL not in shown
        assert services.PLAN_LEAVES_OUT_LABEL in shown
        assert f'title="{state_sentence(source, resolution)}"' in shown
    edit = client.get(f"{EDIT}?id={blink.id}").get_data(as_text=True)
    assert (READS_LABEL in edit) is read
    # The JSON answer of the switch says the same: excluded, then back in.
    for excluded in (True, False):
        answer = toggle(client, blink.id, format="json", excluded="1" if excluded else "0")
        assert answer.get_json() == {
            "blink_id": blink.id, "excluded_from_memory": excluded,
            "read": read and not excluded,
            "label": services.memory_label(excluded, read)}
    assert services.memory_label(False, False) == services.PLAN_LEAVES_OUT_LABEL


# -- services -------------------------------------------------------------------------------

def test_create_blink_keeps_its_signature_for_catch(db_session):
    user = make_user(db_session)
    blink = services.create_blink(db_session, user_id=user.id, title="", content=" caught ")
    assert (blink.content, blink.excluded_from_memory) == ("caught", False)
    with pytest.raises(services.BlinkError) as refused:
        services.create_blink(db_session, user_id=user.id, title="", content="")
    assert refused.value.field == "content"


def test_set_excluded_flips_when_no_state_is_asked(db_session):
    user = make_user(db_session)
    blink = blink_of(db_session, user)
    assert services.set_excluded(db_session, blink).excluded_from_memory is True
    assert services.set_excluded(db_session, blink).excluded_from_memory is False
    assert services.set_excluded(db_session, blink, False).excluded_from_memory is False


def test_list_blinks_pages_by_one_query(db_session, count_queries):
    user = make_user(db_session)
    made = [blink_of(db_session, user, content=str(n)) for n in range(5)]
    with count_queries() as q:
        page = services.list_blinks(db_session, user_id=user.id, page=2, per_page=2)
    assert q.count == 1
    assert [b.id for b in page.blinks] == [made[2].id, made[1].id]
    assert page.has_next and page.has_previous
    last = services.list_blinks(db_session, user_id=user.id, page=3, per_page=2)
    assert [b.id for b in last.blinks] == [made[0].id] and not last.has_next
