"""RQ job functions and the worker entry. Jobs are thin: ids in, an app context, a service."""

from __future__ import annotations

from flask import Flask, current_app, has_app_context

_app: Flask | None = None


def job_app() -> Flask:
    """The app a job runs in: the worker's own, or one built once per process."""
    global _app
    if has_app_context():
        return current_app._get_current_object()
    if _app is None:
        from dashboard import create_app

        _app = create_app()
    return _app
