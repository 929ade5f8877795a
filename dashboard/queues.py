"""An app's Redis client and build queue: one client per app (the embedded Valkey started
on its first use), and the engine's ``BuildQueue`` bound to the app's database engine."""

from __future__ import annotations

import weakref

from flask import Flask, current_app
from redis import Redis

from dashboard.extensions import db
from dashboard.memory import BuildQueue, bind_queue, settings_from


def redis_client(app: Flask | None = None) -> Redis:
    app = app or current_app
    binding = app.extensions.get("orbitpilot.embedded")
    if binding is not None:
        binding.ensure_redis()
    client = app.extensions.get("orbitpilot.redis")
    if client is None:
        # Short timeouts: a Redis outage must fail a request's enqueue fast (the sweeper
        # enqueues later), never hang the request.
        client = Redis.from_url(app.config["REDIS_URL"], socket_connect_timeout=2,
                                socket_timeout=5, health_check_interval=30)
        app.extensions["orbitpilot.redis"] = client
    return client


def revive_redis(app: Flask) -> bool:
    """The app's embedded Valkey, started again if it stopped answering; False when it
    answers, or when the app's Redis is not the embedded one (not ours to start)."""
    binding = app.extensions.get("orbitpilot.embedded")
    return binding is not None and binding.revive_redis()


def build_queue(app: Flask | None = None) -> BuildQueue:
    return (app or current_app).extensions["orbitpilot.build_queue"]


def init_queue(app: Flask) -> None:
    """After the database: jobs asked for in this app's transactions go to its queue.
    The queue reaches its app weakly: the engine it is bound by must not keep the app."""
    app_ref = weakref.ref(app)
    queue = BuildQueue(lambda: redis_client(app_ref()),
                       lambda: settings_from(app_ref().config))
    app.extensions["orbitpilot.build_queue"] = queue
    with app.app_context():
        bind_queue(db.engine, queue)
