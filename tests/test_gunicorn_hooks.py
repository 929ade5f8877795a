"""The web workers' warm-up (``dashboard/gunicorn_hooks.py``): a worker holds the model
before it serves, loaded once; a failure is logged by kind, never by its text."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from dashboard.gunicorn_hooks import post_worker_init
from dashboard.memory import embedders


@pytest.fixture
def fresh_process(monkeypatch):
    """This process as a web worker that has loaded no model yet."""
    monkeypatch.setattr(embedders, "_EMBEDDERS", {})
    monkeypatch.setattr(embedders, "_LOADS", {})


def test_a_worker_loads_the_model_once_before_it_serves(fresh_process):
    worker = SimpleNamespace(wsgi=SimpleNamespace(config={"EMBEDDER": "hashing"}))
    post_worker_init(worker)
    assert embedders.embedder_loaded("hashing")
    embedders.get_embedder("hashing").embed(["the first search"])  # as a request would
    assert embedders.embedder_loads("hashing") == 1


def test_a_failed_warm_up_is_logged_by_kind(fresh_process, caplog):
    broken = SimpleNamespace(wsgi=SimpleNamespace(
        config={"EMBEDDER": "tests.factories:NoSuchEmbedder"}))
    with caplog.at_level(logging.WARNING, logger="dashboard.gunicorn_hooks"):
        post_worker_init(broken)
    (record,) = caplog.records
    assert record.getMessage().startswith("embedder warm-up failed: ")
    assert "NoSuchEmbedder" not in record.getMessage()  # the kind, not the text
