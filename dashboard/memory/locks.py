"""The per-user build lock, and forgetting under it.

A build holds its user's lock for its whole transaction; a forget takes the same lock
before it deletes chunks, in its own transaction. So a build that read a memory first
commits before the forget deletes what it wrote, and a build that starts after the
forget reads the memory as forgotten: recall stops at the forget's commit."""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import bindparam, delete, func, select
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from dashboard.memory.models import MemoryBuild, MemoryChunk
from dashboard.refusals import Busy

# Namespace of the per-user advisory lock (the other half is the user id).
BUILD_LOCK_NAMESPACE = 6_101
# How long a forget or an edit waits for a running build of the same owner: a build
# that crosses the HNSW threshold may hold the lock for minutes.
BUILD_WAIT = "30s"
BUSY = ("A memory build of this account is still writing (a large one can take minutes); "
        "nothing was changed. Try again shortly.")


class BuildsBusy(Busy):
    """A build of the owner held the lock longer than a forget may wait."""

    def __init__(self, sentence: str = BUSY) -> None:
        super().__init__(sentence)


def lock_user(session: Session, user_id: int) -> None:
    """Serialise one user's builds and forgets (transaction-scoped; re-entrant)."""
    session.execute(select(func.pg_advisory_xact_lock(BUILD_LOCK_NAMESPACE, user_id)))


def hold_build_owner(session: Session, build_id: int) -> int | None:
    """The lock of build ``build_id``'s owner, read and taken in one round trip, for as
    long as the session's connection lives (a build job's claim, run and record span
    several transactions; ``release_user`` gives it back). The owner's id, or None if
    there is no such build."""
    row = session.execute(select(MemoryBuild.user_id,
                                 func.pg_advisory_lock(BUILD_LOCK_NAMESPACE,
                                                       MemoryBuild.user_id))
                          .where(MemoryBuild.id == build_id)).first()
    return row[0] if row is not None else None


def release_user(session: Session, user_id: int) -> None:
    session.execute(select(func.pg_advisory_unlock(BUILD_LOCK_NAMESPACE, user_id)))


def wait_for_builds(session: Session, user_id: int, *, wait: str | None = None) -> None:
    """Take the user's lock for this transaction: at once when no build holds it (one
    statement), else waiting at most ``wait`` (``BUILD_WAIT``), then ``BuildsBusy``."""
    if session.scalar(select(func.pg_try_advisory_xact_lock(BUILD_LOCK_NAMESPACE, user_id))):
        return
    previous, _ = session.execute(select(func.current_setting("lock_timeout"),
                                         func.set_config("lock_timeout", wait or BUILD_WAIT,
                                                         True))).one()
    try:
        lock_user(session, user_id)
    except OperationalError as exc:
        if getattr(exc.orig, "sqlstate", None) == "55P03":  # lock_not_available
            raise BuildsBusy() from None
        raise
    session.execute(select(func.set_config("lock_timeout", previous, True)))


def forget_chunks(session: Session, user_id: int, source_key: str,
                  source_ids: Iterable[str], *, locked: bool = False,
                  wait: str | None = None) -> int:
    """Delete the chunks of these records now, under the user's build lock; how many
    went. Recall stops returning them at the caller's commit. The lock must come before
    any row this transaction writes (a build job waiting on such a row while this waits
    for its lock would deadlock): a caller that writes first takes it with
    ``wait_for_builds`` at its start and passes ``locked=True``; otherwise it is taken
    here."""
    ids = list(source_ids)
    if not ids:
        return 0
    if not locked:
        wait_for_builds(session, user_id, wait=wait)
    result = session.execute(delete(MemoryChunk).where(
        MemoryChunk.user_id == user_id, MemoryChunk.source_key == source_key,
        MemoryChunk.source_id == func.any(bindparam("ids", ids, type_=ARRAY(
            MemoryChunk.source_id.type)))))
    return result.rowcount or 0


def count_item_chunks(session: Session, user_id: int, source_key: str, source_id: str) -> int:
    """An exact count of one item's stored chunks (an erasure receipt's post-delete probe:
    by the user's key index, never the approximate one, which could miss a row)."""
    return session.scalar(select(func.count()).select_from(MemoryChunk).where(
        MemoryChunk.user_id == user_id, MemoryChunk.source_key == source_key,
        MemoryChunk.source_id == source_id)) or 0
