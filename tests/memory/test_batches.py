"""Builds asked for in one commit go to workers in batches (``jobs.builds.run_builds``):
one job, one fork and one connection for many small users, each build still claimed, run
and recorded on its own; the sweeper knows a batched build is alive while its batch is."""

from __future__ import annotations

from dataclasses import replace

import pytest
from rq.registry import FinishedJobRegistry
from sqlalchemy import select, update

from dashboard.extensions import db
from dashboard.memory import execute_builds, settings_from
from dashboard.memory.maintenance import sweep_builds
from dashboard.memory.models import MemoryBuild
from dashboard.memory.requests import request_builds
from dashboard.orbitpilot.models import ProfileFact
from dashboard.queues import build_queue
from jobs.builds import build_interrupted
from tests.factories import make_user
from tests.memory.test_worker import CANARY, finish, start_worker


def users_with_a_fact(session, count: int, make) -> list:
    users = [make() for _ in range(count)]
    for user in users:
        session.add(ProfileFact(user_id=user.id, key="name", value=CANARY))
    session.flush()
    return users


def statuses(session, build_ids) -> dict[int, str]:
    session.expire_all()
    return dict(session.execute(select(MemoryBuild.id, MemoryBuild.status)
                                .where(MemoryBuild.id.in_(build_ids))).all())


def test_builds_asked_in_one_commit_go_out_in_batches_of_ids(app, db_session, queue,
                                                             monkeypatch):
    monkeypatch.setitem(app.config, "BUILD_BATCH", 2)
    users = [make_user(db_session) for _ in range(5)]
    requests = request_builds(db_session, [u.id for u in users], trigger="schedule")
    db_session.commit()
    jobs = sorted(queue.get_jobs(), key=lambda j: j.args[0][0])
    ids = [r.build_id for r in requests]
    assert [j.func_name for j in jobs] == ["jobs.builds.run_builds"] * 3
    assert [j.args for j in jobs] == [(ids[0:2],), (ids[2:4],), (ids[4:],)]
    assert all(isinstance(i, int) for j in jobs for i in j.args[0])
    # One build alone is a job of its own, as before.
    queue.empty()
    (alone,) = request_builds(db_session, [make_user(db_session).id])
    db_session.commit()
    assert queue.job_ids == [f"build-{alone.build_id}"]


def test_the_sweeper_leaves_a_batched_build_alone_while_its_batch_lives(app, db_session,
                                                                       queue):
    users = [make_user(db_session) for _ in range(3)]
    request_builds(db_session, [u.id for u in users])
    db_session.commit()
    assert len(queue.job_ids) == 1
    assert sweep_builds(db_session, build_queue(app), requeue_after=0).requeued == 0
    queue.empty()  # the batch job is lost: its builds are pushed again, as a batch
    assert sweep_builds(db_session, build_queue(app), requeue_after=0).requeued == 3
    db_session.commit()
    (job,) = queue.get_jobs()
    assert job.func_name == "jobs.builds.run_builds" and len(job.args[0]) == 3


@pytest.mark.processes
def test_a_real_worker_builds_a_batch_in_one_job(app, committed, queue):
    session = committed.session
    users = users_with_a_fact(session, 6, committed.user)
    requests = request_builds(session, [u.id for u in users], mode="full")
    session.commit()
    (job_id,) = queue.job_ids
    # Earlier tests of this process may have left finished jobs of their own here.
    finished = set(FinishedJobRegistry(queue=queue).get_job_ids())
    output = finish(start_worker(app, "--burst"))
    assert set(statuses(session, [r.build_id for r in requests]).values()) == {"succeeded"}
    rows = session.scalars(select(MemoryBuild).where(
        MemoryBuild.id.in_([r.build_id for r in requests]))).all()
    assert all(r.added == 1 and r.started_at and r.heartbeat_at for r in rows)
    # One job for the six.
    assert set(FinishedJobRegistry(queue=queue).get_job_ids()) - finished == {job_id}
    assert CANARY not in output


def test_a_batch_interrupted_asks_again_only_the_build_that_was_running(app, committed,
                                                                        queue):
    session = committed.session
    users = users_with_a_fact(session, 3, committed.user)
    requests = request_builds(session, [u.id for u in users])
    session.commit()
    (job,) = queue.get_jobs()
    ids = [r.build_id for r in requests]
    session.execute(update(MemoryBuild).where(MemoryBuild.id == ids[1])
                    .values(status="running", attempts=1))
    session.commit()
    assert build_interrupted(job, "worker process terminated (signal 9)") is True
    found = statuses(session, ids)
    assert found == {ids[0]: "queued", ids[1]: "failed", ids[2]: "queued"}
    again = session.scalars(select(MemoryBuild).where(
        MemoryBuild.user_id == users[1].id, MemoryBuild.status == "queued")).one()
    assert again.attempts == 1 and again.id != ids[1]


def test_a_batch_past_its_time_budget_hands_the_rest_to_a_new_job(app, committed, queue):
    session = committed.session
    users = users_with_a_fact(session, 3, committed.user)
    ids = [r.build_id for r in request_builds(session, [u.id for u in users])]
    session.commit()
    handed: list[list[int]] = []
    settings = replace(settings_from(app.config), job_timeout=0)
    outcomes = execute_builds(db.engine, ids, settings=settings, resubmit=handed.append)
    assert outcomes == {"succeeded": 1, "resubmitted": 2}
    assert handed == [ids[1:]]
    assert statuses(session, ids) == {ids[0]: "succeeded", ids[1]: "queued",
                                      ids[2]: "queued"}


def test_a_small_users_build_costs_the_same_statements_in_a_batch_of_any_size(
        app, committed, queue, count_queries):
    session = committed.session
    users = users_with_a_fact(session, 5, committed.user)
    ids = [r.build_id for r in request_builds(session, [u.id for u in users])]
    session.commit()
    settings = settings_from(app.config)
    with count_queries() as one:
        assert execute_builds(db.engine, ids[:1], settings=settings) == {"succeeded": 1}
    with count_queries() as four:
        assert execute_builds(db.engine, ids[1:], settings=settings) == {"succeeded": 4}
    # Read and lock the owner, claim, build, record, release: no round trip more per user.
    assert one.count <= 16
    assert four.count == 4 * one.count


def test_a_cold_shutdown_during_a_batch_records_its_running_build(app, committed, queue):
    from types import SimpleNamespace

    from jobs.worker import _record_interrupted_build

    session = committed.session
    users = users_with_a_fact(session, 2, committed.user)
    ids = [r.build_id for r in request_builds(session, [u.id for u in users])]
    session.commit()
    (job,) = queue.get_jobs()
    session.execute(update(MemoryBuild).where(MemoryBuild.id == ids[0])
                    .values(status="running", attempts=1))
    session.commit()
    # What RQ's worker tells us after it killed the work horse: the job it was running.
    worker = SimpleNamespace(get_current_job_id=lambda: job.id, connection=queue.connection)
    _record_interrupted_build(app, worker)
    session.expire_all()
    first = session.get(MemoryBuild, ids[0])
    assert first.status == "failed" and first.error == "worker shut down during the build"
    assert statuses(session, ids)[ids[1]] == "queued"
