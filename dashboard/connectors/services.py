"""Connected apps' rules: registering a client, a user's consent (a grant), one-time
codes, tokens (rotated on refresh; a rotated refresh token used again revokes the whole
grant), revocation, authenticating a bearer token for one resource, and the access log.

Secrets are stored as SHA-256 hashes only. Services flush; the edge commits."""

from __future__ import annotations

import hashlib
import secrets
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

from sqlalchemy import func, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.orm import Session

from dashboard.access import (
    Action,
    Credential,
    Reach,
    TeamSeat,
    may,
    reach_of,
    team_terms,
)
from dashboard.audit.services import SYSTEM, Actor, record_event
from dashboard.auth.models import User
from dashboard.connectors.models import (
    ConnectorAccess,
    OAuthClient,
    OAuthCode,
    OAuthGrant,
    OAuthToken,
)
from dashboard.connectors.uris import BadURI, origin, split_canonical
from dashboard.refusals import Forbidden, NotFound, Refusal
from dashboard.saved_memories.models import SCOPES

HARD_DELETE = "memory:hard_delete"
# What a user may grant an app: everything but the elevated scope (an admin's to add).
USER_SCOPES = tuple(scope for scope in SCOPES if scope != HARD_DELETE)
SCOPE_WORDS = {
    "memory:read": "read and search your saved memories and what your memory holds",
    "memory:write": "save new memories and change ones it saved or you saved",
    "memory:delete": "delete memories (you can restore them for a while)",
    "memory:redact": "redact memories — this can't be undone: the words are gone",
    "memory:hard_delete": "erase memories for good — this can't be undone",
}
# What an app is given unless a person ticks more (RFC 9728 metadata names only these, so
# clients stop asking for everything): reading and saving.
EVERYDAY_SCOPES = ("memory:read", "memory:write")
# Said under a box the app asked for whose effect cannot be taken back lightly.
SCOPE_WARNINGS = {
    "memory:delete": "The app asked to delete memories. You can restore a deleted memory "
                     "for a while; tick this only if you want the app to delete.",
    "memory:redact": "The app asked to redact memories. Redacting removes the words for "
                     "good and cannot be undone; tick this only if you want the app to do "
                     "that.",
}
GRANT_TYPES = ("authorization_code", "refresh_token")
AUTH_METHODS = ("none", "client_secret_post", "client_secret_basic")
# Who a memory saved through an app names as its source, by the app's name or host.
KNOWN_CLIENTS = (("chatgpt", ("chatgpt", "openai")), ("claude", ("claude", "anthropic")),
                 ("codex", ("codex",)), ("copilot", ("copilot", "vscode", "visual studio")))
MAX_NAME = 200
MAX_REDIRECT_URIS = 10
ACCESS_PREFIX, REFRESH_PREFIX, CODE_PREFIX, SECRET_PREFIX = "opat_", "oprt_", "opac_", "opcs_"
LAST_USED_RESOLUTION = timedelta(minutes=1)


class ConnectorError(Refusal):
    """Client metadata or a request refused, with the field it is about."""


class ConnectionNotFound(NotFound):
    """No connection of this user has that id."""


class NotAllowed(Forbidden):
    """Only an admin may do this."""


@dataclass(frozen=True)
class Lifetimes:
    access: timedelta = timedelta(minutes=15)
    refresh: timedelta = timedelta(days=30)
    code: timedelta = timedelta(minutes=5)

    @classmethod
    def from_settings(cls, config: Mapping[str, Any]) -> Lifetimes:
        return cls(access=timedelta(seconds=int(config.get("OAUTH_ACCESS_TOKEN_SECONDS", 900))),
                   refresh=timedelta(days=int(config.get("OAUTH_REFRESH_TOKEN_DAYS", 30))),
                   code=timedelta(seconds=int(config.get("OAUTH_CODE_SECONDS", 300))))


def hash_secret(raw: str) -> str:
    # Random 256-bit secrets: a fast hash suffices (nothing to guess), and keeps every
    # authenticated call cheap.
    return hashlib.sha256(raw.encode("utf-8")).hexdigest()


