"""The authorization server's refusals, each with its exact status and error: a redirect
URI one character off, an unknown client, no PKCE or the plain method, a wrong verifier,
a code used twice (which revokes the connection), another resource, refresh tokens that
are expired, revoked or rotated out (a rotated one used again revokes the whole grant)."""

from __future__ import annotations

import html
import re
from datetime import UTC, datetime, timedelta
from urllib.parse import parse_qs, urlsplit

import pytest
from sqlalchemy import select, update

from dashboard.audit.models import AuditEvent
from dashboard.connectors import services
from dashboard.connectors.models import OAuthCode, OAuthGrant, OAuthToken
from tests.connectors.oauth_flow import (
    REDIRECT_URI,
    answer_consent,
    authorise,
    authorize_url,
    callback,
    exchange,
    pkce,
    refresh,
    register,
    tokens,
)
from tests.factories import make_user

RETURN_LINK = re.compile(r'<a id="return-link" href="([^"]+)"')


def grant_of(db_session, user) -> OAuthGrant:
    return db_session.scalars(select(OAuthGrant).where(OAuthGrant.user_id == user.id)).one()


# -- registration ---------------------------------------------------------------------------

def test_registration_answers_the_client_and_stores_no_secret_in_clear(client, db_session):
    body = register(client, token_endpoint_auth_method="client_secret_post")
    assert body["client_id"].startswith("opc_") and body["client_secret"].startswith("opcs_")
    assert body["redirect_uris"] == [REDIRECT_URI]
    stored = services.find_client(db_session, body["client_id"])
    assert stored.client_secret_hash == services.hash_secret(body["client_secret"])
    assert body["client_secret"] not in repr(vars(stored))


@pytest.mark.parametrize(("uris", "error"), [
    (["http://evil.example/cb"], "invalid_redirect_uri"),  # plain http off this machine
    (["https://app.example/cb#frag"], "invalid_redirect_uri"),
    (["javascript:alert(1)"], "invalid_redirect_uri"),
    ([], "invalid_redirect_uri"),
    ("https://app.example/cb", "invalid_redirect_uri"),  # not a list
])
def test_registration_refuses_redirect_uris_that_could_leak_a_code(client, uris, error):
    answer = client.post("/oauth/register", json={"client_name": "x", "redirect_uris": uris})
    assert answer.status_code == 400
    assert answer.get_json()["error"] == error


def test_registration_refuses_a_body_that_is_not_an_object(client):
    answer = client.post("/oauth/register", data="[]", content_type="application/json")
    assert (answer.status_code, answer.get_json()["error"]) == (400, "invalid_client_metadata")


# -- the consent page ---------------------------------------------------------------------

def test_the_consent_page_names_the_app_its_return_host_and_each_scope_in_words(
        client, signed_in):
    client_id = register(client, client_name="Claude (test)")["client_id"]
    _, challenge = pkce()
    page = client.get(authorize_url(client_id, challenge,
                                    scope="memory:read memory:redact memory:hard_delete"))
    html = page.get_data(as_text=True)
    assert page.status_code == 200 and page.headers["Cache-Control"] == "no-store"
    assert "Claude (test)" in html and "127.0.0.1:33418" in html
    assert services.SCOPE_WORDS["memory:read"] in html
    assert "this can&#39;t be undone" in html or "this can't be undone" in html
    assert 'id="unverified"' in html  # registered itself: marked so
    assert 'data-withheld="memory:hard_delete"' in html  # an admin's to give


def test_a_guest_is_sent_to_sign_in_and_back(client, db_session):
    client_id = register(client)["client_id"]
    _, challenge = pkce()
    answer = client.get(authorize_url(client_id, challenge))
    assert answer.status_code == 302
    assert answer.headers["Location"].startswith("/auth/signin?next=%2Foauth%2Fauthorize")


def test_deny_returns_access_denied_to_the_app_and_grants_nothing(client, signed_in,
                                                                  db_session):
    client_id = register(client)["client_id"]
    _, challenge = pkce()
    params = callback(answer_consent(client, authorize_url(client_id, challenge), "deny"))
    assert (params["error"], params["state"]) == ("access_denied", "s1")
    assert "code" not in params
    assert db_session.scalars(select(OAuthGrant)).all() == []
    assert db_session.scalars(select(AuditEvent.action).where(
        AuditEvent.owner_id == signed_in.id)).all() == ["oauth.deny"]


def test_consent_needs_the_csrf_token(client, signed_in, db_session):
    client_id = register(client)["client_id"]
    _, challenge = pkce()
    answer = client.post(authorize_url(client_id, challenge), data={"decision": "allow"})
    assert answer.status_code == 400
    assert db_session.scalars(select(OAuthGrant)).all() == []


@pytest.mark.parametrize("redirect_uri", [REDIRECT_URI[:-1], REDIRECT_URI + "x",
                                          REDIRECT_URI.replace("33418", "33419")])
