"""A user's first export asked twice at once (two requests, two real transactions, see
tests/races.py): one export, and both requests are sent to it — never a 500."""

from __future__ import annotations

from sqlalchemy import func, select

from dashboard.exports import DataExport
from dashboard.extensions import db
from tests.races import (
    JOIN,
    Request,
    audit_chain_held,
    signed_in,
    token,
    waiting_on_a_transaction,
    waiting_on_the_chain,
)
from tests.saved_memories.helpers import wait_until


def test_a_first_export_asked_twice_at_once_makes_one_and_sends_both_to_it(
        app, committed, queue):
    user = committed.user()
    committed.session.commit()
    first, second = signed_in(app, user.email), signed_in(app, user.email)
    tokens = [token(client, "/memory/status") for client in (first, second)]
    a = Request(lambda: first.post("/memory/export", data={"csrf_token": tokens[0]}))
    b = Request(lambda: second.post("/memory/export", data={"csrf_token": tokens[1]}))
    with audit_chain_held(db.engine):
        a.start()
        # The first has inserted its export and waits to audit it, uncommitted.
        assert wait_until(lambda: waiting_on_the_chain(db.engine) == 1, a)
        b.start()
        # The second saw no export to join, and waits on the first one's new row.
        assert wait_until(lambda: waiting_on_a_transaction(db.engine) == 1, b)
    a.join(JOIN)
    b.join(JOIN)
    assert (a.error, b.error) == (None, None)
    assert a.response.status_code == 303
    assert b.response.status_code == 303
    assert b.response.headers["Location"] == a.response.headers["Location"]
    with second.session_transaction() as session:
        assert [m for _, m in session["_flashes"]] == [
            "An export is already being prepared: this is it."]
    committed.session.expire_all()
    assert committed.session.scalar(select(func.count()).select_from(DataExport).where(
        DataExport.user_id == user.id)) == 1