def new_secret(prefix: str) -> str:
    return prefix + secrets.token_urlsafe(32)


def _now(now: datetime | None) -> datetime:
    return now or datetime.now(UTC)


# -- clients --------------------------------------------------------------------------------

def _is_loopback(host: str | None) -> bool:
    return host in ("localhost", "127.0.0.1", "::1")


def check_redirect_uri(uri: object) -> str:
    """An absolute https URI, or http on this machine (a desktop client's loopback
    listener), or a private scheme (``vscode://…``, a native app); no fragment; in the
    canonical form ``uris`` describes (what is compared is where a browser goes)."""
    if not isinstance(uri, str) or not 1 <= len(uri) <= 2000:
        raise ConnectorError("Each redirect URI must be an absolute URI.", "redirect_uris")
    try:
        parts = split_canonical(uri)
    except BadURI as exc:
        raise ConnectorError(f"Redirect URIs: {exc.sentence}", "redirect_uris") from None
    if parts.fragment or "#" in uri:
        raise ConnectorError("A redirect URI has a scheme and no fragment.", "redirect_uris")
    if parts.scheme in ("javascript", "data", "file", "blob", "about", "vbscript"):
        raise ConnectorError("That scheme cannot be a redirect URI.", "redirect_uris")
    if parts.scheme in ("http", "https") and (not parts.hostname
                                              or not uri.startswith(parts.scheme + "://")):
        raise ConnectorError("A web redirect URI names a host.", "redirect_uris")
    if parts.scheme == "http" and not _is_loopback(parts.hostname):
        raise ConnectorError("A redirect URI over plain http must be on localhost.",
                             "redirect_uris")
    return uri


def redirect_verified(client: OAuthClient, redirect_uri: str) -> bool:
    """Whether an error may be sent to this redirect URI without asking the person: only
    a metadata-document client's, and only one on the client_id's own origin (whoever
    serves the document there answers for both). A self-registered client chose its URIs
    itself (anyone can register one pointing anywhere), and a document may name any host."""
    return client.kind == "document" and origin(redirect_uri) is not None \
        and origin(redirect_uri) == origin(client.client_id)


def _texts(value: object, field: str, allowed: Iterable[str] | None = None,
           default: tuple[str, ...] = ()) -> list[str]:
    if value is None:
        return list(default)
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConnectorError(f"{field} must be a list of strings.", field)
    if allowed is not None and not set(value) <= set(allowed):
        raise ConnectorError(f"{field} may hold only: {', '.join(allowed)}.", field)
    return list(dict.fromkeys(value))


def attribution_of(name: str, client_id: str | None = None) -> str:
    """The source a memory saved through this app names: a known assistant by its
    name (or its metadata document's host), else ``connector``."""
    host = (urlsplit(client_id).hostname or "") if client_id and "://" in client_id else ""
    words = f"{name} {host}".lower()
    for source, marks in KNOWN_CLIENTS:
        if any(mark in words for mark in marks):
            return source
    return "connector"


@dataclass(frozen=True)
class ClientFields:
    name: str
    redirect_uris: list[str]
    grant_types: list[str]
    response_types: list[str]
    auth_method: str
    client_uri: str | None
    scope: str | None


def check_client_metadata(metadata: Mapping[str, Any]) -> ClientFields:
    """RFC 7591 metadata a client sent (or its metadata document holds), checked."""
    uris = _texts(metadata.get("redirect_uris"), "redirect_uris")
    if not 1 <= len(uris) <= MAX_REDIRECT_URIS:
        raise ConnectorError(f"Give 1 to {MAX_REDIRECT_URIS} redirect URIs.", "redirect_uris")
    uris = [check_redirect_uri(uri) for uri in uris]
    name = metadata.get("client_name")
    if name is not None and not isinstance(name, str):
        raise ConnectorError("client_name must be a string.", "client_name")
    name = " ".join((name or "").split())[:MAX_NAME] or urlsplit(uris[0]).hostname \
        or "Unnamed app"
    grant_types = _texts(metadata.get("grant_types"), "grant_types", GRANT_TYPES,
                         default=("authorization_code",))
    response_types = _texts(metadata.get("response_types"), "response_types", ("code",),
                            default=("code",))
    method = metadata.get("token_endpoint_auth_method", "client_secret_basic")
    if method not in AUTH_METHODS:
        raise ConnectorError(f"token_endpoint_auth_method is one of {', '.join(AUTH_METHODS)}.",
                             "token_endpoint_auth_method")
    client_uri = metadata.get("client_uri")
    if client_uri is not None and (not isinstance(client_uri, str)
                                   or urlsplit(client_uri).scheme != "https"):
        client_uri = None  # decorative: dropped rather than refused
    scope = metadata.get("scope")
    if scope is not None and not isinstance(scope, str):
        raise ConnectorError("scope must be a string.", "scope")
    return ClientFields(name, uris, grant_types, response_types, method, client_uri, scope)


