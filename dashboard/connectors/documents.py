"""Client ID metadata documents: a client whose ``client_id`` is an https URL publishes
its metadata there, and the authorization server fetches it. A fetch has one deadline
for all of it (resolving, connecting, TLS, every read), a size cap and no redirects; it
resolves the host once, refuses an address that is not global (unless configured), and
connects to exactly the address it checked (a second lookup could answer another: DNS
rebinding). Fetches run on a small pool of their own threads (``FetchPool``), never
queued: a request that finds the pool busy is told so at once."""

from __future__ import annotations

import http.client
import io
import ipaddress
import json
import socket
import ssl
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any

from dashboard.connectors.uris import BadURI, split_canonical
from dashboard.refusals import Refusal

MAX_BYTES = 64 * 1024
MAX_HEAD = 16 * 1024  # the status line and headers, besides the body
MAX_URL = 2048

Resolver = Callable[[str, int], list[str]]


class DocumentRefused(Refusal):
    """The document could not be fetched, or is not a client's metadata."""


class FetchesBusy(Refusal):
    """Every fetch this process allows is under way."""

    kind = "busy"


def is_document_client_id(client_id: object) -> bool:
    """A client_id that is a metadata document's URL: https, a canonical host, a path."""
    if not isinstance(client_id, str) or len(client_id) > MAX_URL:
        return False
    try:
        parts = split_canonical(client_id)
    except BadURI:
        return False
    return parts.scheme == "https" and bool(parts.hostname) \
        and parts.path not in ("", "/") and not parts.fragment


