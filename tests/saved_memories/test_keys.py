"""API key services: creation (secret format, only prefix and hash stored, audited
without the secret), authentication (every way a key can fail, last_used_at once a
minute), scope validation, the admin-only grant of memory:hard_delete, revocation."""

from __future__ import annotations

import hashlib
import logging
import re
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select, text

from dashboard.audit.models import AuditEvent
from dashboard.audit.services import SYSTEM, Actor
from dashboard.refusals import FieldError
from dashboard.saved_memories import keys
from dashboard.saved_memories.keys import (
    HARD_DELETE,
    LAST_USED_RESOLUTION,
    ApiKeyError,
    NotAllowed,
    authenticate_key,
    create_key,
    grant_hard_delete,
    revoke_key,
)
from dashboard.saved_memories.models import SCOPES, ApiKey
from tests.factories import make_user

KEY_RE = re.compile(r"op_[0-9a-f]{12}_[A-Za-z0-9_-]{43}")
NOW = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)


@pytest.fixture
def owner(db_session):
    return make_user(db_session)


def new_key(db_session, owner, **kw):
    fields = {"name": "connector", "scopes": ["memory:read"], "actor": Actor.of(owner), **kw}
    return create_key(db_session, owner=owner, **fields)


def events_of(db_session, key: ApiKey, action: str | None = None) -> list[AuditEvent]:
    query = select(AuditEvent).where(AuditEvent.target_type == "api_key",
                                     AuditEvent.target_id == str(key.id)).order_by(AuditEvent.seq)
    if action:
        query = query.where(AuditEvent.action == action)
    return list(db_session.scalars(query))


def all_text(db_session, table: str) -> str:
    return db_session.execute(text(
        f"SELECT coalesce(string_agg(row_to_json(t)::text, '\n'), '') FROM {table} t"
    )).scalar_one()


# -- creation -------------------------------------------------------------------------

def test_a_new_key_is_returned_once_and_only_its_prefix_and_hash_are_stored(db_session, owner,
                                                                           caplog):
    caplog.set_level(logging.DEBUG)
    key, secret = new_key(db_session, owner, scopes=["memory:write", "memory:read"])
    assert KEY_RE.fullmatch(secret)
    assert key.prefix == secret[:15] and len(key.prefix) <= 16
    assert key.key_hash == hashlib.sha256(secret.encode()).hexdigest()
    assert key.scopes == ["memory:read", "memory:write"]  # in SCOPES order
    assert (key.owner_id, key.created_by_id, key.revoked_at) == (owner.id, owner.id, None)
    body = secret.split("_", 2)[2]
    stored = all_text(db_session, "api_keys")
    assert key.prefix in stored
    assert secret not in stored and body not in stored
    audit = all_text(db_session, "audit_events")
    assert secret not in audit and body not in audit and key.key_hash not in audit
    assert not any(body in record.getMessage() for record in caplog.records)


def test_creation_is_audited_with_prefix_scopes_and_expiry_but_not_the_name(db_session,
                                                                             owner):
    expires = NOW + timedelta(days=30)
    key, _ = new_key(db_session, owner, expires_at=expires, now=NOW)
    (event,) = events_of(db_session, key)
    assert (event.action, event.actor_type, event.actor_id, event.owner_id) == (
        "api_key.create", "user", str(owner.id), owner.id)
    assert event.details == {"prefix": key.prefix, "scopes": ["memory:read"], "teams": [],
                             "expires_at": expires.isoformat()}


def test_two_keys_get_different_prefixes_and_secrets(db_session, owner):
    (a, secret_a), (b, secret_b) = new_key(db_session, owner), new_key(db_session, owner)
    assert a.prefix != b.prefix and secret_a != secret_b


@pytest.mark.parametrize("name", ["", "   ", "x" * 101])
def test_a_name_outside_1_to_100_characters_is_refused(db_session, owner, name):
    with pytest.raises(ApiKeyError) as refused:
        new_key(db_session, owner, name=name)
    assert refused.value.field == "name"
    assert isinstance(refused.value, FieldError)


def test_a_name_of_100_characters_is_accepted_and_trimmed(db_session, owner):
    key, _ = new_key(db_session, owner, name=" " + "x" * 100 + " ")
    assert key.name == "x" * 100


