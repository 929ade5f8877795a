"""The OAuth 2.1 authorization server, on Authlib: authorization code with PKCE (S256
only), refresh tokens rotated on use, revocation (RFC 7009), dynamic registration
(RFC 7591) and client ID metadata documents, resource indicators (RFC 8707), and the
metadata documents (RFC 8414, RFC 9728). The rules live in ``services``; this wires
them to Authlib's request handling and to Flask."""

from __future__ import annotations

import base64
import binascii
import logging
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from authlib.integrations.flask_oauth2 import AuthorizationServer
from authlib.oauth2.rfc6749 import (
    InvalidClientError,
    InvalidRequestError,
    OAuth2Error,
    grants,
)
from authlib.oauth2.rfc6750 import BearerTokenGenerator
from authlib.oauth2.rfc7009 import RevocationEndpoint
from authlib.oauth2.rfc7591 import InvalidClientMetadataError, InvalidRedirectURIError
from authlib.oauth2.rfc7636 import CodeChallenge
from flask import Flask, current_app, g, has_request_context, request
from flask_limiter.util import get_remote_address
from limits import parse_many

from dashboard.auth.models import User
from dashboard.connectors import services
from dashboard.connectors.documents import (
    DocumentRefused,
    Fetcher,
    FetchesBusy,
    FetchPool,
    is_document_client_id,
)
from dashboard.connectors.models import OAuthClient, OAuthCode, OAuthGrant, OAuthToken
from dashboard.extensions import db
from dashboard.saved_memories.models import SCOPES
from dashboard.security import get_limiter

log = logging.getLogger(__name__)

AUTH_METHODS = list(services.AUTH_METHODS)
RESOURCE_NAME = "OrbitPilot memory"


class InvalidTargetError(OAuth2Error):
    """RFC 8707: the resource asked for is not one this server issues tokens for."""

    error = "invalid_target"


class UnsupportedResponseType(OAuth2Error):
    """Only the authorization code flow is served (OAuth 2.1)."""

    error = "unsupported_response_type"


class TemporarilyUnavailableError(OAuth2Error):
    """RFC 6749: busy now (every client-metadata fetch is under way); try again soon."""

    error = "temporarily_unavailable"
    status_code = 503


class TooManyClientsError(OAuth2Error):
    """More new clients from this address than OAUTH_REGISTER_LIMIT allows."""

    error = "temporarily_unavailable"
    status_code = 429

    def __init__(self, wait: int, **kwargs: Any) -> None:
        super().__init__(description="Too many new apps were connected from this address. "
                                     f"Try again in {wait} seconds.", **kwargs)
        self.wait = wait


def description(sentence: str) -> str:
    """A sentence as an OAuth error_description may hold it (RFC 6749: printable ASCII
    without a double quote or a backslash)."""
    text = sentence.replace("\u2014", "-").replace("\u2019", "'").replace('"', "'")
    return "".join(c if " " <= c <= "~" and c != "\\" else "?" for c in text)


# -- where things are -----------------------------------------------------------------------

def public_base() -> str:
    """The origin clients reach us at: PUBLIC_URL, else the request's own."""
    configured = current_app.config.get("PUBLIC_URL")
    if configured:
        return str(configured).rstrip("/")
    return request.url_root.rstrip("/") if has_request_context() else ""


def mcp_resource() -> str:
    """The MCP endpoint's canonical URI: tokens are issued for it and only it."""
    return public_base() + "/mcp"


def authorization_server_metadata() -> dict[str, Any]:
    base = public_base()
    return {
        "issuer": base,
        "authorization_endpoint": f"{base}/oauth/authorize",
        "token_endpoint": f"{base}/oauth/token",
        "registration_endpoint": f"{base}/oauth/register",
        "revocation_endpoint": f"{base}/oauth/revoke",
        "scopes_supported": list(SCOPES),
        "response_types_supported": ["code"],
        "response_modes_supported": ["query"],
        "grant_types_supported": list(services.GRANT_TYPES),
        "code_challenge_methods_supported": ["S256"],
        "token_endpoint_auth_methods_supported": AUTH_METHODS,
        "revocation_endpoint_auth_methods_supported": AUTH_METHODS,
        "client_id_metadata_document_supported": True,
        "authorization_response_iss_parameter_supported": False,
        "service_documentation": f"{base}/settings/connections",
    }