def system_resolver(host: str, port: int) -> list[str]:
    """The addresses the system's resolver gives for ``host``, in its order."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def _resolved_by(resolve: Resolver, host: str, port: int, deadline: float) -> list[str]:
    """``resolve(host, port)`` within the fetch's deadline. The system's resolver takes no
    timeout: it runs on a thread of its own, left to finish alone when the deadline
    passes, so a name server that never answers holds no fetch slot past the deadline
    (at most a pool's worth of such threads per deadline, each until the resolver gives
    up)."""
    answer: dict[str, Any] = {}
    done = threading.Event()

    def run() -> None:
        try:
            answer["found"] = resolve(host, port)
        except (OSError, ValueError):  # no such name, or none IDNA can spell
            pass
        finally:
            done.set()

    threading.Thread(target=run, name="client-metadata-dns", daemon=True).start()
    if not done.wait(max(0.0, deadline - time.monotonic())):
        raise DocumentRefused("The client's metadata host did not resolve in time.")
    if "found" not in answer:
        raise DocumentRefused("The client's metadata host cannot be resolved.")
    return answer["found"]


class _Received:
    """Bytes already read, as ``http.client`` reads a socket."""

    def __init__(self, data: bytes) -> None:
        self._data = data

    def makefile(self, *args: Any, **kwargs: Any) -> io.BytesIO:
        return io.BytesIO(self._data)


@dataclass(frozen=True)
class Fetcher:
    """How documents are fetched: ``ca_file`` to trust another CA (a test's own), whether
    private and loopback addresses may be reached (a test's local server), the deadline
    of a whole fetch, and the resolver (the system's; a test's own)."""

    ca_file: str | None = None
    allow_private: bool = False
    timeout: float = 5.0
    resolve: Resolver = field(default=system_resolver, compare=False)

    def addresses(self, host: str, port: int, deadline: float) -> list[str]:
        """Where ``host`` may be reached: resolved once (within ``deadline``), every
        address checked."""
        try:
            found = [str(ipaddress.ip_address(host.strip("[]")))]
        except ValueError:
            found = _resolved_by(self.resolve, host, port, deadline)
        if not found:
            raise DocumentRefused("The client's metadata host cannot be resolved.")
        for address in found:
            try:
                checked = ipaddress.ip_address(address)
            except ValueError:  # a scoped (link-local) address: not global either
                checked = None
            if not self.allow_private and (checked is None or not checked.is_global):
                raise DocumentRefused("The client's metadata URL is on a private network.")
        return found

    def fetch(self, url: str) -> dict[str, Any]:
        deadline = time.monotonic() + self.timeout
        if not is_document_client_id(url):
            raise DocumentRefused("The client's metadata URL is not a canonical https URL.")
        parts = split_canonical(url)
        host, port = parts.hostname or "", parts.port or 443
        target = parts.path + (f"?{parts.query}" if parts.query else "")
        raw = self._exchange(self.addresses(host, port, deadline), host, port, parts.netloc,
                             target, deadline)
        return _document(raw)

    def _exchange(self, addresses: list[str], host: str, port: int, netloc: str,
                  target: str, deadline: float) -> bytes:
        def left() -> float:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise DocumentRefused("The client's metadata document did not arrive in time.")
            return remaining

        try:
            context = ssl.create_default_context(cafile=self.ca_file)
        except (OSError, ValueError):  # a CA file that cannot be read: a setting's fault
            raise DocumentRefused("The client's metadata document could not be fetched.") \
                from None
        sock = None
        for address in addresses:  # each one checked above; none looked up again
            try:
                sock = socket.create_connection((address, port), timeout=left())
                break
            except OSError:
                continue
        if sock is None:
            raise DocumentRefused("The client's metadata document could not be fetched.")
        try:
            sock.settimeout(left())
            # SNI and certificate verification against the host name, on the pinned socket.
            with context.wrap_socket(sock, server_hostname=host) as tls:
                request = (f"GET {target} HTTP/1.1\r\nHost: {netloc}\r\n"
                           "Accept: application/json\r\nConnection: close\r\n"
                           "User-Agent: OrbitPilot client metadata\r\n\r\n")
                tls.settimeout(left())
                tls.sendall(request.encode("ascii"))
                received, size = [], 0
                while True:
                    tls.settimeout(left())
                    data = tls.recv(16384)
                    if not data:
                        break
                    size += len(data)
                    if size > MAX_BYTES + MAX_HEAD:
                        raise DocumentRefused("The client's metadata document is too large.")
                    received.append(data)
        except TimeoutError:
            raise DocumentRefused("The client's metadata document did not arrive in time.") \
                from None
        except (OSError, ValueError):
            raise DocumentRefused("The client's metadata document could not be fetched.") \
                from None
        finally:
            sock.close()
        return b"".join(received)


def _document(raw: bytes) -> dict[str, Any]:
    """The JSON object a whole HTTP answer carries (status 200, no redirect followed)."""
    response = http.client.HTTPResponse(_Received(raw), method="GET")  # type: ignore[arg-type]
    try:
        response.begin()
        if response.status != 200:
            raise DocumentRefused("The client's metadata URL did not answer with the "
                                  "document (redirects are not followed).")
        body = response.read()
    except (http.client.HTTPException, ValueError, OSError):
        raise DocumentRefused("The client's metadata URL did not give a valid HTTP answer.") \
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


class FetchPool:
    """At most ``size`` fetches at once in this process, each on a pool thread (never a
    request's), and at most ``size`` requests waiting on them: a request for a URL being
    fetched shares that fetch; any other finding either full is refused at once
    (``FetchesBusy``), never queued behind a slow server."""

    GRACE = 1.0  # a waiter's patience beyond the fetch's own deadline

    def __init__(self, size: int) -> None:
        self.size = max(1, size)
        self.started = 0  # fetches begun (tests count them)
        self._lock = threading.Lock()
        self._running: dict[str, Future] = {}
        self._waiting = 0
        self._executor: ThreadPoolExecutor | None = None  # made on first use: after forks

    @property
    def waiting(self) -> int:
        """Requests waiting on a fetch now."""
        return self._waiting

    def fetch(self, fetcher: Fetcher, url: str) -> dict[str, Any]:
        with self._lock:
            future = self._running.get(url)
            if self._waiting >= self.size or (future is None
                                              and len(self._running) >= self.size):
                raise FetchesBusy("OrbitPilot is reading other apps' details right now. "
                                  "Try again in a moment.")
            if future is None:
                if self._executor is None:
                    self._executor = ThreadPoolExecutor(self.size, "client-metadata")
                future = self._executor.submit(self._run, fetcher, url)
                self._running[url] = future
                self.started += 1
            self._waiting += 1
        try:
            return future.result(timeout=fetcher.timeout + self.GRACE)
        except FutureTimeout:
            raise DocumentRefused("The client's metadata document did not arrive in "
                                  "time.") from None
        finally:
            with self._lock:
                self._waiting -= 1

    def _run(self, fetcher: Fetcher, url: str) -> dict[str, Any]:
        try:
            return fetcher.fetch(url)
        finally:
            with self._lock:
                self._running.pop(url, None)
