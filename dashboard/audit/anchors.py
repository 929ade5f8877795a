"""Audit anchors: chain heads signed with a key the database does not hold, kept in a
store outside it (``anchor_stores``: a file, or a bucket with object lock). Signing and
reading them back; ``services`` writes and checks them. docs/architecture/audit.md says
what they prove and what they cannot."""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dashboard.audit.anchor_stores import AnchorStore, open_store

_FIELDS = frozenset({"seq", "hash", "signed_at", "sig"})
# An anchor names the chain (the database) it was written for; one written before chains
# had an identity names none, and is taken as the chain's whose store it is in.
_CHAIN_FIELDS = _FIELDS | {"chain"}
_HEX = frozenset("0123456789abcdef")


@dataclass(frozen=True)
class Anchor:
    """The chain head ``seq``/``hash`` as it was at ``signed_at`` (ISO 8601, UTC), of the
    chain ``chain`` (``audit_chain.chain_id``: which database's log it is)."""

    seq: int
    hash: str
    signed_at: str
    chain: str | None = None

    def fields(self) -> dict[str, Any]:
        fields: dict[str, Any] = {"seq": self.seq, "hash": self.hash,
                                  "signed_at": self.signed_at}
        if self.chain is not None:
            fields["chain"] = self.chain
        return fields

    def body(self) -> bytes:
        return json.dumps(self.fields(), sort_keys=True, separators=(",", ":")).encode("utf-8")


class BadAnchor(ValueError):
    """A record of the store that is not an anchor signed with the key (the words say
    which, to follow "line N of <where>")."""


def sign(key: bytes, anchor: Anchor) -> str:
    return hmac.new(key, anchor.body(), hashlib.sha256).hexdigest()


def encode(key: bytes, anchor: Anchor) -> str:
    """One anchor as its stored record: a line of JSON with its HMAC-SHA256."""
    return json.dumps({**anchor.fields(), "sig": sign(key, anchor)}, sort_keys=True,
                      separators=(",", ":"))


def _is_hex(value: Any, length: int) -> bool:
    return isinstance(value, str) and len(value) == length and set(value) <= _HEX


def _is_chain(value: Any) -> bool:
    return isinstance(value, str) and 1 <= len(value) <= 64 and value.isprintable()


def decode(key: bytes, record: str) -> Anchor:
    """The anchor ``record`` holds, its signature checked; ``BadAnchor`` otherwise."""
    try:
        fields = json.loads(record)
    except ValueError:
        fields = None
    if not (isinstance(fields, dict) and set(fields) in (_FIELDS, _CHAIN_FIELDS)
            and type(fields["seq"]) is int and fields["seq"] > 0
            and _is_hex(fields["hash"], 64) and isinstance(fields["signed_at"], str)
            and _is_hex(fields["sig"], 64)
            and (_is_chain(fields["chain"]) if "chain" in fields else True)):
        raise BadAnchor("is not an anchor (a JSON object of seq, hash, signed_at, chain "
                        "and sig)")
    anchor = Anchor(fields["seq"], fields["hash"], fields["signed_at"], fields.get("chain"))
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

    def newest(self, chain: str) -> Anchor | None:
        """The store's last anchor of ``chain`` (a good one, signed with the key). The
        store's last record is it but where another database's anchors came last (a
        store shared, or left behind): only then is the whole store read."""
        record = self.store.last()
        if record is None:
            return None
        try:
            last = decode(self.key, record)
        except BadAnchor:
            return None
        if last.chain in (None, chain):
            return last
        newest = None
        for record in self.store.records():
            try:
                anchor = decode(self.key, record)
            except BadAnchor:
                continue
            if anchor.chain in (None, chain):
                newest = anchor
        return newest


@dataclass(frozen=True)
class AnchorLog:
    """What the store holds for one chain: the head each of its good anchors names
    (seq → hash), the first record that is not a good anchor, if any, and the anchors of
    other chains (another database's: counted, never checked against this log)."""

    where: str
    heads: dict[int, str]
    count: int
    problem: str | None = None
    foreign: dict[str, int] = field(default_factory=dict)  # chain → newest seq
    foreign_count: int = 0

    @property
    def newest_seq(self) -> int | None:
        return max(self.heads) if self.heads else None

    def foreign_note(self) -> str | None:
        """In words, the other databases' anchors the store holds; None if none."""
        if not self.foreign:
            return None
        chains = ", ".join(f"chain {chain} up to seq {seq}"
                           for chain, seq in sorted(self.foreign.items()))
        return (f"{self.where} also holds {self.foreign_count} anchor(s) of another "
                f"database ({chains}): not this database's, so not checked against its log")


def read_anchors(anchoring: Anchoring, *, chain: str) -> AnchorLog:
    """Every anchor of the store, each signature checked; those of ``chain`` (this
    database's) are the heads, another chain's are counted apart. A bad record does not
    hide the good ones: the chain is still checked against them."""
    where, unit = anchoring.store.where, anchoring.store.unit
    heads: dict[int, str] = {}
    foreign: dict[str, int] = {}
    count, foreign_count, problem = 0, 0, None
    for number, record in enumerate(anchoring.store.records(), 1):
        try:
            anchor = decode(anchoring.key, record)
        except BadAnchor as exc:
            problem = problem or f"{unit} {number} of {where} {exc}"
            continue
        if anchor.chain not in (None, chain):
            foreign[anchor.chain] = max(foreign.get(anchor.chain, 0), anchor.seq)
            foreign_count += 1
            continue
        if heads.get(anchor.seq, anchor.hash) != anchor.hash:
            problem = problem or (f"{unit} {number} of {where} names another hash for seq "
                                  f"{anchor.seq} than an earlier anchor does")
        heads[anchor.seq] = anchor.hash
        count += 1
    return AnchorLog(where, heads, count, problem, foreign, foreign_count)
