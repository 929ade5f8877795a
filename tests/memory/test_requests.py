"""Build requests: a row first, merged per user, pushed to RQ only after commit."""

import threading
from datetime import UTC, datetime, timedelta

import pytest
from rq.job import Job
from sqlalchemy import func, select, update

from dashboard.auth.models import User
from dashboard.extensions import db
from dashboard.memory.maintenance import (
    request_scheduled_builds,
    sweep_builds,
)
from dashboard.memory.models import MemoryBuild
from dashboard.memory.queue import build_job_id
from dashboard.memory.requests import (
    BuildRequestError,
    RateLimited,
    build_for_change,
    request_build,
    request_builds_for_plan,
    request_user_update,
)
from dashboard.orbitpilot.conversations import end_conversation, request_idle_conversation_builds
from dashboard.orbitpilot.models import Conversation
from dashboard.plans.models import Plan
from dashboard.queues import build_queue, redis_client
from tests.factories import (
    default_plan,
    make_blink,
    make_conversation,
    make_plan,
    make_user,
    settle,
)


def queued(session, user_id):
    return session.scalars(select(MemoryBuild).where(MemoryBuild.user_id == user_id,
                                                     MemoryBuild.status == "queued")).all()


def test_second_request_merges_and_full_wins(db_session, queue):
    user = make_user(db_session)
    first = request_build(db_session, user.id, mode="quick", trigger="user")
    second = request_build(db_session, user.id, mode="full", trigger="admin")
    third = request_build(db_session, user.id, mode="quick", trigger="schedule")
    assert not first.merged and second.merged and third.merged
    assert first.build_id == second.build_id == third.build_id
    (build,) = queued(db_session, user.id)
    db_session.refresh(build)
    assert (build.mode, build.trigger) == ("full", "user")


def test_job_is_pushed_after_commit_with_ids_only(db_session, queue):
    user = make_user(db_session)
    request = request_build(db_session, user.id)
    assert queue.job_ids == []  # not before the commit
    db_session.commit()
    assert queue.job_ids == [build_job_id(request.build_id)]
    job = queue.fetch_job(build_job_id(request.build_id))
    assert job.func_name == "jobs.builds.run_build"
    assert job.args == (request.build_id,) and job.kwargs == {}
    # A merged request pushes nothing new.
    request_build(db_session, user.id, mode="full")
    db_session.commit()
    assert queue.job_ids == [build_job_id(request.build_id)]


def test_rollback_pushes_nothing(db_session, queue):
    user = make_user(db_session)
    request_build(db_session, user.id)
    db_session.rollback()
    db_session.commit()
    assert queue.job_ids == []


def test_bad_mode_or_trigger_is_refused(db_session):
    user = make_user(db_session)
    with pytest.raises(BuildRequestError, match="mode must be one of quick, full"):
        request_build(db_session, user.id, mode="partial")
    with pytest.raises(BuildRequestError, match="trigger"):
        request_build(db_session, user.id, trigger="cosmic-ray")


def test_user_update_is_rate_limited(db_session):
    user = make_user(db_session)
    request_user_update(db_session, user, interval=60)
    with pytest.raises(RateLimited) as refused:
        request_user_update(db_session, user, interval=60)
    assert 0 < refused.value.retry_after <= 60
    later = datetime.now(UTC) + timedelta(seconds=61)
    assert request_user_update(db_session, user, interval=60, now=later).merged


def test_plan_fan_out_goes_in_batches_and_covers_default_plan_users(db_session, queue):
    free = default_plan(db_session)
    on_free = [make_user(db_session) for _ in range(3)]  # plan_id NULL
    on_free.append(make_user(db_session, plan=free))     # explicit row
    other = make_user(db_session, plan=make_plan(db_session))
    batches = list(request_builds_for_plan(db_session, free, mode="full", batch_size=3))
    mine = {u.id for u in on_free}
    requested = set(db_session.scalars(select(MemoryBuild.user_id).where(
        MemoryBuild.trigger == "admin", MemoryBuild.mode == "full")))
    assert mine <= requested and other.id not in requested
    assert sum(batches) == len(requested) and max(batches) <= 3


