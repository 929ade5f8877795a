"""gunicorn's hooks for the run command (``--config python:dashboard.gunicorn_hooks``): each
web worker loads the embedder, and runs it once, before it serves its first request, so
no search waits for the model and ``/healthz`` never says "warming" under the run command.
Only here: a worker process that forks work horses must never run inference before it
forks (``preload_embedder``)."""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)


def post_worker_init(worker: Any) -> None:
    app = getattr(worker, "wsgi", None)
    if app is None or not hasattr(app, "config"):
        return
    from dashboard.memory import get_embedder

    try:
        get_embedder(app.config["EMBEDDER"]).embed(["warm up"])
    except Exception as exc:  # the first search will say what is wrong
        log.warning("embedder warm-up failed: %s", type(exc).__name__)
