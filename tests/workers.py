"""A real build worker for end-to-end tests: ``flask worker --burst`` in its own process,
on the given app's database and queue. It runs what is queued, then exits."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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