def register_client(session: Session, metadata: Mapping[str, Any]) -> tuple[OAuthClient,
                                                                            str | None]:
    """Dynamic client registration (RFC 7591): a new client and its secret (``None`` for a
    public client, which proves itself with PKCE alone)."""
    fields = check_client_metadata(metadata)
    secret = None if fields.auth_method == "none" else new_secret(SECRET_PREFIX)
    client = OAuthClient(
        client_id="opc_" + secrets.token_urlsafe(18), kind="registered", name=fields.name,
        redirect_uris=fields.redirect_uris, client_uri=fields.client_uri,
        grant_types=fields.grant_types, response_types=fields.response_types,
        scope=fields.scope, token_endpoint_auth_method=fields.auth_method,
        client_secret_hash=hash_secret(secret) if secret else None,
        attribution=attribution_of(fields.name))
    session.add(client)
    session.flush()
    record_event(session, action="oauth.client_register", actor=SYSTEM,
                 target_type="oauth_client", target_id=client.id,
                 details={"kind": "registered", "auth_method": fields.auth_method})
    return client, secret


def find_client(session: Session, client_id: object) -> OAuthClient | None:
    if not isinstance(client_id, str) or not 1 <= len(client_id) <= 2048:
        return None
    return session.scalars(select(OAuthClient).where(OAuthClient.client_id == client_id)).first()


def document_fields(url: str, document: Mapping[str, Any]) -> ClientFields:
    """The client a metadata document fetched from ``url`` (its client_id) describes,
    checked: a public client naming itself by that URL."""
    if document.get("client_id") != url:
        raise ConnectorError("The client metadata document names another client_id.",
                             "client_id")
    fields = check_client_metadata({"token_endpoint_auth_method": "none", **document})
    if fields.auth_method != "none":
        raise ConnectorError("A client identified by a metadata document is a public "
                             "client (token_endpoint_auth_method none).", "client_id")
    return fields


def _document_values(url: str, fields: ClientFields, now: datetime) -> dict[str, Any]:
    return {"name": fields.name, "redirect_uris": fields.redirect_uris,
            "client_uri": fields.client_uri, "scope": fields.scope,
            "grant_types": fields.grant_types or ["authorization_code"],
            "response_types": fields.response_types, "token_endpoint_auth_method": "none",
            "client_secret_hash": None, "attribution": attribution_of(fields.name, url),
            "fetched_at": now}


def unsaved_document_client(url: str, document: Mapping[str, Any],
                            stored: OAuthClient | None = None, *,
                            now: datetime | None = None) -> OAuthClient:
    """The client as the document says now, not stored (a consent page, which a GET
    shows, writes nothing); with the stored one's id, if there is one."""
    values = _document_values(url, document_fields(url, document), _now(now))
    return OAuthClient(id=stored.id if stored is not None else None, client_id=url,
                       kind="document", **values)


def save_document_client(session: Session, url: str, document: Mapping[str, Any], *,
                         now: datetime | None = None) -> OAuthClient:
    """The client a metadata document describes, stored or refreshed in one statement
    (two answers at once for a new app store one row): its name and redirect URIs are
    what the document says now."""
    values = _document_values(url, document_fields(url, document), _now(now))
    statement = pg_insert(OAuthClient).values(client_id=url, kind="document", **values)
    statement = statement.on_conflict_do_update(
        index_elements=[OAuthClient.client_id],
        set_={key: statement.excluded[key] for key in values},
        where=OAuthClient.kind == "document")
    client_pk = session.execute(statement.returning(OAuthClient.id)).scalar()
    if client_pk is None:  # the client_id is a registered client's: never rewritten
        raise ConnectorError("That client_id belongs to another client.", "client_id")
    client = session.get(OAuthClient, client_pk, populate_existing=True)
    assert client is not None
    return client