def test_a_redirect_uri_one_character_off_is_refused_here_never_followed(
        client, signed_in, redirect_uri):
    client_id = register(client)["client_id"]
    _, challenge = pkce()
    answer = client.get(authorize_url(client_id, challenge, redirect_uri=redirect_uri))
    assert answer.status_code == 400
    assert "Location" not in answer.headers
    page = answer.get_data(as_text=True)
    assert "This connection can't be made" in page and redirect_uri in page


def test_an_unknown_client_is_refused_here(client, signed_in):
    _, challenge = pkce()
    answer = client.get(authorize_url("opc_nobody", challenge))
    assert answer.status_code == 400 and "Location" not in answer.headers


@pytest.mark.parametrize(("change", "error"), [
    ({"code_challenge": None, "code_challenge_method": None}, "invalid_request"),
    ({"code_challenge_method": "plain"}, "invalid_request"),
    ({"resource": "https://elsewhere.example/mcp"}, "invalid_target"),
    ({"scope": "memory:read memory:everything"}, "invalid_scope"),
])
def test_a_request_without_pkce_s256_or_for_another_resource_is_refused_with_its_error(
        client, signed_in, change, error):
    """A self-registered app's redirect URI is unverified: the error is shown here, with
    a link back that carries it (tests/connectors/test_redirects.py has the rest)."""
    client_id = register(client)["client_id"]
    _, challenge = pkce()
    answer = client.get(authorize_url(client_id, challenge, **change))
    assert answer.status_code == 400 and "Location" not in answer.headers
    link = html.unescape(RETURN_LINK.search(answer.get_data(as_text=True)).group(1))
    assert link.startswith(REDIRECT_URI + "?")
    assert parse_qs(urlsplit(link).query)["error"] == [error]


# -- the code -------------------------------------------------------------------------------

def test_a_code_is_exchanged_once_for_tokens_stored_as_hashes(client, signed_in,
                                                             db_session):
    client_id = register(client)["client_id"]
    granted = authorise(client, client_id)
    answer = exchange(client, client_id, granted.code, granted.verifier)
    body = answer.get_json()
    assert answer.status_code == 200 and answer.headers["Cache-Control"] == "no-store"
    assert body["token_type"].lower() == "bearer" and body["expires_in"] == 900
    assert body["scope"] == "memory:read memory:write"
    assert body["access_token"].startswith("opat_")
    assert body["refresh_token"].startswith("oprt_")
    (row,) = db_session.scalars(select(OAuthToken)).all()
    assert row.access_hash == services.hash_secret(body["access_token"])
    assert row.refresh_hash == services.hash_secret(body["refresh_token"])
    code = db_session.scalars(select(OAuthCode)).one()
    assert code.code_hash == services.hash_secret(granted.code) and code.used_at
    for event in db_session.scalars(select(AuditEvent)):
        for secret in (body["access_token"], body["refresh_token"], granted.code):
            assert secret not in str(event.details)


def test_a_code_used_twice_is_refused_and_revokes_the_connection(client, signed_in,
                                                                db_session):
    client_id = register(client)["client_id"]
    granted = authorise(client, client_id)
    first = exchange(client, client_id, granted.code, granted.verifier).get_json()
    again = exchange(client, client_id, granted.code, granted.verifier)
    assert (again.status_code, again.get_json()["error"]) == (400, "invalid_grant")
    grant = grant_of(db_session, signed_in)
    assert (grant.revoked_by, grant.revoked_at is not None) == ("code_reuse", True)
    assert services.authenticate_access_token(db_session, first["access_token"],
                                              resource=grant.resource) is None


def test_a_wrong_pkce_verifier_is_refused(client, signed_in):
    client_id = register(client)["client_id"]
    granted = authorise(client, client_id)
    answer = exchange(client, client_id, granted.code, pkce()[0])
    assert (answer.status_code, answer.get_json()["error"]) == (400, "invalid_grant")


def test_a_code_for_another_client_or_another_resource_is_refused(client, signed_in):
    client_id = register(client)["client_id"]
    other = register(client)["client_id"]
    granted = authorise(client, client_id)
    answer = exchange(client, other, granted.code, granted.verifier)
    assert (answer.status_code, answer.get_json()["error"]) == (400, "invalid_grant")
    granted = authorise(client, client_id)
    answer = exchange(client, client_id, granted.code, granted.verifier,
                      resource="https://elsewhere.example/mcp")
    assert (answer.status_code, answer.get_json()["error"]) == (400, "invalid_target")


def test_an_expired_code_is_refused(client, signed_in, db_session):
    client_id = register(client)["client_id"]
    granted = authorise(client, client_id)
    db_session.execute(update(OAuthCode).values(expires_at=datetime.now(UTC) -
                                                timedelta(seconds=1)))
    answer = exchange(client, client_id, granted.code, granted.verifier)
    assert (answer.status_code, answer.get_json()["error"]) == (400, "invalid_grant")


# -- refresh tokens -------------------------------------------------------------------------

