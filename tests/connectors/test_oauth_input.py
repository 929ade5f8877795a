"""Malformed requests at the OAuth endpoints, as a prober sends them: repeated and empty
parameters, huge values, bytes that are not UTF-8, percent garbage, JSON of the wrong
shape, the wrong content type, a Basic header that is not base64, a 5,000-character
client_id, unicode hosts. Each gets exactly one 4xx; at the client endpoints (token,
revocation, registration) an RFC 6749 error body, never stored — the rate limiter's 429,
the input guard's 400 and any other error there included. The consent page answers on
this server's own page, never a redirect."""

from __future__ import annotations

import base64

import pytest
from flask_wtf.csrf import CSRFError

from dashboard.connectors import oauth
from tests.connectors.oauth_flow import REDIRECT_URI, authorize_url, pkce, register

FORM = "application/x-www-form-urlencoded"
LONG = "x" * 5000
CODE = "grant_type=authorization_code&code=opac_x&code_verifier=" + "v" * 50


def basic(raw: bytes) -> dict:
    return {"Authorization": "Basic " + base64.b64encode(raw).decode()}


def form(body: str | bytes, **more) -> dict:
    return {"data": body, "content_type": FORM, **more}


# (method, path, request, status, error); "{client}" in a body: a registered public client.
CLIENT_CASES = {
    # -- the token endpoint
    "token: nothing": ("post", "/oauth/token", form(""), 400, "unsupported_grant_type"),
    "token: empty grant_type": ("post", "/oauth/token", form("grant_type="), 400,
                                "unsupported_grant_type"),
    "token: unknown grant_type": ("post", "/oauth/token", form("grant_type=password"), 400,
                                  "unsupported_grant_type"),
    "token: grant_type twice": ("post", "/oauth/token", form(
        "grant_type=authorization_code&grant_type=refresh_token"), 400, "invalid_request"),
    "token: client_id twice": ("post", "/oauth/token", form(
        CODE + "&client_id={client}&client_id=opc_other"), 400, "invalid_request"),
    "token: resource twice": ("post", "/oauth/token", form(
        CODE + "&client_id={client}&resource=a&resource=b"), 400, "invalid_request"),
    "token: 5,000-character client_id": ("post", "/oauth/token", form(
        CODE + "&client_id=" + LONG), 400, "invalid_request"),
    "token: huge code": ("post", "/oauth/token", form(
        "grant_type=authorization_code&client_id={client}&code=" + "c" * 100_000), 400,
        "invalid_request"),
    "token: empty client_id": ("post", "/oauth/token", form(CODE + "&client_id="), 401,
                               "invalid_client"),
    "token: unknown client": ("post", "/oauth/token", form(CODE + "&client_id=opc_nobody"),
                              400, "invalid_client"),
    "token: no code": ("post", "/oauth/token", form(
        "grant_type=authorization_code&client_id={client}"), 400, "invalid_request"),
    "token: code of another kind": ("post", "/oauth/token", form(
        "grant_type=authorization_code&client_id={client}&code=opat_x&code_verifier=v"),
        400, "invalid_grant"),
    "token: no refresh_token": ("post", "/oauth/token", form(
        "grant_type=refresh_token&client_id={client}"), 400, "invalid_request"),
    "token: bytes that are not UTF-8": ("post", "/oauth/token", form(
        b"grant_type=%ff%fe"), 400, "invalid_request"),
    "token: a NUL byte": ("post", "/oauth/token", form("grant_type=a%00"), 400,
                          "invalid_request"),
    "token: percent garbage": ("post", "/oauth/token", form("grant_type=%zz%"), 400,
                               "unsupported_grant_type"),
    "token: unicode in a value": ("post", "/oauth/token", form(
        CODE + "&client_id={client}&redirect_uri=https://b%C3%BCcher.example/cb"), 400,
        "invalid_request"),
    "token: a parameter name that is not ASCII": ("post", "/oauth/token", form(
        CODE + "&client_id={client}&%C3%A9=1"), 400, "invalid_request"),
    "token: parameters in the URL": ("post", "/oauth/token?grant_type=authorization_code",
                                     form(""), 400, "invalid_request"),
    "token: a JSON object": ("post", "/oauth/token", {"json": {
        "grant_type": "authorization_code", "code": "opac_x"}}, 400, "invalid_request"),
    "token: a JSON array": ("post", "/oauth/token", {"json": ["grant_type"]}, 400,
                            "invalid_request"),
    "token: text/plain": ("post", "/oauth/token", {
        "data": "grant_type=authorization_code", "content_type": "text/plain"}, 400,
        "invalid_request"),
    "token: multipart": ("post", "/oauth/token", {
        "data": {"grant_type": "authorization_code"}, "content_type": "multipart/form-data"},
        400, "invalid_request"),
    "token: no content type": ("post", "/oauth/token", {"data": b"grant_type=x"}, 400,
                               "invalid_request"),
    "token: Basic, not base64": ("post", "/oauth/token", form(
        CODE, headers={"Authorization": "Basic !!not base64!!"}), 401, "invalid_client"),
    "token: Basic, not ASCII": ("post", "/oauth/token", form(
        CODE, headers={"Authorization": "Basic \u00e9t\u00e9"}), 401, "invalid_client"),
    "token: Basic, not UTF-8": ("post", "/oauth/token", form(
        CODE, headers=basic(b"\xff\xfe:\xff")), 401, "invalid_client"),
    "token: Basic, no colon": ("post", "/oauth/token", form(
        CODE, headers=basic(b"opc_x")), 401, "invalid_client"),
    "token: Basic, empty": ("post", "/oauth/token", form(
        CODE, headers={"Authorization": "Basic"}), 401, "invalid_client"),
    "token: Basic, unknown client": ("post", "/oauth/token", form(
        CODE, headers=basic(b"opc_nobody:opcs_secret")), 401, "invalid_client"),
    "token: GET": ("get", "/oauth/token", {}, 405, "invalid_request"),
    # -- the revocation endpoint
    "revoke: nothing": ("post", "/oauth/revoke", form(""), 401, "invalid_client"),
    "revoke: no token": ("post", "/oauth/revoke", form("client_id={client}"), 400,
                         "invalid_request"),
    "revoke: token twice": ("post", "/oauth/revoke", form(
        "token=a&token=b&client_id={client}"), 400, "invalid_request"),
    "revoke: unknown token_type_hint": ("post", "/oauth/revoke", form(
        "token=a&token_type_hint=zzz&client_id={client}"), 400, "unsupported_token_type"),
    "revoke: empty token": ("post", "/oauth/revoke", form("token=&client_id={client}"), 400,
                            "invalid_request"),  # RFC 6749: no value is as good as none
    "revoke: 5,000-character client_id": ("post", "/oauth/revoke", form(
        "token=a&client_id=" + LONG), 400, "invalid_request"),
    "revoke: bytes that are not UTF-8": ("post", "/oauth/revoke", form(b"token=%ff%fe"), 400,
                                         "invalid_request"),
    "revoke: a JSON object": ("post", "/oauth/revoke", {"json": {"token": "x"}}, 400,
                              "invalid_request"),
    "revoke: Basic, not ASCII": ("post", "/oauth/revoke", form(
        "token=x", headers={"Authorization": "Basic \u00e9"}), 401, "invalid_client"),
    "revoke: Basic, not UTF-8": ("post", "/oauth/revoke", form(
        "token=x", headers=basic(b"\xff:\xff")), 401, "invalid_client"),
    "revoke: GET": ("get", "/oauth/revoke", {}, 405, "invalid_request"),
    # -- registration
    "register: broken JSON": ("post", "/oauth/register", {
        "data": "{", "content_type": "application/json"}, 400, "invalid_client_metadata"),
    "register: null": ("post", "/oauth/register", {
        "data": "null", "content_type": "application/json"}, 400, "invalid_client_metadata"),
    "register: a string": ("post", "/oauth/register", {"json": "x"}, 400,
                           "invalid_client_metadata"),
    "register: a number": ("post", "/oauth/register", {"json": 3}, 400,
                           "invalid_client_metadata"),
    "register: an array": ("post", "/oauth/register", {"json": [REDIRECT_URI]}, 400,
                           "invalid_client_metadata"),
    "register: form-encoded": ("post", "/oauth/register", form(
        "redirect_uris=https://app.example/cb"), 400, "invalid_client_metadata"),
    "register: text/plain": ("post", "/oauth/register", {
        "data": '{"redirect_uris": ["https://app.example/cb"]}',
        "content_type": "text/plain"}, 400, "invalid_client_metadata"),
    "register: no redirect_uris": ("post", "/oauth/register", {"json": {
        "client_name": "x"}}, 400, "invalid_redirect_uri"),
    "register: redirect_uris a string": ("post", "/oauth/register", {"json": {
        "redirect_uris": "https://app.example/cb"}}, 400, "invalid_redirect_uri"),
    "register: redirect_uris an object": ("post", "/oauth/register", {"json": {
        "redirect_uris": {"a": 1}}}, 400, "invalid_redirect_uri"),
    "register: a number among redirect_uris": ("post", "/oauth/register", {"json": {
        "redirect_uris": [3]}}, 400, "invalid_redirect_uri"),
    "register: nested redirect_uris": ("post", "/oauth/register", {"json": {
        "redirect_uris": [["https://app.example/cb"]]}}, 400, "invalid_redirect_uri"),
    "register: eleven redirect_uris": ("post", "/oauth/register", {"json": {
        "redirect_uris": [f"https://app.example/{n}" for n in range(11)]}}, 400,
        "invalid_redirect_uri"),
    "register: a huge redirect_uri": ("post", "/oauth/register", {"json": {
        "redirect_uris": ["https://app.example/" + "p" * 5000]}}, 400,
        "invalid_redirect_uri"),
    "register: unreadable IPv6": ("post", "/oauth/register", {"json": {
        "redirect_uris": ["https://[::1/cb"]}}, 400, "invalid_redirect_uri"),
    "register: unicode host": ("post", "/oauth/register", {"json": {
        "redirect_uris": ["https://b\u00fccher.example/cb"]}}, 400, "invalid_redirect_uri"),
    "register: a quote in the URI": ("post", "/oauth/register", {"json": {
        "redirect_uris": ['https://app.example/"cb']}}, 400, "invalid_redirect_uri"),
    "register: client_name an object": ("post", "/oauth/register", {"json": {
        "redirect_uris": [REDIRECT_URI], "client_name": {"a": 1}}}, 400,
        "invalid_client_metadata"),
    "register: auth method a list": ("post", "/oauth/register", {"json": {
        "redirect_uris": [REDIRECT_URI], "token_endpoint_auth_method": ["none"]}}, 400,
        "invalid_client_metadata"),
    "register: grant_types a string": ("post", "/oauth/register", {"json": {
        "redirect_uris": [REDIRECT_URI], "grant_types": "authorization_code"}}, 400,
        "invalid_client_metadata"),
    "register: grant_types with null": ("post", "/oauth/register", {"json": {
        "redirect_uris": [REDIRECT_URI], "grant_types": [None]}}, 400,
        "invalid_client_metadata"),
    "register: an unsupported grant type": ("post", "/oauth/register", {"json": {
        "redirect_uris": [REDIRECT_URI], "grant_types": ["password"]}}, 400,
        "invalid_client_metadata"),
    "register: scope a list": ("post", "/oauth/register", {"json": {
        "redirect_uris": [REDIRECT_URI], "scope": ["memory:read"]}}, 400,
        "invalid_client_metadata"),
    "register: a NUL byte": ("post", "/oauth/register", {"json": {
        "redirect_uris": [REDIRECT_URI], "client_name": "a\u0000"}}, 400, "invalid_request"),
    "register: half a surrogate pair": ("post", "/oauth/register", {
        "data": '{"redirect_uris": ["\\ud800"]}', "content_type": "application/json"}, 400,
        "invalid_request"),
    "register: nested 5,000 deep": ("post", "/oauth/register", {
        "data": "[" * 5000 + "]" * 5000, "content_type": "application/json"}, 400,
        "invalid_request"),
    "register: GET": ("get", "/oauth/register", {}, 405, "invalid_request"),
}


