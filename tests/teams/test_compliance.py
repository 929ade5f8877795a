"""A team's account goes through the person's compliance paths, unchanged: a team memory
past its plan's window leaves memory (at a build, and through the retention run), a legal
hold on the team turns a hard delete (or a purge, or an author's erasure) into a pending
receipt, the truth check (and ``flask memories verify``) finds a violation planted on the
team's chunks and a build repairs it, Memory Status says the team's sentences, and a
receipt of a team memory records its post-delete probe."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import func, select, text, update

from dashboard import saved_memories as memories
from dashboard.access import reach_of
from dashboard.audit.models import AuditEvent
from dashboard.audit.services import Actor
from dashboard.holds import place_hold, release_hold
from dashboard.memory import MemoryBuild, MemoryChunk, memory_status, verify_memory
from dashboard.plans.services import resolve_sources
from dashboard.retention import apply_retention, complete_released
from dashboard.saved_memories import reach as reached
from dashboard.saved_memories.models import Memory
from dashboard.sources import SAVED
from tests.factories import (
    build,
    make_build_record,
    make_plan,
    make_team,
    make_user,
    plans_of,
    settle,
)
from tests.retention.test_retention import run_queued_builds

THRESHOLD = 1000
ALL_SCOPES = list(memories.SCOPE_FOR_OPERATION.values())


@pytest.fixture
def pilot(db_session):
    """The team Pilot on the Team plan (its saved memories kept 30 days), a lead and a
    member, two team memories the member saved, built and recorded."""
    plan = make_plan(db_session, name="Team", cap=3)
    plan.retention = {SAVED: 30}
    lead, member = make_user(db_session, plan=plan), make_user(db_session, plan=plan)
    team = make_team(db_session, lead, slug="pilot", name="Pilot",
                     members={member: "member"})
    canary = f"canary-{uuid.uuid4().hex}"
    saved = [reached.save_for(db_session, reach_of(db_session, member.id), team="pilot",
                              content=f"{canary} Heron note {n}.",
                              actor=Actor.of(member)).memory for n in range(2)]
    recorded_build(db_session, team.account)
    return team, lead, member, saved, canary


def recorded_build(session, account) -> None:
    result = build(session, account, "full", threshold=THRESHOLD)
    settle(session)
    session.add(make_build_record(account, mode="full", source_counts=result.per_source))
    session.flush()


def team_chunks(session, team) -> set[str]:
    return set(session.scalars(select(MemoryChunk.source_id).where(
        MemoryChunk.user_id == team.id, MemoryChunk.source_key == SAVED)))


def age(session, memory, days: int) -> None:
    """``memory`` (and its chunk) ``days`` old, as if time had passed."""
    then = datetime.now(UTC) - timedelta(days=days)
    session.execute(update(Memory).where(Memory.id == memory.id).values(created_at=then))
    session.execute(update(MemoryChunk).where(MemoryChunk.source_id == str(memory.id))
                    .values(record_at=then))
    session.expire_all()


def test_a_team_memory_past_its_plans_window_leaves_memory(db_session, pilot):
    team, _lead, _member, (old, fresh), _ = pilot
    assert team_chunks(db_session, team) == {str(old.id), str(fresh.id)}
    age(db_session, old, 40)
    # Time passed without a write: the retention run asks the team's build …
    run = apply_retention(db_session)
    assert run.builds_requested == 1
    assert db_session.scalar(select(MemoryBuild.user_id).where(
        MemoryBuild.status == "queued")) == team.id
    run_queued_builds(db_session)
    # … which leaves the aged memory out; the memory itself stays (records stay).
    assert team_chunks(db_session, team) == {str(fresh.id)}
    assert db_session.get(Memory, old.id).status == "active"
    # A full rebuild leaves it out too.
    build(db_session, team.account, "full", threshold=THRESHOLD)
    assert team_chunks(db_session, team) == {str(fresh.id)}


def test_a_hold_on_the_team_turns_a_hard_delete_into_a_pending_receipt(db_session, pilot):
    team, lead, member, (first, second), canary = pilot
    hold = place_hold(db_session, team.id, reason="matter", ends_at=None,
                      actor=Actor("system"))
    receipt = memories.forget_memory(db_session, team.id, first.id, mode="hard_delete",
                                     actor=Actor.of(lead), scopes=ALL_SCOPES)
    assert (receipt.pending, receipt.to_status, receipt.removed_chunks) == (
        "legal_hold", "deleted", 1)
    # Recall stops at once, for every member.
    hits = reached.recall_for(db_session, reach_of(db_session, member.id), f"{canary} Heron",
                              5, embedder=build_embedder())
    assert str(first.id) not in {h.memory_id for h in hits}
    # The author's own erasure request waits too; recall of it stops.
    (waiting,) = reached.erase_authored(db_session, team.id, member.id,
                                        actor=Actor.of(member), reason="mine")
    assert (waiting.memory_id, waiting.pending) == (str(second.id), "legal_hold")
    # Released: both erasures complete, each receipt naming the one that completed it.
    release_hold(db_session, hold, actor=Actor("system"))
    assert complete_released(db_session, user_id=team.id) == 2
    assert db_session.get(Memory, first.id) is None
    done = memories.receipts_of_memory(db_session, team.id, first.id)
    assert done[0].completed_by == done[1].marker_id and done[1].pending is None
    assert (done[1].mode, done[1].probe_rows) == ("hard_delete", 0)


def test_a_hold_on_the_team_turns_the_runs_purge_into_a_pending_receipt(db_session, pilot):
    team, lead, _member, (first, _second), _ = pilot
    memories.forget_memory(db_session, team.id, first.id, mode="soft_delete",
                           actor=Actor.of(lead))
    db_session.execute(update(Memory).where(Memory.id == first.id).values(
        deleted_at=datetime.now(UTC) - timedelta(days=40)))
    place_hold(db_session, team.id, reason="matter", ends_at=None, actor=Actor("system"))
    run = apply_retention(db_session)
    assert (run.purged, run.held) == (0, 1)
    assert db_session.get(Memory, first.id).status == "deleted"
    assert memories.receipts_of_memory(db_session, team.id, first.id)[-1].pending == \
        "legal_hold"


def test_the_truth_check_finds_a_violation_on_a_teams_chunks_and_a_build_repairs_it(
        runner, db_session, pilot):
    team, _lead, _member, (first, _second), canary = pilot
    check = verify_memory(db_session, ann_threshold=THRESHOLD, user_ids=[team.id])
    assert (check.users_checked, check.violations) == (1, [])
    # Planted behind the services' back: a memory deleted, its chunk left.
    db_session.execute(text("UPDATE memories SET status = 'deleted' WHERE id = :id"),
                       {"id": first.id})
    dirty = runner.invoke(args=["memories", "verify", "--user", team.account.email,
                                "--no-repair"])
    assert dirty.exit_code == 1
    assert f"user {team.id}: 1 \u00d7 chunks no current record allows" in dirty.output
    report = verify_memory(db_session, ann_threshold=THRESHOLD, user_ids=[team.id])
    assert {(v.kind, v.source_key, v.user_id) for v in report.violations} == {
        ("not_allowed", SAVED, team.id)}
    events = db_session.scalars(select(AuditEvent).where(
        AuditEvent.action == "memory.verify", AuditEvent.owner_id == team.id)).all()
    assert len(events) == 2  # the command's run and this one, each audited
    for event in events:
        assert event.details == {"violations": {f"not_allowed:{SAVED}": 1}}
        assert canary not in str(event.details)
    (repair,) = db_session.scalars(select(MemoryBuild).where(
        MemoryBuild.user_id == team.id, MemoryBuild.status == "queued")).all()
    assert (repair.mode, repair.trigger) == ("full", "repair")
    db_session.delete(repair)
    recorded_build(db_session, team.account)
    assert str(first.id) not in team_chunks(db_session, team)
    after = verify_memory(db_session, ann_threshold=THRESHOLD, user_ids=[team.id])
    assert (after.users_checked, after.violations) == (1, [])


def test_the_teams_memory_status_says_what_its_plan_keeps(db_session, pilot):
    team, *_ = pilot
    account = team.account
    status = memory_status(db_session, account,
                           resolution=resolve_sources(plans_of(db_session).of(account)),
                           embedder_name=build_embedder().name)
    saved = next(s for s in status.sources if s.key == SAVED)
    assert saved.sentence == "Remembered: your Team plan keeps the last 30 days of saved " \
                             "memories."
    assert (saved.chunks, saved.to_add, saved.to_remove, saved.keep_days) == (2, 0, 0, 30)
    assert status.plan_name == "Team" and status.last_build is not None


def test_a_receipt_of_a_team_memory_records_its_probe_and_only_members_read_it(
        db_session, pilot):
    team, lead, member, (first, _second), _ = pilot
    receipt = memories.forget_memory(db_session, team.id, first.id, mode="hard_delete",
                                     actor=Actor.of(lead), scopes=ALL_SCOPES)
    assert receipt.removed_chunks == 1
    assert receipt.probe_rows == 0 and receipt.probed_at is not None
    assert receipt.to_dict()["probe"]["found"] == dict.fromkeys(
        ["chunks", "replies", "drew_on", "exports", "export_parts"], 0)
    assert db_session.scalar(select(func.count()).select_from(MemoryChunk).where(
        MemoryChunk.source_id == str(first.id))) == 0
    # A member reads it through their reach; someone else gets "no such receipt".
    mine = memories.find_receipt(db_session, reach_of(db_session, member.id).owner_ids,
                                 receipt.marker_id)
    assert mine.marker_id == receipt.marker_id
    stranger = make_user(db_session)
    with pytest.raises(memories.MemoryNotFound):
        memories.find_receipt(db_session, reach_of(db_session, stranger.id).owner_ids,
                              receipt.marker_id)


def build_embedder():
    from dashboard.memory import get_embedder

    return get_embedder("hashing")
