"""/settings/keys: guests are sent to sign in; a user lists, creates (the secret shown
once, no-store) and revokes (with a confirmation) their own keys only; CSRF on every
POST. A key acts for the teams ticked among its owner's, within each one's longest key
lifetime. The admin action "Grant memory:hard_delete": admins only, audited."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select

from dashboard.access import reach_of
from dashboard.audit.models import AuditEvent
from dashboard.audit.services import Actor
from dashboard.saved_memories.keys import HARD_DELETE, create_key, credential_of
from dashboard.saved_memories.models import ApiKey
from tests.conftest import csrf_from
from tests.factories import make_team, make_user

INDEX, REVOKE = "/settings/keys/", "/settings/keys/revoke/"
SECRET_RE = re.compile(r"op_[0-9a-f]{12}_[A-Za-z0-9_-]{43}")


@pytest.fixture
def user(db_session, auth):
    user = make_user(db_session, email="keys-owner@example.test")
    assert auth.login("keys-owner@example.test").status_code == 302
    return user


def key_of(db_session, owner, name="theirs", scopes=("memory:read",)):
    key, _ = create_key(db_session, owner=owner, name=name, scopes=scopes,
                        actor=Actor.of(owner))
    return key


def create(client, **fields):
    data = {"csrf_token": csrf_from(client, INDEX), "name": "connector",
            "scopes": ["memory:read", "memory:write"], **fields}
    return client.post(INDEX, data=data)


def own_keys(db_session, user) -> list[ApiKey]:
    return list(db_session.scalars(select(ApiKey).where(ApiKey.owner_id == user.id)))


@pytest.mark.parametrize("path", [INDEX, f"{REVOKE}?id=1"])
def test_guests_are_sent_to_sign_in(client, path):
    response = client.get(path)
    assert response.status_code == 302
    assert "/auth/signin" in response.headers["Location"]


def test_the_list_shows_the_users_keys_without_hash_and_no_one_elses(client, db_session, user):
    mine = key_of(db_session, user, name="my connector")
    theirs = key_of(db_session, make_user(db_session), name="their connector")
    response = client.get(INDEX)
    assert response.status_code == 200
    html = response.get_data(as_text=True)
    assert "my connector" in html and mine.prefix in html
    assert mine.key_hash not in html
    assert "their connector" not in html and theirs.prefix not in html
    assert HARD_DELETE in html  # mentioned as admin-granted, never offered as a checkbox
    assert f'value="{HARD_DELETE}"' not in html
    assert 'href="/settings/keys/"' in client.get("/documents/").get_data(as_text=True)


def test_creating_shows_the_secret_once_with_no_store(client, db_session, user):
    response = create(client, expires_at="2999-12-31")
    assert response.status_code == 200
    assert response.headers["Cache-Control"] == "no-store"
    html = response.get_data(as_text=True)
    (secret,) = set(SECRET_RE.findall(html))
    assert "it will not be shown again" in html
    (key,) = own_keys(db_session, user)
    assert (key.name, key.scopes) == ("connector", ["memory:read", "memory:write"])
    assert key.expires_at.isoformat() == "3000-01-01T00:00:00+00:00"
    assert secret.startswith(key.prefix + "_")
    listing = client.get(INDEX)
    assert listing.status_code == 200
    relisted = listing.get_data(as_text=True)
    assert key.prefix in relisted and secret not in relisted and secret[16:] not in relisted
    (event,) = db_session.scalars(select(AuditEvent).where(
        AuditEvent.action == "api_key.create", AuditEvent.target_id == str(key.id)))
    assert event.actor_id == str(user.id)


@pytest.mark.parametrize("fields, error", [
    ({"name": ""}, "Give the key a name"),
    ({"scopes": []}, "Choose at least one scope"),
    ({"scopes": ["memory:nope"]}, "Unknown scope"),
    ({"scopes": [HARD_DELETE]}, "Only an administrator"),
    ({"expires_at": "2001-01-01"}, "The expiry must be in the future"),
    ({"expires_at": "9999-12-31"}, "Choose an earlier date"),
    ({"expires_at": "not a date"}, "Not a valid date"),
])
def test_a_refused_key_is_a_form_error_and_nothing_is_saved(client, db_session, user, fields,
                                                             error):
    response = create(client, **fields)
    assert response.status_code == 400
    html = response.get_data(as_text=True)
    assert error in html
    assert SECRET_RE.search(html) is None
    assert own_keys(db_session, user) == []


def test_posts_without_the_token_are_refused(client, db_session, user):
    key = key_of(db_session, user)
    response = client.post(INDEX, data={"name": "x", "scopes": ["memory:read"]})
    assert response.status_code == 400
    assert "security token" in response.get_data(as_text=True)
    assert client.post(f"{REVOKE}?id={key.id}").status_code == 400
    assert [k.id for k in own_keys(db_session, user)] == [key.id]
    assert key.revoked_at is None


def test_revoking_asks_first_then_revokes(client, db_session, user):
    key = key_of(db_session, user)
    confirm = client.get(f"{REVOKE}?id={key.id}")
    assert confirm.status_code == 200
    assert "Revoke this key?" in confirm.get_data(as_text=True)
    assert key.revoked_at is None
    token = csrf_from(client, f"{REVOKE}?id={key.id}")
    response = client.post(f"{REVOKE}?id={key.id}", data={"csrf_token": token})
    assert response.status_code == 302
    assert response.headers["Location"].endswith(INDEX)
    db_session.expire_all()
    assert db_session.get(ApiKey, key.id).revoked_at is not None
    (event,) = db_session.scalars(select(AuditEvent).where(
        AuditEvent.action == "api_key.revoke", AuditEvent.target_id == str(key.id)))
    assert (event.actor_type, event.actor_id) == ("user", str(user.id))
    again = client.post(f"{REVOKE}?id={key.id}", data={"csrf_token": token},
                        follow_redirects=True)
    assert again.status_code == 200
    assert "already revoked" in again.get_data(as_text=True)


@pytest.mark.parametrize("method", ["GET", "POST"])
def test_another_users_key_or_a_bad_id_is_a_404(client, db_session, user, method):
    theirs = key_of(db_session, make_user(db_session))
    token = csrf_from(client, INDEX)
    for raw in (str(theirs.id), "abc", "-1", "", str(2**31), "99999999"):
        response = client.open(f"{REVOKE}?id={raw}", method=method,
                               data={"csrf_token": token} if method == "POST" else None)
        assert response.status_code == 404, raw
    assert client.open(REVOKE, method=method,
                       data={"csrf_token": token} if method == "POST" else None
                       ).status_code == 404
    db_session.expire_all()
    assert db_session.get(ApiKey, theirs.id).revoked_at is None


# -- the admin action -----------------------------------------------------------------

GRANT = "/admin/api_keys/action/"


@pytest.mark.parametrize("role, expected", [("admin", 302), ("support", 403), ("user", 403)])
def test_grant_hard_delete_action_by_role(client, db_session, auth, role, expected):
    owner = make_user(db_session)
    key = key_of(db_session, owner)
    make_user(db_session, role=role, email=f"grant-{role}@example.test")
    assert auth.login(f"grant-{role}@example.test").status_code == 302
    token = csrf_from(client, "/")
    response = client.post(GRANT, data={"csrf_token": token, "action": "grant_hard_delete",
                                        "rowid": str(key.id)})
    assert response.status_code == expected
    db_session.expire_all()
    granted = HARD_DELETE in db_session.get(ApiKey, key.id).scopes
    assert granted is (role == "admin")
    events = db_session.scalars(select(AuditEvent).where(
        AuditEvent.action == "api_key.grant", AuditEvent.target_id == str(key.id))).all()
    assert len(events) == (1 if role == "admin" else 0)


def test_grant_hard_delete_action_for_guests_and_bad_ids(client, db_session, auth):
    key = key_of(db_session, make_user(db_session))
    token = csrf_from(client, "/auth/signin")
    guest = client.post(GRANT, data={"csrf_token": token, "action": "grant_hard_delete",
                                     "rowid": str(key.id)})
    assert guest.status_code == 302
    assert "/auth/signin" in guest.headers["Location"]
    make_user(db_session, role="admin", email="grant-admin@example.test")
    auth.login("grant-admin@example.test")
    token = csrf_from(client, "/")
    bad = client.post(GRANT, data={"csrf_token": token, "action": "grant_hard_delete",
                                   "rowid": "abc"})
    assert bad.status_code == 400
    no_token = client.post(GRANT, data={"action": "grant_hard_delete", "rowid": str(key.id)})
    assert no_token.status_code == 400
    db_session.expire_all()
    assert HARD_DELETE not in db_session.get(ApiKey, key.id).scopes


def test_grant_hard_delete_action_skips_revoked_and_granted_keys(client, db_session, auth):
    owner = make_user(db_session)
    fresh, revoked, granted = (key_of(db_session, owner, name=n) for n in ("a", "b", "c"))
    admin = make_user(db_session, role="admin", email="grant-admin@example.test")
    from dashboard.saved_memories.keys import grant_hard_delete, revoke_key

    revoke_key(db_session, revoked, actor=Actor.of(admin))
    grant_hard_delete(db_session, granted, actor=Actor.of(admin))
    auth.login("grant-admin@example.test")
    response = client.post(GRANT, data={
        "csrf_token": csrf_from(client, "/admin/api_keys/"), "action": "grant_hard_delete",
        "rowid": [str(k.id) for k in (fresh, revoked, granted)]}, follow_redirects=True)
    assert response.status_code == 200
    assert "Granted memory:hard_delete to 1 key(s); 2 already had it or are revoked." in \
        response.get_data(as_text=True)
    db_session.expire_all()
    assert HARD_DELETE in db_session.get(ApiKey, fresh.id).scopes
    assert HARD_DELETE not in db_session.get(ApiKey, revoked.id).scopes


# -- the teams a key may act for ----------------------------------------------------------

TEAM_BOX = re.compile(r'<input[^>]*name="teams"[^>]*value="(\d+)"([^>]*)>')


def test_a_key_acts_for_the_teams_ticked_among_its_owners_and_the_list_names_them(
        client, db_session, user):
    lead = make_user(db_session)
    pilot = make_team(db_session, lead, name="Pilot", members={user: "member"})
    ops = make_team(db_session, lead, name="Ops", members={user: "reader"})
    make_team(db_session, lead, name="Not theirs")
    page = client.get(INDEX).get_data(as_text=True)
    # Each of their teams is a box, none ticked; a team they are not in is not offered.
    assert {int(v): "checked" in rest for v, rest in TEAM_BOX.findall(page)} == {
        pilot.id: False, ops.id: False}
    assert "Not theirs" not in page
    response = create(client, teams=[str(pilot.id)])
    assert response.status_code == 200
    assert "It may act for: Pilot." in response.get_data(as_text=True)
    (key,) = own_keys(db_session, user)
    assert key.team_ids == [pilot.id]
    (event,) = db_session.scalars(select(AuditEvent).where(
        AuditEvent.action == "api_key.create", AuditEvent.target_id == str(key.id)))
    assert event.details["teams"] == [pilot.id]  # by id: never a team's name
    row = re.search(rf'<tr id="key-{key.id}">.*?</tr>', client.get(INDEX).get_data(
        as_text=True), re.S).group(0)
    assert re.search(r"<td data-teams><span class=\"d-block\">Pilot</span></td>", row)


def test_a_key_for_a_team_they_are_not_in_is_a_form_error(client, db_session, user):
    other = make_team(db_session, make_user(db_session), name="Elsewhere")
    for teams in ([str(other.id)], ["not-a-number"]):
        response = create(client, teams=teams)
        assert response.status_code == 400
        assert "Choose teams from the list." in response.get_data(as_text=True)
    assert own_keys(db_session, user) == []


@pytest.mark.parametrize("days", [None, 45])
def test_an_expiry_beyond_a_teams_key_lifetime_is_refused_naming_the_team_and_limit(
        client, db_session, user, days):
    pilot = make_team(db_session, make_user(db_session), name="Pilot",
                      members={user: "member"}, max_key_days=30)
    expiry = {} if days is None else {
        "expires_at": (datetime.now(UTC) + timedelta(days=days)).date().isoformat()}
    page = client.get(INDEX).get_data(as_text=True)
    assert "(keys for it live 30 days at most)" in page
    response = create(client, teams=[str(pilot.id)], **expiry)
    assert response.status_code == 400
    assert "Pilot lets a key act for it for at most 30 days" in response.get_data(
        as_text=True)
    assert own_keys(db_session, user) == []


def test_an_expiry_within_a_teams_key_lifetime_is_a_key_that_reaches_it(client, db_session,
                                                                        user):
    pilot = make_team(db_session, make_user(db_session), name="Pilot",
                      members={user: "member"}, max_key_days=30)
    day = (datetime.now(UTC) + timedelta(days=28)).date().isoformat()
    assert create(client, teams=[str(pilot.id)], expires_at=day).status_code == 200
    (key,) = own_keys(db_session, user)
    assert reach_of(db_session, user.id, credential_of(key)).owner_ids == [user.id, pilot.id]
    # The team shortens its limit later: the key no longer acts for it, and says so.
    pilot.max_key_days = 7
    db_session.flush()
    assert reach_of(db_session, user.id, credential_of(key)).owner_ids == [user.id]
    assert "does not act for it: it lives longer than the team&#39;s 7 days" in \
        client.get(INDEX).get_data(as_text=True)
