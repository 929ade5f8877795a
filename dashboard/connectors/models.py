"""Connected apps: OAuth clients, a user's grant to one (a "connection"), its one-time
codes and its tokens (all stored as SHA-256 hashes), and the access log of what a
connection was handed (memory ids and sources, never a query or content)."""

from __future__ import annotations

import hashlib
import hmac
import uuid
from datetime import datetime
from typing import TYPE_CHECKING

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, UUID
from sqlalchemy.orm import Mapped, mapped_column, relationship

from dashboard.extensions import db
from dashboard.models_base import created_at_column, updated_at_column
from dashboard.saved_memories.models import SCOPES

if TYPE_CHECKING:
    from dashboard.auth.models import User

CLIENT_KINDS = ("registered", "document")  # by dynamic registration, or a metadata URL
REVOKED_BY = ("user", "admin", "reuse", "code_reuse")


class OAuthClient(db.Model):
    """An app that may ask users for access. ``client_id`` is ours (registered) or the
    URL of its metadata document; what it says of itself is unverified either way, but
    a document's host is known."""

    __tablename__ = "oauth_clients"
    __table_args__ = (CheckConstraint(f"kind IN {CLIENT_KINDS!r}", name="kind"),)

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    client_id: Mapped[str] = mapped_column(String(2048), unique=True)
    kind: Mapped[str] = mapped_column(String(16))
    name: Mapped[str] = mapped_column(String(200))
    redirect_uris: Mapped[list[str]] = mapped_column(ARRAY(Text))
    client_uri: Mapped[str | None] = mapped_column(Text)
    grant_types: Mapped[list[str]] = mapped_column(ARRAY(String(32)))
    response_types: Mapped[list[str]] = mapped_column(ARRAY(String(32)))
    scope: Mapped[str | None] = mapped_column(Text)
    token_endpoint_auth_method: Mapped[str] = mapped_column(String(32))
    client_secret_hash: Mapped[str | None] = mapped_column(String(64))
    # Who saves through it, as memories name their source (chatgpt, claude, …).
    attribution: Mapped[str] = mapped_column(String(16))
    fetched_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    created_at: Mapped[datetime] = created_at_column()

    # What the OAuth library asks of a client (its ClientMixin), answered from the row.
    def get_client_id(self) -> str:
        return self.client_id

    def get_default_redirect_uri(self) -> str | None:
        # Several registered: the request must name one (exact match, always).
        return self.redirect_uris[0] if len(self.redirect_uris) == 1 else None

    def get_allowed_scope(self, scope: str | None) -> str:
        # The scopes asked for (the server refused unknown ones already); none: those it
        # registered with, else read only.
        asked = (scope or self.scope or "memory:read").split()
        return " ".join(s for s in SCOPES if s in asked)

    def check_redirect_uri(self, redirect_uri: str) -> bool:
        return redirect_uri in self.redirect_uris

    def check_client_secret(self, client_secret: str) -> bool:
        return (self.client_secret_hash is not None and isinstance(client_secret, str)
                and hmac.compare_digest(
                    hashlib.sha256(client_secret.encode("utf-8")).hexdigest(),
                    self.client_secret_hash))

    def check_endpoint_auth_method(self, method: str, endpoint: str) -> bool:
        return method == self.token_endpoint_auth_method

    def check_response_type(self, response_type: str) -> bool:
        return response_type in self.response_types

    def check_grant_type(self, grant_type: str) -> bool:
        return grant_type in self.grant_types


class OAuthGrant(db.Model):
    """A user's authorisation of a client for one resource: a connected app."""

    __tablename__ = "oauth_grants"
    __table_args__ = (
        CheckConstraint(f"revoked_by IS NULL OR revoked_by IN {REVOKED_BY!r}",
                        name="revoked_by"),
        # One live connection per user, client and resource: authorising again updates it.
        Index("uq_oauth_grants_live", "user_id", "client_pk", "resource", unique=True,
              postgresql_where=text("revoked_at IS NULL")),
    )

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"),
                                         index=True)
    client_pk: Mapped[int] = mapped_column(
        ForeignKey("oauth_clients.id", ondelete="CASCADE"), index=True)
    scopes: Mapped[list[str]] = mapped_column(ARRAY(String(32)))
    resource: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = created_at_column()
    updated_at: Mapped[datetime] = updated_at_column()
    last_used_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    calls: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    revoked_by: Mapped[str | None] = mapped_column(String(16))
    # The teams the user let it act for (each still needs their membership at every call).
    team_ids: Mapped[list[int]] = mapped_column(ARRAY(Integer), default=list,
                                                server_default="{}")

    user: Mapped[User] = relationship()
    client: Mapped[OAuthClient] = relationship()


class OAuthCode(db.Model):
    """A one-time authorisation code, bound to its redirect URI and PKCE challenge."""

    __tablename__ = "oauth_codes"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    code_hash: Mapped[str] = mapped_column(String(64), unique=True)
    grant_id: Mapped[int] = mapped_column(ForeignKey("oauth_grants.id", ondelete="CASCADE"),
                                          index=True)
    redirect_uri: Mapped[str] = mapped_column(Text)
    scopes: Mapped[list[str]] = mapped_column(ARRAY(String(32)))
    resource: Mapped[str] = mapped_column(Text)
    code_challenge: Mapped[str] = mapped_column(String(128))
    code_challenge_method: Mapped[str] = mapped_column(String(8))
    created_at: Mapped[datetime] = created_at_column()
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    used_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))

    grant: Mapped[OAuthGrant] = relationship()

    def get_redirect_uri(self) -> str:
        return self.redirect_uri

    def get_scope(self) -> str:
        return " ".join(self.scopes)


class OAuthToken(db.Model):
    """An access token and its refresh token. Refreshing rotates: the old row is marked
    ``rotated_at`` and a new one names it ``parent_id``; a rotated refresh token used
    again revokes the whole grant (someone else holds a copy)."""

    __tablename__ = "oauth_tokens"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    grant_id: Mapped[int] = mapped_column(ForeignKey("oauth_grants.id", ondelete="CASCADE"),
                                          index=True)
    parent_id: Mapped[int | None] = mapped_column(
        ForeignKey("oauth_tokens.id", ondelete="SET NULL"))
    access_hash: Mapped[str] = mapped_column(String(64), unique=True)
    refresh_hash: Mapped[str | None] = mapped_column(String(64), unique=True)
    scopes: Mapped[list[str]] = mapped_column(ARRAY(String(32)))
    resource: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = created_at_column()
    access_expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    refresh_expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    rotated_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))

    grant: Mapped[OAuthGrant] = relationship()

    # What the OAuth library asks of a token (its TokenMixin).
    def check_client(self, client: OAuthClient) -> bool:
        return self.grant.client_pk == client.id

    def get_scope(self) -> str:
        return " ".join(self.scopes)

    def is_revoked(self) -> bool:
        return self.revoked_at is not None


class ConnectorAccess(db.Model):
    """One thing a connection was handed: a memory (by id) or another source's record
    (by source and record id). Never the query that found it, nor its content."""

    __tablename__ = "connector_access"
    __table_args__ = (Index("ix_connector_access_grant_id_id", "grant_id", "id"),)

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    grant_id: Mapped[int] = mapped_column(ForeignKey("oauth_grants.id", ondelete="CASCADE"))
    tool: Mapped[str] = mapped_column(String(32))
    source_key: Mapped[str] = mapped_column(String(64))
    memory_id: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))
    source_id: Mapped[str] = mapped_column(String(200))
    created_at: Mapped[datetime] = created_at_column()
