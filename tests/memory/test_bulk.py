"""A plan change applied in bulk (``memory.bulk``): the rows it leaves are the rows a build
per user would leave; a user it cannot settle so gets a build of their own; each user's
record, note and page are right at their batch's commit; no content reaches a job or the
log."""

from __future__ import annotations

import random

from sqlalchemy import func, select, text

from dashboard.audit.models import AuditEvent
from dashboard.extensions import db
from dashboard.memory.bulk import APPLY_ACTION, apply_plan_change
from dashboard.memory.embedders import HashingEmbedder
from dashboard.memory.locks import BUILD_LOCK_NAMESPACE
from dashboard.memory.models import MemoryBuild, MemoryChunk, MemoryState
from dashboard.memory.pipeline import preview_memory_build, run_memory_build
from dashboard.memory.verify import verify_memory
from dashboard.orbitpilot.models import ProfileFact
from dashboard.sources import CHAT_HISTORY
from tests.factories import (
    build,
    make_blink,
    make_conversation,
    make_memory,
    make_plan,
    make_user,
)

EMBEDDER = HashingEmbedder()
PROFILE, BLINKS, SAVED = "orbitpilot.profile", "blink.blinks", "xmemo.saved"


def stored(session, user_ids) -> dict[int, set[tuple]]:
    rows: dict[int, set[tuple]] = {uid: set() for uid in user_ids}
    for row in session.execute(select(
            MemoryChunk.user_id, MemoryChunk.source_key, MemoryChunk.source_id,
            MemoryChunk.chunk_index, MemoryChunk.content_hash)
            .where(MemoryChunk.user_id.in_(list(user_ids)))):
        rows[row[0]].add(tuple(row[1:]))
    return rows


def populate(session, plan, count: int, seed: int = 7, make=None) -> list:
    """``count`` users of ``plan`` with a random mix of every source, each built."""
    rng = random.Random(seed)
    users = []
    for n in range(count):
        user = (make or (lambda **kw: make_user(session, **kw)))(plan=plan)
        if rng.random() < 0.7:
            session.add(ProfileFact(user_id=user.id, key="city", value=f"City {n}"))
        for b in range(rng.randrange(0, 3)):
            make_blink(session, user, f"blink {n}.{b}", excluded=rng.random() < 0.2)
        for m in range(rng.randrange(0, 3)):
            make_memory(session, user, f"memory {n}.{m}")
        for c in range(rng.randrange(0, 3)):
            make_conversation(session, user, [(f"q{n}.{c}.{i}", f"a{n}.{i}")
                                              for i in range(rng.randrange(1, 4))],
                              flagged={0} if rng.random() < 0.2 else set())
        users.append(user)
    session.flush()
    for user in users:
        build(session, user, embedder=EMBEDDER)
    # The requests the content made are settled by the builds above: as after workers ran.
    session.execute(MemoryBuild.__table__.delete().where(
        MemoryBuild.user_id.in_([u.id for u in users])))
    session.flush()
    return users