def test_ending_a_conversation_requests_a_build(db_session):
    user = make_user(db_session)
    conv, _ = make_conversation(db_session, user, [("q", "a")])
    request = end_conversation(db_session, conv)
    assert conv.status == "ended"
    build = db_session.get(MemoryBuild, request.build_id)
    assert (build.trigger, build.mode, build.status) == ("conversation_end", "quick", "queued")


def test_idle_conversations_request_one_build_once(db_session):
    user = make_user(db_session)
    conv, _ = make_conversation(db_session, user, [("q", "a")])
    db_session.execute(update(Conversation).where(Conversation.id == conv.id).values(
        last_activity_at=func.now() - timedelta(hours=2)))
    assert request_idle_conversation_builds(db_session, idle_minutes=30) >= 1
    assert [b.trigger for b in queued(db_session, user.id)] == ["conversation_idle"]
    db_session.execute(update(MemoryBuild).where(MemoryBuild.user_id == user.id).values(
        status="succeeded"))
    request_idle_conversation_builds(db_session, idle_minutes=30)
    assert queued(db_session, user.id) == []  # already requested since that activity


def _built(db_session, user_id, *, read_at, finished_at):
    db_session.execute(update(MemoryBuild).where(MemoryBuild.user_id == user_id).values(
        status="succeeded", inputs_read_at=read_at, finished_at=finished_at))


def test_schedule_requests_users_whose_inputs_changed(db_session):
    user = make_user(db_session)
    _, messages = make_conversation(db_session, user, [("q", "a")])
    quiet = make_user(db_session)  # no content, no builds
    request_scheduled_builds(db_session, margin_seconds=0)
    assert len(queued(db_session, user.id)) == 1 and queued(db_session, quiet.id) == []
    later = func.now() + timedelta(minutes=1)
    _built(db_session, user.id, read_at=later, finished_at=later)
    request_scheduled_builds(db_session, margin_seconds=0)
    assert queued(db_session, user.id) == []
    db_session.execute(update(type(messages[0])).where(type(messages[0]).id == messages[0].id)
                       .values(updated_at=func.now() + timedelta(minutes=5)))
    request_scheduled_builds(db_session, margin_seconds=0)
    assert len(queued(db_session, user.id)) == 1
    assert request_scheduled_builds(db_session, margin_seconds=0, everyone=True) >= 2


def test_schedule_compares_with_when_the_build_read_its_inputs_not_its_finish(db_session):
    """A change made while a build ran is not in that build: the schedule requests one."""
    user = make_user(db_session)
    _, messages = make_conversation(db_session, user, [("q", "a")])
    request_scheduled_builds(db_session, margin_seconds=0)
    _built(db_session, user.id, read_at=func.now() - timedelta(minutes=10),
           finished_at=func.now() + timedelta(minutes=10))
    # Flagged after the build read its inputs, before it finished (bulk, so no request
    # is made by the change itself: the schedule is the only net here).
    db_session.execute(update(type(messages[0])).where(type(messages[0]).id == messages[0].id)
                       .values(not_remembered=True, updated_at=func.now()))
    assert request_scheduled_builds(db_session, margin_seconds=0) >= 1
    assert [b.trigger for b in queued(db_session, user.id)] == ["schedule"]


def test_schedule_sees_a_plan_switch_and_a_cap_change(db_session):
    plus, other = make_plan(db_session, cap=5), make_plan(db_session, cap=3)
    mover, stayer = make_user(db_session, plan=plus), make_user(db_session, plan=other)
    for user in (mover, stayer):
        make_conversation(db_session, user, [("q", "a")])
    request_scheduled_builds(db_session, margin_seconds=0)
    for user in (mover, stayer):
        _built(db_session, user.id, read_at=func.now() - timedelta(minutes=1),
               finished_at=func.now())
    # Bulk statements: the triggers stamp the change, no ORM listener requests a build.
    db_session.execute(update(User).where(User.id == mover.id).values(plan_id=None))
    db_session.execute(update(Plan).where(Plan.id == other.id).values(included_sources=4))
    assert request_scheduled_builds(db_session, margin_seconds=0) == 2
    assert [b.trigger for b in queued(db_session, mover.id)] == ["schedule"]
    assert [b.trigger for b in queued(db_session, stayer.id)] == ["schedule"]