# -- scopes and consent ---------------------------------------------------------------------

def grantable(scopes: Iterable[str], existing: OAuthGrant | None = None) -> list[str]:
    """What a user's consent gives: the elevated scope only if an admin gave it already."""
    kept = set(existing.scopes) if existing is not None and existing.revoked_at is None else set()
    return [s for s in SCOPES if s in scopes and (s != HARD_DELETE or s in kept)]


@dataclass(frozen=True)
class Choice:
    """One box on the consent page: a scope a person may grant, ticked or not, and
    what it means when it cannot be taken back lightly."""

    scope: str
    ticked: bool
    warning: str | None = None


def consent_choices(asked: Iterable[str]) -> list[Choice]:
    """What the consent page offers: a box for every scope a person may grant, ticked
    when the app asked for it (reading and saving, by default: the RFC 9728 metadata
    names only those). Deleting and redacting, when asked for, come with a warning; not
    asked for, they stay unticked, for a person who wants to give them anyway."""
    asked = set(asked)
    return [Choice(scope, scope in asked, SCOPE_WARNINGS[scope]
                   if scope in asked and scope in SCOPE_WARNINGS else None)
            for scope in USER_SCOPES]


def ticked_scopes(values: Iterable[object]) -> list[str]:
    """The scopes a consent form's boxes name, in SCOPES order: only those a person may
    grant (anything else a form could be made to send is dropped)."""
    named = {value for value in values if isinstance(value, str)}
    return [scope for scope in USER_SCOPES if scope in named]


# -- the teams a connection may act for ----------------------------------------------------

@dataclass(frozen=True)
class TeamChoice:
    """One team box on the consent page: a team the person is in, their role there,
    whether that role saves to it, and whether its admins must approve this app first."""

    team_id: int
    name: str
    role: str
    writes: bool
    needs_approval: bool
    ticked: bool = False

    @property
    def words(self) -> str:
        return f"{self.name} (as {self.role})"


def team_choices(session: Session, user_id: int, client: OAuthClient,
                 ticked: Iterable[int] = ()) -> list[TeamChoice]:
    """The person's teams for the consent page, by name; none ticked unless ``ticked``
    (a form sent back). A team whose app policy lists apps, and does not list this one,
    needs one of its admins to approve it before the app reaches it."""
    reach = reach_of(session, user_id)
    terms = team_terms(session, reach.seats, client_pk=client.id)
    chosen = set(ticked)
    return [TeamChoice(seat.team_id, seat.name, seat.role, may(seat, Action.WRITE),
                       terms[seat.team_id].app_needs_approval
                       if seat.team_id in terms else False, seat.team_id in chosen)
            for seat in sorted(reach.seats.values(), key=lambda s: (s.name, s.team_id))]


def acts_for(seats: Iterable[TeamChoice | TeamSeat]) -> str:
    """Which teams an app will write to (and read), in words: "It may save to: Pilot (as
    member)." — or "It acts for you alone." when it names none."""
    writes, reads = [], []
    for seat in seats:
        words = f"{seat.name} (as {seat.role})"
        writing = seat.writes if isinstance(seat, TeamChoice) else may(seat, Action.WRITE)
        (writes if writing else reads).append(words)
    if not writes and not reads:
        return "It acts for you alone."
    said = [f"It may save to: {', '.join(writes)}." if writes else "",
            f"It may read, not save to: {', '.join(reads)}." if reads else ""]
    return " ".join(part for part in said if part)


