"""gunicorn's hooks for the run command (``--config python:dashboard.gunicorn_hooks``): each
web worker loads the embedder and the MCP SDK before it serves its first request, so no
search waits for the model, no first /mcp call for the SDK's import, and ``/healthz``
never says "warming" under the run command. Loading is all: the weights and tokenizers
load in the constructors, and nothing is run (an embedder of one's own may block on its
first texts); the MCP server itself starts at the first call (its event loop thread)."""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)


def post_worker_init(worker: Any) -> None:
    app = getattr(worker, "wsgi", None)
    if app is None or not hasattr(app, "config"):
        return
    import dashboard.connectors.mcp  # noqa: F401  (the SDK; other processes never load it)
    from dashboard.memory import preload_embedder

    try:
        preload_embedder(app.config["EMBEDDER"])
    except Exception as exc:  # the first search will say what is wrong
        log.warning("embedder warm-up failed: %s", type(exc).__name__)
