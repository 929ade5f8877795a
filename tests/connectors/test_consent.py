"""The consent page offers a box per scope a person may grant (ticked when the app asked
for it, delete and redact explained when asked for), the connection holds only what was
ticked and the audit event records what was asked and ticked; the protected-resource
metadata advertises only the everyday scopes. A double-clicked Allow (two answers at
once) gets one connection, never a 500."""

from __future__ import annotations

import html
import re
import threading
from urllib.parse import parse_qs, urljoin, urlsplit

import httpx2
import pytest
from markupsafe import escape
from sqlalchemy import select, text

from dashboard.audit.models import AuditEvent
from dashboard.connectors import services
from dashboard.connectors.models import OAuthCode, OAuthGrant
from dashboard.extensions import db
from dashboard.saved_memories.models import SCOPES
from tests.connectors.helpers import Person, live_app
from tests.connectors.oauth_flow import (
    ACTION,
    CSRF,
    REDIRECT_URI,
    answer_consent,
    authorize_url,
    boxes,
    callback,
    exchange,
    pkce,
    register,
)
from tests.embedded.procs import wait_until

LABEL = re.compile(r'<label class="form-check-label" for="([^"]+)">')
BOX_ID = re.compile(r'<input[^>]*type="checkbox"[^>]*id="([^"]+)"')


def consent_page(client, client_id: str, scope: str) -> str:
    _, challenge = pkce()
    page = client.get(authorize_url(client_id, challenge, scope=scope))
    assert page.status_code == 200, page.status_code
    return page.get_data(as_text=True)


def grant_of(db_session, user) -> OAuthGrant:
    return db_session.scalars(select(OAuthGrant).where(OAuthGrant.user_id == user.id)).one()


def test_every_grantable_scope_is_a_labelled_box_ticked_when_the_app_asked_for_it(
        client, signed_in):
    client_id = register(client)["client_id"]
    page = consent_page(client, client_id, "memory:read memory:write")
    assert boxes(page) == {"memory:read": True, "memory:write": True,
                           "memory:delete": False, "memory:redact": False}
    assert LABEL.findall(page) == BOX_ID.findall(page)  # every box has its own <label>
    for scope in services.USER_SCOPES:
        assert str(escape(services.SCOPE_WORDS[scope])) in page
    assert "data-warning" not in page  # nothing asked for that needs one


def test_delete_and_redact_asked_for_are_ticked_and_explained(client, signed_in):
    client_id = register(client)["client_id"]
    page = consent_page(client, client_id, "memory:read memory:delete memory:redact")
    assert boxes(page) == {"memory:read": True, "memory:write": False,
                           "memory:delete": True, "memory:redact": True}
    for scope in ("memory:delete", "memory:redact"):
        warning = re.search(rf'<p[^>]*id="([^"]+)" data-warning="{scope}">', page).group(1)
        assert f'aria-describedby="{warning}"' in page  # read out with its box
    assert "cannot be undone" in page


def test_the_connection_holds_only_what_was_ticked_and_the_audit_says_both(
        client, signed_in, db_session):
    client_id = register(client)["client_id"]
    verifier, challenge = pkce()
    asked = "memory:read memory:write memory:delete"
    params = callback(answer_consent(client, authorize_url(client_id, challenge, scope=asked),
                                     untick=("memory:write", "memory:delete")))
    grant = grant_of(db_session, signed_in)
    assert grant.scopes == ["memory:read"]
    body = exchange(client, client_id, params["code"], verifier).get_json()
    assert body["scope"] == "memory:read"
    event = db_session.scalars(select(AuditEvent).where(
        AuditEvent.action == "oauth.grant", AuditEvent.owner_id == signed_in.id)).one()
    assert (event.details["asked"], event.details["ticked"]) == (asked.split(),
                                                                 ["memory:read"])


def test_a_box_ticked_beyond_what_was_asked_is_granted(client, signed_in, db_session):
    client_id = register(client)["client_id"]
    verifier, challenge = pkce()
    params = callback(answer_consent(client, authorize_url(client_id, challenge),
                                     tick=("memory:delete",)))
    assert grant_of(db_session, signed_in).scopes == ["memory:read", "memory:write",
                                                      "memory:delete"]
    body = exchange(client, client_id, params["code"], verifier).get_json()
    assert body["scope"] == "memory:read memory:write memory:delete"