def chosen_teams(session: Session, user_id: int, values: Iterable[object]) -> list[int]:
    """The team ids a consent form names: only teams the person is in (anything else is
    refused, never dropped: a person must see what they allow)."""
    wanted = set()
    for value in values:
        try:
            wanted.add(int(value))  # type: ignore[call-overload]
        except (TypeError, ValueError, OverflowError):
            raise ConnectorError("Choose teams from the list.", "teams") from None
    if wanted and not wanted <= set(reach_of(session, user_id).seats):
        raise ConnectorError("Choose teams from the list.", "teams")
    return sorted(wanted)


@dataclass(frozen=True)
class ConnectionTeams:
    """What a connection acts for now: the sentence, and each team it names but does not
    reach, with why (not approved by the team yet, or the person left it)."""

    sentence: str
    waiting: list[str]


def connection_teams(session: Session, grant: OAuthGrant) -> ConnectionTeams:
    if not grant.team_ids:
        return ConnectionTeams(acts_for(()), [])
    reach = connection_reach(session, grant)
    terms = team_terms(session, grant.team_ids, client_pk=grant.client_pk)
    mine = reach_of(session, grant.user_id).seats
    waiting = []
    for team_id in sorted(set(grant.team_ids) - set(reach.seats)):
        team = terms.get(team_id)
        if team is None:
            continue
        waiting.append(f"{team.name}: needs an admin of {team.name} to approve this app"
                       if team_id in mine and team.app_needs_approval
                       else f"{team.name}: you are no longer in it")
    seats = sorted(reach.seats.values(), key=lambda s: (s.name, s.team_id))
    return ConnectionTeams(acts_for(seats), waiting)


def connection_reach(session: Session, grant: OAuthGrant) -> Reach:
    return reach_of(session, grant.user_id, Credential(team_ids=tuple(grant.team_ids),
                                                       client_pk=grant.client_pk))


def code_scopes(asked: Iterable[str], ticked: Iterable[str]) -> list[str]:
    """What a code (and the tokens it buys) carries: what the person ticked, and the
    elevated scope if the app asked for it (it applies once an admin grants it)."""
    asked, ticked = set(asked), set(ticked)
    return [s for s in SCOPES if s in ticked or (s == HARD_DELETE and s in asked)]


def live_grant(session: Session, user_id: int, client: OAuthClient,
               resource: str) -> OAuthGrant | None:
    return session.scalars(select(OAuthGrant).where(
        OAuthGrant.user_id == user_id, OAuthGrant.client_pk == client.id,
        OAuthGrant.resource == resource, OAuthGrant.revoked_at.is_(None))).first()


def _live_grant_locked(session: Session, user_id: int, client: OAuthClient,
                       resource: str) -> OAuthGrant:
    """The live connection, made if there is none, locked. One statement makes it: of
    two answers at once (a double-clicked Allow) the second waits for the first and
    takes its row, never a second one (nor a unique-index error)."""
    session.execute(pg_insert(OAuthGrant).values(
        user_id=user_id, client_pk=client.id, resource=resource, scopes=[], calls=0,
    ).on_conflict_do_nothing(index_elements=["user_id", "client_pk", "resource"],
                             index_where=OAuthGrant.revoked_at.is_(None)))
    return session.scalars(select(OAuthGrant).where(
        OAuthGrant.user_id == user_id, OAuthGrant.client_pk == client.id,
        OAuthGrant.resource == resource, OAuthGrant.revoked_at.is_(None))
        .with_for_update().execution_options(populate_existing=True)).one()


def consent(session: Session, *, user: User, client: OAuthClient, scopes: list[str],
            resource: str, allowed: bool, asked: list[str] | None = None,
            team_ids: Iterable[object] = ()) -> OAuthGrant | None:
    """The user's answer: ``scopes`` are what they ticked, ``asked`` what the app asked
    for (the same, unless given), ``team_ids`` the teams they let it act for (this
    answer's choice replaces the last). Allowed: the live connection with the ticked
    scopes and teams (made, or updated), audited with them by id; denied: audited."""
    actor = Actor.of(user)
    asked = list(scopes if asked is None else asked)
    if not allowed:
        record_event(session, action="oauth.deny", actor=actor, owner_id=user.id,
                     target_type="oauth_client", target_id=client.id,
                     details={"scopes": asked})
        return None
    ticked = ticked_scopes(scopes)
    if not ticked:
        raise ConnectorError("Tick at least one thing the app may do, or choose Deny.",
                             "scope")
    teams = chosen_teams(session, user.id, team_ids)
    grant = _live_grant_locked(session, user.id, client, resource)
    before, teams_before = list(grant.scopes), list(grant.team_ids)
    grant.scopes = grantable(set(ticked) | ({HARD_DELETE} & set(before)), grant)
    grant.team_ids = teams
    session.flush()
    record_event(session, action="oauth.grant", actor=actor, owner_id=user.id,
                 target_type="oauth_grant", target_id=grant.id,
                 details={"client": client.id, "asked": asked, "ticked": ticked,
                          "scopes": grant.scopes, "before": before, "teams": teams,
                          "teams_before": teams_before})
    return grant


