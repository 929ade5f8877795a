"""What only the running app can show, measured by asking it: internal requests (headers,
the session cookie, CSRF, the body limit), its URL map, its rate limiter read back, and its
OAuth server's registered grants called with probe requests. The report's checks judge
these answers (``checks.AppProbes``). The limiter's limits and the server's registered
grants are read through Flask-Limiter's and Authlib's own (underscored) registries, the
only place they are kept; tests/evidence pins what they read."""

from __future__ import annotations

import base64
import hashlib
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from urllib.parse import urlsplit

from authlib.oauth2 import OAuth2Error
from flask import Flask

from dashboard.connectors.models import OAuthClient
from dashboard.connectors.services import Lifetimes
from dashboard.evidence.checks import AppProbes
from dashboard.evidence.report import Inputs
from dashboard.evidence.signing import SigningKey
from dashboard.security import get_limiter

PROJECT_ROOT = Path(__file__).resolve().parents[2]
PROBE_PAGE = "/auth/signin"
PROBE_FORM = "/auth/signout"
# The API and MCP take other methods, authenticated by a key or token, never a cookie.
API_PREFIXES = ("/v1/", "/mcp")
PROBE_REDIRECT = "https://client.example/cb"
NEAR_MISSES = ("https://client.example/cb/", "https://client.example/cb?next=/x",
               "https://client.example/cb/../evil", "https://CLIENT.example/cb",
               "http://client.example/cb", "https://client.example/cbx",
               "https://client.example.evil.test/cb")
# RFC 7636 appendix B's verifier, hashed: a well-formed S256 challenge.
_VERIFIER = "dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk"


def _host(app: Flask) -> str:
    """A host the app answers for: its public URL's, a trusted one, or its own name."""
    public = urlsplit(app.config.get("PUBLIC_URL") or "").netloc
    trusted = app.config.get("TRUSTED_HOSTS") or []
    return public or (trusted[0].lstrip(".") if trusted else None) \
        or app.config.get("SERVER_NAME") or "localhost"


def _cookie_flags(set_cookies: list[str], name: str) -> dict[str, Any] | None:
    for header in set_cookies:
        parts = [part.strip() for part in header.split(";")]
        if not parts[0].startswith(f"{name}="):
            continue
        attrs = {}
        for part in parts[1:]:
            key, _, value = part.partition("=")
            attrs[key.lower()] = value or True
        return {"name": name, "httponly": "httponly" in attrs, "secure": "secure" in attrs,
                "samesite": attrs.get("samesite") if isinstance(attrs.get("samesite"), str)
                else None}
    return None


def _limits(app: Flask) -> dict[str, str]:
    """Each limit the limiter holds, by scope, as the limiter resolves it now."""
    manager = get_limiter(app).limit_manager
    found: dict[str, str] = {}
    groups = [*manager._decorated_limits.values(), *manager._blueprint_limits.values()]
    for group in groups:
        for limit in group:
            provider = limit.limit_provider
            value = provider() if callable(provider) else provider
            scope = limit.scope if isinstance(limit.scope, str) else "unnamed"
            found[scope] = str(value)
    return found


def _challenge_taken(extensions: list[Any], data: dict[str, str]) -> bool:
    payload = SimpleNamespace(data=data, datalist={k: [v] for k, v in data.items()})
    grant = SimpleNamespace(request=SimpleNamespace(payload=payload, data=data))
    try:
        for extension in extensions:
            extension.validate_code_challenge(grant, PROBE_REDIRECT)
    except OAuth2Error:
        return False
    return True


def _pkce(app: Flask) -> dict[str, bool]:
    server = app.extensions["orbitpilot.oauth"]
    extensions = [ext for _, exts in server._authorization_grants for ext in (exts or ())
                  if hasattr(ext, "validate_code_challenge")]
    if not extensions:
        return {"plain_refused": False, "missing_refused": False, "s256_accepted": True}
    s256 = base64.urlsafe_b64encode(hashlib.sha256(_VERIFIER.encode()).digest()) \
        .rstrip(b"=").decode()
    return {
        "plain_refused": not _challenge_taken(extensions, {
            "code_challenge": _VERIFIER, "code_challenge_method": "plain"}),
        "missing_refused": not _challenge_taken(extensions, {}),
        "s256_accepted": _challenge_taken(extensions, {
            "code_challenge": s256, "code_challenge_method": "S256"}),
    }


