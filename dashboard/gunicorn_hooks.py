"""gunicorn's hooks for the run command (``--config python:dashboard.gunicorn_hooks``): each
web worker loads the embedder in the background as it starts, so the first search does
not wait seconds for the model. Only here: a worker process that forks work horses must
never run inference before it forks (``preload_embedder``)."""

from __future__ import annotations

import logging
import threading
from typing import Any

log = logging.getLogger(__name__)


def _warm(app: Any, worker: Any) -> None:
    from dashboard.memory import get_embedder

    try:
        get_embedder(app.config["EMBEDDER"]).embed(["warm up"])
    except Exception as exc:
        if getattr(worker, "alive", True):  # the first search will say what is wrong
            log.warning("embedder warm-up failed: %s", type(exc).__name__)
        # else: the worker is stopping under the warm-up; nothing is wrong


def post_worker_init(worker: Any) -> None:
    app = getattr(worker, "wsgi", None)
    if app is not None and hasattr(app, "config"):
        threading.Thread(target=_warm, args=(app, worker), name="embedder-warm-up",
                         daemon=True).start()
