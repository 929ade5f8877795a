"""Client ID metadata documents: a client whose ``client_id`` is an https URL publishes
its metadata there, and the authorization server fetches it. Fetched with a short
timeout, a size cap and no redirects, and — unless configured otherwise — never from
an address on this machine or its private network (the server must not be a way in)."""

from __future__ import annotations

import ipaddress
import json
import socket
import ssl
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from dashboard.refusals import Refusal

MAX_BYTES = 64 * 1024


class DocumentRefused(Refusal):
    """The document could not be fetched, or is not a client's metadata."""


def is_document_client_id(client_id: object) -> bool:
    """A client_id that is a metadata document's URL: https, a host, a path."""
    if not isinstance(client_id, str) or len(client_id) > 2048:
        return False
    parts = urlsplit(client_id)
    return parts.scheme == "https" and bool(parts.hostname) and parts.path not in ("", "/") \
        and not parts.fragment and not parts.username and not parts.password


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


@dataclass(frozen=True)
class Fetcher:
    """How documents are fetched: ``ca_file`` to trust another CA (a test's own), and
    whether private and loopback addresses may be reached (a test's local server)."""

    ca_file: str | None = None
    allow_private: bool = False
    timeout: float = 5.0

    def _check_host(self, host: str, port: int) -> None:
        if self.allow_private:
            return
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError:
            raise DocumentRefused("The client's metadata host cannot be resolved.") from None
        for info in infos:
            address = ipaddress.ip_address(info[4][0])
            if not address.is_global:
                raise DocumentRefused("The client's metadata URL is on a private network.")

    def fetch(self, url: str) -> dict[str, Any]:
        parts = urlsplit(url)
        self._check_host(parts.hostname or "", parts.port or 443)
        context = ssl.create_default_context(cafile=self.ca_file)
        opener = urllib.request.build_opener(urllib.request.HTTPSHandler(context=context),
                                             _NoRedirects())
        request = urllib.request.Request(url, headers={"Accept": "application/json"})
        try:
            with opener.open(request, timeout=self.timeout) as response:
                body = response.read(MAX_BYTES + 1)
        except (urllib.error.URLError, OSError, ValueError):
            raise DocumentRefused("The client's metadata document could not be fetched.") \
                from None
        if len(body) > MAX_BYTES:
            raise DocumentRefused("The client's metadata document is too large.")
        try:
            document = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            raise DocumentRefused("The client's metadata document is not JSON.") from None
        if not isinstance(document, dict):
            raise DocumentRefused("The client's metadata document is not a JSON object.")
        return document