@pytest.mark.parametrize("scopes", [[], ["memory:everything"], ["memory:read", "admin"],
                                    [HARD_DELETE], ["memory:read", HARD_DELETE]])
def test_scopes_must_be_a_non_empty_subset_without_hard_delete(db_session, owner, scopes):
    with pytest.raises(ApiKeyError) as refused:
        new_key(db_session, owner, scopes=scopes)
    assert refused.value.field == "scopes"
    assert db_session.scalar(select(ApiKey.id).where(ApiKey.owner_id == owner.id)) is None


def test_every_scope_but_hard_delete_can_be_chosen(db_session, owner):
    key, _ = new_key(db_session, owner, scopes=keys.USER_SCOPES)
    assert key.scopes == [scope for scope in SCOPES if scope != HARD_DELETE]


@pytest.mark.parametrize("delta", [timedelta(0), timedelta(seconds=-1), timedelta(days=-3)])
def test_an_expiry_not_in_the_future_is_refused(db_session, owner, delta):
    with pytest.raises(ApiKeyError) as refused:
        new_key(db_session, owner, expires_at=NOW + delta, now=NOW)
    assert refused.value.field == "expires_at"


# -- authentication -------------------------------------------------------------------

def test_a_good_key_authenticates_and_stamps_last_used(db_session, owner):
    key, secret = new_key(db_session, owner)
    assert authenticate_key(db_session, secret, now=NOW) is key
    assert key.last_used_at == NOW


def test_the_wrong_secret_with_a_real_prefix_is_refused(db_session, owner):
    key, secret = new_key(db_session, owner)
    last = secret[-1]
    forged = secret[:-1] + ("A" if last != "A" else "B")
    assert authenticate_key(db_session, forged, now=NOW) is None
    other_body = key.prefix + "_" + "a" * 43
    assert authenticate_key(db_session, other_body, now=NOW) is None
    assert key.last_used_at is None


def test_an_unknown_prefix_is_refused(db_session, owner):
    _, secret = new_key(db_session, owner)
    unknown = "op_" + ("0" * 12 if secret[3:15] != "0" * 12 else "1" * 12) + secret[15:]
    assert authenticate_key(db_session, unknown, now=NOW) is None


@pytest.mark.parametrize("raw", [None, 42, b"op_", "", "op_", "Bearer x", "op_abc_def",
                                 "OP_0123456789ab_" + "a" * 43,
                                 "op_0123456789ab_" + "a" * 42,
                                 "op_0123456789ab_" + "a" * 44,
                                 "op_0123456789ab_" + "a" * 42 + "=",
                                 "op_0123456789ab_" + "a" * 42 + "\n",
                                 " op_0123456789ab_" + "a" * 43,
                                 "op_0123456789aG_" + "a" * 43,
                                 "op_0123456789ab_" + "é" * 43])
def test_a_malformed_key_is_refused_without_a_query(db_session, count_queries, raw):
    with count_queries() as q:
        assert authenticate_key(db_session, raw, now=NOW) is None
    assert q.count == 0


def test_a_well_formed_key_is_one_query(db_session, owner, count_queries):
    _, secret = new_key(db_session, owner)
    authenticate_key(db_session, secret, now=NOW)
    with count_queries() as q:  # stamped a moment ago: a read only
        assert authenticate_key(db_session, secret, now=NOW + timedelta(seconds=5)) is not None
    assert q.count == 1


def test_a_revoked_key_is_refused(db_session, owner):
    key, secret = new_key(db_session, owner)
    revoke_key(db_session, key, actor=Actor.of(owner), now=NOW - timedelta(seconds=1))
    assert authenticate_key(db_session, secret, now=NOW) is None
    assert key.last_used_at is None


def test_an_expired_key_is_refused_from_its_expiry_on(db_session, owner):
    key, secret = new_key(db_session, owner, expires_at=NOW + timedelta(hours=1), now=NOW)
    assert authenticate_key(db_session, secret, now=NOW + timedelta(minutes=59)) is key
    assert authenticate_key(db_session, secret, now=NOW + timedelta(hours=1)) is None
    assert authenticate_key(db_session, secret, now=NOW + timedelta(days=1)) is None