def test_hard_delete_sent_as_a_box_is_never_granted(client, signed_in, db_session):
    client_id = register(client)["client_id"]
    _, challenge = pkce()
    url = authorize_url(client_id, challenge, scope="memory:read memory:hard_delete")
    page = client.get(url).get_data(as_text=True)
    assert "memory:hard_delete" not in boxes(page)
    answer = client.post(ACTION.search(page).group(1).replace("&amp;", "&"), data={
        "csrf_token": CSRF.search(page).group(1), "decision": "allow",
        "granted": ["memory:read", "memory:hard_delete", "memory:everything"]})
    assert answer.status_code == 302
    assert grant_of(db_session, signed_in).scopes == ["memory:read"]


def test_allow_with_nothing_ticked_asks_again_and_grants_nothing(client, signed_in,
                                                                db_session):
    client_id = register(client)["client_id"]
    _, challenge = pkce()
    answer = answer_consent(client, authorize_url(client_id, challenge),
                            untick=("memory:read", "memory:write"))
    assert answer.status_code == 400 and "Location" not in answer.headers
    assert 'id="consent-error"' in answer.get_data(as_text=True)
    assert db_session.scalars(select(OAuthGrant)).all() == []
    assert db_session.scalars(select(OAuthCode)).all() == []


def test_the_metadata_advertise_the_everyday_scopes_to_clients(client):
    resource = client.get("/.well-known/oauth-protected-resource/mcp").get_json()
    assert resource["scopes_supported"] == ["memory:read", "memory:write"]
    server = client.get("/.well-known/oauth-authorization-server").get_json()
    assert server["scopes_supported"] == list(SCOPES)


# -- a double-clicked Allow -----------------------------------------------------------------

@pytest.mark.processes
def test_two_allows_at_once_make_one_connection_and_both_get_a_code(app):
    with live_app() as live:
        client_id = httpx2.post(f"{live.url}/oauth/register", json={
            "client_name": "Twice", "redirect_uris": [REDIRECT_URI],
            "token_endpoint_auth_method": "none"}).json()["client_id"]
        person = Person(live.url, live.email)
        _, challenge = pkce()
        page = person.http.get(authorize_url(client_id, challenge,
                                             resource=f"{live.url}/mcp")).text
        action = urljoin(live.url, html.unescape(ACTION.search(page).group(1)))
        form = {"csrf_token": CSRF.search(page).group(1), "decision": "allow",
                "granted": ["memory:read", "memory:write"]}
        with live.app.app_context():
            holder = db.engine.connect()
            # Both answers read "no connection yet", then wait here to write theirs.
            holder.execute(text("LOCK TABLE oauth_grants IN SHARE ROW EXCLUSIVE MODE"))
            answers: list[httpx2.Response] = []

            def click() -> None:
                with httpx2.Client(cookies=person.http.cookies, timeout=60) as http:
                    answers.append(http.post(action, data=form))

            clicks = [threading.Thread(target=click) for _ in range(2)]
            for thread in clicks:
                thread.start()
            try:
                assert wait_until(lambda: holder.execute(text(
                    "SELECT count(*) FROM pg_locks WHERE NOT granted "
                    "AND relation = 'oauth_grants'::regclass")).scalar() == 2, timeout=30)
            finally:
                holder.rollback()  # both go on at once
                holder.close()
            for thread in clicks:
                thread.join(60)
            person.close()
            assert [answer.status_code for answer in answers] == [302, 302]
            codes = [parse_qs(urlsplit(answer.headers["location"]).query)["code"][0]
                     for answer in answers]
            assert codes[0] != codes[1]  # each answer its own code ...
            grants = db.session.scalars(select(OAuthGrant).where(
                OAuthGrant.user_id == live.user_id)).all()
            assert len(grants) == 1  # ... for the one connection
            assert {code.grant_id for code in db.session.scalars(select(OAuthCode).where(
                OAuthCode.code_hash.in_([services.hash_secret(c) for c in codes])))} == \
                {grants[0].id}
            db.session.remove()
