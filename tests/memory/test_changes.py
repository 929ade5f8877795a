"""Every change that alters what a user's next build holds requests that build, in the
same transaction: content, flags, deletions, a plan switch, a cap or an assignment
(fanned out by a job), and a change made while a build runs."""

from __future__ import annotations

import threading
from datetime import timedelta

from sqlalchemy import func, select, update

from dashboard.auth.models import User
from dashboard.blinks.models import Blink
from dashboard.documents.models import Document
from dashboard.extensions import db
from dashboard.memory.embedders import HashingEmbedder
from dashboard.memory.maintenance import fan_out_plan_builds, sweep_builds
from dashboard.memory.models import MemoryBuild, MemoryChunk
from dashboard.memory.queue import build_job_id, fanout_job_id
from dashboard.memory.requests import request_build
from dashboard.memory.runner import DEAD_PREDECESSOR
from dashboard.memory.search import search_memory
from dashboard.orbitpilot.models import Message, ProfileFact
from dashboard.plans.models import Plan, SourceAssignment
from dashboard.plans.sentences import state_sentence
from dashboard.plans.services import resolve_build_sources
from dashboard.queues import build_queue
from dashboard.saved_memories.models import Memory
from dashboard.sources import CHAT_HISTORY
from tests.conftest import csrf_from
from tests.factories import (
    PASSWORD,
    PausedEmbedder,
    default_plan,
    make_conversation,
    make_plan,
    make_user,
    plans_of,
)
from tests.workers import run_build


def queued(session, user_id) -> list[MemoryBuild]:
    return session.scalars(select(MemoryBuild).where(MemoryBuild.user_id == user_id,
                                                     MemoryBuild.status == "queued")).all()


def settle(session) -> None:
    """Pretend every queued build ran, so the next change must request a new one."""
    session.execute(update(MemoryBuild).where(MemoryBuild.status == "queued")
                    .values(status="succeeded"))


def requested_by_change(session, user, change) -> list[str]:
    settle(session)
    change()
    session.flush()
    return [b.trigger for b in queued(session, user.id)]


def test_content_flags_and_deletions_request_a_build_in_the_same_flush(db_session):
    user = make_user(db_session)
    blink = Blink(user_id=user.id, title="t", content="c")
    fact = ProfileFact(user_id=user.id, key="city", value="Lyon")
    memory = Memory(owner_id=user.id, content="remember me")
    conversation, messages = make_conversation(db_session, user, [("q", "a")])

    assert requested_by_change(db_session, user, lambda: db_session.add_all(
        [blink, fact, memory])) == ["content_change"]
    assert requested_by_change(db_session, user,
                               lambda: setattr(blink, "content", "edited")) == ["content_change"]
    assert requested_by_change(db_session, user, lambda: setattr(
        blink, "excluded_from_memory", True)) == ["content_change"]
    assert requested_by_change(db_session, user,
                               lambda: setattr(fact, "value", "Paris")) == ["content_change"]
    assert requested_by_change(db_session, user,
                               lambda: setattr(memory, "status", "deleted")) == ["content_change"]
    assert requested_by_change(db_session, user, lambda: setattr(
        messages[0], "not_remembered", True)) == ["content_change"]
    assert requested_by_change(db_session, user, lambda: db_session.add(Document(
        user_id=user.id, title="d", content="text"))) == ["content_change"]
    assert requested_by_change(db_session, user,
                               lambda: db_session.delete(blink)) == ["content_change"]
    assert requested_by_change(db_session, user,
                               lambda: db_session.delete(conversation)) == ["content_change"]


