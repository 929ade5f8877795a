"""Retention windows, purges after the restore window, legal holds: what builds leave out,
what the preview counts (against a recount), what the run does, what users are told."""

from __future__ import annotations

import random
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import func, insert, select, update

from dashboard import saved_memories as memories
from dashboard.audit.models import AuditEvent
from dashboard.audit.services import Actor
from dashboard.auth.models import User
from dashboard.connectors.models import ConnectorAccess
from dashboard.holds import HoldError, is_held, place_hold, release_hold
from dashboard.memory import DeletedPart, MemoryBuild, MemoryChunk, verify_memory
from dashboard.memory.models import EMBEDDING_DIMENSIONS
from dashboard.memory.pipeline import preview_memory_build
from dashboard.memory.verify import RETENTION_GRACE
from dashboard.orbitpilot.models import Message
from dashboard.plans.sentences import source_sentence
from dashboard.plans.services import resolve_sources
from dashboard.retention import (
    RETENTION_ACTOR,
    RetentionChanged,
    apply_retention,
    complete_released,
    preview_retention,
    retention_fingerprint,
    set_retention,
)
from dashboard.saved_memories.models import ForgetMarker, Memory
from dashboard.sources import BLINKS, CHAT_HISTORY, SAVED
from tests.factories import (
    build,
    make_blink,
    make_build_record,
    make_connection,
    make_conversation,
    make_memory,
    make_plan,
    make_user,
    plans_of,
    settle,
)

NOW = datetime.now(UTC)


def staff(session) -> Actor:
    """An admin, as the staff console names one."""
    return Actor.of(make_user(session, role="admin"))


def aged(session, rows, days: float) -> None:
    """Make ``rows`` (messages, Blinks, memories) ``days`` old, and the chunks already
    made of them with them (as if time had passed)."""
    for row in rows:
        row.created_at = NOW - timedelta(days=days)
    session.flush()


def chat_plan(session, **retention):
    plan = make_plan(session, cap=4)  # chat history included
    plan.retention = {CHAT_HISTORY: retention["chat"]} if "chat" in retention else {}
    session.flush()
    return plan


def chat_ids(session, user) -> set[str]:
    return set(session.scalars(select(MemoryChunk.source_id).where(
        MemoryChunk.user_id == user.id, MemoryChunk.source_key == CHAT_HISTORY)))


def run_queued_builds(session, mode=None) -> int:
    """Run every queued build in the test's transaction, as a worker would."""
    queued = session.scalars(select(MemoryBuild).where(MemoryBuild.status == "queued")).all()
    for record in queued:
        user = session.get(User, record.user_id)
        result = build(session, user, mode or record.mode)
        record.status, record.source_counts = "succeeded", result.per_source
        record.finished_at = datetime.now(UTC)
    session.flush()
    return len(queued)


# -- the sentence and the builds ------------------------------------------------------------

def test_the_sentence_names_the_window_in_one_place(db_session):
    plan = chat_plan(db_session, chat=90)
    plan.name = "Trial"
    user = make_user(db_session, plan=plan)
    resolution = resolve_sources(plans_of(db_session).of(user))
    _, sentence = source_sentence(resolution, CHAT_HISTORY)
    assert sentence == "Remembered: your Trial plan keeps the last 90 days of chat history."
    _, blinks = source_sentence(resolution, BLINKS)
    assert blinks == "Remembered: your Trial plan includes your Blinks."


def test_a_build_leaves_out_records_older_than_the_window_and_stamps_their_time(db_session):
    plan = chat_plan(db_session, chat=30)
    plan.retention = {CHAT_HISTORY: 30, BLINKS: 30}
    user = make_user(db_session, plan=plan)
    _, messages = make_conversation(db_session, user, [("old q", "a"), ("new q", "b")])
    old_blink, new_blink = make_blink(db_session, user, "old"), make_blink(db_session, user)
    aged(db_session, [messages[0], old_blink], 40)
    for mode in ("full", "quick"):
        build(db_session, user, mode)
        conversation = messages[0].conversation_id
        assert chat_ids(db_session, user) == {f"{conversation}:1"}
        assert set(db_session.scalars(select(MemoryChunk.source_id).where(
            MemoryChunk.user_id == user.id, MemoryChunk.source_key == BLINKS))) == \
            {str(new_blink.id)}
    stamped = db_session.scalar(select(MemoryChunk.record_at).where(
        MemoryChunk.user_id == user.id, MemoryChunk.source_key == CHAT_HISTORY))
    assert stamped == messages[2].created_at


