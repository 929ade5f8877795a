"""Ed25519 signatures over a report's exact bytes (``cryptography``): a detached 64-byte
signature that ``flask evidence verify`` and ``openssl pkeyutl -verify -rawin`` both check
against the public key (PEM, SubjectPublicKeyInfo)."""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

ALGORITHM = "Ed25519"


def canonical_bytes(document: Any) -> bytes:
    """The one serialisation that is signed: sorted keys, no spaces, UTF-8, one newline
    at the end (so the file prints well and is still exactly what was signed)."""
    return json.dumps(document, sort_keys=True, separators=(",", ":"),
                      ensure_ascii=False, allow_nan=False).encode("utf-8") + b"\n"


@dataclass(frozen=True)
class SigningKey:
    private: Ed25519PrivateKey

    @classmethod
    def from_setting(cls, value: str) -> SigningKey:
        """``EVIDENCE_SIGNING_KEY``: 64 hex digits (the private key's 32 bytes), or a PEM
        PKCS#8 private key."""
        text = value.strip()
        if text.startswith("-----BEGIN"):
            key = serialization.load_pem_private_key(text.encode(), password=None)
            if not isinstance(key, Ed25519PrivateKey):
                raise ValueError("EVIDENCE_SIGNING_KEY: not an Ed25519 private key")
            return cls(key)
        try:
            raw = bytes.fromhex(text)
        except ValueError:
            raise ValueError("EVIDENCE_SIGNING_KEY: 64 hex digits or a PEM key") from None
        if len(raw) != 32:
            raise ValueError("EVIDENCE_SIGNING_KEY: 64 hex digits (32 bytes)")
        return cls(Ed25519PrivateKey.from_private_bytes(raw))

    @property
    def public(self) -> Ed25519PublicKey:
        return self.private.public_key()

    def public_pem(self) -> str:
        return public_pem(self.public)

    def key_id(self) -> str:
        return key_id(self.public)

    def sign(self, data: bytes) -> bytes:
        return self.private.sign(data)


def public_pem(key: Ed25519PublicKey) -> str:
    return key.public_bytes(serialization.Encoding.PEM,
                            serialization.PublicFormat.SubjectPublicKeyInfo).decode("ascii")


def key_id(key: Ed25519PublicKey) -> str:
    """SHA-256 of the raw public key, hex: names the key in a report."""
    raw = key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()


def load_public_pem(pem: bytes | str) -> Ed25519PublicKey:
    data = pem.encode("ascii") if isinstance(pem, str) else pem
    key = serialization.load_pem_public_key(data)
    if not isinstance(key, Ed25519PublicKey):
        raise ValueError("not an Ed25519 public key")
    return key


def verify(key: Ed25519PublicKey, data: bytes, signature: bytes) -> bool:
    try:
        key.verify(signature, data)
    except InvalidSignature:
        return False
    return True


def signature_b64(signature: bytes) -> str:
    return base64.b64encode(signature).decode("ascii")
