"""The audit log: ``record_event`` for every audited action (in the caller's transaction,
under the chain's lock), a hash chain that makes any later change to a row visible,
checkpoints of its head, signed anchors of it outside the database, and a verifier.
Events never hold content. docs/architecture/audit.md says why."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import func, select, text
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.orm import Session

from dashboard.audit.anchors import Anchor, Anchoring, AnchorLog, encode
from dashboard.audit.models import AuditChain, AuditCheckpoint, AuditEvent
from dashboard.roles import ROLES, STAFF_ROLES

GENESIS_HASH = "0" * 64
# An arbitrary constant naming the audit chain's advisory lock.
_CHAIN_LOCK = 0x0A0D17


@dataclass(frozen=True)
class Actor:
    """Who did it: ``kind`` is admin, support, user, api_key or system."""

    kind: str
    id: str | None = None

    @classmethod
    def of(cls, user: Any) -> Actor:
        """A signed-in person, named by role and id (never by email: emails change)."""
        role = getattr(user, "role", "user")
        return cls(role if role in STAFF_ROLES else "user", str(user.id))

    @property
    def user_id(self) -> int | None:
        """The account behind the actor, for a person; ``None`` for a key or the system."""
        return int(self.id) if self.kind in ROLES and self.id else None


SYSTEM = Actor("system")
# Commands run by whoever operates the server: the audit log names them as such.
CLI_ACTOR = Actor("system", "cli")


def _jsonb_number(literal: str) -> float | int:
    # JSONB keeps numbers as PostgreSQL numerics and writes them back without exponent or
    # sign of zero: 1e+16 comes back as the integer 10000000000000000, -0.0 as 0.0. Hash
    # what will come back, or verify would call an untouched event changed.
    if "e+" in literal or "E+" in literal:
        return int(Decimal(literal))
    number = float(literal)
    return 0.0 if number == 0 else number


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"audit details cannot hold {name}: JSONB has no such number")


def _json_safe(value: Any) -> Any:
    """What JSONB gives back for ``value``: hashing the stored form keeps verify exact."""
    return json.loads(json.dumps(value, default=str), parse_float=_jsonb_number,
                      parse_constant=_refuse_constant)


def canonical(event: Mapping[str, Any]) -> bytes:
    return json.dumps(event, sort_keys=True, separators=(",", ":"),
                      ensure_ascii=False).encode("utf-8")


def _timestamp(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat(timespec="microseconds")


def event_payload(event: Any) -> dict[str, Any]:
    """The fields the hash covers, as the row holds them (an ``AuditEvent`` or a row)."""
    return {
        "seq": event.seq,
        "occurred_at": _timestamp(event.occurred_at),
        "action": event.action,
        "actor_type": event.actor_type,
        "actor_id": event.actor_id,
        "owner_id": event.owner_id,
        "target_type": event.target_type,
        "target_id": event.target_id,
        "mode": event.mode,
        "details": event.details,
        "prev_hash": event.prev_hash,
    }


def event_hash(event: Any) -> str:
    return hashlib.sha256(canonical(event_payload(event))).hexdigest()


def _chain_head(session: Session) -> tuple[int, str]:
    head = session.execute(
        select(AuditEvent.seq, AuditEvent.hash).order_by(AuditEvent.seq.desc()).limit(1)
    ).first()
    return (head.seq, head.hash) if head else (0, GENESIS_HASH)


def changes(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """``{"before": {...}, "after": {...}}`` of the fields whose value differs."""
    changed = [key for key in after if before.get(key) != after.get(key)]
    return {"before": {key: before.get(key) for key in changed},
            "after": {key: after.get(key) for key in changed}}


def record_event(
    session: Session,
    *,
    action: str,
    actor: Actor,
    owner_id: int | None = None,
    target_type: str | None = None,
    target_id: Any = None,
    mode: str | None = None,
    details: Mapping[str, Any] | None = None,
) -> AuditEvent:
    """Append one event to the chain, in the caller's transaction (flushed, not
    committed): it lands with the change it describes, or not at all."""
    # The caller's pending writes first: their row locks are then always taken before
    # the chain's lock, in every path, so two audited transactions cannot deadlock.
    session.flush()
    session.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _CHAIN_LOCK})
    seq, prev_hash = _chain_head(session)
    event = AuditEvent(
        seq=seq + 1,
        # Set here, not by the database, so the hash is computed over the stored value.
        occurred_at=datetime.now(UTC),
        action=action,
        actor_type=actor.kind,
        # As the columns will hold them (text, bigint): the hash is over the stored row,
        # so Actor("api_key", 5) or owner_id="5" must not read back differently.
        actor_id=None if actor.id is None else str(actor.id),
        owner_id=None if owner_id is None else int(owner_id),
        target_type=target_type,
        target_id=None if target_id is None else str(target_id),
        mode=mode,
        details=_json_safe(dict(details or {})),
        prev_hash=prev_hash,
    )
    event.hash = event_hash(event)
    session.add(event)
    session.flush()
    return event


# -- checkpoints and verification --------------------------------------------------------

def checkpoint_chain(session: Session) -> AuditCheckpoint | None:
    """Write the committed chain head down, if it moved since the last checkpoint.

    No lock: seq numbers are handed out under the chain's lock and visible only once
    committed, so what this transaction sees is always a gap-free prefix of the chain
    and its head a valid checkpoint. (Waiting for the lock would stall a worker's
    maintenance behind any open audited transaction.) Two workers at once: one row."""
    seq, head_hash = _chain_head(session)
    last = session.scalar(select(func.max(AuditCheckpoint.seq)))
    if seq == 0 or (last is not None and last >= seq):
        return None
    written = session.execute(
        pg_insert(AuditCheckpoint).values(seq=seq, hash=head_hash)
        .on_conflict_do_nothing(index_elements=[AuditCheckpoint.seq])
        .returning(AuditCheckpoint.id)
    ).scalar()
    return session.get(AuditCheckpoint, written) if written is not None else None


def chain_id(session: Session) -> str:
    """This database's chain identity, as anchors name it."""
    return str(session.scalar(select(AuditChain.chain_id)))