def test_a_quick_update_drops_a_pair_that_aged_out_of_an_unchanged_conversation(db_session):
    plan = chat_plan(db_session)
    user = make_user(db_session, plan=plan)
    _, messages = make_conversation(db_session, user, [("q0", "a0"), ("q1", "a1"), ("q2", "a2")])
    aged(db_session, [messages[0]], 40)
    build(db_session, user, "full")
    conversation = messages[0].conversation_id
    assert len(chat_ids(db_session, user)) == 3
    # Time passes with nothing written; then the plan keeps 30 days.
    db_session.execute(update(MemoryChunk).where(MemoryChunk.user_id == user.id,
                                                 MemoryChunk.source_id == f"{conversation}:0")
                       .values(record_at=NOW - timedelta(days=40)))
    plan.retention = {CHAT_HISTORY: 30}
    db_session.flush()
    dry = preview_memory_build(user, session=db_session, embedder_name="hashing-v1")
    assert (dry[CHAT_HISTORY].to_add, dry[CHAT_HISTORY].to_remove) == (0, 1)
    result = build(db_session, user, "quick")
    assert (result.added, result.removed, result.embedded) == (0, 1, 0)
    assert chat_ids(db_session, user) == {f"{conversation}:1", f"{conversation}:2"}


# -- the preview counts what the run removes ---------------------------------------------------

def _bulk_world(session, plan, users: int, seed: int = 7):
    """``users`` users of ``plan``, each with chat chunks and deleted memories of mixed
    ages, written in bulk; what a recount must find."""
    rng = random.Random(seed)
    tag = uuid.uuid4().hex[:8]
    ids = session.scalars(insert(User).returning(User.id), [
        {"email": f"bulk{n}-{tag}@example.test", "display_name": f"Bulk {n}",
         "password_hash": "x", "role": "user", "plan_id": plan.id} for n in range(users)
    ]).all()
    vector = [0.05] * EMBEDDING_DIMENSIONS
    chunks, deleted = [], []
    for user_id in ids:
        for pair in range(rng.randint(0, 6)):
            chunks.append({"user_id": user_id, "source_key": CHAT_HISTORY,
                           "source_id": f"{user_id}:{pair}", "chunk_index": 0,
                           "content_hash": f"h{pair}", "content": "x", "embedding": vector,
                           "embedding_model": "hashing-v1",
                           "record_at": NOW - timedelta(days=rng.uniform(0, 60))})
        for _ in range(rng.randint(0, 2)):
            deleted.append({"owner_id": user_id, "content": "x", "status": "deleted",
                            "deleted_at": NOW - timedelta(days=rng.uniform(0, 60))})
    session.execute(insert(MemoryChunk), chunks)
    if deleted:
        session.execute(insert(Memory), deleted)
    return ids, chunks, deleted


def test_the_preview_counts_equal_a_recount_over_1000_users(db_session):
    plan = chat_plan(db_session)
    ids, chunks, deleted = _bulk_world(db_session, plan, 1000)
    preview = preview_retention(db_session, plan, {CHAT_HISTORY: 30}, 20, now=NOW)
    old = [c for c in chunks if c["record_at"] < NOW - timedelta(days=30)]
    (drop,) = preview.drops
    assert (drop.source_key, drop.days_before, drop.days_after) == (CHAT_HISTORY, None, 30)
    assert drop.items == len({(c["user_id"], c["source_id"]) for c in old}) > 0
    assert drop.users == len({c["user_id"] for c in old})
    due = [m for m in deleted if m["deleted_at"] < NOW - timedelta(days=20)]
    assert preview.purge_items == len(due) > 0
    assert preview.purge_users == len({m["owner_id"] for m in due})
    assert preview.users == 1000
    # A hold on one owner: their due purges are counted as waiting.
    held = due[0]["owner_id"]
    place_hold(db_session, held, reason="matter 1", ends_at=None, actor=staff(db_session))
    again = preview_retention(db_session, plan, {CHAT_HISTORY: 30}, 20, now=NOW)
    assert again.purge_held == sum(m["owner_id"] == held for m in due)


