"""API keys: created by their owner (shown once), authenticated by prefix then hash,
granted ``memory:hard_delete`` by an admin only, revoked by their owner or staff.

A key is ``op_<12 hex>_<43 urlsafe>``: the first 15 characters are the stored, visible
prefix (for lookup); the whole string is hashed. A key is revoked, never deleted: the
memories it saved keep their attribution and the audit log its history. Audit events name
the key by id and prefix — never the secret, its hash, or the name its owner gave it (the
owner's own words, which staff pages never show). A key names the teams it may act for
(each still needs its owner's membership, and an expiry within the team's longest key
lifetime, at every call: ``dashboard.access``); audited by their ids."""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from dashboard.access import Credential, reach_of, team_terms
from dashboard.audit.services import Actor, record_event
from dashboard.auth.models import User
from dashboard.refusals import FieldError, Forbidden
from dashboard.saved_memories.models import SCOPES, ApiKey

KEY_PREFIX = "op_"
HARD_DELETE = "memory:hard_delete"
# What an owner may pick for their own key: everything but the elevated scope.
USER_SCOPES = tuple(scope for scope in SCOPES if scope != HARD_DELETE)
MAX_NAME = 100
# A busy client authenticates on every call; stamping last_used_at that often would turn
# every read into a write. Once a minute is precise enough to tell a live key from a dead one.
LAST_USED_RESOLUTION = timedelta(minutes=1)

_PREFIX_HEX = 12  # 48 random bits: collisions are rare, and checked for anyway
_SECRET_BYTES = 32
_PREFIX_LENGTH = len(KEY_PREFIX) + _PREFIX_HEX
# token_urlsafe(32) is 43 characters of [A-Za-z0-9_-] (no padding).
_KEY_RE = re.compile(rf"{KEY_PREFIX}[0-9a-f]{{{_PREFIX_HEX}}}_[A-Za-z0-9_-]{{43}}")


class ApiKeyError(FieldError):
    """A value ``create_key`` refused, with the form field it is about."""


class NotAllowed(Forbidden):
    """The actor may not do this (granting the elevated scope is for admins)."""


def hash_key(raw: str) -> str:
    # SHA-256, not a password hash: a key is 256 random bits, so there is nothing to
    # guess or brute-force, and a fast hash keeps authenticating every API call cheap.
    return hashlib.sha256(raw.encode("ascii")).hexdigest()


