"""Redis and the RQ build queue, one connection pool per app."""

from __future__ import annotations

from flask import Flask, current_app
from redis import Redis
from rq import Queue


def get_redis(app: Flask | None = None) -> Redis:
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


def get_build_queue(app: Flask | None = None) -> Queue:
    app = app or current_app
    return Queue(app.config["BUILD_QUEUE"], connection=get_redis(app),
                 default_timeout=app.config["BUILD_JOB_TIMEOUT"])


def build_job_id(build_id: int) -> str:
    return f"build-{build_id}"


def fanout_job_id(plan_id: int) -> str:
    return f"fanout-plan-{plan_id}"