def test_confirm_asks_the_builds_that_drop_exactly_what_the_preview_counted(db_session):
    plan = chat_plan(db_session)
    people = [make_user(db_session, plan=plan) for _ in range(5)]
    for n, person in enumerate(people):
        _, messages = make_conversation(db_session, person,
                                        [(f"q{i}", f"a{i}") for i in range(3)])
        aged(db_session, messages[: 2 * (n % 3)], 45)  # 0, 1 or 2 old pairs
        build(db_session, person, "full")
    settle(db_session)
    preview = preview_retention(db_session, plan, {CHAT_HISTORY: 30}, 30)
    set_retention(db_session, plan, {CHAT_HISTORY: 30}, 30, actor=staff(db_session),
                  expected=retention_fingerprint(plan))
    queued = db_session.scalars(select(MemoryBuild.trigger).where(
        MemoryBuild.status == "queued")).all()
    assert len(queued) == preview.drops[0].users == 3 and set(queued) == {"retention"}
    before = db_session.scalar(select(func.count()).select_from(MemoryChunk).where(
        MemoryChunk.user_id.in_([p.id for p in people])))
    run_queued_builds(db_session)
    after = db_session.scalar(select(func.count()).select_from(MemoryChunk).where(
        MemoryChunk.user_id.in_([p.id for p in people])))
    assert before - after == preview.drops[0].items == 4
    assert not db_session.scalar(select(func.count()).select_from(MemoryChunk).where(
        MemoryChunk.source_key == CHAT_HISTORY,
        MemoryChunk.record_at < datetime.now(UTC) - timedelta(days=30)))
    # The audit event: before and after, counts; nothing any user wrote.
    event = db_session.scalars(select(AuditEvent).where(AuditEvent.action == "plan.retention")
                               .order_by(AuditEvent.seq.desc())).first()
    assert event.details["impact"]["drops"][CHAT_HISTORY] == {"items": 4, "users": 3}
    assert event.details["changes"] == {"before": {"retention": {}},
                                        "after": {"retention": {CHAT_HISTORY: 30}}}
    # The run finds nothing more to age out; a pair that ages later gets its build.
    assert apply_retention(db_session).builds_requested == 0
    later = datetime.now(UTC) - timedelta(days=31)  # a month on, nothing written
    db_session.execute(update(MemoryChunk).where(MemoryChunk.user_id == people[0].id)
                       .values(record_at=later))
    db_session.execute(update(Message).where(Message.user_id == people[0].id)
                       .values(created_at=later))
    assert apply_retention(db_session).builds_requested == 1
    assert run_queued_builds(db_session) == 1
    assert not chat_ids(db_session, people[0])


def test_a_change_confirmed_against_an_older_preview_is_refused(db_session):
    plan = chat_plan(db_session)
    seen = retention_fingerprint(plan)
    admin = staff(db_session)
    set_retention(db_session, plan, {CHAT_HISTORY: 60}, 30, actor=admin, expected=seen)
    with pytest.raises(RetentionChanged):
        set_retention(db_session, plan, {CHAT_HISTORY: 30}, 30, actor=admin, expected=seen)
    assert plan.retention == {CHAT_HISTORY: 60}


def test_a_window_that_grows_asks_full_rebuilds_that_bring_older_pairs_back(db_session):
    plan = chat_plan(db_session, chat=30)
    user = make_user(db_session, plan=plan)
    _, messages = make_conversation(db_session, user, [("q0", "a0"), ("q1", "a1")])
    aged(db_session, [messages[0]], 40)
    build(db_session, user, "full")
    settle(db_session)
    assert len(chat_ids(db_session, user)) == 1
    set_retention(db_session, plan, {}, 30, actor=staff(db_session))
    assert db_session.scalars(select(MemoryBuild.mode).where(
        MemoryBuild.user_id == user.id, MemoryBuild.status == "queued")).all() == ["full"]
    run_queued_builds(db_session)
    assert len(chat_ids(db_session, user)) == 2


# -- purges and legal holds --------------------------------------------------------------------

def soft_deleted(session, user, days: float) -> Memory:
    memory = make_memory(session, user, "to be purged")
    memories.forget_memory(session, user.id, memory.id, mode="soft_delete",
                           actor=Actor.of(user))
    memory.deleted_at = datetime.now(UTC) - timedelta(days=days)
    session.flush()
    return memory


