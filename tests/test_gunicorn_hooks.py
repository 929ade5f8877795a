"""The web workers' warm-up (``dashboard/gunicorn_hooks.py``): a failure is logged by kind
while the worker serves, and is no news when the worker is stopping under it."""

from __future__ import annotations

import logging
from types import SimpleNamespace

from dashboard.gunicorn_hooks import _warm

BROKEN = SimpleNamespace(config={"EMBEDDER": "tests.factories:NoSuchEmbedder"})


def test_a_failed_warm_up_of_a_serving_worker_is_logged_by_kind(caplog):
    with caplog.at_level(logging.WARNING, logger="dashboard.gunicorn_hooks"):
        _warm(BROKEN, SimpleNamespace(alive=True))
    (record,) = caplog.records
    assert record.getMessage().startswith("embedder warm-up failed: ")
    assert "NoSuchEmbedder" not in record.getMessage()  # the kind, not the text


def test_a_warm_up_cut_short_by_the_workers_stop_says_nothing(caplog):
    with caplog.at_level(logging.WARNING, logger="dashboard.gunicorn_hooks"):
        _warm(BROKEN, SimpleNamespace(alive=False))
    assert caplog.records == []