@pytest.fixture
def public_client(client) -> str:
    return register(client)["client_id"]


def assert_oauth_error(answer, status: int, error: str | None) -> None:
    """Exactly ``status``; an error body of RFC 6749's shape (or, for a success, none)."""
    body = answer.get_json()
    assert (answer.status_code, body.get("error") if isinstance(body, dict) else body) == \
        (status, error), answer.get_data(as_text=True)[:300]
    assert answer.headers["Cache-Control"] == "no-store"
    if error is not None:
        assert answer.mimetype == "application/json"
        assert set(body) == {"error", "error_description"}
        assert isinstance(body["error_description"], str) and body["error_description"]
        assert all(" " <= c <= "~" and c not in '"\\' for c in body["error_description"])


@pytest.mark.parametrize(("method", "path", "sent", "status", "error"),
                         CLIENT_CASES.values(), ids=CLIENT_CASES.keys())
def test_a_malformed_request_to_a_client_endpoint_gets_its_oauth_error(
        app, client, public_client, monkeypatch, method, path, sent, status, error):
    monkeypatch.setitem(app.config, "PROPAGATE_TEST_ERRORS", False)  # a 500 shows as one
    sent = dict(sent)
    if isinstance(sent.get("data"), str):
        sent["data"] = sent["data"].replace("{client}", public_client)
    answer = getattr(client, method)(path, **sent)
    assert_oauth_error(answer, status, error)