def test_the_run_purges_past_the_restore_window_with_receipts_and_a_hold_waits(db_session):
    plan = chat_plan(db_session)
    free, held = make_user(db_session, plan=plan), make_user(db_session, plan=plan)
    fresh = soft_deleted(db_session, free, 3)
    purged, kept = soft_deleted(db_session, free, 40), soft_deleted(db_session, held, 40)
    hold = place_hold(db_session, held.id, reason="matter 7", ends_at=None, actor=staff(db_session))

    run = apply_retention(db_session)
    assert (run.purged, run.held) == (1, 1)
    assert db_session.get(Memory, purged.id) is None
    assert db_session.get(Memory, fresh.id).status == "deleted"
    receipt = db_session.scalars(select(ForgetMarker).where(
        ForgetMarker.memory_id == purged.id, ForgetMarker.mode == "hard_delete")).one()
    assert (receipt.actor_type, receipt.actor_id, receipt.probe_rows) == \
        ("system", RETENTION_ACTOR.id, 0)
    # The held user's memory is still there; her receipt says why.
    assert db_session.get(Memory, kept.id).status == "deleted"
    pending = memories.receipts_of_memory(db_session, held.id, kept.id)[-1]
    assert (pending.mode, pending.pending) == ("hard_delete", "legal_hold")
    assert apply_retention(db_session).held == 0  # not twice

    release_hold(db_session, hold, actor=staff(db_session))
    assert complete_released(db_session, user_id=held.id) == 1
    assert db_session.get(Memory, kept.id) is None
    done = memories.receipts_of_memory(db_session, held.id, kept.id)
    assert done[-2].completed_by == done[-1].marker_id and done[-2].pending is None
    assert (done[-1].mode, done[-1].probe_rows) == ("hard_delete", 0)


def test_a_hold_that_reached_its_end_lets_the_run_complete_what_waited(db_session):
    user = make_user(db_session, plan=chat_plan(db_session))
    memory = make_memory(db_session, user)
    hold = place_hold(db_session, user.id, reason="r", actor=staff(db_session),
                      ends_at=datetime.now(UTC) + timedelta(days=1))
    receipt = memories.forget_memory(db_session, user.id, memory.id, mode="redact",
                                     actor=Actor.of(user))
    assert receipt.pending == "legal_hold" and memory.status == "deleted"
    hold.ends_at = datetime.now(UTC) - timedelta(seconds=1)
    db_session.flush()
    assert not is_held(db_session, user.id)
    assert apply_retention(db_session).completed == 1
    assert db_session.get(Memory, memory.id).status == "redacted"


def test_under_a_hold_a_hard_delete_waits_recall_stops_and_restore_is_refused(db_session):
    user = make_user(db_session, plan=chat_plan(db_session))
    memory = make_memory(db_session, user, "Likes quiet carriages on trains.")
    build(db_session, user, "full")
    place_hold(db_session, user.id, reason="matter", ends_at=None, actor=staff(db_session))
    receipt = memories.forget_memory(db_session, user.id, memory.id, mode="hard_delete",
                                     actor=Actor.of(user), scopes=["memory:hard_delete"])
    assert (receipt.pending, receipt.to_status, receipt.removed_chunks) == \
        ("legal_hold", "deleted", 1)
    assert receipt.vacuum_due is False
    assert not db_session.scalar(select(func.count()).select_from(MemoryChunk).where(
        MemoryChunk.source_key == SAVED, MemoryChunk.source_id == str(memory.id)))
    with pytest.raises(memories.MemoryConflict, match="waits for a legal hold"):
        memories.restore_memory(db_session, user.id, memory.id, actor=Actor.of(user))
    with pytest.raises(memories.MemoryConflict, match="already waits"):
        memories.forget_memory(db_session, user.id, memory.id, mode="redact",
                               actor=Actor.of(user))
    with pytest.raises(memories.MemoryConflict, match="replacement"):
        memories.forget_memory(db_session, user.id, memory.id, mode="redact",
                               actor=Actor.of(user), replacement_content="x")
    event = db_session.get(AuditEvent, receipt.audit_event_id)
    assert event.details["pending"] == "legal_hold"


def test_holds_refuse_a_second_hold_a_past_end_and_an_empty_reason(db_session):
    user = make_user(db_session)
    with pytest.raises(HoldError, match="why"):
        place_hold(db_session, user.id, reason="  ", ends_at=None, actor=staff(db_session))
    with pytest.raises(HoldError, match="future"):
        place_hold(db_session, user.id, reason="r", actor=staff(db_session),
                   ends_at=datetime.now(UTC) - timedelta(days=1))
    hold = place_hold(db_session, user.id, reason="r", ends_at=None, actor=staff(db_session))
    with pytest.raises(HoldError, match="already"):
        place_hold(db_session, user.id, reason="r", ends_at=None, actor=staff(db_session))
    release_hold(db_session, hold, actor=staff(db_session))
    with pytest.raises(HoldError, match="released already"):
        release_hold(db_session, hold, actor=staff(db_session))


# -- the truth check and the pruning ---------------------------------------------------------