def test_what_does_not_change_the_next_build_requests_nothing(db_session):
    user = make_user(db_session)
    blink = Blink(user_id=user.id, title="t", content="c")
    db_session.add(blink)
    _, messages = make_conversation(db_session, user, [("q", "a")])
    # A new turn waits for the conversation's end or idleness, and a change of a
    # column no source reads is no change at all.
    assert requested_by_change(db_session, user, lambda: db_session.add(Message(
        conversation_id=messages[0].conversation_id, user_id=user.id, role="user",
        position=5, content="another turn"))) == []
    assert requested_by_change(db_session, user,
                               lambda: setattr(blink, "updated_at", func.now())) == []
    assert requested_by_change(db_session, user,
                               lambda: setattr(user, "last_login_at", func.now())) == []


def test_a_plan_switch_requests_the_users_build(db_session):
    user = make_user(db_session, plan=make_plan(db_session, cap=5))
    assert requested_by_change(db_session, user,
                               lambda: setattr(user, "plan_id", None)) == ["plan_change"]
    db_session.refresh(user)
    assert user.plan_changed_at is not None  # the trigger's stamp, for the safety net


def test_cap_and_assignment_changes_fan_out_through_a_job_after_commit(db_session, queue):
    plan = make_plan(db_session, cap=3)
    members = [make_user(db_session, plan=plan) for _ in range(3)]
    outsider = make_user(db_session)
    db_session.commit()
    queue.empty()

    plan.included_sources = 4
    db_session.flush()
    assert queue.job_ids == []  # nothing before the commit
    db_session.commit()
    assert queue.job_ids == [fanout_job_id(plan.id)]
    job = queue.fetch_job(fanout_job_id(plan.id))
    assert (job.func_name, job.args) == ("jobs.builds.fan_out_plan", (plan.id,))

    queue.empty()
    db_session.add(SourceAssignment(plan_id=plan.id, source_key="blink.blinks", enabled=False))
    db_session.commit()
    assert queue.job_ids == [fanout_job_id(plan.id)]
    assignment = db_session.scalars(select(SourceAssignment)
                                    .where(SourceAssignment.plan_id == plan.id)).one()
    for change in (lambda: setattr(assignment, "enabled", True),
                   lambda: db_session.delete(assignment)):
        queue.empty()
        change()
        db_session.commit()
        assert queue.job_ids == [fanout_job_id(plan.id)]

    # The job: one build per user of the plan, none for anyone else.
    assert fan_out_plan_builds(db_session, plan.id, batch_size=500) == 3
    for user in members:
        assert [b.trigger for b in queued(db_session, user.id)] == ["plan_change"]
    assert queued(db_session, outsider.id) == []
    db_session.refresh(plan)
    assert plan.fanned_out_at == plan.memory_changed_at is not None


def test_the_default_plan_fans_out_to_users_without_a_plan_too(db_session):
    free = default_plan(db_session)
    implicit, explicit = make_user(db_session), make_user(db_session, plan=free)
    free.included_sources = 4
    db_session.flush()
    assert fan_out_plan_builds(db_session, free.id, batch_size=500) >= 2
    for user in (implicit, explicit):
        assert [b.trigger for b in queued(db_session, user.id)] == ["plan_change"]


def test_a_lost_fan_out_is_pushed_again_by_the_sweeper(app, db_session, queue):
    plan = make_plan(db_session, cap=3)
    make_user(db_session, plan=plan)
    plan.included_sources = 2
    db_session.commit()
    queue.empty()  # as if Redis lost the job
    result = sweep_builds(db_session, build_queue(app), requeue_after=0)
    assert result.fanouts == 1
    assert fanout_job_id(plan.id) in queue.job_ids
    fan_out_plan_builds(db_session, plan.id, batch_size=500)
    queue.empty()
    assert sweep_builds(db_session, build_queue(app), requeue_after=0).fanouts == 0  # caught up


def test_a_savepoint_rollback_keeps_the_outer_transactions_pushes(db_session, queue):
    outer, inner, kept = make_user(db_session), make_user(db_session), make_user(db_session)
    first = request_build(db_session, outer.id)
    try:
        with db_session.begin_nested():
            request_build(db_session, inner.id)
            raise RuntimeError("the savepoint fails")
    except RuntimeError:
        pass
    with db_session.begin_nested():  # a savepoint that is released keeps its request
        third = request_build(db_session, kept.id)
    db_session.commit()
    (job,) = queue.get_jobs()  # two builds asked in one commit: one batch job
    assert job.func_name == "jobs.builds.run_builds"
    assert sorted(job.args[0]) == sorted([first.build_id, third.build_id])
    assert queued(db_session, inner.id) == []


