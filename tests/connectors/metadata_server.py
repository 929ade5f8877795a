"""A client's metadata document served over HTTPS from this machine (a certificate made
for the test, which the authorization server is told to trust): what a connector
publishes at the URL it uses as its client_id. ``trickle`` makes it a slow server: the
document one byte at a time, then blanks (valid JSON) for as long as anyone listens."""

from __future__ import annotations

import datetime
import ipaddress
import json
import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tests.connectors.helpers import REDIRECT_URI

# A host name the certificate also holds: a test's own resolver says where it is.
TEST_HOST = "client-metadata.test"


def make_certificate(folder: Path) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name)
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName(
            [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName(TEST_HOST)]),
            critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256()))
    cert_file, key_file = folder / "cert.pem", folder / "key.pem"
    cert_file.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_file, key_file


@dataclass
class Document:
    url: str
    ca_file: Path
    port: int = 0
    body: dict = field(default_factory=dict)
    trickle: float | None = None  # seconds between bytes: a slow server
    fetches: int = 0
    abandoned: int = 0  # trickled answers the reader walked away from
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _abandoned: threading.Condition = field(init=False)

    def __post_init__(self) -> None:
        self._abandoned = threading.Condition(self._lock)

    def url_on(self, host: str) -> str:
        """The document's URL with another host name (its client_id changes with it)."""
        return f"https://{host}:{self.port}/oauth/client.json"

    def wait_abandoned(self, count: int, timeout: float = 60) -> bool:
        with self._abandoned:
            return self._abandoned.wait_for(lambda: self.abandoned >= count, timeout)


@contextmanager
def serving_client_document(folder: Path, *, client_name: str) -> Iterator[Document]:
    cert_file, key_file = make_certificate(folder)
    document = Document(url="", ca_file=cert_file)
    stopping = threading.Event()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path != "/oauth/client.json":
                self.send_error(404)
                return
            with document._lock:
                document.fetches += 1
            body = json.dumps(document.body).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            if document.trickle is None:
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            self.end_headers()
            self._trickle(body)

        def _trickle(self, body: bytes) -> None:
            sent = 0
            try:
                while not stopping.wait(document.trickle):
                    self.wfile.write(body[sent:sent + 1] if sent < len(body) else b" ")
                    self.wfile.flush()
                    sent += 1
            except OSError:  # the reader hung up
                with document._abandoned:
                    document.abandoned += 1
                    document._abandoned.notify_all()

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert_file, key_file)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    document.port = server.server_port
    document.url = document.url_on("127.0.0.1")
    document.body = {"client_id": document.url, "client_name": client_name,
                     "redirect_uris": [REDIRECT_URI],
                     "grant_types": ["authorization_code", "refresh_token"],
                     "response_types": ["code"], "token_endpoint_auth_method": "none"}
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield document
    finally:
        stopping.set()
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
