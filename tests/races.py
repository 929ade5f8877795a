"""Two requests at once, in the order a race takes them, each in its own thread with its
own test client (so its own session and connection) on committed data. The test holds
the audit chain's lock, which an audited write takes last, after its row writes: the
first request stops there with its new row not yet committed; the second runs into that
row and waits for the first transaction; then the lock is let go and both finish. Every
wait is observed in pg_locks, never assumed from a sleep."""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import Engine

from dashboard.audit.services import _CHAIN_LOCK
from tests.conftest import AuthActions, csrf_from

JOIN = 60


@contextmanager
def audit_chain_held(engine: Engine) -> Iterator[None]:
    with engine.connect() as conn:
        conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _CHAIN_LOCK})
        try:
            yield
        finally:
            conn.rollback()


def _waiting(engine: Engine, condition: str) -> int:
    with engine.connect() as probe:
        count = probe.scalar(text(
            "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
            "WHERE NOT l.granted AND a.datname = current_database() AND " + condition),
            {"key": _CHAIN_LOCK})
        probe.rollback()
    return count or 0


def waiting_on_the_chain(engine: Engine) -> int:
    """Backends waiting for the audit chain's lock."""
    return _waiting(engine, "l.locktype = 'advisory' AND l.classid = 0 AND l.objid = :key "
                            "AND l.objsubid = 1")


def waiting_on_a_transaction(engine: Engine) -> int:
    """Backends waiting for another transaction to end (a row or index entry it wrote)."""
    return _waiting(engine, "l.locktype = 'transactionid'")


class Request(threading.Thread):
    """``send()`` in a thread of its own; its response, or what it raised."""

    def __init__(self, send: Callable[[], Any]) -> None:
        super().__init__(daemon=True)
        self.send, self.response, self.error = send, None, None

    def run(self) -> None:
        try:
            self.response = self.send()
        except BaseException as exc:  # reported by the test's assertions
            self.error = exc


def apart(call: Callable[[], Any]) -> Any:
    """``call()`` outside the test's app context: a request there would reuse it (its
    ``g``, so the signed-in user, and its session), as a real request never does."""
    return contextvars.Context().run(call)


def signed_in(app, email: str):
    """A test client of its own, signed in as ``email``."""
    client = app.test_client()
    assert apart(lambda: AuthActions(client).login(email)).status_code == 302
    return client


def token(client, path: str) -> str:
    return apart(lambda: csrf_from(client, path))