def protected_resource_metadata() -> dict[str, Any]:
    return {
        "resource": mcp_resource(),
        "resource_name": RESOURCE_NAME,
        "authorization_servers": [public_base()],
        # The everyday scopes only: clients ask for what is advertised here by default,
        # and a person may tick more on the consent page.
        "scopes_supported": list(services.EVERYDAY_SCOPES),
        "bearer_methods_supported": ["header"],
    }


def lifetimes() -> services.Lifetimes:
    return services.Lifetimes.from_settings(current_app.config)


# -- clients, codes and tokens as Authlib asks for them -------------------------------------

def fetcher() -> Fetcher:
    config = current_app.config
    return Fetcher(ca_file=config.get("OAUTH_CLIENT_METADATA_CA") or None,
                   allow_private=bool(config.get("OAUTH_CLIENT_METADATA_ALLOW_PRIVATE")),
                   timeout=float(config.get("OAUTH_CLIENT_METADATA_TIMEOUT", 5)))


def fetch_pool(app: Flask | None = None) -> FetchPool:
    return (app or current_app).extensions["orbitpilot.client_metadata"]


def query_client(client_id: str) -> OAuthClient | None:
    """A client as stored (a metadata document's copy whatever its age), or the one this
    authorization request read from its document (``prepare_client``). Never a fetch:
    the token and revocation endpoints, which anyone may call, must not make this
    server wait on someone else's (a client whose document was never read at the
    consent page holds no code or token anyway)."""
    prepared = g.get("oauth_client") if has_request_context() else None
    if prepared is not None and prepared.client_id == client_id:
        return prepared
    return services.find_client(db.session, client_id)


def _stale(client: OAuthClient) -> bool:
    ttl = timedelta(seconds=int(current_app.config.get("OAUTH_CLIENT_METADATA_SECONDS", 3600)))
    return client.fetched_at is None or datetime.now(UTC) - client.fetched_at >= ttl


def prepare_client(*, store: bool) -> None:
    """For the consent page (a signed-in person): the client an authorization request
    names by its metadata document's URL, read again if new or older than
    OAUTH_CLIENT_METADATA_SECONDS, on the fetch pool. The answer (``store``: a POST)
    stores it; the page (a GET) only shows it. A new one counts against the
    registration limit, as a registration does."""
    client_id = request.args.get("client_id")
    if not is_document_client_id(client_id):
        return
    stored = services.find_client(db.session, client_id)
    if stored is not None and stored.kind != "document":
        return
    if stored is not None and not _stale(stored):
        return
    if stored is None:
        wait = registration_wait(count=store)
        if wait is not None:
            raise TooManyClientsError(wait)
    try:
        document = fetch_pool().fetch(fetcher(), client_id)
        if store:
            g.oauth_client = services.save_document_client(db.session, client_id, document)
        else:
            g.oauth_client = services.unsaved_document_client(client_id, document, stored)
    except FetchesBusy as exc:
        raise TemporarilyUnavailableError(description=description(exc.sentence)) from None
    except (DocumentRefused, services.ConnectorError) as exc:
        log.info("client metadata document refused: %s", type(exc).__name__)
        raise InvalidClientError(description=description(exc.sentence)) from None


REGISTRATIONS = "oauth-registrations"