def test_a_bulk_eviction_leaves_exactly_the_rows_a_build_per_user_would(db_session,
                                                                         count_queries):
    plan = make_plan(db_session, cap=4)
    users = populate(db_session, plan, 100)
    ids = [u.id for u in users]
    before = stored(db_session, ids)
    assert any(key[0] == CHAT_HISTORY for rows in before.values() for key in rows)
    plan.included_sources = 2  # profile and Blinks stay; saved memories and chat leave
    db_session.flush()

    with db_session.begin_nested() as per_user:
        for user in users:
            run_memory_build(user, "quick", session=db_session, embedder=EMBEDDER)
        expected = stored(db_session, ids)
        per_user.rollback()
    assert expected != before

    with count_queries() as counter:
        result = apply_plan_change(db_session, plan.id, batch_size=25)
    assert stored(db_session, ids) == expected
    removed = sum(len(before[u] - expected[u]) for u in ids)
    assert result.chunks_removed == removed > 0
    assert result.batches == 4 and result.users == 100 and result.builds_requested == 0
    assert result.applied + result.unchanged == 100
    # A fixed number of statements per batch of users, whatever they hold.
    assert counter.count <= 4 * 12 + 6
    assert db_session.scalar(select(func.count()).select_from(MemoryBuild)
                             .where(MemoryBuild.user_id.in_(ids),
                                    MemoryBuild.status == "queued")) == 0

    # Each user's note, record and dry run are right at once: nothing left for a build,
    # and the truth check finds nothing.
    keys = set(db_session.scalars(select(func.unnest(MemoryState.included_keys))
                                  .where(MemoryState.user_id.in_(ids))))
    assert keys <= {PROFILE, BLINKS}
    for user in users[:25]:
        preview = preview_memory_build(user, session=db_session, embedder_name=EMBEDDER.name)
        assert all(p.to_add == 0 and p.to_remove == 0 for p in preview.values()), user.id
    report = verify_memory(db_session, ann_threshold=10**9, user_ids=ids, repair=False)
    assert report.users_checked == 100 and report.violations == []
    records = db_session.scalars(select(MemoryBuild).where(MemoryBuild.user_id.in_(ids))).all()
    assert len(records) == result.applied
    assert {(r.mode, r.trigger, r.status) for r in records} == {("bulk", "plan_change",
                                                                 "succeeded")}
    assert sum(r.removed for r in records) == removed
    assert all(r.kept == len(expected[r.user_id]) for r in records)
    (event,) = db_session.scalars(select(AuditEvent).where(AuditEvent.action == APPLY_ACTION,
                                                           AuditEvent.target_id == str(plan.id)))
    assert event.details["chunks_removed"] == removed
    assert event.details["users"] == 100


def test_a_user_whose_lock_is_held_gets_their_own_build_after(committed, queue):
    # Committed for real: a build in the test's own transaction would keep holding the
    # users' locks until the test ends.
    session = committed.session
    plan = committed.plan(cap=4)
    users = populate(session, plan, 6, seed=3, make=committed.user)
    busy, others = users[2], [u for u in users if u is not users[2]]
    make_memory(session, busy, "memory of the busy one")
    build(session, busy, embedder=EMBEDDER)
    session.execute(MemoryBuild.__table__.delete().where(MemoryBuild.user_id == busy.id))
    plan.included_sources = 2
    session.commit()
    before = stored(session, [busy.id])[busy.id]
    holder = db.engine.connect()  # a build of that user is writing meanwhile
    try:
        holder.execute(text("SELECT pg_advisory_lock(:ns, :u)"),
                       {"ns": BUILD_LOCK_NAMESPACE, "u": busy.id})
        result = apply_plan_change(session, plan.id, batch_size=4)
    finally:
        holder.execute(text("SELECT pg_advisory_unlock(:ns, :u)"),
                       {"ns": BUILD_LOCK_NAMESPACE, "u": busy.id})
        holder.close()
    assert result.busy == 1 and result.builds_requested == 1
    assert stored(session, [busy.id])[busy.id] == before  # untouched under the lock
    (queued,) = session.scalars(select(MemoryBuild).where(
        MemoryBuild.user_id == busy.id, MemoryBuild.status == "queued"))
    assert (queued.mode, queued.trigger) == ("quick", "plan_change")
    for user in others:
        assert {k[0] for k in stored(session, [user.id])[user.id]} <= {PROFILE, BLINKS}
    # The user's own build runs after the holder and leaves what the others got.
    build(session, busy, embedder=EMBEDDER, commit=True)
    assert {k[0] for k in stored(session, [busy.id])[busy.id]} <= {PROFILE, BLINKS}
    assert any(k[0] == SAVED for k in before)


def test_a_source_that_joins_asks_builds_and_a_user_never_built_gets_one(db_session):
    plan = make_plan(db_session, cap=2)
    users = populate(db_session, plan, 5, seed=5)
    newcomer = make_user(db_session, plan=plan)  # no note: never built
    before = stored(db_session, [u.id for u in users])
    plan.included_sources = 4  # saved memories and chat join
    db_session.flush()
    result = apply_plan_change(db_session, plan.id)
    assert result.builds_requested == 6 and result.applied == 0
    assert stored(db_session, [u.id for u in users]) == before
    asked = set(db_session.scalars(select(MemoryBuild.user_id).where(
        MemoryBuild.status == "queued", MemoryBuild.trigger == "plan_change")))
    assert asked == {u.id for u in users} | {newcomer.id}