def anchor_head(session: Session, anchoring: Anchoring, *,
                now: datetime | None = None) -> Anchor | None:
    """Sign the committed chain head and append it to the anchor store, unless the
    store's newest anchor is that far already (or further, as after a cut: verify tells
    then). Like ``checkpoint_chain``, no lock; two processes at once may append the
    same head twice, which is harmless."""
    seq, head_hash = _chain_head(session)
    chain = chain_id(session)
    newest = anchoring.newest(chain)
    if seq == 0 or (newest is not None and newest.seq >= seq):
        return None
    anchor = Anchor(seq, head_hash, _timestamp(now or datetime.now(UTC)), chain)
    anchoring.store.append(encode(anchoring.key, anchor))
    return anchor


@dataclass(frozen=True)
class Verification:
    events: int
    checkpoints: int
    head_seq: int
    head_hash: str
    broken_event_id: int | None = None
    broken_seq: int | None = None
    reason: str | None = None
    # The anchors the chain was checked against (None: it was not), and what is wrong
    # with their store, if anything.
    anchors: AnchorLog | None = None
    anchors_matched: int = 0

    @property
    def anchor_problem(self) -> str | None:
        return self.anchors.problem if self.anchors is not None else None

    @property
    def ok(self) -> bool:
        return self.reason is None and self.anchor_problem is None

    def describe(self) -> str:
        lines = []
        if self.reason is not None:
            where = (f"event id {self.broken_event_id} (seq {self.broken_seq})"
                     if self.broken_event_id is not None else f"seq {self.broken_seq}")
            lines.append(f"BROKEN at {where}: {self.reason}")
        if self.anchor_problem is not None:
            lines.append(f"BROKEN anchors: {self.anchor_problem}")
        if self.ok:
            lines.append(f"OK: {self.events} events, chain head seq {self.head_seq} hash "
                         f"{self.head_hash}, {self.checkpoints} checkpoint(s) matched"
                         f"{self._anchor_summary()}.")
        note = self.anchors.foreign_note() if self.anchors is not None else None
        if note is not None:
            lines.append(f"NOTE: {note}.")
        return "\n".join(lines)

    def _anchor_summary(self) -> str:
        if self.anchors is None:
            return ""
        if not self.anchors.heads:
            return f", no anchor yet in {self.anchors.where}"
        return (f", {self.anchors_matched} signed anchor(s) matched (the newest: seq "
                f"{self.anchors.newest_seq}, in {self.anchors.where})")


