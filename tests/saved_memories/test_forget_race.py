"""Forgetting races a running build ("a build never brings back what was forgotten",
"it stops being recalled at once"), with committed data and real concurrent
transactions: the forget and the build serialise on the user's build lock, whichever
comes first, and no chunk of the forgotten memory survives either order. The waits are
observed in pg_locks / pg_stat_activity, never assumed from a sleep."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from sqlalchemy import select, text
from sqlalchemy.orm import Session

from dashboard.audit.services import Actor
from dashboard.extensions import db
from dashboard.memory import MemoryBuild, MemoryChunk, get_embedder, locks, request_build
from dashboard.saved_memories import MemoryConflict, MemoryGone, find_memory, forget_memory, recall
from dashboard.sources import SAVED
from tests.factories import ALL_SCOPES, PausedEmbedder, make_memory
from tests.saved_memories.helpers import (
    backend_pid,
    lock_waiters,
    markers_of,
    recalled_ids,
    wait_until,
    waits_on_build_lock,
)
from tests.workers import run_build

SECRET = "Keeps the spare house key under the blue flowerpot."
KEPT = "Takes the early train to Utrecht on Mondays."
ACTOR = Actor("api_key", "1")
JOIN = 60


def queued_build_id(session, user_id: int) -> int:
    session.expire_all()
    return session.scalar(select(MemoryBuild.id).where(MemoryBuild.user_id == user_id,
                                                       MemoryBuild.status == "queued"))


def chunks_of(memory_id: Any) -> list[str]:
    """Committed chunks of the memory, read on a connection of its own."""
    with db.engine.connect() as conn:
        return list(conn.scalars(select(MemoryChunk.content).where(
            MemoryChunk.source_key == SAVED, MemoryChunk.source_id == str(memory_id))))


def recalled_now(app, user_id: int, query: str = SECRET) -> set[str | None]:
    with app.app_context(), Session(db.engine) as session:
        return recalled_ids(recall(session, user_id, query, 10,
                                   embedder=get_embedder("hashing")))


def build_record(build_id: int) -> MemoryBuild:
    with Session(db.engine, expire_on_commit=False) as session:
        return session.get(MemoryBuild, build_id)


def saved_pair(committed):
    """A committed user with two saved memories and the build their save requested."""
    user = committed.user()
    session = committed.session
    secret = make_memory(session, user, SECRET, source="chatgpt", actor=ACTOR)
    kept = make_memory(session, user, KEPT, source="codex", actor=ACTOR)
    session.commit()
    return user, secret.id, kept.id, queued_build_id(session, user.id)


@pytest.mark.parametrize("mode", ["soft_delete", "redact", "hard_delete"])
def test_a_forget_issued_while_a_build_runs_leaves_no_chunk_after_the_build_commits(
        app, committed, queue, mode):
    user, secret_id, kept_id, build_id = saved_pair(committed)
    queue.empty()
    embedder = PausedEmbedder(hold=JOIN)
    built: list[str] = []
    forgot: dict[str, Any] = {}
    started = threading.Event()

    def build_in_thread() -> None:
        with app.app_context():
            built.append(run_build(build_id, embedder=embedder))

    def run_forget() -> None:
        with app.app_context():
            session = Session(db.engine)
            try:
                forgot["pid"] = backend_pid(session)
                started.set()
                receipt = forget_memory(session, user.id, secret_id, mode=mode, actor=ACTOR,
                                        scopes=ALL_SCOPES, reason="race")
                session.commit()
                forgot["receipt"] = receipt
            except Exception as exc:  # reported by the assertion below
                forgot["error"] = exc
            finally:
                session.rollback()
                session.close()

    builder = threading.Thread(target=build_in_thread, name="build")
    forgetter = threading.Thread(target=run_forget, name="forget")
    try:
        builder.start()
        assert embedder.reading.wait(JOIN), "the build never reached its embedding step"
        assert SECRET in embedder.texts  # it read the memory as active
        forgetter.start()
        assert started.wait(JOIN)
        # The forget waits for the build's lock (it must not delete before the build
        # has written, or the build would write the chunk back after it).
        assert wait_until(lambda: waits_on_build_lock(db.engine, forgot["pid"], user.id),
                          forgetter), forgot
        assert "receipt" not in forgot
        assert build_record(build_id).status == "running"
    finally:
        embedder.release.set()
        builder.join(JOIN)
        if forgetter.ident:
            forgetter.join(JOIN)
    assert not builder.is_alive() and not forgetter.is_alive()
    assert built == ["succeeded"]
    assert set(forgot) == {"pid", "receipt"}, forgot
    # The forget ran after the build committed, and removed what the build had written.
    assert forgot["receipt"].removed_chunks == 1

    assert chunks_of(secret_id) == []
    assert chunks_of(kept_id) == [KEPT]
    assert recalled_now(app, user.id) == {str(kept_id)}
    record = build_record(build_id)
    assert (record.status, record.added) == ("succeeded", 2)

    # The build the forget requested changes nothing about it either.
    follow_up = queued_build_id(committed.session, user.id)
    assert follow_up is not None
    assert run_build(follow_up) == "succeeded"
    assert chunks_of(secret_id) == []
    assert recalled_now(app, user.id) == {str(kept_id)}


@pytest.mark.parametrize("mode", ["soft_delete", "redact", "hard_delete"])
def test_a_build_that_starts_during_a_forget_waits_and_does_not_bring_it_back(
        app, committed, queue, mode):
    user, secret_id, kept_id, first = saved_pair(committed)
    assert run_build(first) == "succeeded"
    assert chunks_of(secret_id) == [SECRET]
    request_build(committed.session, user.id, trigger="admin")
    committed.session.commit()
    build_id = queued_build_id(committed.session, user.id)
    queue.empty()

    built: list[str] = []

    def build_in_thread() -> None:
        with app.app_context():
            built.append(run_build(build_id, embedder=get_embedder("hashing")))

    builder = threading.Thread(target=build_in_thread, name="build")
    forget_session = Session(db.engine)
    try:
        receipt = forget_memory(forget_session, user.id, secret_id, mode=mode, actor=ACTOR,
                                scopes=ALL_SCOPES)
        forget_pid = backend_pid(forget_session)
        builder.start()
        # The build waits for the forget's lock: one waiter, and not the forget itself.
        assert wait_until(lambda: len(lock_waiters(db.engine, user.id)) == 1, builder)
        assert forget_pid not in lock_waiters(db.engine, user.id)
        assert built == []
        forget_session.commit()
    finally:
        forget_session.rollback()
        forget_session.close()
        if builder.ident:
            builder.join(JOIN)
    assert not builder.is_alive()
    assert built == ["succeeded"]
    assert receipt.removed_chunks == 1
    record = build_record(build_id)
    assert (record.status, record.added, record.removed, record.kept) == ("succeeded", 0, 0, 1)
    assert chunks_of(secret_id) == []
    assert recalled_now(app, user.id) == {str(kept_id)}


@pytest.mark.parametrize("mode", ["soft_delete", "redact", "hard_delete"])
def test_a_full_rebuild_after_a_forget_never_brings_the_memory_back(app, committed, queue,
                                                                    mode):
    user, secret_id, kept_id, first = saved_pair(committed)
    assert run_build(first) == "succeeded"
    forget_memory(committed.session, user.id, secret_id, mode=mode, actor=ACTOR,
                  scopes=ALL_SCOPES)
    committed.session.commit()
    # The forget's own request, made a full rebuild.
    request_build(committed.session, user.id, mode="full", trigger="admin")
    committed.session.commit()
    build_id = queued_build_id(committed.session, user.id)
    assert build_record(build_id).mode == "full"
    assert run_build(build_id) == "succeeded"

    record = build_record(build_id)
    assert (record.status, record.added) == ("succeeded", 1)
    assert chunks_of(secret_id) == []
    with db.engine.connect() as conn:
        contents = list(conn.scalars(select(MemoryChunk.content)
                                     .where(MemoryChunk.user_id == user.id)))
    assert contents == [KEPT]  # neither the content nor "[REDACTED]" is made a chunk
    assert recalled_now(app, user.id) == {str(kept_id)}


@pytest.mark.parametrize(("first", "second", "refusal"), [
    ("soft_delete", "soft_delete", MemoryConflict),
    ("redact", "soft_delete", MemoryConflict),
    ("redact", "redact", MemoryConflict),
    ("hard_delete", "soft_delete", MemoryGone),
    ("soft_delete", "hard_delete", None),
])
def test_a_forget_that_waited_for_another_sees_what_the_first_did(app, committed, queue, first,
                                                                  second, refusal):
    """Two forgets of one memory at once: the second reads the memory after it got the
    lock, as the first left it — never the copy it read before waiting."""
    user, secret_id, _, _ = saved_pair(committed)
    outcome: dict[str, Any] = {}
    started = threading.Event()

    def run_second() -> None:
        with app.app_context():
            session = Session(db.engine)
            try:
                outcome["pid"] = backend_pid(session)
                # A caller that read the memory first (a confirmation page, the API's
                # lookup) holds it in this session's identity map while the forget waits.
                held = find_memory(session, user.id, secret_id)
                outcome["read_first"] = held.status
                started.set()
                outcome["receipt"] = forget_memory(session, user.id, secret_id, mode=second,
                                                   actor=ACTOR, scopes=ALL_SCOPES)
                session.commit()
                del held
            except Exception as exc:  # compared below
                outcome["error"] = exc
            finally:
                session.rollback()
                session.close()

    racer = threading.Thread(target=run_second, name="second-forget")
    holder = Session(db.engine)
    try:
        forget_memory(holder, user.id, secret_id, mode=first, actor=ACTOR, scopes=ALL_SCOPES)
        racer.start()
        assert started.wait(JOIN)
        assert wait_until(lambda: waits_on_build_lock(db.engine, outcome["pid"], user.id),
                          racer), outcome
        holder.commit()
    finally:
        holder.rollback()
        holder.close()
        if racer.ident:
            racer.join(JOIN)
    assert not racer.is_alive()
    assert outcome.pop("read_first") == "active"  # as read before the wait
    if refusal is None:
        assert "error" not in outcome, outcome
        assert outcome["receipt"].from_status == "deleted"
    else:
        assert isinstance(outcome.get("error"), refusal), outcome
    committed.session.expire_all()
    modes = [m.mode for m in markers_of(committed.session, secret_id)]
    assert modes == [first] + ([second] if refusal is None else [])


def blocked(engine, pid: int) -> bool:
    """Whether backend ``pid`` waits on a lock of any kind right now."""
    with engine.connect() as probe:
        row = probe.execute(text("SELECT wait_event_type FROM pg_stat_activity "
                                 "WHERE pid = :pid"), {"pid": pid}).first()
        probe.rollback()
    return row is not None and row[0] == "Lock"


@pytest.mark.parametrize("change", ["hard_delete", "metadata_edit"])
def test_no_deadlock_with_a_transaction_that_requests_a_build_then_audits(app, committed,
                                                                          change):
    """Every row write comes before the audit chain's lock. A transaction that requests
    the owner's build and then audits (a save, a staff rebuild) and one that forgets or
    edits must queue behind each other, never deadlock (PostgreSQL would abort one: a
    503 for someone)."""
    from dashboard.audit.services import record_event
    from dashboard.saved_memories import update_memory

    owner = committed.user()
    memory = make_memory(committed.session, owner, KEPT)
    committed.session.commit()
    with app.app_context():
        first, second = Session(db.engine), Session(db.engine)
    errors: list[BaseException] = []
    try:
        request_build(first, owner.id, mode="quick", trigger="admin")  # holds the queued row
        pid = backend_pid(second)

        def other() -> None:
            try:
                with app.app_context():
                    change_it()
            except BaseException as exc:  # noqa: BLE001 (reported below)
                errors.append(exc)
                second.rollback()

        def change_it() -> None:
            if change == "hard_delete":
                forget_memory(second, owner.id, memory.id, mode="hard_delete",
                              actor=ACTOR, scopes=ALL_SCOPES)
            else:
                update_memory(second, find_memory(second, owner.id, memory.id),
                              metadata={"topic": "trains"}, actor=ACTOR)
            second.commit()

        thread = threading.Thread(target=other)
        thread.start()
        # The change waits on the first's queued-build row (a hard delete's flush requests
        # a build) or, an edit of metadata only, requests none and finishes.
        waited = wait_until(lambda: blocked(db.engine, pid), thread)
        assert waited == (change == "hard_delete")
        record_event(first, action="builds.request", actor=ACTOR, owner_id=owner.id,
                     target_type="user", target_id=owner.id)
        first.commit()
        thread.join(JOIN)
        assert not thread.is_alive()
        assert errors == []
    finally:
        first.close()
        second.close()


def test_an_edit_of_a_memory_hard_deleted_meanwhile_is_gone_not_an_error(app, committed):
    from dashboard.saved_memories import update_memory

    owner = committed.user()
    memory = make_memory(committed.session, owner, KEPT)
    committed.session.commit()
    with app.app_context():
        editor, eraser = Session(db.engine), Session(db.engine)
    try:
        seen = find_memory(editor, owner.id, memory.id)  # the edit read it: active
        forget_memory(eraser, owner.id, memory.id, mode="hard_delete", actor=ACTOR,
                      scopes=ALL_SCOPES)
        eraser.commit()
        with pytest.raises(MemoryGone):
            update_memory(editor, seen, metadata={"topic": "trains"}, actor=ACTOR)
    finally:
        editor.rollback()
        editor.close()
        eraser.close()


def test_a_forget_waits_for_a_build_only_so_long_then_says_busy_and_changes_nothing(
        app, committed, monkeypatch):
    from dashboard.memory.locks import BUSY, lock_user
    from dashboard.saved_memories import MemoryBusy

    monkeypatch.setattr(locks, "BUILD_WAIT", "200ms")
    owner = committed.user()
    memory = make_memory(committed.session, owner, SECRET)
    committed.session.commit()
    with app.app_context():
        build, forgetter = Session(db.engine), Session(db.engine)
    try:
        lock_user(build, owner.id)  # a long build holds the owner's lock
        with pytest.raises(MemoryBusy) as refused:
            forget_memory(forgetter, owner.id, memory.id, mode="redact", actor=ACTOR,
                          scopes=ALL_SCOPES)
        assert refused.value.sentence == BUSY
        forgetter.rollback()
        assert find_memory(forgetter, owner.id, memory.id).status == "active"
        assert forgetter.scalar(text("SHOW lock_timeout")) == "0"  # nothing left set
    finally:
        build.rollback()
        build.close()
        forgetter.close()
