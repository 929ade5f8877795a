"""API keys (§7): staff revocation. A key is revoked, never deleted: the memories it
saved keep their attribution and the audit log its history."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy.orm import Session

from dashboard.audit.services import Actor, record_event
from dashboard.xmemo.models import ApiKey


def revoke_key(session: Session, key: ApiKey, *, actor: Actor,
               now: datetime | None = None) -> bool:
    """Revoke ``key`` from now on; ``False`` when it already was (nothing recorded)."""
    if key.revoked_at is not None:
        return False
    key.revoked_at = now or datetime.now(UTC)
    session.flush()
    record_event(session, action="api_key.revoke", actor=actor, owner_id=key.owner_id,
                 target_type="api_key", target_id=key.id,
                 details={"prefix": key.prefix, "before": {"revoked_at": None},
                          "after": {"revoked_at": key.revoked_at.isoformat()}})
    return True
