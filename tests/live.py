"""The app as a real HTTP server in a thread, for tests that need a socket (a browser,
schemathesis' own runner): ``serving(app)`` yields its base URL and stops it after."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from werkzeug.serving import WSGIRequestHandler, make_server


class _QuietHandler(WSGIRequestHandler):
    def log_request(self, *args, **kwargs) -> None:
        pass


@contextmanager
def serving(app) -> Iterator[str]:
    server = make_server("127.0.0.1", 0, app, threaded=True, request_handler=_QuietHandler)
    thread = threading.Thread(target=server.serve_forever, name="live-test-server",
                              daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        thread.join(timeout=10)
        server.server_close()
