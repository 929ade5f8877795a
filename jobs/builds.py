"""Build jobs. Arguments are ids only; new parameters must be trailing keywords with
defaults, so jobs queued before a deploy still run after it."""

from __future__ import annotations

import os

from dashboard import memory
from dashboard.extensions import db
from dashboard.queues import build_queue
from jobs import job_app


def run_build(build_id: int) -> str:
    app = job_app()
    with app.app_context():
        # A forked work horse must not reuse the parent's pooled connections.
        db.engine.dispose(close=False)
        settings = memory.settings_from(app.config)
        return memory.execute_build(db.engine, build_id, settings=settings,
                                    embedder=memory.get_embedder(settings.embedder))


def run_builds(build_ids: list[int]) -> dict[str, int]:
    """Several builds in one job (one fork, one connection, the model loaded once), each
    exactly as ``run_build`` runs it alone."""
    app = job_app()
    with app.app_context():
        db.engine.dispose(close=False)
        settings = memory.settings_from(app.config)
        queue = build_queue(app)
        return memory.execute_builds(
            db.engine, [int(i) for i in build_ids], settings=settings,
            embedder=memory.get_embedder(settings.embedder),
            resubmit=lambda left: queue.push([("build", i) for i in left]))


def fan_out_plan(plan_id: int, mode: str = "quick", trigger: str = "plan_change",
                 requested_by_id: int | None = None) -> int:
    """A plan's cap or assignments changed: applied in bulk where that only removes
    (``apply_plan_change``, builds asked for the rest); or an admin asked to rebuild the
    whole plan: a build for each user."""
    app = job_app()
    with app.app_context():
        db.engine.dispose(close=False)
        try:
            batch = memory.settings_from(app.config).fanout_batch
            if trigger == "plan_change" and mode == "quick":
                return memory.apply_plan_change(db.session, plan_id,
                                                batch_size=batch).users
            return memory.fan_out_plan_builds(db.session, plan_id, batch_size=batch,
                                              mode=mode, trigger=trigger,
                                              requested_by_id=requested_by_id)
        finally:
            db.session.remove()


def index_ann(user_id: int) -> str:
    """Move a user's rows into the HNSW index, a committed batch at a time (asked for by
    the build that took them to ANN_MIN_CHUNKS); the state it left (``ready``, ...)."""
    app = job_app()
    with app.app_context():
        db.engine.dispose(close=False)
        try:
            settings = memory.settings_from(app.config)
            # Half the job timeout, then a continuation job: never killed mid-way.
            return memory.index_user_ann(db.session, user_id, settings=settings,
                                         budget_seconds=settings.job_timeout / 2).state
        finally:
            db.session.remove()


def work_horse_killed(job, retpid, ret_val, rusage) -> None:  # noqa: ARG001 (RQ's signature)
    """RQ calls this in the worker when a work horse dies outside Python (SIGKILL, OOM)."""
    signal = f" (signal {os.WTERMSIG(ret_val)})" if ret_val and os.WIFSIGNALED(ret_val) else ""
    build_interrupted(job, f"worker process terminated{signal}")


def build_interrupted(job, reason: str) -> bool:
    """A build job that ended outside our code: its build recorded failed with
    ``reason``, its request queued again (``abandon_build``). True if it was running."""
    if job.func_name not in ("jobs.builds.run_build", "jobs.builds.run_builds") \
            or not job.args:
        return False
    app = job_app()
    with app.app_context():
        attempts = app.config["BUILD_MAX_ATTEMPTS"]
        if job.func_name == "jobs.builds.run_builds":
            # The one running is asked again; those not started stay queued.
            return memory.abandon_builds(db.engine, [int(i) for i in job.args[0]], reason,
                                         max_attempts=attempts) > 0
        return memory.abandon_build(db.engine, int(job.args[0]), reason,
                                    max_attempts=attempts)
