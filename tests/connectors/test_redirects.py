"""Redirect URIs: only canonical ones are registered (no userinfo, no backslash, hosts in
one spelling, ports in range), an error goes back to the app only when its redirect URI
is verified (a metadata-document client's, on the client_id's own origin) and is shown
here otherwise, and the consent page names where the app sends the person by the
parsed host, never by the raw authority."""

from __future__ import annotations

import html
import re
from urllib.parse import parse_qs, urlsplit

import pytest

from dashboard.connectors import services, uris
from dashboard.connectors.models import OAuthClient
from tests.connectors.oauth_flow import REDIRECT_URI, authorize_url, pkce, register

RETURN_LINK = re.compile(r'<a id="return-link" href="([^"]+)"')
RETURN_HOST = re.compile(r'<strong id="return-host"[^>]*>([^<]+)</strong>')
REDIRECT_HOST = re.compile(r'<strong id="redirect-host"[^>]*>([^<]+)</strong>')

REFUSED = {
    "userinfo": "https://chatgpt.com@evil.example/cb",
    "user and password": "https://user:secret@app.example/cb",
    "backslash before @": "https://evil.example\\@chatgpt.com/cb",
    "backslash as a slash": "https://app.example\\cb",
    "upper-case host": "https://App.example/cb",
    "upper-case scheme": "HTTPS://app.example/cb",
    "trailing dot": "https://app.example./cb",
    "empty label": "https://app..example/cb",
    "leading dot": "https://.app.example/cb",
    "percent-encoded host": "https://app%2eexample/cb",
    "non-ASCII host": "https://b\u00fccher.example/cb",
    "non-ASCII path": "https://app.example/r\u00fcckruf",
    "decimal IPv4": "https://2130706433/cb",
    "hexadecimal IPv4": "https://0x7f.0.0.1/cb",
    "short IPv4": "https://127.1/cb",
    "octal IPv4": "https://0177.0.0.1/cb",
    "long-form IPv6": "http://[0:0:0:0:0:0:0:1]/cb",
    "IPv6 zone": "http://[fe80::1%25eth0]/cb",
    "unreadable IPv6": "https://[::1/cb",
    "port too large": "https://app.example:99999/cb",
    "port zero": "https://app.example:0/cb",
    "empty port": "https://app.example:/cb",
    "port with a leading zero": "https://app.example:08443/cb",
    "port not a number": "https://app.example:https/cb",
    "no authority": "https:app.example/cb",
    "tab inside": "https://app.example/c\tb",
    "a quote": 'https://app.example/"cb',
    "angle brackets": "https://app.example/<cb>",
    "plain http elsewhere": "http://evil.example/cb",
    "javascript": "javascript:alert(1)",
    "fragment": "https://app.example/cb#x",
}
ACCEPTED = ["https://app.example/cb", "https://xn--bcher-kva.example/cb",
            "https://app.example:8443/cb?from=orbitpilot", "https://192.0.2.7/cb",
            "http://127.0.0.1:33418/callback", "http://[::1]:8080/cb", "http://localhost/cb",
            "vscode://vscode.github-authentication/did-authenticate",
            "com.example.app:/oauth2redirect"]


@pytest.mark.parametrize("uri", REFUSED.values(), ids=REFUSED.keys())
def test_a_redirect_uri_not_in_canonical_form_is_refused_at_registration(client, uri):
    answer = client.post("/oauth/register", json={"client_name": "x", "redirect_uris": [uri],
                                                  "token_endpoint_auth_method": "none"})
    assert answer.status_code == 400
    assert answer.get_json()["error"] == "invalid_redirect_uri"


@pytest.mark.parametrize("uri", ACCEPTED)
def test_a_canonical_redirect_uri_is_registered_as_given(client, uri):
    answer = client.post("/oauth/register", json={"client_name": "x", "redirect_uris": [uri],
                                                  "token_endpoint_auth_method": "none"})
    assert answer.status_code == 201, answer.get_json()
    assert answer.get_json()["redirect_uris"] == [uri]


def test_a_metadata_document_naming_a_redirect_uri_with_userinfo_is_refused(
        client, signed_in, document):
    document.body["redirect_uris"] = ["https://chatgpt.com@evil.example/cb"]
    _, challenge = pkce()
    answer = client.get(authorize_url(document.url, challenge,
                                      redirect_uri="https://chatgpt.com@evil.example/cb"))
    assert answer.status_code == 400 and "Location" not in answer.headers
    assert "Redirect URIs: A URI names no user" in answer.get_data(as_text=True)


# -- where an error goes --------------------------------------------------------------------