def test_sweeper_fails_silent_running_builds_and_pushes_lost_queued_ones(app, db_session, queue):
    stuck_user, waiting_user = make_user(db_session), make_user(db_session)
    stuck = MemoryBuild(user_id=stuck_user.id, mode="quick", trigger="user", status="running")
    db_session.add(stuck)
    db_session.flush()
    db_session.execute(update(MemoryBuild).where(MemoryBuild.id == stuck.id).values(
        heartbeat_at=func.now() - timedelta(minutes=5)))
    waiting = MemoryBuild(user_id=waiting_user.id, mode="quick", trigger="user",
                          status="queued")
    db_session.add(waiting)  # as if Redis was down: no job was ever pushed
    db_session.flush()
    db_session.execute(update(MemoryBuild).where(MemoryBuild.id == waiting.id).values(
        created_at=func.now() - timedelta(minutes=5)))

    result = sweep_builds(db_session, build_queue(app), stale_after=60, requeue_after=30)
    assert (result.failed, result.requeued) == (1, 1)
    db_session.refresh(stuck)
    assert stuck.status == "failed" and "heartbeat" in stuck.error
    # The stuck build's request is queued again, so its change still gets built.
    assert [(b.mode, b.trigger) for b in queued(db_session, stuck_user.id)] == [("quick", "user")]
    assert Job.exists(build_job_id(waiting.id), connection=redis_client())
    # A second pass finds the job alive and pushes nothing.
    again = sweep_builds(db_session, build_queue(app), stale_after=60, requeue_after=30)
    assert again.requeued == 0


def test_a_live_job_of_another_queue_with_the_same_id_does_not_hide_a_lost_one(
        app, db_session, queue):
    """Another test run (or deployment) on the same Redis reuses build ids: its live
    job ``build-N`` is not this queue's, so this queue's lost request is still pushed."""
    from rq import Queue

    user = make_user(db_session)
    waiting = MemoryBuild(user_id=user.id, mode="quick", trigger="user", status="queued")
    db_session.add(waiting)
    db_session.flush()
    db_session.execute(update(MemoryBuild).where(MemoryBuild.id == waiting.id).values(
        created_at=func.now() - timedelta(minutes=5)))
    other = Queue(f"{queue.name}-another-run", connection=redis_client())
    other.enqueue("jobs.builds.run_build", waiting.id, job_id=build_job_id(waiting.id))
    try:
        result = sweep_builds(db_session, build_queue(app), stale_after=60, requeue_after=30)
        assert result.requeued == 1
        assert Job.fetch(build_job_id(waiting.id), connection=redis_client()).origin == \
            queue.name
    finally:
        other.delete(delete_jobs=True)


def test_redis_down_loses_no_request(app, committed):
    """The request commits although Redis is unreachable; the sweeper pushes it later."""
    from dashboard import create_app
    from tests.conftest import make_test_config

    user = committed.user()
    committed.session.commit()
    broken = create_app(make_test_config(
        SQLALCHEMY_DATABASE_URI=app.config["SQLALCHEMY_DATABASE_URI"],
        REDIS_URL="unix:///nonexistent/redis.sock"))
    with broken.app_context():
        request = request_build(db.session, user.id)
        db.session.commit()  # no exception: the row is the request
        db.session.remove()
    queue = build_queue(app).rq()
    assert build_job_id(request.build_id) not in queue.job_ids
    assert sweep_builds(committed.session, build_queue(app), requeue_after=0).requeued >= 1
    committed.session.commit()
    assert build_job_id(request.build_id) in queue.job_ids
    queue.empty()


