"""The team's report asked twice at once (two requests, two real transactions, see
tests/races.py): one report, and both requests are sent to it — never a 500."""

from __future__ import annotations

from sqlalchemy import func, select, text

from dashboard.evidence.models import EvidenceReport
from dashboard.evidence.report import _REQUEST_LOCK
from dashboard.extensions import db
from tests.factories import make_team
from tests.races import JOIN, Request, audit_chain_held, signed_in, token, waiting_on_the_chain
from tests.saved_memories.helpers import wait_until


def waiting_on_the_request_lock() -> int:
    with db.engine.connect() as probe:
        count = probe.scalar(text(
            "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
            "WHERE NOT l.granted AND a.datname = current_database() AND "
            "l.locktype = 'advisory' AND l.objsubid = 2 AND l.classid = :key"),
            {"key": _REQUEST_LOCK})
        probe.rollback()
    return count or 0


def test_a_report_asked_twice_at_once_makes_one_and_sends_both_to_it(app, committed,
                                                                     queue):
    lead = committed.user()
    team = make_team(committed.session, lead, slug="evidence-race")
    committed.users.append(team.id)
    committed.session.commit()
    page = "/teams/evidence-race/evidence"
    first, second = signed_in(app, lead.email), signed_in(app, lead.email)
    tokens = [token(client, page) for client in (first, second)]
    a = Request(lambda: first.post(page, data={"csrf_token": tokens[0]}))
    b = Request(lambda: second.post(page, data={"csrf_token": tokens[1]}))
    with audit_chain_held(db.engine):
        a.start()
        # The first has made its report and waits to audit it, uncommitted.
        assert wait_until(lambda: waiting_on_the_chain(db.engine) == 1, a)
        b.start()
        # The second waits for the first to end before it looks for one in the making.
        assert wait_until(lambda: waiting_on_the_request_lock() == 1, b)
    a.join(JOIN)
    b.join(JOIN)
    assert (a.error, b.error) == (None, None)
    assert (a.response.status_code, b.response.status_code) == (303, 303)
    with second.session_transaction() as session:
        assert [m for _, m in session["_flashes"]] == [
            "A report of this team is already being made: this is it."]
    committed.session.expire_all()
    assert committed.session.scalar(select(func.count()).select_from(EvidenceReport).where(
        EvidenceReport.team_id == team.id)) == 1