def registration_wait(*, count: bool) -> int | None:
    """Seconds until this client address may add a client again (OAUTH_REGISTER_LIMIT),
    or ``None``: it may now (and, with ``count``, this one is counted). Registrations
    and new metadata-document clients share the count. The limiter's store down: let
    through, as the limiter is configured to."""
    limiter = get_limiter()
    if not limiter.enabled:
        return None
    strategy = limiter.limiter
    who = get_remote_address()
    try:
        for item in parse_many(current_app.config["OAUTH_REGISTER_LIMIT"]):
            allowed = strategy.hit(item, REGISTRATIONS, who) if count \
                else strategy.test(item, REGISTRATIONS, who)
            if not allowed:
                reset = strategy.get_window_stats(item, REGISTRATIONS, who).reset_time
                return max(1, int(reset - time.time()))
    except Exception as exc:  # the store is unreachable: no count, no refusal
        log.warning("registration limit not checked: %s", type(exc).__name__)
    return None


# -- what a request may hold ----------------------------------------------------------------

MAX_PARAMETER = 2048
AUTHORIZE_PARAMETERS = ("response_type", "client_id", "redirect_uri", "scope", "state",
                        "code_challenge", "code_challenge_method", "resource")


def _printable(value: str) -> bool:
    return all(" " <= c <= "~" for c in value)


def _check_values(values: Any, names: Any) -> None:
    for name in names:
        found = values.getlist(name)
        if len(found) > 1:
            raise InvalidRequestError(f"Send {description(name)[:40]} once.")
        if found and len(found[0]) > MAX_PARAMETER:
            raise InvalidRequestError(f"{description(name)[:40]} is longer than "
                                      f"{MAX_PARAMETER} characters.")
        if found and not _printable(found[0]):
            raise InvalidRequestError(f"{description(name)[:40]} must be printable ASCII "
                                      "(percent-encode anything else).")


def check_authorize_request() -> None:
    """An authorization request's parameters: each once, printable ASCII (RFC 6749,
    appendix A), of a sane length. Refused on this server's own page."""
    _check_values(request.args, AUTHORIZE_PARAMETERS)


def check_client_request() -> None:
    """A request to the token or revocation endpoint, as RFC 6749 has it: parameters
    form-encoded in the body (never the URL), each once, printable ASCII; HTTP Basic
    credentials, if any, that decode."""
    if request.args:
        raise InvalidRequestError("Send the parameters in the request body, not the URL.")
    if request.mimetype != "application/x-www-form-urlencoded":
        raise InvalidRequestError("Send the parameters form-encoded "
                                  "(application/x-www-form-urlencoded).")
    if not all(_printable(name) for name in request.form):
        raise InvalidRequestError("Parameter names are printable ASCII.")
    _check_values(request.form, list(request.form.keys()))
    header = request.headers.get("Authorization")
    if header is not None:
        scheme, _, credentials = header.strip().partition(" ")
        if scheme.lower() == "basic" and not _basic_credentials(credentials.strip()):
            raise InvalidClientError(status_code=401, description=(
                "The Authorization header holds no HTTP Basic credentials "
                "(base64 of client_id:client_secret)."))


def _basic_credentials(credentials: str) -> bool:
    try:
        decoded = base64.b64decode(credentials, validate=True).decode("utf-8")
    except (binascii.Error, ValueError):
        return False
    return ":" in decoded and _printable(decoded)


def _resource_asked() -> str:
    """The ``resource`` a request names (RFC 8707), which must be our MCP endpoint; none
    named: the MCP endpoint."""
    asked = request.values.getlist("resource")
    if len(asked) > 1:
        raise InvalidTargetError(description="Ask for one resource at a time.")
    resource = asked[0] if asked else mcp_resource()
    if resource.rstrip("/") != mcp_resource():
        raise InvalidTargetError(description=f"This server issues tokens for {mcp_resource()} "
                                             "only.")
    return mcp_resource()


class S256Only(CodeChallenge):
    """PKCE is required of every client, and only with S256 (OAuth 2.1)."""

    DEFAULT_CODE_CHALLENGE_METHOD = "S256"
    SUPPORTED_CODE_CHALLENGE_METHOD = ["S256"]

    def validate_code_challenge(self, grant: Any, redirect_uri: str) -> None:
        data = grant.request.payload.data
        if not data.get("code_challenge"):
            raise InvalidRequestError("PKCE is required: send code_challenge with "
                                      "code_challenge_method S256.")
        if data.get("code_challenge_method") != "S256":
            raise InvalidRequestError("Only code_challenge_method S256 is supported.")
        super().validate_code_challenge(grant, redirect_uri)