def test_a_refresh_rotates_the_pair_and_the_old_pair_stops(client, signed_in, db_session):
    client_id = register(client)["client_id"]
    first = tokens(client, client_id)
    answer = refresh(client, client_id, first["refresh_token"])
    second = answer.get_json()
    assert answer.status_code == 200
    assert second["refresh_token"] != first["refresh_token"]
    grant = grant_of(db_session, signed_in)
    assert services.authenticate_access_token(db_session, first["access_token"],
                                              resource=grant.resource) is None
    assert services.authenticate_access_token(db_session, second["access_token"],
                                              resource=grant.resource) is not None


def test_reusing_a_rotated_refresh_token_revokes_the_whole_grant(client, signed_in,
                                                                 db_session):
    client_id = register(client)["client_id"]
    first = tokens(client, client_id)
    second = refresh(client, client_id, first["refresh_token"]).get_json()
    stolen = refresh(client, client_id, first["refresh_token"])
    assert (stolen.status_code, stolen.get_json()["error"]) == (400, "invalid_grant")
    grant = grant_of(db_session, signed_in)
    assert grant.revoked_by == "reuse"
    # The legitimate holder's newer tokens stop too: both are in the thief's reach.
    assert services.authenticate_access_token(db_session, second["access_token"],
                                              resource=grant.resource) is None
    answer = refresh(client, client_id, second["refresh_token"])
    assert (answer.status_code, answer.get_json()["error"]) == (400, "invalid_grant")


def test_an_expired_refresh_token_is_refused(client, signed_in, db_session):
    client_id = register(client)["client_id"]
    first = tokens(client, client_id)
    db_session.execute(update(OAuthToken).values(
        refresh_expires_at=datetime.now(UTC) - timedelta(seconds=1)))
    answer = refresh(client, client_id, first["refresh_token"])
    assert (answer.status_code, answer.get_json()["error"]) == (400, "invalid_grant")


def test_a_revoked_refresh_token_is_refused(client, signed_in):
    client_id = register(client)["client_id"]
    first = tokens(client, client_id)
    answer = client.post("/oauth/revoke", data={"token": first["refresh_token"],
                                                "client_id": client_id})
    assert answer.status_code == 200
    answer = refresh(client, client_id, first["refresh_token"])
    assert (answer.status_code, answer.get_json()["error"]) == (400, "invalid_grant")


def test_a_refresh_cannot_widen_the_scopes(client, signed_in):
    client_id = register(client)["client_id"]
    first = tokens(client, client_id, scope="memory:read")
    answer = refresh(client, client_id, first["refresh_token"],
                     scope="memory:read memory:write")
    assert (answer.status_code, answer.get_json()["error"]) == (400, "invalid_scope")


def test_an_expired_access_token_is_refused(client, signed_in, db_session):
    client_id = register(client)["client_id"]
    first = tokens(client, client_id)
    db_session.execute(update(OAuthToken).values(
        access_expires_at=datetime.now(UTC) - timedelta(seconds=1)))
    grant = grant_of(db_session, signed_in)
    assert services.authenticate_access_token(db_session, first["access_token"],
                                              resource=grant.resource) is None


# -- what a user may grant ------------------------------------------------------------------

def test_a_user_cannot_grant_hard_delete_but_an_admin_can_add_it(client, signed_in,
                                                                 db_session):
    client_id = register(client)["client_id"]
    first = tokens(client, client_id, scope="memory:read memory:hard_delete")
    assert first["scope"] == "memory:read"
    grant = grant_of(db_session, signed_in)
    caller = services.authenticate_access_token(db_session, first["access_token"],
                                                resource=grant.resource)
    assert caller.scopes == ("memory:read",)
    admin = make_user(db_session, role="admin")
    from dashboard.audit.services import Actor

    with pytest.raises(services.NotAllowed):
        services.grant_hard_delete(db_session, grant, actor=Actor.of(signed_in))
    assert services.grant_hard_delete(db_session, grant, actor=Actor.of(admin))
    caller = services.authenticate_access_token(db_session, first["access_token"],
                                                resource=grant.resource)
    assert caller.scopes == ("memory:read", "memory:hard_delete")


def test_registrations_are_limited_per_client_address(app, client, monkeypatch):
    monkeypatch.setitem(app.config, "OAUTH_REGISTER_LIMIT", "2 per hour")
    register(client)
    register(client)
    answer = client.post("/oauth/register", json={"client_name": "x",
                                                  "redirect_uris": [REDIRECT_URI]})
    assert answer.status_code == 429


def test_with_nothing_connected_the_page_says_how_to_connect_an_app(client, signed_in):
    response = client.get("/settings/connections/")
    assert response.status_code == 200
    page = response.get_data(as_text=True)
    empty = page[page.index('id="no-connections"'):]
    assert "No connected apps yet." in empty
    assert "http://localhost/mcp</code>" in empty  # the server's own address, to paste
    assert 'href="/settings/keys/"' in empty