def test_only_a_document_clients_redirect_uri_on_its_own_origin_is_verified():
    document = OAuthClient(client_id="https://app.example/oauth/client.json", kind="document")
    registered = OAuthClient(client_id="opc_x", kind="registered")
    assert services.redirect_verified(document, "https://app.example/cb")
    assert services.redirect_verified(document, "https://app.example:443/cb")
    assert not services.redirect_verified(document, "https://app.example:8443/cb")
    assert not services.redirect_verified(document, "http://app.example/cb")
    assert not services.redirect_verified(document, "https://evil.example/cb")
    assert not services.redirect_verified(document, "http://127.0.0.1:33418/callback")
    assert not services.redirect_verified(document, "vscode://app.example/cb")
    assert not services.redirect_verified(registered, "https://app.example/cb")


def test_a_bad_request_from_a_self_registered_app_stays_here_with_a_link_back(
        client, signed_in):
    client_id = register(client, redirect_uris=["https://evil.example/cb"])["client_id"]
    _, challenge = pkce()
    answer = client.get(authorize_url(client_id, challenge, code_challenge_method="plain",
                                      redirect_uri="https://evil.example/cb", state="s9"))
    assert answer.status_code == 400 and "Location" not in answer.headers
    page = answer.get_data(as_text=True)
    assert RETURN_HOST.search(page).group(1) == "evil.example"  # the host, in words
    link = html.unescape(RETURN_LINK.search(page).group(1))
    assert link.startswith("https://evil.example/cb?")
    assert {k: v[0] for k, v in parse_qs(urlsplit(link).query).items()} == {
        "error": "invalid_request", "state": "s9",
        "error_description": "Only code_challenge_method S256 is supported."}


def test_a_bad_request_from_a_document_client_on_its_own_origin_goes_back_to_it(
        client, signed_in, document):
    back = f"https://127.0.0.1:{document.port}/callback"
    document.body["redirect_uris"] = [back]
    _, challenge = pkce()
    answer = client.get(authorize_url(document.url, challenge, redirect_uri=back,
                                      code_challenge_method="plain"))
    assert answer.status_code == 302
    location = answer.headers["Location"]
    assert location.startswith(back + "?")
    assert parse_qs(urlsplit(location).query)["error"] == ["invalid_request"]


def test_a_bad_request_from_a_document_client_sending_elsewhere_stays_here(
        client, signed_in, document):
    # Its redirect URI (this machine's loopback listener) is not on the client_id's origin.
    _, challenge = pkce()
    answer = client.get(authorize_url(document.url, challenge, code_challenge_method="plain"))
    assert answer.status_code == 400 and "Location" not in answer.headers
    page = answer.get_data(as_text=True)
    assert RETURN_HOST.search(page).group(1) == "127.0.0.1:33418"
    assert html.unescape(RETURN_LINK.search(page).group(1)).startswith(REDIRECT_URI + "?")


def test_an_unsupported_response_type_from_a_self_registered_app_stays_here(
        client, signed_in):
    client_id = register(client)["client_id"]
    _, challenge = pkce()
    answer = client.get(authorize_url(client_id, challenge, response_type="token"))
    assert answer.status_code == 400 and "Location" not in answer.headers
    assert "Only response_type code is supported." in answer.get_data(as_text=True)


def test_a_redirect_uri_the_app_never_registered_gets_no_link(client, signed_in):
    client_id = register(client)["client_id"]
    _, challenge = pkce()
    answer = client.get(authorize_url(client_id, challenge,
                                      redirect_uri="https://evil.example/cb"))
    assert answer.status_code == 400 and "Location" not in answer.headers
    assert 'id="return-link"' not in answer.get_data(as_text=True)


# -- naming the host ------------------------------------------------------------------------

@pytest.mark.parametrize(("uri", "words"), [
    ("https://chatgpt.com@evil.example/cb", "evil.example"),
    ("https://App.Example:443/cb", "app.example"),
    ("http://127.0.0.1:33418/callback", "127.0.0.1:33418"),
    ("http://[::1]:8080/cb", "[::1]:8080"),
    ("vscode://vscode.github-authentication/did-authenticate",
     "vscode://vscode.github-authentication"),
    ("com.example.app:/oauth2redirect", "com.example.app:"),
])
def test_where_a_uri_leads_is_named_by_its_parsed_host(uri, words):
    assert uris.host_words(uri) == words


def test_the_consent_page_names_the_parsed_host_of_a_stored_uri_never_its_authority(
        client, signed_in, db_session):
    # A row from before the canonical-form rule: userinfo that reads like another host.
    tricky = "https://chatgpt.com@evil.example/cb"
    row = OAuthClient(client_id="opc_legacy", kind="registered", name="Legacy",
                      redirect_uris=[tricky], grant_types=["authorization_code"],
                      response_types=["code"], token_endpoint_auth_method="none",
                      attribution="connector")
    db_session.add(row)
    db_session.flush()
    _, challenge = pkce()
    answer = client.get(authorize_url("opc_legacy", challenge, redirect_uri=tricky))
    assert answer.status_code == 200
    assert REDIRECT_HOST.search(answer.get_data(as_text=True)).group(1) == "evil.example"
    assert "form-action 'self' https://evil.example;" in \
        answer.headers["Content-Security-Policy"]