def issue_code(session: Session, grant: OAuthGrant, raw: str, *, redirect_uri: str,
               scopes: list[str], challenge: str, method: str, lifetimes: Lifetimes,
               now: datetime | None = None) -> OAuthCode:
    """Store the code ``raw`` (as its hash), bound to the redirect URI and challenge."""
    code = OAuthCode(code_hash=hash_secret(raw), grant_id=grant.id, redirect_uri=redirect_uri,
                     scopes=scopes, resource=grant.resource, code_challenge=challenge,
                     code_challenge_method=method, expires_at=_now(now) + lifetimes.code)
    session.add(code)
    session.flush()
    return code


def take_code(session: Session, raw: object, client: OAuthClient, *,
              now: datetime | None = None) -> OAuthCode | None:
    """The live code ``raw`` spells, for this client, now used up. A code used a second
    time revokes the connection it was issued for (RFC 6749, section 4.1.2: whoever replays it
    may hold the tokens of the first use)."""
    if not isinstance(raw, str) or not raw.startswith(CODE_PREFIX):
        return None
    code = session.scalars(select(OAuthCode).where(OAuthCode.code_hash == hash_secret(raw))
                           .with_for_update()).first()
    if code is None or code.grant.client_pk != client.id:
        return None
    now = _now(now)
    if code.used_at is not None:
        revoke_grant(session, code.grant, actor=SYSTEM, by="code_reuse", now=now)
        return None
    if code.expires_at <= now or code.grant.revoked_at is not None:
        return None
    code.used_at = now
    session.flush()
    return code


# -- tokens ---------------------------------------------------------------------------------

def store_tokens(session: Session, grant: OAuthGrant, *, access: str, refresh: str | None,
                 scopes: list[str], lifetimes: Lifetimes, parent: OAuthToken | None = None,
                 now: datetime | None = None) -> OAuthToken:
    """Store a token pair (as hashes) for ``grant``; ``scopes`` are the ones asked for
    (what it may do is those the connection allows, at each call). ``parent``: the
    token whose refresh this is, spent now (and its access token with it)."""
    now = _now(now)
    if parent is not None:
        if not set(scopes) <= set(parent.scopes):
            raise ConnectorError("A refresh cannot widen the scopes.", "scope")
        parent.rotated_at = parent.revoked_at = now
    row = OAuthToken(grant_id=grant.id, parent_id=parent.id if parent else None,
                     access_hash=hash_secret(access),
                     refresh_hash=hash_secret(refresh) if refresh else None,
                     scopes=scopes, resource=grant.resource,
                     access_expires_at=now + lifetimes.access,
                     refresh_expires_at=now + lifetimes.refresh if refresh else None)
    session.add(row)
    session.flush()
    record_event(session, action="oauth.token_refresh" if parent else "oauth.token_issue",
                 actor=Actor("connector", str(grant.id)), owner_id=grant.user_id,
                 target_type="oauth_grant", target_id=grant.id,
                 details={"token": row.id, "scopes": scopes})
    return row


def allowed_scopes(scopes: Iterable[str], grant: OAuthGrant) -> list[str]:
    """What a token asking for ``scopes`` may do now: those the connection allows."""
    return [scope for scope in scopes if scope in grant.scopes]


