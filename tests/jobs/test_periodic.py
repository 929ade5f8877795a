"""Periodic work runs once per interval across all workers, and nothing a worker starts
outlives it: RQ's scheduled retries move from a thread, not from a forked scheduler. The
audit checkpoint is anchored outside the database, and once more when a worker stops."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
import uuid
from datetime import timedelta
from pathlib import Path

import psutil
import pytest
from rq import Worker
from sqlalchemy import delete

from dashboard.audit.services import SYSTEM, record_event
from dashboard.config import settings_from_env
from dashboard.extensions import db
from dashboard.leases import MaintenanceLease, claim_lease
from dashboard.queues import build_queue
from jobs.periodic import PERIODIC_TASKS, run_due_tasks
from jobs.worker import MAINTENANCE_EVERY_SECONDS
from tests.embedded.procs import wait_until
from tests.memory.test_worker import ROOT, start_worker, worker_env


def anchored(path: Path) -> list[tuple[int, str]]:
    """The (seq, hash) of each anchor in the file at ``path``."""
    return [(anchor["seq"], anchor["hash"])
            for anchor in map(json.loads, path.read_text().splitlines())]


def test_a_lease_is_won_by_exactly_one_of_many_workers_at_once(app):
    task = f"test-{uuid.uuid4().hex[:8]}"
    barrier = threading.Barrier(8)
    wins: list[bool] = []

    def contend() -> None:
        with app.app_context():
            barrier.wait()
            wins.append(claim_lease(db.session, task, 60, holder=threading.current_thread().name))
            db.session.remove()

    threads = [threading.Thread(target=contend) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert sorted(wins) == [False] * 7 + [True]
        with app.app_context():
            assert claim_lease(db.session, task, 60) is False  # within the interval
            assert claim_lease(db.session, task, 0) is True  # the interval has passed
    finally:
        with app.app_context():
            db.session.execute(delete(MaintenanceLease).where(MaintenanceLease.task == task))
            db.session.commit()
            db.session.remove()


def test_two_workers_maintenance_passes_run_each_task_once(app):
    with app.app_context():
        db.session.execute(delete(MaintenanceLease))
        db.session.commit()
        first = run_due_tasks(db.session, app.config, build_queue(app), holder="worker-a")
        second = run_due_tasks(db.session, app.config, build_queue(app), holder="worker-b")
        db.session.remove()
    names = {task.name for task in PERIODIC_TASKS}
    assert set(first) == names
    assert second == []


@pytest.mark.processes
def test_a_worker_forks_no_scheduler_and_still_moves_scheduled_retries(app, queue):
    # A job scheduled for later, as RQ's Retry does between attempts.
    job = queue.enqueue_in(timedelta(seconds=1), "jobs.builds.run_build", 2**31 - 7)
    worker = start_worker(app)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and job.get_status(refresh=True) != "finished":
            time.sleep(0.2)
        assert job.get_status(refresh=True) == "finished"
        assert job.return_value() == "missing"  # it ran: no such build
        # No scheduler process, no stray horse: the job's horse has exited (it may take a
        # moment to be reaped after the job reads "finished"), and nothing else was forked.
        def children() -> list:
            alive = []
            for child in psutil.Process(worker.pid).children(recursive=True):
                try:
                    if child.status() != psutil.STATUS_ZOMBIE:
                        alive.append(child)
                except psutil.NoSuchProcess:
                    pass
            return alive
        assert wait_until(lambda: children() == [], timeout=10), children()
    finally:
        worker.send_signal(signal.SIGKILL)
        worker.wait(timeout=30)


# -- the audit checkpoint -------------------------------------------------------------------

def test_by_default_a_checkpoint_is_written_within_a_minute(monkeypatch, tmp_path):
    monkeypatch.delenv("AUDIT_CHECKPOINT_SECONDS", raising=False)
    every = settings_from_env(tmp_path)["AUDIT_CHECKPOINT_SECONDS"]
    # A worker's maintenance pass comes every few seconds and runs what is due.
    assert every > 0 and every + MAINTENANCE_EVERY_SECONDS <= 60


def test_the_periodic_checkpoint_is_anchored_outside_the_database(app, db_session):
    db_session.execute(delete(MaintenanceLease)
                       .where(MaintenanceLease.task == "audit_checkpoint"))
    event = record_event(db_session, action="test.periodic", actor=SYSTEM)
    config = {**app.config, **{task.setting: 0 for task in PERIODIC_TASKS},
              "AUDIT_CHECKPOINT_SECONDS": 30}
    assert run_due_tasks(db_session, config, build_queue(app)) == ["audit_checkpoint"]
    assert anchored(Path(app.config["AUDIT_ANCHOR_PATH"])) == [(event.seq, event.hash)]


def wait_until_idle(queue, pid: int, timeout: float = 60) -> None:
    """Until the worker ``pid`` waits for jobs (its signal handlers are in place then)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(w.pid == pid and w.get_state() == "idle"
               for w in Worker.all(connection=queue.connection, queue=queue)):
            return
        time.sleep(0.1)
    raise AssertionError(f"worker {pid} never became idle")


@pytest.mark.processes
def test_a_worker_anchors_the_chain_head_when_it_stops(app, queue, tmp_path):
    anchors = tmp_path / "anchors.jsonl"
    with app.app_context():
        # As far as the lease knows the periodic checkpoint has just run: only the
        # worker's shutdown can write this head down.
        claim_lease(db.session, "audit_checkpoint", 0, holder="test")
        event = record_event(db.session, action="test.shutdown", actor=SYSTEM)
        db.session.commit()
        head = (event.seq, event.hash)
        db.session.remove()
    env = {**worker_env(app), "AUDIT_ANCHOR_PATH": str(anchors),
           "AUDIT_CHECKPOINT_SECONDS": "3600"}
    with (tmp_path / "worker.log").open("w") as log:
        worker = subprocess.Popen([sys.executable, "-m", "flask", "worker"], cwd=ROOT,
                                  env=env, stdout=log, stderr=subprocess.STDOUT,
                                  start_new_session=True)
    try:
        wait_until_idle(queue, worker.pid)
        assert not anchors.exists()
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=60) == 0
        assert anchored(anchors) == [head]
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait(timeout=30)
        with app.app_context():
            db.session.execute(delete(MaintenanceLease)
                               .where(MaintenanceLease.task == "audit_checkpoint"))
            db.session.commit()
            db.session.remove()
