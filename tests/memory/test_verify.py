"""The truth check (``dashboard/memory/verify.py``): each kind of violation, written behind
the services' back with plain SQL, is named; the repair build removes it and the next
check is clean; a user with a build due is not judged; findings are content-free."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import select, text, update
from sqlalchemy.exc import DBAPIError

from dashboard.audit.models import AuditEvent
from dashboard.memory import MemoryBuild, verify_memory
from dashboard.memory.models import EMBEDDING_DIMENSIONS, MemoryChunk, MemoryVerification
from dashboard.orbitpilot.models import Message
from dashboard.sources import BLINKS, CHAT_HISTORY, DOCUMENTS, SAVED
from tests.factories import (
    build,
    make_blink,
    make_build_record,
    make_conversation,
    make_memory,
    make_plan,
    make_user,
    settle,
)

THRESHOLD = 1000  # nobody here is large enough for the HNSW index


def built(session, user) -> None:
    """A full build, recorded as the runner records one (its per-source counts)."""
    result = build(session, user, "full", threshold=THRESHOLD)
    settle(session)
    session.add(make_build_record(user, mode="full", source_counts=result.per_source))
    session.flush()


@pytest.fixture
def person(db_session):
    """A user whose plan includes chat history, with something in every included source."""
    user = make_user(db_session, plan=make_plan(db_session, cap=4))
    canary = f"canary-{uuid.uuid4().hex}"
    make_blink(db_session, user, f"{canary} Blink")
    memory = make_memory(db_session, user, f"{canary} memory")
    _, messages = make_conversation(db_session, user, [(f"{canary} q1", "a1"), ("q2", "a2")])
    built(db_session, user)
    return user, memory, messages, canary


def check(session, user, **options):
    return verify_memory(session, ann_threshold=THRESHOLD, user_ids=[user.id], **options)


def found(report) -> set[tuple[str, str | None, int]]:
    return {(v.kind, v.source_key, v.count) for v in report.violations}


def test_a_clean_memory_passes_and_the_run_is_recorded(db_session, person):
    user, *_ = person
    report = check(db_session, user)
    assert (report.users_checked, report.violations) == (1, [])
    assert report.chunks_checked == db_session.query(MemoryChunk).filter_by(
        user_id=user.id).count() > 0
    last = db_session.scalars(select(MemoryVerification)
                              .order_by(MemoryVerification.id.desc())).first()
    assert (last.users_checked, last.violations, last.repairs_requested) == (1, 0, 0)


def insert_chunk(session, user, source_key: str, source_id: str) -> None:
    session.execute(text(
        "INSERT INTO memory_chunks (user_id, source_key, source_id, chunk_index, content_hash,"
        " content, embedding, embedding_model, ann) VALUES (:u, :k, :s, 0, :h, 'x', :e,"
        " 'hashing-v1', false)"),
        {"u": user.id, "k": source_key, "s": source_id, "h": uuid.uuid4().hex,
         "e": str([0.01] * EMBEDDING_DIMENSIONS)})


def test_a_chunk_of_a_source_the_plan_leaves_out_is_named(db_session, person):
    user, *_ = person
    insert_chunk(db_session, user, DOCUMENTS, "99")  # documents: off by default
    assert found(check(db_session, user, repair=False)) >= {
        ("source_not_included", DOCUMENTS, 1)}


def test_a_chunk_of_a_flagged_pair_is_named(db_session, person):
    user, _, messages, _ = person
    # A bulk UPDATE: no listener asks for a build, as if a bug had skipped it.
    db_session.execute(update(Message).where(Message.id == messages[0].id)
                       .values(not_remembered=True))
    assert found(check(db_session, user, repair=False)) == {("not_allowed", CHAT_HISTORY, 1)}


def test_a_chunk_of_a_soft_deleted_memory_is_named(db_session, person):
    user, memory, *_ = person
    db_session.execute(text("UPDATE memories SET status = 'deleted' WHERE id = :id"),
                       {"id": memory.id})
    assert found(check(db_session, user, repair=False)) == {("not_allowed", SAVED, 1)}


def test_a_wrong_ann_flag_and_a_count_off_the_last_build_are_named(db_session, person):
    user, *_ = person
    first, second = db_session.scalars(select(MemoryChunk.id).where(
        MemoryChunk.user_id == user.id).order_by(MemoryChunk.id).limit(2)).all()
    db_session.execute(update(MemoryChunk).where(MemoryChunk.id == first).values(ann=True))
    key = db_session.get(MemoryChunk, second).source_key
    db_session.execute(text("DELETE FROM memory_chunks WHERE id = :id"), {"id": second})
    assert found(check(db_session, user, repair=False)) == {
        ("ann_flag", None, 1), ("count_mismatch", key, -1)}


def test_a_vector_that_is_not_finite_cannot_be_stored_at_all(db_session, person):
    user, *_ = person
    vector = [0.01] * EMBEDDING_DIMENSIONS
    vector[7] = float("nan")
    with pytest.raises(DBAPIError), db_session.begin_nested():
        db_session.execute(text(
            "INSERT INTO memory_chunks (user_id, source_key, source_id, chunk_index,"
            " content_hash, content, embedding, embedding_model) VALUES"
            " (:u, 'blink.blinks', '1', 0, 'h', 'x', CAST(:e AS vector), 'm')"),
            {"u": user.id, "e": "[" + ",".join(map(str, vector)) + "]"})


def test_a_finding_is_audited_without_content_repaired_and_then_clean(db_session, person):
    user, memory, messages, canary = person
    db_session.execute(update(Message).where(Message.id == messages[0].id)
                       .values(not_remembered=True))
    db_session.execute(text("UPDATE memories SET status = 'deleted' WHERE id = :id"),
                       {"id": memory.id})
    report = check(db_session, user)
    assert report.repairs_requested == 1
    (event,) = db_session.scalars(select(AuditEvent).where(
        AuditEvent.action == "memory.verify", AuditEvent.owner_id == user.id)).all()
    assert event.details == {"violations": {f"not_allowed:{CHAT_HISTORY}": 1,
                                            f"not_allowed:{SAVED}": 1}}
    assert canary not in str(event.details) and canary not in str(event.target_id)
    (repair,) = db_session.scalars(select(MemoryBuild).where(
        MemoryBuild.user_id == user.id, MemoryBuild.status == "queued")).all()
    assert (repair.mode, repair.trigger) == ("full", "repair")

    # While the repair waits, the user is not judged; once it ran, all is well.
    assert check(db_session, user).users_pending == 1
    built(db_session, user)
    after = check(db_session, user)
    assert (after.users_checked, after.violations) == (1, [])


def test_every_user_is_checked_in_batches(db_session, person):
    user, *_ = person
    others = [make_user(db_session) for _ in range(3)]
    for other in others:
        make_blink(db_session, other, "hello")
        built(db_session, other)
    insert_chunk(db_session, others[1], BLINKS, "404")
    ids = [user.id, *(o.id for o in others)]
    report = verify_memory(db_session, ann_threshold=THRESHOLD, user_ids=ids, batch_size=2,
                           repair=False)
    assert report.users_checked == 4
    assert found(report) == {("not_allowed", BLINKS, 1), ("count_mismatch", BLINKS, 1)}
    assert {v.user_id for v in report.violations} == {others[1].id}


def test_the_command_reports_findings_and_exits_1(runner, db_session, person):
    user, memory, *_ = person
    clean = runner.invoke(args=["memories", "verify", "--user", user.email, "--no-repair"])
    assert clean.exit_code == 0, clean.output
    assert "Checked 1 users" in clean.output and "Nothing found." in clean.output
    db_session.execute(text("UPDATE memories SET status = 'deleted' WHERE id = :id"),
                       {"id": memory.id})
    dirty = runner.invoke(args=["memories", "verify", "--user", user.email, "--no-repair"])
    assert dirty.exit_code == 1
    assert f"user {user.id}: 1 × chunks no current record allows" in dirty.output
    unknown = runner.invoke(args=["memories", "verify", "--user", "nobody@example.test"])
    assert unknown.exit_code != 0 and "No user has the email" in unknown.output


def test_the_staff_and_support_homes_show_the_last_run(client, auth, db_session, person):
    user, memory, *_ = person
    support = make_user(db_session, role="support")
    auth.login(support.email)
    check(db_session, user)
    for path in ("/admin/", "/support/"):
        page = client.get(path).get_data(as_text=True)
        assert 'data-truth-check="clean"' in page and "Truth check: nothing found" in page
    db_session.execute(text("UPDATE memories SET status = 'deleted' WHERE id = :id"),
                       {"id": memory.id})
    check(db_session, user)
    for path in ("/admin/", "/support/"):
        page = client.get(path).get_data(as_text=True)
        assert 'data-truth-check="found"' in page, path
        assert "Truth check: 1 finding for 1 user" in page
        assert "flt0_action_equals=memory.verify" in page


def test_the_check_costs_the_same_queries_for_5_users_or_50(db_session, count_queries):
    def world(n: int) -> list[int]:
        ids = []
        for i in range(n):
            user = make_user(db_session, plan=make_plan(db_session, cap=4) if i % 2 else None)
            make_blink(db_session, user, f"blink {i}")
            make_memory(db_session, user, f"memory {i}")
            make_conversation(db_session, user, [(f"q{i}", f"a{i}")])
            built(db_session, user)
            ids.append(user.id)
        return ids

    few, many = world(5), world(50)
    with count_queries() as small:
        assert verify_memory(db_session, ann_threshold=THRESHOLD, user_ids=few).users_checked \
            == 5
    with count_queries() as large:
        report = verify_memory(db_session, ann_threshold=THRESHOLD, user_ids=many)
    assert (report.users_checked, report.violations) == (50, [])
    assert large.count == small.count, (small.count, large.count)
