"""Connected apps on the web: the OAuth endpoints and metadata, the consent page a
signed-in user answers, and ``/settings/connections`` (what each app may do, what it was
handed, and one click to cut it off)."""

from __future__ import annotations

import json
import logging
from typing import Any
from urllib.parse import urlsplit

from authlib.oauth2.rfc6749 import OAuth2Error
from flask import (
    Blueprint,
    Flask,
    abort,
    current_app,
    flash,
    jsonify,
    make_response,
    redirect,
    render_template,
    request,
    url_for,
)
from flask_limiter.util import get_remote_address
from flask_login import current_user, login_required

from dashboard.audit.services import Actor
from dashboard.connectors import oauth, services, uris
from dashboard.errors import TOO_MANY, oauth_error, wait_words
from dashboard.extensions import csrf, db
from dashboard.security import content_security_policy, csp_nonce, get_limiter

log = logging.getLogger(__name__)

bp = Blueprint("connectors", __name__)

def init_oauth(app: Flask) -> None:
    app.extensions["orbitpilot.oauth"] = oauth.create_server(app)
    for view in (token, register, revoke_token):
        csrf.exempt(view)  # clients, not browsers: no cookies, no forms


def limit_oauth(app: Flask) -> None:
    """Per client address: the token and revocation endpoints (after ``init_security``,
    which makes the limiter). Registrations are counted by ``oauth.registration_wait``,
    with the new metadata-document clients a consent stores."""
    limiter = get_limiter(app)
    for endpoint in ("connectors.token", "connectors.revoke_token"):
        view = app.view_functions[endpoint]
        app.view_functions[endpoint] = limiter.limit(
            lambda: app.config["OAUTH_RATE_LIMIT"], key_func=get_remote_address,
            scope=endpoint)(view)


def _server() -> Any:
    return current_app.extensions["orbitpilot.oauth"]


def _json(body: dict[str, Any], status: int = 200):
    response = jsonify(body)
    response.status_code = status
    response.headers["Cache-Control"] = "no-store"
    return response


# Said for an error Authlib raises without a sentence of its own.
DESCRIPTIONS = {
    "invalid_request": "The request lacks a parameter it needs, or holds one that is not "
                       "valid here.",
    "unsupported_grant_type": "grant_type is authorization_code or refresh_token.",
    "unsupported_token_type": "token_type_hint is access_token or refresh_token.",
    "invalid_grant": "The code or refresh token is not valid (used, expired, revoked, or "
                     "issued to another client).",
    "invalid_client": "The client is unknown here, or did not authenticate as it "
                      "registered to.",
    "invalid_scope": "The scope asked for is not one this server knows, or is wider than "
                     "the one granted.",
}


def _oauth_error(error: OAuth2Error):
    """An RFC 6749 error as the client endpoints answer it: JSON, not stored."""
    db.session.rollback()
    return _described(_server().handle_error_response(None, error))


def _described(response):
    """An error answer always says what went wrong (``error_description``)."""
    if response.status_code >= 400:
        body = response.get_json(silent=True)
        if isinstance(body, dict) and body.get("error") and not body.get("error_description"):
            body["error_description"] = DESCRIPTIONS.get(body["error"], "The request failed.")
            response.set_data(json.dumps(body))
    return response


# -- metadata -------------------------------------------------------------------------------

@bp.get("/.well-known/oauth-authorization-server")
def authorization_server_metadata():
    """RFC 8414: where to authorise, exchange, register and revoke."""
    return jsonify(oauth.authorization_server_metadata())


@bp.get("/.well-known/oauth-protected-resource")
@bp.get("/.well-known/oauth-protected-resource/mcp")
def protected_resource_metadata():
    """RFC 9728: the MCP endpoint, and which authorization server issues its tokens."""
    return jsonify(oauth.protected_resource_metadata())


# -- the client endpoints -------------------------------------------------------------------

@bp.post("/oauth/token")
def token():
    """Exchange a code (with its PKCE verifier) or a refresh token for tokens. Only
    clients already stored are known here: nothing is fetched for anyone who asks."""
    try:
        oauth.check_client_request()
        response = _server().create_token_response()
    except OAuth2Error as error:
        return _oauth_error(error)
    except services.ConnectorError as exc:
        db.session.rollback()
        return _json({"error": "invalid_request",
                      "error_description": oauth.description(exc.sentence)}, 400)
    # Commit either way: an error may have revoked a connection (a code or refresh
    # token used twice), which must hold; nothing else is written on an error.
    db.session.commit()
    return _described(response)


@bp.post("/oauth/register")
def register():
    """Dynamic client registration (RFC 7591), counted per client address."""
    wait = oauth.registration_wait(count=True)
    if wait is not None:
        response = oauth_error(429, TOO_MANY.format(wait=wait_words(wait)))
        response.headers["Retry-After"] = str(wait)
        return response
    status, body = oauth.register(request.get_json(silent=True))
    if status == 201:
        db.session.commit()
    return _json(body, status)


@bp.post("/oauth/revoke")
def revoke_token():
    """RFC 7009: a client gives a token back."""
    try:
        oauth.check_client_request()
        response = _server().create_endpoint_response("revocation")
    except OAuth2Error as error:
        return _oauth_error(error)
    db.session.commit()
    return _described(response)


# -- consent --------------------------------------------------------------------------------