def test_the_truth_check_names_a_chunk_older_than_the_window_past_its_grace(db_session):
    plan = chat_plan(db_session, chat=30)
    user = make_user(db_session, plan=plan)
    make_conversation(db_session, user, [("q0", "a0")])
    result = build(db_session, user, "full", threshold=1000)
    settle(db_session)
    db_session.add(make_build_record(user, mode="full", source_counts=result.per_source))
    db_session.flush()
    window = timedelta(days=30)
    checked = verify_memory(db_session, ann_threshold=1000, user_ids=[user.id], repair=False)
    assert not checked.violations
    # Aged out an hour ago: the run has not come round yet; not a finding.
    db_session.execute(update(MemoryChunk).where(MemoryChunk.user_id == user.id)
                       .values(record_at=datetime.now(UTC) - window - timedelta(hours=1)))
    db_session.execute(update(Message).where(Message.user_id == user.id)
                       .values(created_at=datetime.now(UTC) - window - timedelta(hours=1)))
    assert not verify_memory(db_session, ann_threshold=1000, user_ids=[user.id],
                             repair=False).violations
    late = datetime.now(UTC) - window - RETENTION_GRACE - timedelta(hours=1)
    db_session.execute(update(MemoryChunk).where(MemoryChunk.user_id == user.id)
                       .values(record_at=late))
    db_session.execute(update(Message).where(Message.user_id == user.id)
                       .values(created_at=late))
    report = verify_memory(db_session, ann_threshold=1000, user_ids=[user.id], repair=False)
    assert {(v.kind, v.source_key) for v in report.violations} == \
        {("not_allowed", CHAT_HISTORY)}


def test_the_run_prunes_old_build_records_but_each_users_latest_success_and_old_reads(
        db_session):
    user = make_user(db_session)
    old = datetime.now(UTC) - timedelta(days=400)
    records = [make_build_record(user, created_at=old, finished_at=old) for _ in range(3)]
    records.append(make_build_record(user, status="failed", created_at=old, finished_at=old))
    db_session.add_all(records)
    db_session.flush()
    grant, _ = make_connection(db_session, user)
    reads = [ConnectorAccess(grant_id=grant.id, tool="search_memory", source_key=SAVED,
                             source_id=str(n), created_at=at)
             for n, at in enumerate((old, datetime.now(UTC)))]
    db_session.add_all(reads)
    db_session.flush()
    build(db_session, user, "full")  # its note: inputs read now
    db_session.add_all([
        DeletedPart(source_key=CHAT_HISTORY, user_id=user.id, part_id=1, xid=1,
                    deleted_at=datetime.now(UTC) - timedelta(days=10)),
        DeletedPart(source_key=CHAT_HISTORY, user_id=user.id, part_id=2, xid=1,
                    deleted_at=datetime.now(UTC) - timedelta(hours=1))])
    db_session.flush()
    run = apply_retention(db_session, config={"BUILD_RECORD_DAYS": 180,
                                              "ACCESS_LOG_DAYS": 90})
    assert db_session.scalars(select(DeletedPart.part_id).where(
        DeletedPart.user_id == user.id)).all() == [2] and run.tombstones_pruned == 1
    left = db_session.scalars(select(MemoryBuild.id).where(MemoryBuild.user_id == user.id)
                              .execution_options(populate_existing=True)).all()
    assert left == [records[2].id] and run.builds_pruned == 3
    assert db_session.scalars(select(ConnectorAccess.source_id).where(
        ConnectorAccess.grant_id == grant.id)).all() == ["1"] and run.access_pruned == 1
    event = db_session.scalars(select(AuditEvent).where(AuditEvent.action == "retention.apply")
                               .order_by(AuditEvent.seq.desc())).first()
    assert event.details["builds_pruned"] == 3


def test_the_run_asks_each_aged_user_once_across_windows_and_batches(db_session,
                                                                      monkeypatch):
    from dashboard.retention import services

    monkeypatch.setattr(services, "USER_BATCH", 2)
    plan = chat_plan(db_session)
    plan.retention = {CHAT_HISTORY: 30, BLINKS: 30}
    people = [make_user(db_session, plan=plan) for _ in range(5)]
    for n, person in enumerate(people):
        _, messages = make_conversation(db_session, person, [("q", "a")])
        blink = make_blink(db_session, person)
        aged(db_session, [messages[0]] if n % 2 else [blink], 40)
    for person in people:  # stored before the plan kept 30 days
        plan.retention = {}
        build(db_session, person, "full")
    plan.retention = {CHAT_HISTORY: 30, BLINKS: 30}
    settle(db_session)
    run = apply_retention(db_session)
    assert run.builds_requested == 5
    assert sorted(db_session.scalars(select(MemoryBuild.user_id).where(
        MemoryBuild.status == "queued", MemoryBuild.trigger == "retention"))) == \
        sorted(p.id for p in people)