def find_refresh(session: Session, raw: object, client: OAuthClient, *,
                 now: datetime | None = None) -> OAuthToken | None:
    """The live refresh token ``raw`` spells, for this client. One already rotated out
    means a copy is in other hands: the whole connection is revoked."""
    if not isinstance(raw, str) or not raw.startswith(REFRESH_PREFIX):
        return None
    token = session.scalars(select(OAuthToken).where(OAuthToken.refresh_hash == hash_secret(raw))
                            .with_for_update()).first()
    if token is None or token.grant.client_pk != client.id:
        return None
    now = _now(now)
    if token.rotated_at is not None:
        if token.grant.revoked_at is None:
            revoke_grant(session, token.grant, actor=SYSTEM, by="reuse", now=now)
        return None
    if token.revoked_at is not None or token.grant.revoked_at is not None:
        return None
    if token.refresh_expires_at is None or token.refresh_expires_at <= now:
        return None
    return token


def find_token(session: Session, raw: object) -> OAuthToken | None:
    """Any token row ``raw`` spells (access or refresh), for revocation."""
    if not isinstance(raw, str):
        return None
    digest = hash_secret(raw)
    if raw.startswith(ACCESS_PREFIX):
        column = OAuthToken.access_hash
    elif raw.startswith(REFRESH_PREFIX):
        column = OAuthToken.refresh_hash
    else:
        return None
    return session.scalars(select(OAuthToken).where(column == digest)).first()


def revoke_token(session: Session, token: OAuthToken, *, now: datetime | None = None) -> None:
    """RFC 7009: the token pair goes at once (a client that logs out revokes it)."""
    if token.revoked_at is None:
        token.revoked_at = _now(now)
        session.flush()
        record_event(session, action="oauth.token_revoke",
                     actor=Actor("connector", str(token.grant_id)),
                     owner_id=token.grant.user_id, target_type="oauth_grant",
                     target_id=token.grant_id, details={"token": token.id})


def revoke_grant(session: Session, grant: OAuthGrant, *, actor: Actor, by: str,
                 now: datetime | None = None) -> bool:
    """The connection and every token of it revoked; the next call fails. False when it
    was revoked already."""
    if grant.revoked_at is not None:
        return False
    now = _now(now)
    grant.revoked_at, grant.revoked_by = now, by
    session.execute(update(OAuthToken).where(OAuthToken.grant_id == grant.id,
                                             OAuthToken.revoked_at.is_(None))
                    .values(revoked_at=now))
    session.execute(update(OAuthCode).where(OAuthCode.grant_id == grant.id,
                                            OAuthCode.used_at.is_(None))
                    .values(used_at=now))
    session.flush()
    record_event(session, action="oauth.revoke", actor=actor, owner_id=grant.user_id,
                 target_type="oauth_grant", target_id=grant.id, details={"by": by})
    return True


# -- authenticated calls --------------------------------------------------------------------

@dataclass(frozen=True)
class Caller:
    """Who a bearer token speaks for: the connection, its user and scopes, its app."""

    grant_id: int
    user_id: int
    scopes: tuple[str, ...]
    client_name: str
    attribution: str
    token_expires_at: datetime
    team_ids: tuple[int, ...] = ()  # the teams the person let it act for
    client_pk: int | None = None  # the registered app (a team's app policy names it)

    @property
    def actor(self) -> Actor:
        return Actor("connector", str(self.grant_id))

    @property
    def credential(self) -> Credential:
        return Credential(team_ids=tuple(self.team_ids), client_pk=self.client_pk)