AUTHORIZE_CASES = {
    "no client_id": {"client_id": None},
    "empty client_id": {"client_id": ""},
    "client_id twice": {"client_id": ["{client}", "{client}"]},
    "5,000-character client_id": {"client_id": LONG},
    "unknown client": {"client_id": "opc_nobody"},
    "a private metadata URL": {"client_id": "https://10.0.0.1/oauth/client.json"},
    "no response_type": {"response_type": None},
    "response_type token": {"response_type": "token"},
    "response_type with a quote": {"response_type": 'co"de'},
    "response_type twice": {"response_type": ["code", "code"]},
    "redirect_uri with a unicode host": {"redirect_uri": "https://b\u00fccher.example/cb"},
    "redirect_uri with a quote": {"redirect_uri": 'https://app.example/"cb'},
    "redirect_uri with a backslash": {"redirect_uri": "https://app.example\\@evil/cb"},
    "unreadable redirect_uri": {"redirect_uri": "https://[::1/cb"},
    "redirect_uri port out of range": {"redirect_uri": "http://127.0.0.1:99999/callback"},
    "unknown scope": {"scope": "memory:everything"},
    "scope twice": {"scope": ["memory:read", "memory:write"]},
    "huge code_challenge": {"code_challenge": "x" * 5000},
    "short code_challenge": {"code_challenge": "x"},
    "code_challenge twice": {"code_challenge": ["a" * 43, "b" * 43]},
    "huge state": {"state": "s" * 5000},
    "state with a newline": {"state": "a\nb"},
    "resource twice": {"resource": ["http://localhost/mcp", "http://localhost/mcp"]},
    "another resource": {"resource": "https://elsewhere.example/mcp"},
}