def test_nothing_is_pushed_before_the_outermost_commit(db_session, queue):
    user, plan = make_user(db_session), make_plan(db_session, cap=3)
    request_build(db_session, user.id)
    with db_session.begin_nested():  # a savepoint released is not a commit
        pass
    from dashboard.audit.services import SYSTEM
    from dashboard.plans.editing import PlanFields, update_plan

    update_plan(db_session, plan, PlanFields(name=plan.name, slug=plan.slug,
                                             included_sources=4),
                actor=SYSTEM)  # flushes in a savepoint
    assert queue.job_ids == []
    db_session.commit()
    assert len(queue.job_ids) == 2


def test_a_released_savepoint_then_an_outer_rollback_pushes_nothing(db_session, queue):
    user = make_user(db_session)
    db_session.commit()
    with db_session.begin_nested():
        request_build(db_session, user.id)
    db_session.rollback()
    db_session.commit()
    assert queue.job_ids == []


def test_the_pushed_job_carries_the_configured_timeout_and_retries(app, db_session, queue):
    user = make_user(db_session)
    request = request_build(db_session, user.id)
    db_session.commit()
    job = queue.fetch_job(build_job_id(request.build_id))
    assert job.timeout == app.config["BUILD_JOB_TIMEOUT"]
    assert job.retries_left == app.config["BUILD_MAX_ATTEMPTS"] - 1
    assert job.retry_intervals == app.config["BUILD_RETRY_INTERVALS"]


# -- end to end, with committed data and real builds ------------------------------------

def sign_in(client, email: str) -> None:
    token = csrf_from(client, "/auth/signin")
    response = client.post("/auth/signin", data={"email": email, "password": PASSWORD,
                                                 "csrf_token": token})
    assert response.status_code == 302


def chat_chunks(user_id: int, query: str) -> list[str]:
    hits = search_memory(db.session, user_id, query, 10, embedder=HashingEmbedder())
    db.session.rollback()
    return [h.source_key for h in hits if h.source_key == CHAT_HISTORY]


def test_moving_a_user_from_plus_to_free_forgets_their_chat_at_the_build_it_requests(
        app, committed, queue):
    plus = committed.plan(name="Plus (test)", cap=5)
    user = committed.user(plan=plus)
    admin = committed.user(role="admin")
    make_conversation(committed.session, user, [("Which tram goes to Belém?", "Tram 15.")])
    committed.session.commit()
    first = request_build(committed.session, user.id)
    committed.session.commit()
    with app.app_context():
        assert run_build(first.build_id) == "succeeded"
        assert chat_chunks(user.id, "tram Belém") == [CHAT_HISTORY]

    client = app.test_client()
    sign_in(client, admin.email)
    token = csrf_from(client, f"/admin/user/edit/?id={user.id}")
    response = client.post(f"/admin/user/edit/?id={user.id}", data={
        "role": "user", "plan_ref": "", "active": "y", "csrf_token": token})
    assert response.status_code == 302

    committed.session.expire_all()
    (build,) = queued(committed.session, user.id)
    assert build.trigger == "plan_change"  # requested by the edit itself, nothing else
    with app.app_context():
        assert run_build(build.id) == "succeeded"
        assert chat_chunks(user.id, "tram Belém") == []
        moved = db.session.get(User, user.id)
        resolution = resolve_build_sources(moved, plans_of(db.session))
        sentence = state_sentence(resolution.get(CHAT_HISTORY), resolution)
        db.session.rollback()
    assert sentence.startswith("Not remembered on the Free plan")


