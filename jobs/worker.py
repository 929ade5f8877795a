"""The build worker: an RQ worker with the app context, plus a maintenance thread that
sweeps stuck builds, requests builds for idle conversations, and runs the schedule.

Run it with ``flask worker`` (any number, on any number of machines)."""

from __future__ import annotations

import logging
import threading
import time

from flask import Flask
from rq import SimpleWorker, Worker

log = logging.getLogger(__name__)


class JobIdFilter(logging.Filter):
    """Stamps the current RQ job id on every log record of a work horse."""

    def filter(self, record: logging.LogRecord) -> bool:
        from rq import get_current_job

        job = get_current_job()
        record.job_id = job.id if job else "-"
        return True


def maintenance_loop(app: Flask, stop: threading.Event) -> None:
    from dashboard.extensions import db
    from dashboard.memory.builds import (
        request_idle_conversation_builds,
        request_scheduled_builds,
        sweep_builds,
    )

    sweep_every = app.config["BUILD_SWEEP_SECONDS"]
    schedule_every = app.config["BUILD_SCHEDULE_SECONDS"]
    next_schedule = time.monotonic() + schedule_every
    while not stop.wait(sweep_every):
        with app.app_context():
            try:
                sweep_builds(db.session)
                request_idle_conversation_builds(
                    db.session, idle_minutes=app.config["CONVERSATION_IDLE_MINUTES"])
                if schedule_every and time.monotonic() >= next_schedule:
                    request_scheduled_builds(db.session)
                    next_schedule = time.monotonic() + schedule_every
                db.session.commit()
            except Exception as exc:
                db.session.rollback()
                log.warning("maintenance pass failed: %s", type(exc).__name__)
            finally:
                db.session.remove()


def run_worker(app: Flask, *, burst: bool = False, simple: bool = False,
               maintenance: bool = True) -> bool:
    from dashboard.memory.queue import get_build_queue, get_redis
    from jobs.builds import work_horse_killed

    worker_class = SimpleWorker if simple else Worker
    handler = logging.StreamHandler()
    handler.addFilter(JobIdFilter())
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s [%(job_id)s] %(name)s: "
                                           "%(message)s"))
    logging.getLogger("dashboard").addHandler(handler)
    logging.getLogger("dashboard").setLevel(logging.INFO)

    with app.app_context():
        worker = worker_class([get_build_queue(app)], connection=get_redis(app),
                              work_horse_killed_handler=work_horse_killed)
    stop = threading.Event()
    if maintenance and not burst:
        threading.Thread(target=maintenance_loop, args=(app, stop), daemon=True,
                         name="maintenance").start()
    try:
        # The scheduler runs retries with backoff (RQ's Retry intervals).
        with app.app_context():
            return worker.work(burst=burst, with_scheduler=True, logging_level="INFO")
    finally:
        stop.set()
