"""One delete for every page of the user's own rows (``forms.delete_page``): a Blink, a
document and a profile fact are deleted the same way — the confirm page is a GET that
changes nothing (under a legal hold too), the delete is a POST with its CSRF token, and
both a delete and a legal hold's refusal answer 303 back to the list with a flash of the
same shape."""

from __future__ import annotations

import pytest

from dashboard.audit.services import Actor
from dashboard.blinks.models import Blink
from dashboard.documents.models import Document
from dashboard.holds import place_hold
from dashboard.orbitpilot.models import ProfileFact
from tests.conftest import csrf_from
from tests.factories import make_blink

PAGES = {
    # kind: (delete path, the list, the noun of "… deleted.", what the hold's refusal names)
    "blink": ("/blinks/delete/", "/blinks/", "Blink", "a Blink"),
    "document": ("/documents/delete/", "/documents/", "Document", "a document"),
    "fact": ("/profile/delete/", "/profile/", "Profile fact", "a profile fact"),
}
MODELS = {"blink": Blink, "document": Document, "fact": ProfileFact}


def row_of(db_session, user, kind: str):
    if kind == "blink":
        return make_blink(db_session, user, "a note to delete")
    row = Document(user_id=user.id, title="Notes", content="text") if kind == "document" \
        else ProfileFact(user_id=user.id, key="city", value="Lyon")
    db_session.add(row)
    db_session.flush()
    return row


def still_there(db_session, kind: str, row_id: int) -> bool:
    db_session.expire_all()
    return db_session.get(MODELS[kind], row_id) is not None


def flashes(client) -> list[str]:
    with client.session_transaction() as session:
        return [message for _, message in session.get("_flashes", [])]


def hold(db_session, user) -> None:
    place_hold(db_session, user.id, reason="matter 9", ends_at=None, actor=Actor("system"))


@pytest.mark.parametrize("held", [False, True], ids=["free", "held"])
@pytest.mark.parametrize("method", ["GET", "HEAD"])
@pytest.mark.parametrize("kind", sorted(PAGES))
def test_the_confirm_page_is_a_get_that_changes_nothing(client, db_session, user, kind,
                                                       method, held):
    path, _, _, _ = PAGES[kind]
    row = row_of(db_session, user, kind)
    if held:
        hold(db_session, user)
    answer = client.open(f"{path}?id={row.id}", method=method)
    assert answer.status_code == 200
    if method == "GET":
        page = answer.get_data(as_text=True)
        assert f'<form method="post" action="{path}?id={row.id}">' in page
        assert 'name="csrf_token"' in page
    assert still_there(db_session, kind, row.id)
    assert flashes(client) == []


@pytest.mark.parametrize("kind", sorted(PAGES))
def test_a_post_deletes_and_goes_back_to_the_list_with_303(client, db_session, user, kind):
    path, back, noun, _ = PAGES[kind]
    row = row_of(db_session, user, kind)
    answer = client.post(f"{path}?id={row.id}", data={"csrf_token": csrf_from(client, back)})
    assert answer.status_code == 303
    assert answer.headers["Location"] == back
    assert flashes(client) == [f"{noun} deleted."]
    assert not still_there(db_session, kind, row.id)


@pytest.mark.parametrize("kind", sorted(PAGES))
def test_under_a_hold_a_post_deletes_nothing_and_says_why_with_303(client, db_session, user,
                                                                  kind):
    path, back, _, what = PAGES[kind]
    row = row_of(db_session, user, kind)
    hold(db_session, user)
    answer = client.post(f"{path}?id={row.id}", data={"csrf_token": csrf_from(client, back)})
    assert answer.status_code == 303
    assert answer.headers["Location"] == back
    (message,) = flashes(client)
    assert message.startswith(f"Your account is under a legal hold: {what} cannot be "
                              "deleted until the hold ends.")
    assert still_there(db_session, kind, row.id)


@pytest.mark.parametrize("kind", sorted(PAGES))
def test_a_post_without_its_csrf_token_is_400_and_deletes_nothing(client, db_session, user,
                                                                 kind):
    path, _, _, _ = PAGES[kind]
    row = row_of(db_session, user, kind)
    assert client.post(f"{path}?id={row.id}").status_code == 400
    assert still_there(db_session, kind, row.id)