def test_the_key_of_a_deactivated_account_is_refused(db_session, owner):
    _, secret = new_key(db_session, owner)
    owner.active = False
    db_session.flush()
    assert authenticate_key(db_session, secret, now=NOW) is None


def test_last_used_is_stamped_at_most_once_a_minute(db_session, owner, count_queries):
    key, secret = new_key(db_session, owner)
    authenticate_key(db_session, secret, now=NOW)
    just_before = NOW + LAST_USED_RESOLUTION - timedelta(microseconds=1)
    assert authenticate_key(db_session, secret, now=just_before) is key
    assert key.last_used_at == NOW
    assert authenticate_key(db_session, secret, now=NOW + LAST_USED_RESOLUTION) is key
    assert key.last_used_at == NOW + LAST_USED_RESOLUTION
    db_session.expire_all()
    stored = db_session.scalar(select(ApiKey.last_used_at).where(ApiKey.id == key.id))
    assert stored == NOW + LAST_USED_RESOLUTION
    with count_queries() as q:  # within the minute: a read, no UPDATE
        authenticate_key(db_session, secret, now=NOW + LAST_USED_RESOLUTION * 1.5)
    assert [s.split()[0].upper() for s in q.statements] == ["SELECT"]
    with count_queries() as q:  # a minute on: the read and one UPDATE
        authenticate_key(db_session, secret, now=NOW + LAST_USED_RESOLUTION * 2)
    assert [s.split()[0].upper() for s in q.statements] == ["SELECT", "UPDATE"]


# -- grant ----------------------------------------------------------------------------

def test_an_admin_grants_hard_delete_once_audited(db_session, owner):
    admin = make_user(db_session, role="admin")
    key, secret = new_key(db_session, owner, scopes=["memory:delete", "memory:read"])
    assert grant_hard_delete(db_session, key, actor=Actor.of(admin)) is True
    assert grant_hard_delete(db_session, key, actor=Actor.of(admin)) is False
    assert key.scopes == ["memory:read", "memory:delete", HARD_DELETE]
    (event,) = events_of(db_session, key, "api_key.grant")
    assert (event.actor_type, event.actor_id, event.owner_id) == ("admin", str(admin.id),
                                                                   owner.id)
    assert event.details == {"prefix": key.prefix, "scope": HARD_DELETE,
                             "before": {"scopes": ["memory:read", "memory:delete"]},
                             "after": {"scopes": ["memory:read", "memory:delete",
                                                  HARD_DELETE]}}
    assert secret not in all_text(db_session, "audit_events")


@pytest.mark.parametrize("role", ["user", "support"])
def test_nobody_but_an_admin_grants_hard_delete(db_session, owner, role):
    actor = owner if role == "user" else make_user(db_session, role=role)
    key, _ = new_key(db_session, owner)
    with pytest.raises(NotAllowed):
        grant_hard_delete(db_session, key, actor=Actor.of(actor))
    assert key.scopes == ["memory:read"]
    assert events_of(db_session, key, "api_key.grant") == []


def test_the_system_cannot_grant_hard_delete(db_session, owner):
    key, _ = new_key(db_session, owner)
    with pytest.raises(NotAllowed):
        grant_hard_delete(db_session, key, actor=SYSTEM)


def test_a_revoked_key_is_not_granted(db_session, owner):
    admin = make_user(db_session, role="admin")
    key, _ = new_key(db_session, owner)
    revoke_key(db_session, key, actor=Actor.of(owner))
    assert grant_hard_delete(db_session, key, actor=Actor.of(admin)) is False
    assert HARD_DELETE not in key.scopes


# -- revocation -----------------------------------------------------------------------

def test_revocation_is_audited_once_without_the_secret(db_session, owner):
    key, secret = new_key(db_session, owner)
    assert revoke_key(db_session, key, actor=Actor.of(owner), now=NOW) is True
    assert revoke_key(db_session, key, actor=Actor.of(owner), now=NOW) is False
    (event,) = events_of(db_session, key, "api_key.revoke")
    assert (event.actor_type, event.owner_id) == ("user", owner.id)
    assert event.details == {"prefix": key.prefix, "scopes": ["memory:read"], "teams": [],
                             "expires_at": None,
                             "before": {"revoked_at": None},
                             "after": {"revoked_at": NOW.isoformat()}}
    assert secret not in all_text(db_session, "audit_events")
