"""Build jobs. Arguments are ids only; new parameters must be trailing keywords with
defaults, so jobs queued before a deploy still run after it."""

from __future__ import annotations

from jobs import job_app


def run_build(build_id: int) -> str:
    app = job_app()
    with app.app_context():
        from dashboard.extensions import db
        from dashboard.memory.runner import execute_build

        # A forked work horse must not reuse the parent's pooled connections.
        db.engine.dispose(close=False)
        return execute_build(build_id)


def fan_out_plan(plan_id: int, mode: str = "quick", trigger: str = "plan_change",
                 requested_by_id: int | None = None) -> int:
    """Request a build for each user of a plan (its cap or assignments changed, or an
    admin asked to rebuild it)."""
    app = job_app()
    with app.app_context():
        from dashboard.extensions import db
        from dashboard.memory.maintenance import fan_out_plan_builds

        db.engine.dispose(close=False)
        try:
            return fan_out_plan_builds(db.session, plan_id, mode=mode, trigger=trigger,
                                       requested_by_id=requested_by_id)
        finally:
            db.session.remove()


def work_horse_killed(job, retpid, ret_val, rusage) -> None:  # noqa: ARG001 (RQ's signature)
    """RQ calls this in the worker when a work horse dies outside Python (SIGKILL, OOM)."""
    if job.func_name != "jobs.builds.run_build" or not job.args:
        return
    import os

    signal = f" (signal {os.WTERMSIG(ret_val)})" if ret_val and os.WIFSIGNALED(ret_val) else ""
    app = job_app()
    with app.app_context():
        from dashboard.memory.runner import abandon_build

        abandon_build(int(job.args[0]), f"worker process terminated{signal}")