@dataclass(frozen=True)
class Consented:
    """The signed-in user's allow, with the connection it made and the scopes the code
    carries (what they ticked)."""

    user: User
    grant: OAuthGrant
    scopes: list[str] = field(default_factory=list)

    @property
    def id(self) -> int:
        return self.user.id


class CodeGrant(grants.AuthorizationCodeGrant):
    TOKEN_ENDPOINT_AUTH_METHODS = AUTH_METHODS

    @staticmethod
    def validate_authorization_redirect_uri(request: Any, client: OAuthClient) -> str:
        # Authlib's own quotes the URI as it came, which fails on characters an error
        # may not hold (a 500): this quotes it made safe.
        asked = request.payload.redirect_uri
        if asked:
            if not client.check_redirect_uri(asked):
                raise InvalidRequestError(description(
                    f"The redirect URI {asked[:200]} is not one the app registered."),
                    state=request.payload.state)
            return asked
        default = client.get_default_redirect_uri()
        if not default:
            raise InvalidRequestError("The app registered several redirect URIs: name one "
                                      "(redirect_uri).", state=request.payload.state)
        return default

    def validate_authorization_request(self) -> str:
        redirect_uri = super().validate_authorization_request()
        try:
            self.request.resource = _resource_asked()
        except OAuth2Error as error:
            error.redirect_uri = redirect_uri
            raise
        return redirect_uri

    def generate_authorization_code(self) -> str:
        return services.new_secret(services.CODE_PREFIX)

    def save_authorization_code(self, code: str, request: Any) -> None:
        consented: Consented = request.user
        services.issue_code(
            db.session, consented.grant, code, redirect_uri=request.payload.redirect_uri
            or request.client.get_default_redirect_uri(), scopes=consented.scopes,
            challenge=request.payload.data["code_challenge"], method="S256",
            lifetimes=lifetimes())

    def query_authorization_code(self, code: str, client: OAuthClient) -> OAuthCode | None:
        found = services.take_code(db.session, code, client)
        if found is not None:
            asked = request.form.getlist("resource")
            if asked and (len(asked) > 1 or asked[0].rstrip("/") != found.resource):
                raise InvalidTargetError(description="The resource differs from the one "
                                                     "the code was issued for.")
        return found

    def delete_authorization_code(self, authorization_code: OAuthCode) -> None:
        pass  # used up already (take_code): a second use revokes the connection

    def authenticate_user(self, authorization_code: OAuthCode) -> User | None:
        grant = authorization_code.grant
        return grant.user if grant.revoked_at is None and grant.user.active else None


class RefreshGrant(grants.RefreshTokenGrant):
    TOKEN_ENDPOINT_AUTH_METHODS = AUTH_METHODS
    INCLUDE_NEW_REFRESH_TOKEN = True

    def authenticate_refresh_token(self, refresh_token: str) -> OAuthToken | None:
        return services.find_refresh(db.session, refresh_token, self.request.client)

    def authenticate_user(self, refresh_token: OAuthToken) -> User | None:
        user = refresh_token.grant.user
        return user if user.active else None

    def revoke_old_credential(self, refresh_token: OAuthToken) -> None:
        pass  # spent by save_token, with the new pair stored in the same flush


class UnsupportedTokenType(OAuth2Error):
    """RFC 7009: a token_type_hint this server does not know (a 400, as RFC 6749 has
    every error but invalid_client; Authlib's own answers 401)."""

    error = "unsupported_token_type"


