"""An OAuth client's side of the flow against the test client: register, authorise
with PKCE as a signed-in person, exchange, refresh, revoke."""

from __future__ import annotations

import base64
import hashlib
import re
import secrets
from dataclasses import dataclass
from urllib.parse import parse_qs, urlencode, urlsplit

REDIRECT_URI = "http://127.0.0.1:33418/callback"
RESOURCE = "http://localhost/mcp"  # the test app's SERVER_NAME is localhost
CSRF = re.compile(r'name="csrf_token"[^>]*value="([^"]+)"')
ACTION = re.compile(r'<form id="consent" method="post" action="([^"]+)"')
BOX = re.compile(r'<input[^>]*type="checkbox" name="granted" value="([^"]+)"([^>]*)>')


def boxes(html: str) -> dict[str, bool]:
    """The consent page's boxes: each scope offered, and whether it is ticked."""
    return {scope: " checked" in rest for scope, rest in BOX.findall(html)}


def ticked(html: str, tick: tuple[str, ...] = (), untick: tuple[str, ...] = ()) -> list[str]:
    """What a person sends who leaves the boxes as they are, but for ``tick``/``untick``."""
    return [scope for scope, on in boxes(html).items()
            if (on or scope in tick) and scope not in untick]


def pkce() -> tuple[str, str]:
    verifier = secrets.token_urlsafe(48)
    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()) \
        .rstrip(b"=").decode()
    return verifier, challenge


def register(client, **metadata) -> dict:
    body = {"client_name": "Test connector", "redirect_uris": [REDIRECT_URI],
            "grant_types": ["authorization_code", "refresh_token"],
            "token_endpoint_auth_method": "none", **metadata}
    answer = client.post("/oauth/register", json=body)
    assert answer.status_code == 201, answer.get_json()
    return answer.get_json()


@dataclass
class Authorised:
    code: str
    verifier: str
    state: str


def authorize_url(client_id: str, challenge: str, *, scope: str = "memory:read memory:write",
                  redirect_uri: str = REDIRECT_URI, state: str = "s1", **more) -> str:
    params = {"response_type": "code", "client_id": client_id, "redirect_uri": redirect_uri,
              "scope": scope, "state": state, "code_challenge": challenge,
              "code_challenge_method": "S256", "resource": RESOURCE, **more}
    return "/oauth/authorize?" + urlencode({k: v for k, v in params.items() if v is not None})


def answer_consent(client, url: str, decision: str = "allow", *,
                   tick: tuple[str, ...] = (), untick: tuple[str, ...] = ()):
    """Open the consent page and answer it as a person would: the boxes as they come,
    but for ``tick`` and ``untick``."""
    page = client.get(url)
    assert page.status_code == 200, page.get_data(as_text=True)[:400]
    html = page.get_data(as_text=True)
    action = ACTION.search(html).group(1).replace("&amp;", "&")
    return client.post(action, data={"csrf_token": CSRF.search(html).group(1),
                                     "decision": decision,
                                     "granted": ticked(html, tick, untick)})


def callback(answer) -> dict[str, str]:
    assert answer.status_code == 302, answer.status_code
    location = answer.headers["Location"]
    assert location.startswith(REDIRECT_URI), location
    return {k: v[0] for k, v in parse_qs(urlsplit(location).query).items()}


def authorise(client, client_id: str, *, tick: tuple[str, ...] = (), **kwargs) -> Authorised:
    verifier, challenge = pkce()
    params = callback(answer_consent(client, authorize_url(client_id, challenge, **kwargs),
                                     tick=tick))
    return Authorised(params["code"], verifier, params["state"])


def exchange(client, client_id: str, code: str, verifier: str, **more):
    return client.post("/oauth/token", data={
        "grant_type": "authorization_code", "code": code, "code_verifier": verifier,
        "redirect_uri": REDIRECT_URI, "client_id": client_id, "resource": RESOURCE, **more})


def refresh(client, client_id: str, refresh_token: str, **more):
    return client.post("/oauth/token", data={
        "grant_type": "refresh_token", "refresh_token": refresh_token, "client_id": client_id,
        **more})


def tokens(client, client_id: str, **kwargs) -> dict:
    granted = authorise(client, client_id, **kwargs)
    answer = exchange(client, client_id, granted.code, granted.verifier)
    assert answer.status_code == 200, answer.get_json()
    return answer.get_json()