def _refresh_rotates(app: Flask) -> bool:
    server = app.extensions["orbitpilot.oauth"]
    return any(getattr(grant, "GRANT_TYPE", "") == "refresh_token"
               and getattr(grant, "INCLUDE_NEW_REFRESH_TOKEN", False)
               for grant, _ in server._token_grants)


def _redirects() -> dict[str, bool]:
    client = OAuthClient(redirect_uris=[PROBE_REDIRECT])  # never added to a session
    taken = {f"{PROBE_REDIRECT}#exact": client.check_redirect_uri(PROBE_REDIRECT)}
    taken.update({uri: client.check_redirect_uri(uri) for uri in NEAR_MISSES})
    return taken


def _mutating_rules(app: Flask) -> list[str]:
    found = []
    for rule in app.url_map.iter_rules():
        extra = (rule.methods or set()) & {"PUT", "PATCH", "DELETE"}
        if extra and not rule.rule.startswith(API_PREFIXES):
            found.append(f"{' '.join(sorted(extra))} {rule.rule}")
    return sorted(found)


def probe_app(app: Flask) -> AppProbes:
    """Ask the app. Every request is internal (the test client) and changes nothing: a
    GET, a POST the CSRF check refuses, a POST refused for its declared size."""
    host = _host(app)
    client = app.test_client()
    http = client.get(PROBE_PAGE, base_url=f"http://{host}")
    https = client.get(PROBE_PAGE, base_url=f"https://{host}")
    csrf = client.post(PROBE_FORM, base_url=f"https://{host}", data={})
    limit = app.config.get("MAX_CONTENT_LENGTH")
    oversize = client.post(PROBE_FORM, base_url=f"https://{host}", data=b"",
                           content_type="application/x-www-form-urlencoded",
                           environ_overrides={"CONTENT_LENGTH": str((limit or 0) + 1)})
    public = app.config.get("PUBLIC_URL") or ""
    lifetimes = Lifetimes.from_settings(app.config)
    return AppProbes(
        headers=dict(http.headers), tls_headers=dict(https.headers),
        cookie=_cookie_flags(https.headers.getlist("Set-Cookie")
                             or http.headers.getlist("Set-Cookie"),
                             app.config.get("SESSION_COOKIE_NAME", "session")),
        csrf_status=csrf.status_code, oversize_status=oversize.status_code,
        max_content_length=limit, limits=_limits(app), pkce=_pkce(app),
        redirects=_redirects(), refresh_rotates=_refresh_rotates(app),
        lifetimes={"access": int(lifetimes.access.total_seconds()),
                   "code": int(lifetimes.code.total_seconds()),
                   "refresh": int(lifetimes.refresh.total_seconds())},
        mutating_rules=_mutating_rules(app),
        served_over_tls=public.startswith("https://")
        or bool(app.config.get("SESSION_COOKIE_SECURE")))


def signing_key(app: Flask) -> SigningKey:
    return SigningKey.from_setting(str(app.config["EVIDENCE_SIGNING_KEY"]))


def _commit() -> str | None:
    """The checked-out commit, when the app runs from a git work tree (5 s at most)."""
    try:
        done = subprocess.run(["git", "rev-parse", "HEAD"], cwd=PROJECT_ROOT, timeout=5,
                              capture_output=True, text=True, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    commit = done.stdout.strip()
    return commit if done.returncode == 0 and len(commit) == 40 else None


def inputs_for(app: Flask) -> Inputs:
    """Everything a report is measured with besides the database, asked of ``app`` now."""
    binding = app.extensions.get("orbitpilot.embedded")
    return Inputs(config=app.config, probes=probe_app(app), key=signing_key(app),
                  embedded=bool(binding is not None and binding.postgres), commit=_commit())
