"""URIs other parties give us (redirect URIs, metadata documents' URLs), held to one
canonical spelling: the string compared is the string a browser or a socket goes to.
No userinfo (``https://chatgpt.com@evil.example/`` goes to evil.example), no backslash
(browsers read it as a slash), hosts in lower-case ASCII (IDNA as punycode) with no empty
label or trailing dot, an IP address only as a plain dotted quad or a bracketed IPv6
address in its short form, a port from 1 to 65535 as plain digits."""

from __future__ import annotations

import ipaddress
import re
from urllib.parse import SplitResult, urlsplit

_LABEL = re.compile(r"[a-z0-9](?:[a-z0-9_-]{0,61}[a-z0-9])?")
# What a URL parser (WHATWG) takes for an IPv4 address in another spelling: a last label
# of digits, or hexadecimal (2130706433, 0x7f.1, 127.1, 0177.0.0.1).
_NUMERIC = re.compile(r"(?:[0-9]+|0x[0-9a-f]*)")
_PORT = re.compile(r"[1-9][0-9]{0,4}")
# Printable, but no character of a URI (RFC 3986): they must come percent-encoded.
_NOT_IN_URIS = frozenset('"<>^`{|}')


class BadURI(ValueError):
    """The URI is not in canonical form; ``sentence`` says how."""

    def __init__(self, sentence: str) -> None:
        super().__init__(sentence)
        self.sentence = sentence


def canonical_host(host: str) -> bool:
    """A host name or address as written in a canonical URI (without the port)."""
    if host.startswith("["):
        inner = host[1:-1] if host.endswith("]") else ""
        try:
            return str(ipaddress.IPv6Address(inner)) == inner
        except ValueError:
            return False
    if not host or len(host) > 253:
        return False
    labels = host.split(".")
    if not all(_LABEL.fullmatch(label) for label in labels):
        return False  # empty label, trailing dot, upper case, %, non-ASCII, ...
    if _NUMERIC.fullmatch(labels[-1]):
        try:
            return str(ipaddress.IPv4Address(host)) == host
        except ValueError:
            return False
    return True


def split_canonical(uri: str) -> SplitResult:
    """``uri`` split, once it is known to be in canonical form; else ``BadURI``."""
    if not uri.isascii() or any(c <= " " or c == "\x7f" for c in uri):
        raise BadURI("A URI is printable ASCII without spaces (percent-encode the rest; "
                     "an international host name as punycode, xn--).")
    if "\\" in uri:
        raise BadURI("A URI has no backslash.")
    if any(c in _NOT_IN_URIS for c in uri):
        raise BadURI("A URI percent-encodes quotes, angle brackets, braces, | ^ and `.")
    try:
        parts = urlsplit(uri)
    except ValueError:
        raise BadURI("The URI cannot be read.") from None
    if not parts.scheme or not uri.startswith(parts.scheme + ":"):
        raise BadURI("A URI starts with its scheme, in lower case.")
    if not uri[len(parts.scheme) + 1:].startswith("//"):
        return parts  # no authority: nothing more to check (com.example.app:/callback)
    netloc = parts.netloc
    if "@" in netloc:
        raise BadURI("A URI names no user (nothing@ before the host).")
    host, port = netloc, ""
    if netloc.startswith("["):
        end = netloc.find("]")
        host, rest = netloc[:end + 1], netloc[end + 1:]
        if rest:
            if not rest.startswith(":"):
                raise BadURI("The URI's host cannot be read.")
            port = rest[1:] or ":"
    elif ":" in netloc:
        host, _, port = netloc.partition(":")
        port = port or ":"
    if not canonical_host(host):
        raise BadURI("The URI's host is not in canonical form: lower case, no trailing dot "
                     "or empty part, no percent-encoding, an international name as punycode "
                     "(xn--), an IP address as a plain dotted quad or [IPv6].")
    if port and (not _PORT.fullmatch(port) or int(port) > 65535):
        raise BadURI("The URI's port is a number from 1 to 65535.")
    return parts


def origin(uri: str) -> tuple[str, str, int] | None:
    """The (scheme, host, port) a web URI goes to; ``None`` for any other."""
    try:
        parts = urlsplit(uri)
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return None
    return parts.scheme, parts.hostname, port or (443 if parts.scheme == "https" else 80)


def host_words(uri: str) -> str:
    """Where a URI leads, as a person should read it: the parsed host (and a port that is
    not the default) of a web URI, never the raw authority that may hide another host; an
    app's own scheme otherwise (``vscode://…``)."""
    try:
        parts = urlsplit(uri)
        host, port = parts.hostname, parts.port
    except ValueError:
        return "an address that cannot be read"
    if parts.scheme in ("http", "https") and host:
        shown = f"[{host}]" if ":" in host else host
        default = 443 if parts.scheme == "https" else 80
        return f"{shown}:{port}" if port and port != default else shown
    if host:
        return f"{parts.scheme}://{host}"
    return f"{parts.scheme}:" if parts.scheme else "an address that cannot be read"