def test_fifty_simultaneous_requests_make_one_build(app, committed):
    user_id = committed.user().id
    committed.session.commit()
    queue = build_queue(app).rq()
    queue.empty()
    barrier = threading.Barrier(50)
    outcomes: list[bool] = []

    def ask(mode: str) -> None:
        with app.app_context():
            barrier.wait()
            outcomes.append(request_build(db.session, user_id, mode=mode).merged)
            db.session.commit()
            db.session.remove()

    threads = [threading.Thread(target=ask, args=("full" if i == 17 else "quick",))
               for i in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    builds = committed.session.scalars(select(MemoryBuild).where(
        MemoryBuild.user_id == user_id)).all()
    assert len(builds) == 1 and builds[0].mode == "full"
    assert outcomes.count(False) == 1 and len(outcomes) == 50
    assert queue.job_ids == [build_job_id(builds[0].id)]
    queue.empty()


# -- the request a write's flush made, reused (build_for_change) ------------------------------

def test_a_write_reuses_the_request_its_flush_made_for_that_user(db_session, queue):
    one, two = make_user(db_session), make_user(db_session)
    settle(db_session)
    make_blink(db_session, one, "a change of one's content")  # the listener's request
    first = build_for_change(db_session, one.id)
    assert [b.id for b in queued(db_session, one.id)] == [first.build_id]
    assert not first.merged
    # Another user has no such request: one is made, the first is untouched.
    other = build_for_change(db_session, two.id)
    assert other.user_id == two.id and other.build_id != first.build_id
    assert build_for_change(db_session, one.id) == first


def test_a_request_rolled_back_with_its_savepoint_is_not_reused(db_session, queue):
    user = make_user(db_session)
    settle(db_session)
    savepoint = db_session.begin_nested()
    make_blink(db_session, user, "undone")
    undone = build_for_change(db_session, user.id)
    savepoint.rollback()
    again = build_for_change(db_session, user.id)
    assert again.build_id != undone.build_id
    assert [b.id for b in queued(db_session, user.id)] == [again.build_id]


def test_a_request_made_first_in_a_transaction_then_rolled_back_is_not_reused(app, committed):
    """The request is the transaction's first statement: what it belongs to is the
    transaction that statement began, so the rollback drops it."""
    session = committed.session
    user_id = committed.user().id
    session.commit()  # no transaction now: the request's INSERT begins the next one
    assert session().get_transaction() is None
    first = request_build(session, user_id, trigger="admin")
    session.rollback()
    again = build_for_change(session, user_id)
    assert again.build_id != first.build_id and not again.merged
    session.rollback()


def test_after_a_commit_a_later_write_asks_again(app, committed, queue):
    session = committed.session
    user = committed.user()
    make_blink(session, user, "first")
    first = build_for_change(session, user.id)
    session.commit()
    make_blink(session, user, "second")
    later = build_for_change(session, user.id)
    assert later.build_id == first.build_id and later.merged  # merged into the queued row
    session.commit()


# -- which queue a commit pushes to ---------------------------------------------------------

def test_every_kind_of_session_finds_the_apps_queue(app, db_session):
    from sqlalchemy.orm import Session

    from dashboard.memory.queue import queue_for

    ours = build_queue(app)
    with app.app_context():
        engine = db.engine
        assert queue_for(db.session) is ours  # the app's scoped session (here: the test's)
        with Session(engine) as plain, \
                Session(engine.execution_options(isolation_level="AUTOCOMMIT")) as opted, \
                Session(binds={MemoryBuild: engine}) as bound:
            assert queue_for(plain) is queue_for(opted) is queue_for(bound) is ours
        with engine.connect() as conn, Session(bind=conn) as on_a_connection:
            assert queue_for(on_a_connection) is ours


def test_an_app_that_is_dropped_is_not_kept_alive_by_its_queue(app):
    """The registry holds engines weakly and each queue reaches its app weakly."""
    import gc
    import weakref

    from dashboard import create_app
    from dashboard.memory.queue import _BOUND
    from tests.conftest import make_test_config

    scratch = create_app(make_test_config())
    with scratch.app_context():
        assert _BOUND[db.engine] is build_queue(scratch)
    gone = weakref.ref(scratch)
    del scratch
    gc.collect()
    assert gone() is None
