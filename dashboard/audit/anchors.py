"""Audit anchors: chain heads signed with a key the database does not hold, kept in a
store outside it (``anchor_stores``: a file, or a bucket with object lock). Signing and
reading them back; ``services`` writes and checks them. docs/architecture/audit.md says
what they prove and what they cannot."""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dashboard.audit.anchor_stores import AnchorStore, open_store

_FIELDS = frozenset({"seq", "hash", "signed_at", "sig"})
_HEX = frozenset("0123456789abcdef")


@dataclass(frozen=True)
class Anchor:
    """The chain head ``seq``/``hash`` as it was at ``signed_at`` (ISO 8601, UTC)."""

    seq: int
    hash: str
    signed_at: str

    def body(self) -> bytes:
        return json.dumps({"seq": self.seq, "hash": self.hash, "signed_at": self.signed_at},
                          sort_keys=True, separators=(",", ":")).encode("utf-8")


class BadAnchor(ValueError):
    """A record of the store that is not an anchor signed with the key (the words say
    which, to follow "line N of <where>")."""


def sign(key: bytes, anchor: Anchor) -> str:
    return hmac.new(key, anchor.body(), hashlib.sha256).hexdigest()


def encode(key: bytes, anchor: Anchor) -> str:
    """One anchor as its stored record: a line of JSON with its HMAC-SHA256."""
    return json.dumps({"seq": anchor.seq, "hash": anchor.hash, "signed_at": anchor.signed_at,
                       "sig": sign(key, anchor)}, sort_keys=True, separators=(",", ":"))


def _is_hex(value: Any, length: int) -> bool:
    return isinstance(value, str) and len(value) == length and set(value) <= _HEX


def decode(key: bytes, record: str) -> Anchor:
    """The anchor ``record`` holds, its signature checked; ``BadAnchor`` otherwise."""
    try:
        fields = json.loads(record)
    except ValueError:
        fields = None
    if not (isinstance(fields, dict) and set(fields) == _FIELDS
            and type(fields["seq"]) is int and fields["seq"] > 0
            and _is_hex(fields["hash"], 64) and isinstance(fields["signed_at"], str)
            and _is_hex(fields["sig"], 64)):
        raise BadAnchor("is not an anchor (a JSON object of seq, hash, signed_at and sig)")
    anchor = Anchor(fields["seq"], fields["hash"], fields["signed_at"])
    if not hmac.compare_digest(sign(key, anchor), fields["sig"]):
        raise BadAnchor("is not signed with the anchor key: the file was altered, or "
                        "AUDIT_ANCHOR_KEY is not the key that signed it")
    return anchor


@dataclass(frozen=True)
class Anchoring:
    """The key anchors are signed with and the store they go to."""

    key: bytes
    store: AnchorStore

    @classmethod
    def from_settings(cls, config: Mapping[str, Any]) -> Anchoring:
        return cls(key=str(config["AUDIT_ANCHOR_KEY"]).encode("utf-8"),
                   store=open_store(str(config["AUDIT_ANCHOR_PATH"]), config))

    def newest(self) -> Anchor | None:
        """The store's last anchor, when it is one signed with the key."""
        record = self.store.last()
        if record is None:
            return None
        try:
            return decode(self.key, record)
        except BadAnchor:
            return None


@dataclass(frozen=True)
class AnchorLog:
    """What the store holds: the head each good anchor names (seq → hash), and the
    first record that is not a good anchor, if any."""

    where: str
    heads: dict[int, str]
    count: int
    problem: str | None = None

    @property
    def newest_seq(self) -> int | None:
        return max(self.heads) if self.heads else None


def read_anchors(anchoring: Anchoring) -> AnchorLog:
    """Every anchor of the store, each signature checked. A bad record does not hide
    the good ones: the chain is still checked against them."""
    where, unit = anchoring.store.where, anchoring.store.unit
    heads: dict[int, str] = {}
    count, problem = 0, None
    for number, record in enumerate(anchoring.store.records(), 1):
        try:
            anchor = decode(anchoring.key, record)
        except BadAnchor as exc:
            problem = problem or f"{unit} {number} of {where} {exc}"
            continue
        if heads.get(anchor.seq, anchor.hash) != anchor.hash:
            problem = problem or (f"{unit} {number} of {where} names another hash for seq "
                                  f"{anchor.seq} than an earlier anchor does")
        heads[anchor.seq] = anchor.hash
        count += 1
    return AnchorLog(where, heads, count, problem)