def authenticate_access_token(session: Session, raw: object, *, resource: str,
                              now: datetime | None = None) -> Caller | None:
    """The caller a live access token for ``resource`` speaks for, in one query; ``None``
    for anything else (unknown, expired, revoked, for another resource, its connection
    revoked, its user deactivated) — the caller answers all alike. Counts the call."""
    if not isinstance(raw, str) or not raw.startswith(ACCESS_PREFIX) or len(raw) > 100:
        return None
    now = _now(now)
    row = session.execute(
        select(OAuthToken.access_expires_at, OAuthToken.scopes, OAuthToken.resource,
               OAuthGrant.id, OAuthGrant.user_id, OAuthGrant.last_used_at,
               OAuthGrant.scopes.label("granted"), OAuthGrant.team_ids,
               OAuthGrant.client_pk, OAuthClient.name, OAuthClient.attribution)
        .join(OAuthGrant, OAuthGrant.id == OAuthToken.grant_id)
        .join(OAuthClient, OAuthClient.id == OAuthGrant.client_pk)
        .join(User, User.id == OAuthGrant.user_id)
        .where(OAuthToken.access_hash == hash_secret(raw), OAuthToken.revoked_at.is_(None),
               OAuthGrant.revoked_at.is_(None), User.active.is_(True))
    ).first()
    if row is None or row.access_expires_at <= now or row.resource != resource:
        return None
    values: dict[str, Any] = {"calls": OAuthGrant.calls + 1}
    if row.last_used_at is None or now - row.last_used_at >= LAST_USED_RESOLUTION:
        values["last_used_at"] = now
    session.execute(update(OAuthGrant).where(OAuthGrant.id == row.id).values(**values))
    # What the app asked for, as far as the connection allows now (an admin's later
    # grant, a narrower consent).
    scopes = tuple(scope for scope in row.scopes if scope in row.granted)
    return Caller(row.id, row.user_id, scopes, row.name, row.attribution,
                  row.access_expires_at, tuple(row.team_ids), row.client_pk)


@dataclass(frozen=True)
class Handed:
    source_key: str
    source_id: str
    memory_id: str | None = None


def log_access(session: Session, caller: Caller, tool: str, items: Iterable[Handed]) -> int:
    """What a tool call handed the app: one row per memory or record (never a query)."""
    rows = [ConnectorAccess(grant_id=caller.grant_id, tool=tool, source_key=item.source_key,
                            source_id=item.source_id[:200],
                            memory_id=uuid.UUID(item.memory_id) if item.memory_id else None)
            for item in items]
    session.add_all(rows)
    session.flush()
    return len(rows)


# -- the user's connections, and staff ------------------------------------------------------

@dataclass(frozen=True)
class Connection:
    grant: OAuthGrant
    client: OAuthClient
    handed: int


def connections_of(session: Session, user_id: int, *, live_only: bool = False
                   ) -> list[Connection]:
    """A user's connected apps, newest first, with how many items each was handed."""
    handed = (select(func.count()).where(ConnectorAccess.grant_id == OAuthGrant.id)
              .scalar_subquery())
    query = (select(OAuthGrant, OAuthClient, handed)
             .join(OAuthClient, OAuthClient.id == OAuthGrant.client_pk)
             .where(OAuthGrant.user_id == user_id)
             .order_by(OAuthGrant.revoked_at.is_(None).desc(), OAuthGrant.id.desc()))
    if live_only:
        query = query.where(OAuthGrant.revoked_at.is_(None))
    return [Connection(grant, client, count) for grant, client, count in session.execute(query)]


def find_connection(session: Session, user_id: int, grant_id: object) -> OAuthGrant:
    try:
        grant = session.get(OAuthGrant, int(grant_id))  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        grant = None
    if grant is None or grant.user_id != user_id:
        raise ConnectionNotFound("You have no such connected app.")
    return grant


def access_log(session: Session, grant_id: int, *, limit: int = 100) -> list[ConnectorAccess]:
    return list(session.scalars(select(ConnectorAccess).where(
        ConnectorAccess.grant_id == grant_id).order_by(ConnectorAccess.id.desc()).limit(limit)))


def grant_hard_delete(session: Session, grant: OAuthGrant, *, actor: Actor) -> bool:
    """An admin lets a connection erase for good. False when there was nothing to do."""
    if actor.kind != "admin":
        raise NotAllowed("Only an administrator can let an app erase memories for good.")
    if grant.revoked_at is not None or HARD_DELETE in grant.scopes:
        return False
    before = list(grant.scopes)
    grant.scopes = [s for s in SCOPES if s in {*before, HARD_DELETE}]
    session.flush()
    record_event(session, action="oauth.grant_hard_delete", actor=actor, owner_id=grant.user_id,
                 target_type="oauth_grant", target_id=grant.id,
                 details={"before": before, "after": grant.scopes})
    return True