def _authorize_error(error: OAuth2Error):
    """A bad authorization request. It goes back to the app with the error only when
    its redirect URI is verified (``services.redirect_verified``); any other is answered
    here, naming where the app would have taken the person, with a link they may
    follow — never a redirect to an address anyone could have registered."""
    redirect_uri = getattr(error, "redirect_uri", None)
    client = oauth.query_client(request.args.get("client_id", "")) if redirect_uri else None
    known = client is not None and client.check_redirect_uri(redirect_uri)
    if known and services.redirect_verified(client, redirect_uri):
        response = _server().handle_error_response(None, error)
        db.session.rollback()
        return response
    link = dict(error()[2]).get("Location") if known else None
    host = uris.host_words(redirect_uri) if link else None
    db.session.rollback()
    status = error.status_code if error.status_code in (429, 503) else 400
    response = make_response(render_template(
        "connectors/authorize_error.html", sentence=error.description or error.error,
        busy=status != 400, link=link, host=host), status)
    response.headers["Cache-Control"] = "no-store"
    if status != 400:
        response.headers["Retry-After"] = str(getattr(error, "wait", 5))
    return response


def form_source(uri: str) -> tuple[str, ...]:
    """The CSP source of a redirect URI: its origin (web), or its scheme (an app's)."""
    parts = urlsplit(uri)
    if parts.scheme in ("http", "https"):  # the parsed host, never the raw authority
        source = f"{parts.scheme}://{uris.host_words(uri)}" if uris.origin(uri) else ""
    else:
        source = f"{parts.scheme}:"
    return (source,) if source and source.isascii() \
        and not any(c in source for c in " ;,'\"") else ()


def _consent_page(grant: Any, client: Any, asked: list[str], resource: str, *,
                  error: str | None = None, status: int = 200, teams: list[int] = ()):
    existing = services.live_grant(db.session, current_user.id, client, resource) \
        if client.id is not None else None
    kept = services.HARD_DELETE in services.grantable(asked, existing)
    # The person's teams, none ticked (a form sent back keeps what it ticked).
    team_choices = services.team_choices(db.session, current_user.id, client, teams)
    response = make_response(render_template(
        "connectors/authorize.html", client=client, choices=services.consent_choices(asked),
        words=services.SCOPE_WORDS, hard_delete=services.HARD_DELETE in asked,
        hard_delete_kept=kept, redirect_host=uris.host_words(grant.redirect_uri),
        action=request.full_path, unverified=client.kind == "registered", error=error,
        teams=team_choices,
        acts_for=services.acts_for(choice for choice in team_choices if choice.ticked)),
        status)
    response.headers["Cache-Control"] = "no-store"
    # The answer redirects to the app: the policy lets this form go there.
    response.headers["Content-Security-Policy"] = content_security_policy(
        csp_nonce(), form_source(grant.redirect_uri))
    return response


@bp.route("/oauth/authorize", methods=["GET", "POST"])
@login_required
def authorize():
    """GET shows the consent page (a box per scope); POST (CSRF-protected) records the
    answer — the scopes ticked — and sends the user back to the app with a code, or
    with access_denied."""
    server = _server()
    posting = request.method == "POST"  # GET and HEAD show; only a POST changes
    try:
        oauth.check_authorize_request()
        oauth.prepare_client(store=posting)
        grant = server.get_consent_grant(end_user=current_user)
    except OAuth2Error as error:
        return _authorize_error(error)
    client = grant.request.client
    asked = grant.request.scope.split()
    resource = oauth.mcp_resource()
    if not posting:
        return _consent_page(grant, client, asked, resource)
    grant_user = None
    if request.form.get("decision") == "allow":
        ticked = services.ticked_scopes(request.form.getlist("granted"))
        teams = request.form.getlist("teams")
        try:
            connection = services.consent(db.session, user=current_user, client=client,
                                          scopes=ticked, asked=asked, resource=resource,
                                          allowed=True, team_ids=teams)
        except services.ConnectorError as exc:  # nothing ticked, a team not theirs: again
            return _consent_page(grant, client, asked, resource, error=exc.sentence,
                                 status=400,
                                 teams=[int(t) for t in teams if t.isdigit() and len(t) < 10])
        grant_user = oauth.Consented(current_user, connection,
                                     services.code_scopes(asked, ticked))
    else:
        services.consent(db.session, user=current_user, client=client, scopes=asked,
                         resource=resource, allowed=False)
    response = server.create_authorization_response(grant=grant, grant_user=grant_user)
    db.session.commit()
    return response


# -- the user's connected apps --------------------------------------------------------------

@bp.get("/settings/connections/")
@login_required
def connections():
    """Every app the user authorised: what it may do, when, how often, and what it read."""
    listed = services.connections_of(db.session, current_user.id)
    return render_template("connectors/connections.html", connections=listed,
                           words=services.SCOPE_WORDS,
                           teams={c.grant.id: services.connection_teams(db.session, c.grant)
                                  for c in listed})


@bp.get("/settings/connections/<int:grant_id>")
@login_required
def connection(grant_id: int):
    grant = _own(grant_id)
    return render_template("connectors/connection.html", grant=grant, client=grant.client,
                           log=services.access_log(db.session, grant.id),
                           words=services.SCOPE_WORDS,
                           teams=services.connection_teams(db.session, grant))


@bp.route("/settings/connections/<int:grant_id>/revoke", methods=["GET", "POST"])
@login_required
def revoke(grant_id: int):
    """GET asks; POST cuts the app off: its very next call fails."""
    grant = _own(grant_id)
    if request.method != "POST":  # GET and HEAD show; only a POST changes
        return render_template("connectors/revoke.html", grant=grant, client=grant.client)
    if services.revoke_grant(db.session, grant, actor=Actor.of(current_user), by="user"):
        flash(f"{grant.client.name} is disconnected. Its next call will fail.", "success")
    else:
        flash(f"{grant.client.name} was disconnected already.", "info")
    db.session.commit()
    return redirect(url_for("connectors.connections"))


def _own(grant_id: int):
    try:
        return services.find_connection(db.session, current_user.id, grant_id)
    except services.ConnectionNotFound as exc:
        abort(404, exc.sentence)
