"""RQ job functions, the worker and their commands. Jobs are thin: ids in, an app context,
a service. ``dashboard`` never imports this package; its commands reach ``flask`` through
the ``flask.commands`` entry point (pyproject.toml)."""

from __future__ import annotations

from flask import Flask, current_app, has_app_context

from dashboard import create_app

_app: Flask | None = None


def job_app() -> Flask:
    """The app a job runs in: the worker's own, or one built once per process."""
    global _app
    if has_app_context():
        return current_app._get_current_object()
    if _app is None:
        _app = create_app()
    return _app