def test_a_message_flagged_during_a_running_build_is_excluded_by_the_build_that_follows(
        app, committed, queue):
    user = committed.user(plan=committed.plan(cap=4))
    _, messages = make_conversation(committed.session, user, [
        ("q0 about Lisbon", "a0"), ("q1 about Porto", "a1"), ("q2 about Faro", "a2")])
    committed.session.commit()
    flagged_id = messages[2].id  # the user turn of pair 1
    first = request_build(committed.session, user.id)
    committed.session.commit()
    queue.empty()

    paused = PausedEmbedder(hold=30)
    outcome: list[str] = []

    def run_first() -> None:
        with app.app_context():
            outcome.append(run_build(first.build_id, embedder=paused))

    runner = threading.Thread(target=run_first)
    runner.start()
    try:
        assert paused.reading.wait(30)  # the build has read its inputs
        with app.app_context():
            db.session.get(Message, flagged_id).not_remembered = True
            db.session.commit()
            db.session.remove()
    finally:
        paused.release.set()
        runner.join(60)
    assert outcome == ["succeeded"]

    committed.session.expire_all()
    (follow,) = queued(committed.session, user.id)
    assert follow.trigger == "content_change"
    with app.app_context():
        assert run_build(follow.id) == "succeeded"
    committed.session.expire_all()
    row = committed.session.get(MemoryBuild, follow.id)
    assert (row.removed, row.added) == (1, 0)
    source_ids = committed.session.scalars(select(MemoryChunk.source_id).where(
        MemoryChunk.user_id == user.id, MemoryChunk.source_key == CHAT_HISTORY)).all()
    conversation_id = messages[0].conversation_id
    assert sorted(source_ids) == [f"{conversation_id}:0", f"{conversation_id}:2"]


def test_a_claim_fails_a_predecessor_whose_worker_died_instead_of_stalling(
        app, committed, queue):
    user = committed.user()
    committed.session.add(Blink(user_id=user.id, title="b", content="something"))
    committed.session.commit()
    # A build left running by a worker that died (its lock died with its connection).
    orphan = MemoryBuild(user_id=user.id, mode="quick", trigger="user", status="running")
    committed.session.add(orphan)
    committed.session.commit()
    (waiting,) = queued(committed.session, user.id)
    committed.session.execute(update(MemoryBuild).where(MemoryBuild.id == orphan.id).values(
        heartbeat_at=func.now(), started_at=func.now() - timedelta(minutes=1)))
    committed.session.commit()
    with app.app_context():
        assert run_build(waiting.id) == "succeeded"
    committed.session.expire_all()
    orphan = committed.session.get(MemoryBuild, orphan.id)
    assert (orphan.status, orphan.error) == ("failed", DEAD_PREDECESSOR)
    assert committed.session.get(MemoryBuild, waiting.id).attempts == 1  # no retry spent


def test_a_plan_cap_change_committed_by_an_admin_reaches_every_user_through_the_job(
        app, committed, queue):
    plan = committed.plan(cap=3)
    users = [committed.user(plan=plan) for _ in range(3)]
    admin = committed.user(role="admin")
    committed.session.commit()
    queue.empty()
    client = app.test_client()
    sign_in(client, admin.email)
    from dashboard.plans.impact import plan_fingerprint

    token = csrf_from(client, "/admin/assignments/")
    response = client.post("/admin/assignments/apply", data={
        "plan_id": plan.id, "kind": "cap", "cap": "4", "expected": plan_fingerprint(plan),
        "csrf_token": token})
    assert response.status_code == 303
    assert queue.job_ids == [fanout_job_id(plan.id)]
    for user in users:  # the admin's request itself requested none of them
        assert queued(committed.session, user.id) == []
    from jobs.builds import fan_out_plan

    with app.app_context():
        assert fan_out_plan(plan.id) == 3
    committed.session.expire_all()
    for user in users:
        assert [b.trigger for b in queued(committed.session, user.id)] == ["plan_change"]
    assert committed.session.get(Plan, plan.id).included_sources == 4