@pytest.mark.parametrize("change", AUTHORIZE_CASES.values(), ids=AUTHORIZE_CASES.keys())
def test_a_malformed_authorization_request_is_answered_on_this_servers_page(
        app, client, signed_in, public_client, monkeypatch, change):
    monkeypatch.setitem(app.config, "PROPAGATE_TEST_ERRORS", False)
    change = {key: [v.replace("{client}", public_client) for v in value]
              if isinstance(value, list) else value for key, value in change.items()}
    client_id = change.pop("client_id", public_client)
    _, challenge = pkce()
    answer = client.get(authorize_url(client_id, challenge, **{
        "code_challenge": challenge, **change}))
    assert answer.status_code == 400
    assert "Location" not in answer.headers and answer.mimetype == "text/html"
    assert "This connection can't be made" in answer.get_data(as_text=True)


def test_bytes_that_are_not_utf8_in_an_authorization_request_are_a_400_page(
        client, signed_in):
    answer = client.get("/oauth/authorize?client_id=%ff%fe&response_type=code")
    assert answer.status_code == 400 and answer.mimetype == "text/html"


# -- the edge's own answers at the client endpoints -----------------------------------------

@pytest.mark.parametrize("path", ["/oauth/token", "/oauth/revoke"])
def test_the_rate_limiters_429_is_an_oauth_error(app, client, monkeypatch, path):
    monkeypatch.setitem(app.config, "OAUTH_RATE_LIMIT", "1 per minute")
    client.post(path, data="token=x&grant_type=x", content_type=FORM)
    answer = client.post(path, data="token=x&grant_type=x", content_type=FORM)
    assert_oauth_error(answer, 429, "temporarily_unavailable")
    assert int(answer.headers["Retry-After"]) > 0