def test_a_user_with_a_change_not_yet_built_keeps_it_for_their_build(db_session):
    plan = make_plan(db_session, cap=4)
    (user,) = populate(db_session, plan, 1, seed=11)
    make_blink(db_session, user, "written after the last build")  # asks a build
    plan.included_sources = 2
    db_session.flush()
    apply_plan_change(db_session, plan.id)
    assert {k[0] for k in stored(db_session, [user.id])[user.id]} <= {PROFILE, BLINKS}
    preview = preview_memory_build(user, session=db_session, embedder_name=EMBEDDER.name)
    assert preview[BLINKS].to_add == 1  # the page still shows the change to build
    assert db_session.scalar(select(func.count()).select_from(MemoryBuild).where(
        MemoryBuild.user_id == user.id, MemoryBuild.status == "queued")) == 1


def test_no_content_reaches_a_job_argument_or_the_audit_log(db_session, queue):
    canary = "canary-7f3a bulk secret"
    plan = make_plan(db_session, cap=4)
    users = [make_user(db_session, plan=plan) for _ in range(3)]
    for user in users:
        make_memory(db_session, user, f"{canary} memory")
        make_blink(db_session, user, f"{canary} blink", title=canary)
    build(db_session, users[0], embedder=EMBEDDER)  # the others have no note: builds
    db_session.commit()
    queue.empty()
    plan.included_sources = 1
    db_session.commit()
    apply_plan_change(db_session, plan.id)
    jobs = queue.get_jobs()
    assert jobs  # the fan-out and the builds it asked for
    for job in jobs:
        assert canary not in repr(job.args) + repr(job.kwargs) + (job.description or "")
    for event in db_session.scalars(select(AuditEvent)):
        assert canary not in repr(event.details)


def test_the_page_says_being_applied_until_the_users_batch_commits(client, db_session, auth):
    plan = make_plan(db_session, cap=4)
    user = make_user(db_session, plan=plan)
    make_memory(db_session, user, "remembered until the change lands")
    build(db_session, user, embedder=EMBEDDER)
    plan.included_sources = 2
    db_session.commit()
    auth.login(user.email)
    page = client.get("/memory/status").get_data(as_text=True)
    assert f'data-source="{SAVED}"' in page and "data-being-applied=\"1\"" in page
    apply_plan_change(db_session, plan.id)
    page = client.get("/memory/status").get_data(as_text=True)
    assert "data-being-applied" not in page
    assert "plan change applied to the whole plan at once" in page


def test_the_schedule_asks_nothing_of_a_plan_change_the_apply_settled(db_session):
    from datetime import timedelta

    from dashboard.memory.maintenance import request_scheduled_builds

    plan = make_plan(db_session, cap=4)
    users = [make_user(db_session, plan=plan) for _ in range(4)]  # no content to change
    for user in users:  # each built a while ago, as a worker records it
        build(db_session, user, embedder=EMBEDDER)
        db_session.add(MemoryBuild(user_id=user.id, mode="quick", trigger="admin",
                                   status="succeeded",
                                   inputs_read_at=func.now() - timedelta(minutes=5)))
    from dashboard.auth.models import User

    db_session.execute(User.__table__.update().where(User.id.in_([u.id for u in users]))
                       .values(plan_changed_at=func.now() - timedelta(days=1)))  # long ago
    plan.included_sources = 2
    db_session.flush()
    # Not applied yet: the safety net asks a build of each (its fan-out may be lost).
    with db_session.begin_nested() as before_the_apply:
        assert request_scheduled_builds(db_session, margin_seconds=60) == 4
        before_the_apply.rollback()
    assert apply_plan_change(db_session, plan.id).applied == 4
    # Settled within the schedule's margin of the change: nothing to ask again.
    assert request_scheduled_builds(db_session, margin_seconds=60) == 0
