"""The build worker: an RQ worker with the app context, plus one maintenance thread that
moves RQ's retries along and runs the periodic tasks (sweep, idle conversations, the
schedule, the audit checkpoint) — each once per interval across all workers, by a lease
in PostgreSQL; and, as it stops, the audit checkpoint once more.

Run it with ``flask worker`` (any number, on any number of machines). Nothing here forks
a process of its own: RQ's scheduler runs in the maintenance thread (under RQ's own
per-queue lock), so it can never outlive the worker."""

from __future__ import annotations

import gc
import importlib
import logging
import os
import pkgutil
import signal
import socket
import threading
import time

from flask import Flask
from rq import SimpleWorker, Worker, get_current_job
from rq.scheduler import RQScheduler

import dashboard
import jobs
from dashboard import memory
from dashboard.embedded import die_with_parent
from dashboard.extensions import db
from dashboard.queues import build_queue, redis_client
from jobs.builds import work_horse_killed
from jobs.periodic import checkpoint_at_shutdown, run_due_tasks

log = logging.getLogger(__name__)

TICK_SECONDS = 1.0
MAINTENANCE_EVERY_SECONDS = 5.0


class JobIdFilter(logging.Filter):
    """Stamps the current RQ job id on every log record of a work horse."""

    def filter(self, record: logging.LogRecord) -> bool:
        job = get_current_job()
        record.job_id = job.id if job else "-"
        return True


class ForkingWorker(Worker):
    """RQ's forking worker, whose work horse dies with it: a horse left behind by a
    worker that was killed would go on holding the database and the embedded servers."""

    def main_work_horse(self, job, queue):  # noqa: ANN001 (RQ's signature)
        die_with_parent(self.pid, signal.SIGKILL)
        return super().main_work_horse(job, queue)


def import_everything() -> None:
    """Import every module of the app and the jobs before any thread starts or any job
    is forked. A fork copies a module lock that another thread holds mid-import; the work
    horse would then wait for that import forever (seen: a horse forked while the
    maintenance thread's first pass was importing)."""
    for package in (dashboard, jobs):
        for module in pkgutil.walk_packages(package.__path__, f"{package.__name__}."):
            importlib.import_module(module.name)


def maintenance_pass(app: Flask, holder: str) -> None:
    with app.app_context():
        try:
            run_due_tasks(db.session, app.config, build_queue(app), holder=holder)
        except Exception as exc:
            log.warning("maintenance pass failed: %s", type(exc).__name__)
        finally:
            db.session.remove()


def maintenance_loop(app: Flask, stop: threading.Event, scheduler: RQScheduler | None,
                     holder: str) -> None:
    # The first pass ran before the worker started (see run_worker).
    next_maintenance = time.monotonic() + MAINTENANCE_EVERY_SECONDS
    try:
        while not stop.wait(TICK_SECONDS):
            if scheduler is not None:
                try:
                    # Retries with backoff wait in RQ's scheduled registry; whichever
                    # worker holds the queue's scheduler lock moves them when due.
                    if scheduler.acquire_locks():
                        scheduler.enqueue_scheduled_jobs()
                except Exception as exc:
                    log.warning("moving scheduled retries failed: %s", type(exc).__name__)
            if time.monotonic() < next_maintenance:
                continue
            next_maintenance = time.monotonic() + MAINTENANCE_EVERY_SECONDS
            maintenance_pass(app, holder)
    finally:
        if scheduler is not None:
            try:
                scheduler.release_locks()
            except Exception as exc:
                log.warning("releasing the scheduler lock failed: %s", type(exc).__name__)


def run_worker(app: Flask, *, burst: bool = False, simple: bool = False,
               maintenance: bool = True) -> bool:
    worker_class = SimpleWorker if simple else ForkingWorker
    import_everything()
    # Once per worker process, before any thread starts or any job is forked.
    memory.preload_embedder(app.config["EMBEDDER"])
    # What is loaded now lives as long as the worker: out of the collector's sight, so a
    # work horse's full collections stay short and leave the pages it shares unwritten.
    gc.freeze()
    handler = logging.StreamHandler()
    handler.addFilter(JobIdFilter())
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s [%(job_id)s] %(name)s: "
                                           "%(message)s"))
    logging.getLogger("dashboard").addHandler(handler)
    logging.getLogger("dashboard").setLevel(logging.INFO)

    with app.app_context():
        queue = build_queue(app).rq()
        worker = worker_class([queue], connection=redis_client(app),
                              work_horse_killed_handler=work_horse_killed)
        scheduler = RQScheduler([queue], connection=redis_client(app))
    stop = threading.Event()
    thread = None
    holder = f"{socket.gethostname()}:{os.getpid()}"
    if not burst and maintenance:
        # Once here, before any job is forked, so whatever its first run loads lazily
        # (drivers, dialect modules) is loaded by then; then every few seconds in a thread.
        maintenance_pass(app, holder)
        thread = threading.Thread(target=maintenance_loop, name="maintenance", daemon=True,
                                  args=(app, stop, scheduler, holder))
        thread.start()
    try:
        with app.app_context():
            if burst:
                # A burst run still moves retries that are already due, then drains.
                scheduler.acquire_locks()
                scheduler.enqueue_scheduled_jobs()
                scheduler.release_locks()
            return worker.work(burst=burst, logging_level="INFO")
    finally:
        stop.set()
        _record_interrupted_build(app, worker)
        if thread is not None and thread.is_alive():
            thread.join(timeout=5)
        if thread is not None:
            # The worker that ran the periodic tasks writes the chain head down as it goes.
            with app.app_context():
                try:
                    checkpoint_at_shutdown(db.session, app.config)
                finally:
                    db.session.remove()


def _record_interrupted_build(app: Flask, worker: Worker) -> None:
    """After a cold shutdown (RQ killed the work horse mid-job), say so on the record."""
    try:
        job_id = worker.get_current_job_id()
    except Exception:
        return
    if not job_id or not job_id.startswith("build-"):
        return
    with app.app_context():
        if memory.abandon_build(db.engine, int(job_id.removeprefix("build-")),
                                "worker shut down during the build"):
            log.warning("build %s recorded failed: the worker shut down during it", job_id)
