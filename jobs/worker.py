"""The build worker: an RQ worker with the app context, plus one maintenance thread that
moves RQ's retries along, runs the periodic tasks (sweep, idle conversations, the
schedule, the audit checkpoint) — each once per interval across all workers, by a lease
in PostgreSQL — and watches Redis: it lives through an outage (docs/architecture/run.md).
As it stops, it writes the audit checkpoint once more.

Run it with ``flask worker`` (any number, on any number of machines). Nothing here forks
a process of its own: RQ's scheduler runs in the maintenance thread (under RQ's own
per-queue lock), so it can never outlive the worker."""

from __future__ import annotations

import gc
import importlib
import logging
import math
import os
import pkgutil
import signal
import socket
import threading
import time
from contextlib import suppress

import redis
from flask import Flask
from rq import SimpleWorker, Worker, get_current_job
from rq.exceptions import StopRequested
from rq.job import Job
from rq.scheduler import RQScheduler
from rq.worker import WorkerStatus

import dashboard
import jobs
from dashboard import memory
from dashboard.embedded import die_with_parent
from dashboard.extensions import db
from dashboard.queues import build_queue, redis_client, revive_redis
from jobs import job_app
from jobs.builds import build_interrupted, work_horse_killed
from jobs.periodic import checkpoint_at_shutdown, run_due_tasks

log = logging.getLogger(__name__)

TICK_SECONDS = 1.0
MAINTENANCE_EVERY_SECONDS = 5.0
# What a Redis that went away (or does not answer) raises.
REDIS_DOWN = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)
REDIS_LOST = "the worker lost its connection to Redis during the build"


class JobIdFilter(logging.Filter):
    """Stamps the current RQ job id on every log record of a work horse."""

    def filter(self, record: logging.LogRecord) -> bool:
        job = get_current_job()
        record.job_id = job.id if job else "-"
        return True


class ForkingWorker(Worker):
    """RQ's forking worker, whose work horse dies with it (a horse left behind by a
    worker that was killed would go on holding the database and the embedded servers),
    and which lives through a Redis outage in the middle of a job, where RQ's own loop
    would end and the worker with it."""

    def main_work_horse(self, job, queue):  # noqa: ANN001 (RQ's signature)
        die_with_parent(self.pid, signal.SIGKILL)
        return super().main_work_horse(job, queue)

    def execute_job(self, job, queue):  # noqa: ANN001 (RQ's signature)
        try:
            super().execute_job(job, queue)
        except REDIS_DOWN as exc:
            self._lost_redis(job, exc)

    def _lost_redis(self, job, exc: BaseException) -> None:
        # RQ cannot follow the job without Redis: stop its horse, record the build
        # interrupted (its request is queued again), wait for Redis, then work on.
        log.warning("Redis lost during job %s (%s)", job.id, type(exc).__name__)
        if self.horse_pid:
            self.kill_horse()
            self.wait_for_horse()
            self._horse_pid = 0
        self.execution = None  # one job at a time: the one that just ended
        try:
            if build_interrupted(job, REDIS_LOST):
                log.warning("job %s: build recorded failed, its request queued again", job.id)
        except Exception as error:  # the database too: the sweeper fails it later
            log.warning("job %s: recording its build failed: %s", job.id,
                        type(error).__name__)
        self.wait_for_redis()
        push_lost_jobs(job_app())  # the request asked again could not be pushed until now
        with suppress(*REDIS_DOWN):  # gone again: the work loop's next call meets it
            self.set_state(WorkerStatus.IDLE)

    def wait_for_redis(self) -> None:
        """Until Redis answers again (the embedded Valkey started again, if it is ours),
        or a stop is asked for (then StopRequested, which ends RQ's loop)."""
        pause = 0.5
        while not self._stop_requested:
            try:
                if revive_redis(job_app()):
                    log.warning("the embedded Valkey had stopped; it answers again")
                self.connection.ping()
                log.warning("Redis answers again")
                return
            except REDIS_DOWN:
                pass  # also what a stop request raises from RQ's handler while Redis is down
            except Exception as exc:
                log.warning("starting the embedded Valkey again failed: %s",
                            type(exc).__name__)
            time.sleep(pause)
            pause = min(pause * 2, 5.0)
        raise StopRequested()

    def teardown(self) -> None:
        try:
            super().teardown()
        except REDIS_DOWN as exc:
            # Stopping while Redis is down: the worker's record there expires by itself.
            log.warning("could not unregister the worker from Redis (%s)", type(exc).__name__)