def _new_prefix(session: Session) -> str:
    for _ in range(5):
        prefix = KEY_PREFIX + secrets.token_hex(_PREFIX_HEX // 2)
        if session.scalar(select(ApiKey.id).where(ApiKey.prefix == prefix)) is None:
            return prefix
    raise RuntimeError("could not find a free API key prefix")  # 48 random bits: never


def _audit_details(key: ApiKey) -> dict[str, object]:
    return {"prefix": key.prefix, "scopes": list(key.scopes), "teams": list(key.team_ids),
            "expires_at": key.expires_at.isoformat() if key.expires_at else None}


def credential_of(key: ApiKey) -> Credential:
    """What a call made with ``key`` may act for: the teams it names, while it ends
    within each one's longest key lifetime."""
    return Credential(team_ids=tuple(key.team_ids), key_created_at=key.created_at,
                      key_expires_at=key.expires_at)


def check_key_teams(session: Session, owner_id: int, team_ids: Iterable[object], *,
                    expires_at: datetime | None, now: datetime) -> list[int]:
    """The teams a new key may name: teams its owner is in, each letting a key of this
    lifetime act for it (``max_key_days``); refused naming the team and its limit."""
    wanted = set()
    for value in team_ids:
        try:
            wanted.add(int(value))  # type: ignore[call-overload]
        except (TypeError, ValueError, OverflowError):
            raise ApiKeyError("Choose teams from the list.", "teams") from None
    if not wanted:
        return []
    if not wanted <= set(reach_of(session, owner_id).seats):
        raise ApiKeyError("Choose teams from the list.", "teams")
    terms = team_terms(session, wanted)
    for team in sorted(terms.values(), key=lambda t: (t.name, t.team_id)):
        days = team.max_key_days
        if days is None:
            continue
        if expires_at is None or expires_at > now + timedelta(days=days):
            raise ApiKeyError(f"{team.name} lets a key act for it for at most {days} days: "
                              "choose an expiry date within that, or leave the team out.",
                              "expires_at")
    return sorted(wanted)


def validate_scopes(scopes: Iterable[str]) -> list[str]:
    """The scopes an owner asked for, in SCOPES order; refused when empty, unknown or
    elevated."""
    chosen = set(scopes)
    if not chosen:
        raise ApiKeyError("Choose at least one scope.", "scopes")
    unknown = chosen - set(SCOPES)
    if unknown:
        raise ApiKeyError("Unknown scope: " + ", ".join(sorted(unknown)) + ".", "scopes")
    if HARD_DELETE in chosen:
        raise ApiKeyError(f"Only an administrator can grant {HARD_DELETE}.", "scopes")
    return [scope for scope in SCOPES if scope in chosen]


def create_key(session: Session, *, owner: User, name: str, scopes: Iterable[str],
               expires_at: datetime | None = None, actor: Actor,
               now: datetime | None = None, team_ids: Iterable[object] = ()
               ) -> tuple[ApiKey, str]:
    """A new key for ``owner`` and its secret, acting for the teams ``team_ids`` names
    (``check_key_teams``). The secret is returned here and nowhere else: only its
    prefix and hash are stored."""
    now = now or datetime.now(UTC)
    name = (name or "").strip()
    if not 1 <= len(name) <= MAX_NAME:
        raise ApiKeyError(f"Give the key a name of 1 to {MAX_NAME} characters.", "name")
    chosen = validate_scopes(scopes)
    if expires_at is not None:
        if expires_at.tzinfo is None:
            raise ValueError("expires_at must be timezone-aware")
        if expires_at <= now:
            raise ApiKeyError("The expiry must be in the future.", "expires_at")
    teams = check_key_teams(session, owner.id, team_ids, expires_at=expires_at, now=now)
    prefix = _new_prefix(session)
    raw = f"{prefix}_{secrets.token_urlsafe(_SECRET_BYTES)}"
    # Made at ``now``: a team's longest lifetime is counted from the moment checked here.
    key = ApiKey(owner_id=owner.id, name=name, prefix=prefix, key_hash=hash_key(raw),
                 scopes=chosen, created_by_id=actor.user_id, expires_at=expires_at,
                 created_at=now, team_ids=teams)
    session.add(key)
    session.flush()
    record_event(session, action="api_key.create", actor=actor, owner_id=owner.id,
                 target_type="api_key", target_id=key.id, details=_audit_details(key))
    return key, raw


def authenticate_key(session: Session, raw: object, *,
                     now: datetime | None = None) -> ApiKey | None:
    """The live key ``raw`` spells, or ``None`` (malformed, unknown, wrong secret, revoked,
    expired, or its owner's account deactivated) — the caller answers all of them alike."""
    if not isinstance(raw, str) or not _KEY_RE.fullmatch(raw):
        return None
    now = now or datetime.now(UTC)
    key = session.scalars(
        select(ApiKey).join(User, User.id == ApiKey.owner_id)
        .where(ApiKey.prefix == raw[:_PREFIX_LENGTH], User.active.is_(True))
    ).first()
    if key is None or not hmac.compare_digest(hash_key(raw), key.key_hash):
        return None
    if key.revoked_at is not None or (key.expires_at is not None and key.expires_at <= now):
        return None
    if key.last_used_at is None or now - key.last_used_at >= LAST_USED_RESOLUTION:
        key.last_used_at = now
        session.flush()
    return key


def grant_hard_delete(session: Session, key: ApiKey, *, actor: Actor) -> bool:
    """Add ``memory:hard_delete`` to ``key``; admins only. ``False`` when there is nothing
    to do (it has the scope already, or it is revoked): nothing is recorded then."""
    if actor.kind != "admin":
        raise NotAllowed(f"Only an administrator can grant {HARD_DELETE}.")
    if key.revoked_at is not None or HARD_DELETE in key.scopes:
        return False
    before = list(key.scopes)
    key.scopes = [scope for scope in SCOPES if scope in {*before, HARD_DELETE}]
    session.flush()
    record_event(session, action="api_key.grant", actor=actor, owner_id=key.owner_id,
                 target_type="api_key", target_id=key.id,
                 details={"prefix": key.prefix, "scope": HARD_DELETE,
                          "before": {"scopes": before}, "after": {"scopes": list(key.scopes)}})
    return True


def list_keys(session: Session, *, owner_id: int) -> list[ApiKey]:
    """The owner's keys, newest first, revoked ones included (they say so)."""
    return list(session.scalars(select(ApiKey).where(ApiKey.owner_id == owner_id)
                                .order_by(ApiKey.created_at.desc(), ApiKey.id.desc())))


def find_own_key(session: Session, key_id: int | None, *, owner_id: int,
                 lock: bool = False) -> ApiKey | None:
    """The key ``key_id`` when it is ``owner_id``'s; ``None`` otherwise (no difference
    between someone else's and none at all)."""
    if key_id is None:
        return None
    query = select(ApiKey).where(ApiKey.id == key_id, ApiKey.owner_id == owner_id)
    if lock:
        query = query.with_for_update()
    return session.scalars(query).first()


def revoke_key(session: Session, key: ApiKey, *, actor: Actor,
               now: datetime | None = None) -> bool:
    """Revoke ``key`` from now on; ``False`` when it already was (nothing recorded)."""
    if key.revoked_at is not None:
        return False
    key.revoked_at = now or datetime.now(UTC)
    session.flush()
    record_event(session, action="api_key.revoke", actor=actor, owner_id=key.owner_id,
                 target_type="api_key", target_id=key.id,
                 details={**_audit_details(key), "before": {"revoked_at": None},
                          "after": {"revoked_at": key.revoked_at.isoformat()}})
    return True
