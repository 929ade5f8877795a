"""Workers for tests: a real ``flask worker --burst`` in its own process, on the given
app's database and queue (it runs what is queued, then exits); and one build record run
in this process, as a worker's job runs it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from flask import current_app

from dashboard.extensions import db
from dashboard.memory import execute_build, get_embedder, settings_from

ROOT = Path(__file__).resolve().parent.parent


def run_worker(app) -> str:
    env = dict(os.environ)
    env.update(FLASK_APP="wsgi.py", DATABASE_URL=app.config["SQLALCHEMY_DATABASE_URI"],
               REDIS_URL=app.config["REDIS_URL"], BUILD_QUEUE=app.config["BUILD_QUEUE"],
               EMBEDDER=app.config["EMBEDDER"])
    done = subprocess.run([sys.executable, "-m", "flask", "worker", "--burst"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr


def run_build(build_id: int, embedder=None) -> str:
    """Run one build record in this process as a worker's job does (the current app's
    engine and settings); its final status for this attempt."""
    settings = settings_from(current_app.config)
    return execute_build(db.engine, build_id, settings=settings,
                         embedder=embedder or get_embedder(settings.embedder))