NEVER_IN_A_WORKER = frozenset({"dashboard.connectors.mcp"})


def import_everything() -> None:
    """Import every module of the app and the jobs before any thread starts or any job
    is forked. A fork copies a module lock that another thread holds mid-import; the work
    horse would then wait for that import forever (seen: a horse forked while the
    maintenance thread's first pass was importing). Not the MCP tools: only web workers
    and ``flask mcp stdio`` serve MCP, and the SDK costs a start half a second."""
    for package in (dashboard, jobs):
        for module in pkgutil.walk_packages(package.__path__, f"{package.__name__}."):
            if module.name not in NEVER_IN_A_WORKER:
                importlib.import_module(module.name)


def maintenance_pass(app: Flask, holder: str) -> None:
    with app.app_context():
        try:
            run_due_tasks(db.session, app.config, build_queue(app), holder=holder)
        except Exception as exc:
            log.warning("maintenance pass failed: %s", type(exc).__name__)
        finally:
            db.session.remove()


def push_lost_jobs(app: Flask) -> None:
    """Once Redis answers again: push every queued build and fan-out whose job it lost
    (pushes that failed meanwhile, a Valkey started again with an older dump or none),
    rather than wait for the sweeper's interval and age threshold."""
    with app.app_context():
        try:
            result = memory.sweep_builds(db.session, build_queue(app), requeue_after=0)
            db.session.commit()
            if result.requeued or result.fanouts:
                log.warning("pushed %d build(s) and %d fan-out(s) Redis had lost",
                            result.requeued, result.fanouts)
        except Exception as exc:
            db.session.rollback()
            log.warning("pushing the jobs Redis lost failed: %s", type(exc).__name__)
        finally:
            db.session.remove()


def redis_tick(app: Flask, scheduler: RQScheduler | None, was_down: bool) -> bool:
    """Move RQ's due retries along; notice Redis going away (then start the embedded
    Valkey again) and coming back (then push the jobs it lost). Whether it is down."""
    try:
        if scheduler is None:
            redis_client(app).ping()
        # Retries with backoff wait in RQ's scheduled registry; whichever worker holds
        # the queue's scheduler lock moves them when due.
        elif scheduler.acquire_locks():
            scheduler.enqueue_scheduled_jobs()
    except REDIS_DOWN as exc:
        if not was_down:
            log.warning("Redis does not answer (%s)", type(exc).__name__)
        try:
            if revive_redis(app):
                log.warning("the embedded Valkey had stopped; it answers again")
        except Exception as error:
            log.warning("starting the embedded Valkey again failed: %s",
                        type(error).__name__)
        return True
    except Exception as exc:
        log.warning("moving scheduled retries failed: %s", type(exc).__name__)
        return was_down
    if was_down:
        log.warning("Redis answers again")
        push_lost_jobs(app)
    return False


def maintenance_loop(app: Flask, stop: threading.Event, scheduler: RQScheduler | None,
                     holder: str) -> None:
    # The first pass ran before the worker started (see run_worker).
    next_maintenance = time.monotonic() + MAINTENANCE_EVERY_SECONDS
    redis_down = False
    try:
        while not stop.wait(TICK_SECONDS):
            redis_down = redis_tick(app, scheduler, redis_down)
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
    for name in ("dashboard", "jobs"):
        logging.getLogger(name).addHandler(handler)
        logging.getLogger(name).setLevel(logging.INFO)

    with app.app_context():
        queue = build_queue(app).rq()
        # The worker tells Redis it is alive (and so learns that Redis is gone) as often
        # as a build tells PostgreSQL; RQ's default is every 30 s.
        monitor = max(1, math.ceil(app.config["BUILD_HEARTBEAT_SECONDS"]))
        worker = worker_class([queue], connection=redis_client(app),
                              work_horse_killed_handler=work_horse_killed,
                              job_monitoring_interval=monitor)
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
    if job_id and job_id.startswith("builds-"):
        with suppress(Exception):
            job = Job.fetch(job_id, connection=worker.connection)
            if build_interrupted(job, "worker shut down during the build"):
                log.warning("a build of job %s recorded failed: the worker shut down "
                            "during it", job_id)
        return
    if not job_id or not job_id.startswith("build-"):
        return
    with app.app_context():
        if memory.abandon_build(db.engine, int(job_id.removeprefix("build-")),
                                "worker shut down during the build",
                                max_attempts=app.config["BUILD_MAX_ATTEMPTS"]):
            log.warning("build %s recorded failed: the worker shut down during it", job_id)
