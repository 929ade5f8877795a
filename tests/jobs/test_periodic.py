"""Periodic work runs once per interval across all workers, and nothing a worker starts
outlives it: RQ's scheduled retries move from a thread, not from a forked scheduler."""

from __future__ import annotations

import signal
import threading
import time
import uuid
from datetime import timedelta

import psutil
import pytest
from sqlalchemy import delete

from dashboard.extensions import db
from dashboard.leases import MaintenanceLease, claim_lease
from dashboard.queues import build_queue
from jobs.periodic import PERIODIC_TASKS, run_due_tasks
from tests.memory.test_worker import start_worker


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
        idle_children = psutil.Process(worker.pid).children(recursive=True)
        assert idle_children == []  # no scheduler process, no stray horse
    finally:
        worker.send_signal(signal.SIGKILL)
        worker.wait(timeout=30)