def _events_in_order(session: Session, batch: int) -> Iterator[Any]:
    # Keyset batches of plain rows (not ORM objects, which the session would keep):
    # millions of events in bounded memory.
    table = AuditEvent.__table__
    after = 0
    while True:
        rows = session.execute(
            select(table).where(table.c.seq > after).order_by(table.c.seq).limit(batch)
        ).all()
        if not rows:
            return
        yield from rows
        after = rows[-1].seq


def verify_chain(session: Session, *, batch: int = 5000,
                 expect: dict[int, str] | None = None,
                 anchors: AnchorLog | None = None) -> Verification:
    """Recompute every hash and link in order; check each checkpoint and each signed
    anchor against the chain. Stops at the first broken link and names it.

    ``expect``: chain heads kept outside this database (seq → hash, e.g. from an earlier
    ``verify`` printed into a ticket), checked like checkpoints — a forger who can
    rewrite the log and its checkpoint table still cannot match those. ``anchors``
    (``read_anchors``): the same, signed, and the newest names where the log must
    reach at least: short of it, the log was cut short."""
    result = _verify(session, batch, expect or {}, anchors.heads if anchors else {})
    return replace(result, anchors=anchors)


def _verify(session: Session, batch: int, expect: dict[int, str],
            anchored: dict[int, str]) -> Verification:
    checkpoints = dict(session.execute(
        select(AuditCheckpoint.seq, AuditCheckpoint.hash).order_by(AuditCheckpoint.seq)
    ).all())
    for seq, expected_hash in expect.items():
        if checkpoints.get(seq, expected_hash) != expected_hash:
            return Verification(0, 0, 0, GENESIS_HASH, None, seq,
                                f"the checkpoint table's hash for seq {seq} differs from "
                                "the one you gave")
        checkpoints[seq] = expected_hash
    count, prev_seq, prev_hash, matched, anchors_matched = 0, 0, GENESIS_HASH, 0, 0

    def broken(event: Any, reason: str) -> Verification:
        return Verification(count, matched, prev_seq, prev_hash, event.id, event.seq, reason,
                            anchors_matched=anchors_matched)

    for event in _events_in_order(session, batch):
        if event.seq != prev_seq + 1:
            return broken(event, f"sequence jumps from {prev_seq} to {event.seq}: "
                                 "events are missing")
        if event.prev_hash != prev_hash:
            return broken(event, "it does not link to the event before it")
        if event_hash(event) != event.hash:
            return broken(event, "its content does not match its hash (the row was "
                                 "changed after it was written)")
        if event.seq in checkpoints:
            if checkpoints[event.seq] != event.hash:
                return broken(event, "it differs from the checkpoint written for it")
            matched += 1
        if event.seq in anchored:
            if anchored[event.seq] != event.hash:
                return broken(event, "it differs from the signed anchor written for it")
            anchors_matched += 1
        count, prev_seq, prev_hash = count + 1, event.seq, event.hash
    newest = max(anchored, default=0)
    if newest > prev_seq:
        return Verification(count, matched, prev_seq, prev_hash, None, prev_seq + 1,
                            f"the newest anchor (signed, outside the database) names seq "
                            f"{newest}, but the log ends at seq {prev_seq}: it was cut "
                            f"short after seq {prev_seq}", anchors_matched=anchors_matched)
    beyond = [seq for seq in checkpoints if seq > prev_seq]
    if beyond:
        return Verification(count, matched, prev_seq, prev_hash, None, min(beyond),
                            f"a checkpoint names seq {min(beyond)}, but the log ends at "
                            f"seq {prev_seq}: it was cut short",
                            anchors_matched=anchors_matched)
    return Verification(count, matched, prev_seq, prev_hash, anchors_matched=anchors_matched)