def test_the_registration_limits_429_is_an_oauth_error(app, client, monkeypatch):
    monkeypatch.setitem(app.config, "OAUTH_REGISTER_LIMIT", "1 per hour")
    register(client)
    answer = client.post("/oauth/register", json={"redirect_uris": [REDIRECT_URI]})
    assert_oauth_error(answer, 429, "temporarily_unavailable")
    assert int(answer.headers["Retry-After"]) > 0


def test_a_body_over_the_size_limit_is_an_oauth_error(app, client, monkeypatch):
    monkeypatch.setitem(app.config, "MAX_CONTENT_LENGTH", 1024)
    answer = client.post("/oauth/token", data="code=" + "c" * 2048, content_type=FORM)
    assert_oauth_error(answer, 413, "invalid_request")


def test_a_host_header_that_is_no_host_name_is_an_oauth_error(client):
    answer = client.post("/oauth/token", data="grant_type=x", content_type=FORM,
                         headers={"Host": "a" * 64 + ".example"})
    assert_oauth_error(answer, 400, "invalid_request")


def test_something_broken_on_our_side_is_an_oauth_server_error(app, client, monkeypatch):
    def broken() -> None:
        raise RuntimeError("a bug")

    monkeypatch.setitem(app.config, "PROPAGATE_TEST_ERRORS", False)
    monkeypatch.setattr(oauth, "check_client_request", broken)
    answer = client.post("/oauth/token", data="grant_type=x", content_type=FORM)
    assert_oauth_error(answer, 500, "server_error")
    assert "bug" not in answer.get_data(as_text=True)


@pytest.mark.parametrize(("path", "mimetype"), [
    ("/oauth/register", "application/json"), ("/oauth/token", "application/json"),
    ("/v1/memories", "application/problem+json"), ("/settings/keys/", "text/html")])
def test_a_csrf_refusal_speaks_each_paths_language(app, path, mimetype):
    # The client endpoints are exempt from CSRF (no cookies there); should one ever be
    # refused for it, the client still gets an OAuth error.
    with app.test_request_context(path, method="POST"):
        answer = app.make_response(app.handle_user_exception(CSRFError("expired")))
    assert (answer.status_code, answer.mimetype) == (400, mimetype)
    if mimetype == "application/json":
        assert answer.get_json()["error"] == "invalid_request"
