"""Builds on real RQ worker processes: committed data, real Redis, real PostgreSQL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from redis import Redis
from sqlalchemy import func, select, update

from dashboard.embedded import EmbeddedServices
from dashboard.extensions import db
from dashboard.memory import BuildQueue, abandon_build, settings_from
from dashboard.memory.embedders import HashingEmbedder
from dashboard.memory.maintenance import sweep_builds
from dashboard.memory.models import MemoryBuild, MemoryChunk
from dashboard.memory.queue import build_job_id
from dashboard.memory.requests import request_build
from dashboard.orbitpilot.models import ProfileFact
from dashboard.queues import build_queue
from tests.factories import GATE_VARIABLE, make_conversation
from tests.saved_memories.helpers import lock_waiters, wait_until
from tests.workers import run_build

ROOT = Path(__file__).resolve().parents[2]
CANARY = "CANARY-7f3a-do-not-leak"


def worker_env(app, gate: Path | None = None, redis_url: str | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        FLASK_APP="wsgi.py",
        DATABASE_URL=app.config["SQLALCHEMY_DATABASE_URI"],
        REDIS_URL=redis_url or app.config["REDIS_URL"],
        BUILD_QUEUE=app.config["BUILD_QUEUE"],
        BUILD_HEARTBEAT_SECONDS="0.2",
        EMBEDDER="hashing",
    )
    if gate is not None:  # its builds wait, "running", until the test opens the gate
        env.update(EMBEDDER="tests.factories:GatedEmbedder", **{GATE_VARIABLE: str(gate)})
    return env


def start_worker(app, *args: str, gate: Path | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "flask", "worker", *args], cwd=ROOT,
        env=worker_env(app, gate), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, start_new_session=True,
    )


# No periodic tasks: nothing but the worker itself may push a job.
NO_PERIODIC_TASKS = {name: "0" for name in ("BUILD_SWEEP_SECONDS", "BUILD_SCHEDULE_SECONDS",
                                            "AUDIT_CHECKPOINT_SECONDS",
                                            "ERASURE_VACUUM_SECONDS")}


def finish(proc: subprocess.Popen, timeout: float = 120) -> str:
    out, _ = proc.communicate(timeout=timeout)
    return out


def build_row(session, build_id) -> MemoryBuild:
    session.expire_all()
    return session.get(MemoryBuild, build_id)


def wait_for_status(session, build_id, statuses, timeout=60.0) -> MemoryBuild:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        session.rollback()
        row = build_row(session, build_id)
        if row.status in statuses:
            return row
        time.sleep(0.05)
    raise AssertionError(f"build {build_id} never reached {statuses}")


def chat_user(committed, pairs: int, cap: int = 4):
    user = committed.user(plan=committed.plan(cap=cap))
    make_conversation(committed.session, user,
                      [(f"question {i} {CANARY}", f"answer {i}") for i in range(pairs)])
    committed.session.add(ProfileFact(user_id=user.id, key="name", value=CANARY))
    committed.session.commit()
    return user


def requested_here(committed, queue, user_id: int, mode: str = "quick") -> int:
    """A committed build request whose job is taken off the queue, to run in this process."""
    build_id = request_build(committed.session, user_id, mode=mode).build_id
    committed.session.commit()
    queue.empty()
    return build_id


def failing_embedder(name: str, exc: BaseException) -> HashingEmbedder:
    """An embedder of a new model name (so everything must be embedded) that raises."""

    class Failing(HashingEmbedder):
        def embed(self, texts):
            raise exc

    Failing.name = name
    return Failing()


def chunk_count(session, user_id) -> int:
    session.rollback()
    return session.scalar(select(func.count()).select_from(MemoryChunk)
                          .where(MemoryChunk.user_id == user_id))


@pytest.mark.processes
def test_a_real_worker_runs_the_build_with_ids_only_and_no_content_in_logs(
        app, committed, queue):
    user = chat_user(committed, pairs=5)
    request = request_build(committed.session, user.id, mode="full")
    committed.session.commit()
    job = queue.fetch_job(f"build-{request.build_id}")
    assert job.args == (request.build_id,) and job.kwargs == {}

    output = finish(start_worker(app, "--burst"))
    row = build_row(committed.session, request.build_id)
    assert row.status == "succeeded", output
    assert (row.added, row.embedded, row.removed) == (6, 6, 0)
    assert row.resolution["cap"] == 4 and row.started_at <= row.finished_at
    assert row.source_counts["orbitpilot.chat_history"]["added"] == 5
    assert chunk_count(committed.session, user.id) == 6
    assert CANARY not in output  # worker logs carry ids and counts, never content
    assert CANARY not in repr(row.resolution) + repr(row.source_counts) + (row.error or "")


@pytest.mark.processes
def test_two_workers_never_interleave_builds_of_one_user(app, committed, queue, tmp_path):
    user = chat_user(committed, pairs=3)
    gate = tmp_path / "gate"
    first = request_build(committed.session, user.id, mode="full")
    committed.session.commit()
    worker_a = start_worker(app, "--burst", gate=gate)
    wait_for_status(committed.session, first.build_id, {"running"})
    worker_b = start_worker(app, "--burst", gate=gate)
    time.sleep(0.3)  # B is waiting on the queue before the second request exists
    second = request_build(committed.session, user.id, mode="full")
    committed.session.commit()
    assert second.build_id != first.build_id  # the first is running: this one queues
    # B has the second build's job and waits for the user's lock, which A holds.
    assert wait_until(lambda: len(lock_waiters(db.engine, user.id)) == 1), \
        "the second worker never waited for the user's lock"
    assert build_row(committed.session, first.build_id).status == "running"
    assert build_row(committed.session, second.build_id).status == "queued"
    gate.touch()
    outputs = finish(worker_a) + finish(worker_b)

    a, b = build_row(committed.session, first.build_id), build_row(committed.session,
                                                                   second.build_id)
    assert (a.status, b.status) == ("succeeded", "succeeded"), outputs
    assert b.started_at >= a.finished_at  # B waited for A's swap to commit
    assert chunk_count(committed.session, user.id) == 4
    # The stored set is exactly one build's worth: a quick update finds nothing to do.
    check = requested_here(committed, queue, user.id)
    with app.app_context():
        assert run_build(check) == "succeeded"
    row = build_row(committed.session, check)
    assert (row.added, row.removed, row.embedded) == (0, 0, 0)


def test_an_exception_mid_build_leaves_previous_chunks_and_a_failed_record(app, committed,
                                                                           queue):
    user = chat_user(committed, pairs=3)
    first = requested_here(committed, queue, user.id)
    with app.app_context():
        assert run_build(first) == "succeeded"
    before = chunk_count(committed.session, user.id)

    # The message quotes content, as real exceptions can; the record must not.
    crash = RuntimeError(f"model crashed on question 0 {CANARY}")
    second = requested_here(committed, queue, user.id, mode="full")
    with app.app_context():
        assert run_build(second, embedder=failing_embedder("exploding", crash)) == "failed"
    row = build_row(committed.session, second)
    assert row.status == "failed" and row.finished_at is not None
    assert row.error == "RuntimeError during the build"  # the kind, never the content
    assert chunk_count(committed.session, user.id) == before
    # Nothing is stuck: the next request runs.
    third = requested_here(committed, queue, user.id)
    with app.app_context():
        assert run_build(third) == "succeeded"


def test_a_build_the_sweeper_failed_meanwhile_is_not_marked_succeeded(app, committed,
                                                                     queue):
    from dashboard.memory.runner import fail_running

    user = chat_user(committed, pairs=3)
    first = requested_here(committed, queue, user.id)
    with app.app_context():
        assert run_build(first) == "succeeded"
    before = chunk_count(committed.session, user.id)
    committed.session.add(ProfileFact(user_id=user.id, key="city", value="Lyon"))
    committed.session.commit()
    second = requested_here(committed, queue, user.id, mode="full")

    class SweptMidBuild(HashingEmbedder):
        """While it embeds, the sweeper (another connection) fails the running build, as
        it does when a heartbeat is late."""

        def embed(self, texts):
            with db.engine.begin() as conn:
                conn.execute(fail_running(MemoryBuild.id == second,
                                          reason="no heartbeat for 300 s"))
            return super().embed(texts)

    SweptMidBuild.name = "swept-mid-build"
    with app.app_context():
        assert run_build(second, embedder=SweptMidBuild()) == "failed"
    row = build_row(committed.session, second)
    assert (row.status, row.error) == ("failed", "no heartbeat for 300 s")
    # The record says failed, so its swap did not land either.
    assert chunk_count(committed.session, user.id) == before


@pytest.mark.processes
def test_a_worker_killed_mid_job_leaves_a_failed_record_then_builds_again(app, committed,
                                                                          queue, tmp_path):
    user = chat_user(committed, pairs=3)
    first = request_build(committed.session, user.id, mode="full")
    committed.session.commit()
    worker = start_worker(app, "--burst", gate=tmp_path / "never")
    wait_for_status(committed.session, first.build_id, {"running"})
    # RQ puts its work horse in a session of its own, so kill both by pid: no process is
    # left to notice, only the missing heartbeat tells.
    for pid in [*work_horses(worker.pid), worker.pid]:
        os.kill(pid, signal.SIGKILL)
    worker.wait(timeout=30)
    assert chunk_count(committed.session, user.id) == 0  # the swap never committed

    time.sleep(1.0)  # heartbeats (every 0.2 s) have stopped
    with app.app_context():
        result = sweep_builds(committed.session, build_queue(app), stale_after=0.8,
                              requeue_after=3600)
        committed.session.commit()
    row = build_row(committed.session, first.build_id)
    assert row.status == "failed" and "heartbeat" in row.error
    assert result.failed >= 1

    again = request_build(committed.session, user.id, mode="quick")
    committed.session.commit()
    output = finish(start_worker(app, "--burst"))
    assert build_row(committed.session, again.build_id).status == "succeeded", output
    assert chunk_count(committed.session, user.id) == 4


@pytest.mark.processes
def test_a_killed_work_horse_is_recorded_by_the_worker_and_asked_again(app, committed,
                                                                        queue, tmp_path):
    user = chat_user(committed, pairs=3)
    request = request_build(committed.session, user.id, mode="full")
    committed.session.commit()
    gate = tmp_path / "gate"
    worker = start_worker(app, "--burst", gate=gate)
    row = wait_for_status(committed.session, request.build_id, {"running"})
    assert row is not None
    horse_pids = work_horses(worker.pid)
    assert horse_pids, "the worker forked no work horse"
    for pid in horse_pids:
        os.kill(pid, signal.SIGKILL)
    # Asked again: a new build of the user (the burst worker may have claimed it already).
    again = wait_for_build_after(committed.session, user.id, request.build_id)
    gate.touch()
    output = finish(worker)
    row = build_row(committed.session, request.build_id)
    assert row.status == "failed" and row.error.startswith("worker process terminated")
    # Its request, queued again, ran on the same worker.
    assert build_row(committed.session, again.id).status == "succeeded", output
    assert chunk_count(committed.session, user.id) == 4


def work_horses(worker_pid: int) -> list[int]:
    """The worker's child processes, read from /proc."""
    children = []
    for proc_dir in Path("/proc").iterdir():
        if not proc_dir.name.isdigit():
            continue
        try:
            ppid = int((proc_dir / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if ppid == worker_pid:
            children.append(int(proc_dir.name))
    return children


def test_a_transient_database_error_queues_the_build_again_for_rq_retry(app, committed,
                                                                         queue):
    from sqlalchemy.exc import OperationalError

    build_id = requested_here(committed, queue, chat_user(committed, pairs=2).id)
    lost = OperationalError("SELECT 1", {}, Exception("server closed the connection"))
    with app.app_context(), pytest.raises(OperationalError):  # RQ sees it and retries
        run_build(build_id, embedder=failing_embedder("flaky", lost))
    row = build_row(committed.session, build_id)
    assert (row.status, row.attempts) == ("queued", 1)
    assert row.error.startswith("database error")
    with app.app_context():  # the retry
        assert run_build(build_id) == "succeeded"
    assert build_row(committed.session, build_id).attempts == 2


def test_a_job_timeout_fails_the_build_with_the_reason(app, committed, queue):
    from rq.timeouts import JobTimeoutException

    user = chat_user(committed, pairs=2)
    build_id = requested_here(committed, queue, user.id)
    timeout = JobTimeoutException("Task exceeded maximum timeout value (900 seconds)")
    with app.app_context():
        assert run_build(build_id, embedder=failing_embedder("slow", timeout)) == "failed"
    row = build_row(committed.session, build_id)
    assert row.status == "failed" and row.error.startswith("timed out")
    assert chunk_count(committed.session, user.id) == 0


def running_build(committed, user_id: int, *, mode: str = "quick", attempts: int = 1) -> int:
    """A build record as a worker leaves it when it dies mid-build."""
    build = MemoryBuild(user_id=user_id, mode=mode, trigger="user", requested_by_id=user_id,
                        status="running", attempts=attempts, started_at=func.now(),
                        heartbeat_at=func.now())
    committed.session.add(build)
    committed.session.commit()
    return build.id


def queued_builds(session, user_id: int) -> list[MemoryBuild]:
    session.rollback()
    return session.scalars(select(MemoryBuild).where(MemoryBuild.user_id == user_id,
                                                     MemoryBuild.status == "queued")).all()


def wait_for_build_after(session, user_id: int, build_id: int,
                         timeout: float = 30.0) -> MemoryBuild:
    """A build of ``user_id`` requested after ``build_id``, in whatever state it is now."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        session.rollback()
        later = session.scalars(select(MemoryBuild).where(
            MemoryBuild.user_id == user_id, MemoryBuild.id > build_id)).first()
        if later is not None:
            return later
        time.sleep(0.05)
    raise AssertionError(f"no build of user {user_id} was requested after {build_id}")


def test_an_interrupted_build_is_asked_again_until_its_attempts_run_out(app, committed,
                                                                         queue):
    user = committed.user()
    committed.session.commit()
    assert queued_builds(committed.session, user.id) == []
    first = running_build(committed, user.id, mode="full")
    reason = "worker process terminated (signal 9)"
    with app.app_context():
        assert abandon_build(db.engine, first, reason)
    row = build_row(committed.session, first)
    assert (row.status, row.error) == ("failed", reason)
    # The same request, queued again: its mode, who asked, when, and the attempts it used.
    (again,) = queued_builds(committed.session, user.id)
    assert (again.mode, again.trigger, again.requested_by_id, again.attempts) == \
        ("full", "user", user.id, 1)
    assert again.created_at == row.created_at
    assert build_job_id(again.id) in queue.job_ids  # pushed at commit
    with app.app_context():
        assert not abandon_build(db.engine, first, reason)  # failed already: left alone

    # Interrupted on its last attempt: failed for good, and the record says so.
    committed.session.execute(update(MemoryBuild).where(MemoryBuild.id == again.id)
                              .values(status="running", attempts=3))
    committed.session.commit()
    with app.app_context():
        assert abandon_build(db.engine, again.id, reason)
    row = build_row(committed.session, again.id)
    assert row.status == "failed" and row.error.startswith(reason)
    assert "not asked again" in row.error
    assert queued_builds(committed.session, user.id) == []

    # A request made during the build is queued already: it takes the interrupted one in.
    later = request_build(committed.session, user.id, mode="quick")
    committed.session.commit()
    third = running_build(committed, user.id, mode="full")
    with app.app_context():
        assert abandon_build(db.engine, third, reason)
    assert [(b.id, b.mode) for b in queued_builds(committed.session, user.id)] == \
        [(later.build_id, "full")]


@pytest.mark.processes
def test_a_worker_that_loses_redis_mid_build_lives_on_and_builds_it_again(app, committed,
                                                                            queue, tmp_path):
    # A Valkey of this test's own, to kill: the suite's serves every other test. For the
    # worker it is an external Redis (REDIS_URL), not one of its to start again.
    own = EmbeddedServices(tmp_path / "services")
    redis_url = own.ensure(postgres=False, redis=True).redis
    log = tmp_path / "worker.log"
    worker = None
    try:
        user = chat_user(committed, pairs=3)
        build_id = requested_here(committed, queue, user.id, mode="full")
        BuildQueue(lambda: Redis.from_url(redis_url), lambda: settings_from(app.config)).push(
            [("build", build_id)])
        gate = tmp_path / "gate"
        worker = subprocess.Popen(
            [sys.executable, "-m", "flask", "worker"], cwd=ROOT,
            env={**worker_env(app, gate, redis_url), **NO_PERIODIC_TASKS},
            stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)
        wait_for_status(committed.session, build_id, {"running"})
        os.kill(own.valkey.pid(), signal.SIGKILL)

        row = wait_for_status(committed.session, build_id, {"failed"}, timeout=30)
        assert "Redis" in row.error, row.error
        assert worker.poll() is None, log.read_text()[-3000:]  # it waits for Redis
        (again,) = queued_builds(committed.session, user.id)
        own.ensure(postgres=False, redis=True)  # Redis is back
        gate.touch()
        assert wait_for_status(committed.session, again.id, {"succeeded", "failed"},
                               timeout=60).status == "succeeded", log.read_text()[-3000:]
        assert chunk_count(committed.session, user.id) == 4
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=30)
        assert CANARY not in log.read_text()
    finally:
        if worker is not None and worker.poll() is None:
            worker.kill()
        own.stop(force=True)