class Revocation(RevocationEndpoint):
    CLIENT_AUTH_METHODS = AUTH_METHODS

    def check_params(self, request: Any, client: OAuthClient) -> None:
        if not request.form.get("token"):
            raise InvalidRequestError("Send the token to revoke.")
        hint = request.form.get("token_type_hint")
        if hint and hint not in self.SUPPORTED_TOKEN_TYPES:
            raise UnsupportedTokenType(description="token_type_hint is access_token or "
                                                   "refresh_token.")

    def query_token(self, token_string: str, token_type_hint: str | None) -> OAuthToken | None:
        return services.find_token(db.session, token_string)

    def revoke_token(self, token: OAuthToken, request: Any) -> None:
        services.revoke_token(db.session, token)


def save_token(token: dict[str, Any], oauth_request: Any) -> None:
    found = oauth_request.refresh_token  # set on a refresh, the spent token
    parent = found if isinstance(found, OAuthToken) else None
    grant = parent.grant if parent is not None else oauth_request.authorization_code.grant
    asked = token.get("scope", "").split()
    services.store_tokens(db.session, grant, access=token["access_token"],
                          refresh=token.get("refresh_token"), scopes=asked,
                          lifetimes=lifetimes(), parent=parent)
    # The response says what the token may do now (asked for, and granted).
    token["scope"] = " ".join(services.allowed_scopes(asked, grant))


def _access_token(client: Any, grant_type: str, user: Any, scope: str) -> str:
    return services.new_secret(services.ACCESS_PREFIX)


def _refresh_token(client: Any, grant_type: str, user: Any, scope: str) -> str:
    return services.new_secret(services.REFRESH_PREFIX)


def _expires_in(client: Any, grant_type: str) -> int:
    return int(lifetimes().access.total_seconds())


def register(metadata: Any) -> tuple[int, dict[str, Any]]:
    """Dynamic client registration (RFC 7591): the stored client as JSON, or its error."""
    if not isinstance(metadata, dict):
        return 400, dict(InvalidClientMetadataError(
            description="Send the client's metadata as a JSON object.").get_body())
    try:
        client, secret = services.register_client(db.session, metadata)
    except services.ConnectorError as exc:
        error = InvalidRedirectURIError if exc.field == "redirect_uris" \
            else InvalidClientMetadataError
        return 400, dict(error(description=description(exc.sentence)).get_body())
    body = {"client_id": client.client_id, "client_id_issued_at": int(client.created_at
                                                                     .timestamp()),
            "client_name": client.name, "redirect_uris": client.redirect_uris,
            "grant_types": client.grant_types, "response_types": client.response_types,
            "token_endpoint_auth_method": client.token_endpoint_auth_method}
    if client.scope:
        body["scope"] = client.scope
    if secret:
        body.update(client_secret=secret, client_secret_expires_at=0)
    return 201, body


class Server(AuthorizationServer):
    def get_authorization_grant(self, request: Any) -> Any:
        # Authlib's own quotes the response_type in the error, which fails on characters
        # an error may not hold (a 500); and only "code" is served here.
        if request.payload.response_type == "code":
            return super().get_authorization_grant(request)
        redirect_uri = None
        client = self.query_client(request.payload.client_id)
        if client is not None:
            asked = request.payload.redirect_uri
            redirect_uri = (asked if client.check_redirect_uri(asked) else None) if asked \
                else client.get_default_redirect_uri()
        raise UnsupportedResponseType(description="Only response_type code is supported.",
                                      redirect_uri=redirect_uri)


def create_server(app: Flask) -> AuthorizationServer:
    app.extensions["orbitpilot.client_metadata"] = FetchPool(
        int(app.config.get("OAUTH_CLIENT_METADATA_FETCHES", 2)))
    server = Server(app, query_client=query_client, save_token=save_token)
    server.register_token_generator(
        "default", BearerTokenGenerator(_access_token, _refresh_token, _expires_in))
    server.scopes_supported = list(SCOPES)
    server.register_grant(CodeGrant, [S256Only(required=True)])
    server.register_grant(RefreshGrant)
    server.register_endpoint(Revocation)
    return server
